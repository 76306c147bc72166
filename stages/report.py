"""DVC stage `report`: see dpledger.pipeline.report."""

from stages._entry import main

if __name__ == "__main__":
    main("report")
