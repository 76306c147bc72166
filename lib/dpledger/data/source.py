"""The one entry point the stages call: the dataset the ``data`` section of params.yaml names."""

from __future__ import annotations

from pathlib import Path

from dpledger.data.dataset import Dataset, load_dataset
from dpledger.data.text import load_text
from dpledger.errors import ParamsError
from dpledger.params.core import DataParams


def load_data(data: DataParams, seed: int) -> Dataset:
    """Images (digits, npz, cifar10, mnist) or tokenized text, split into train and test with
    ``seed``."""
    if data.name != "text":
        return load_dataset(data.name, data.path, data.test_fraction, seed)
    if data.path is None:
        raise ParamsError(
            "params: data.path is missing: data.name = 'text' reads a .jsonl or .csv file"
        )
    if not Path(data.path).is_file():
        raise ParamsError(f"params: data.path = {data.path!r} is invalid: no such file")
    return load_text(data, seed)
