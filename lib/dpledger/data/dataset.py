"""The in-memory dataset every stage is handed, and the one entry point that builds it from params."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpledger.errors import ParamsError


@dataclass(frozen=True)
class Dataset:
    """Train/test arrays. ``x`` keeps its image shape (N, C, H, W) or is flat (N, D); ``y`` is int64."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    name: str

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def train_size(self) -> int:
        return int(self.x_train.shape[0])


def split_dataset(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int, name: str) -> Dataset:
    """Split (x, y) into train and test by a seeded permutation; labels must be 0..K-1."""
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"{name}: {x.shape[0]} inputs but {y.shape[0]} labels")
    n = x.shape[0]
    n_test = max(1, int(round(test_fraction * n)))
    if n_test >= n:
        raise ParamsError(f"params: data.test_fraction = {test_fraction} leaves no training data out of {n} examples")
    order = np.random.default_rng(seed).permutation(n)
    test, train = order[:n_test], order[n_test:]
    y = y.astype(np.int64)
    return Dataset(
        x_train=np.ascontiguousarray(x[train], dtype=np.float32),
        y_train=y[train],
        x_test=np.ascontiguousarray(x[test], dtype=np.float32),
        y_test=y[test],
        num_classes=int(y.max()) + 1,
        name=name,
    )


def load_dataset(name: str, path: str | None, test_fraction: float, seed: int) -> Dataset:
    """Build the dataset named in params (``data`` section); file formats need ``data.path``."""
    from dpledger.data import loaders

    if name == "digits":
        x, y = loaders.load_digits()
        return split_dataset(x, y, test_fraction, seed, name)
    if path is None:
        raise ParamsError(f"params: data.path is missing: data.name = {name!r} reads its arrays from a file")
    source = Path(path)
    if not source.exists():
        raise ParamsError(f"params: data.path = {path!r} does not exist")
    if name == "npz":
        arrays = loaders.load_npz(source)
        if "x_test" in arrays:
            x_train, y_train = arrays["x_train"], arrays["y_train"]
            x_test, y_test = arrays["x_test"], arrays["y_test"]
            y_all = np.concatenate([y_train, y_test]).astype(np.int64)
            return Dataset(
                x_train=np.ascontiguousarray(x_train, dtype=np.float32),
                y_train=y_train.astype(np.int64),
                x_test=np.ascontiguousarray(x_test, dtype=np.float32),
                y_test=y_test.astype(np.int64),
                num_classes=int(y_all.max()) + 1,
                name=name,
            )
        return split_dataset(arrays["x"], arrays["y"], test_fraction, seed, name)
    if name == "cifar10":
        x_train, y_train, x_test, y_test = loaders.load_cifar10_batches(source)
    elif name == "mnist":
        x_train, y_train, x_test, y_test = loaders.load_mnist_folder(source)
    else:
        raise ParamsError(f"params: data.name = {name!r} is invalid: allowed values are digits, npz, cifar10, mnist")
    return Dataset(x_train, y_train, x_test, y_test, int(max(y_train.max(), y_test.max())) + 1, name)
