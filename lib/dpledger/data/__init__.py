"""Datasets: the embedded default (scikit-learn's handwritten digits), loaders for standard formats,
and text."""

from dpledger.data.dataset import Dataset, load_dataset, split_dataset
from dpledger.data.loaders import (
    load_cifar10_batches,
    load_digits,
    load_idx_pair,
    load_mnist_folder,
    load_npz,
)
from dpledger.data.source import load_data

__all__ = [
    "Dataset",
    "load_dataset",
    "load_data",
    "split_dataset",
    "load_digits",
    "load_npz",
    "load_cifar10_batches",
    "load_idx_pair",
    "load_mnist_folder",
]
