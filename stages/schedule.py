"""DVC stage `schedule`: see dpledger.pipeline.schedule."""

from stages._entry import main

if __name__ == "__main__":
    main("schedule")
