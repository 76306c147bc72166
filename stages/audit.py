"""DVC stage `audit`: see dpledger.pipeline.audit."""

from stages._entry import main

if __name__ == "__main__":
    main("audit")
