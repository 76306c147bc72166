"""DVC stage `train`: see dpledger.pipeline.train."""

from stages._entry import main

if __name__ == "__main__":
    main("train")
