"""DVC stage `verify`: see dpledger.pipeline.verify."""

from stages._entry import main

if __name__ == "__main__":
    main("verify")
