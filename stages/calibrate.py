"""DVC stage `calibrate`: see dpledger.pipeline.calibrate."""

from stages._entry import main

if __name__ == "__main__":
    main("calibrate")
