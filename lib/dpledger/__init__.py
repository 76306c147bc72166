"""dpledger: train with DP-SGD and produce evidence that the reported epsilon holds."""

__version__ = "0.1.0"
