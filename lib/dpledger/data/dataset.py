"""The in-memory dataset every stage is handed, and the one entry point that builds it from
params."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpledger import validation
from dpledger.data.loaders import require_finite
from dpledger.errors import DpledgerError, ParamsError


@dataclass(frozen=True)
class Dataset:
    """Train/test arrays. ``x`` keeps its image shape (N, C, H, W) or is flat (N, D); ``y`` is
    int64.

    Text (``name == "text"``): ``x`` holds int64 token ids (N, T) with
    :data:`dpledger.data.text.PAD` after each text's end, ``vocab_size`` is the tokenizer's, and
    ``has_labels`` is False for unlabelled text.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    name: str
    vocab_size: int | None = None
    has_labels: bool = True

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def train_size(self) -> int:
        return int(self.x_train.shape[0])


def split_dataset(
    x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int, name: str
) -> Dataset:
    """Split (x, y) into train and test by a seeded permutation; labels must be 0..K-1."""
    y = _class_labels(x, y, name)
    n = x.shape[0]
    n_test = max(1, int(round(test_fraction * n)))
    if n_test >= n:
        raise ParamsError(
            "params: "
            f"data.test_fraction = {test_fraction} leaves no training data out of {n} examples"
        )
    order = np.random.default_rng(seed).permutation(n)
    test, train = order[:n_test], order[n_test:]
    y = y.astype(np.int64)
    dtype = np.int64 if name == "text" else np.float32  # token ids stay integers
    return Dataset(
        x_train=np.ascontiguousarray(x[train], dtype=dtype),
        y_train=y[train],
        x_test=np.ascontiguousarray(x[test], dtype=dtype),
        y_test=y[test],
        num_classes=_num_classes(y, name),
        name=name,
    )


def _class_labels(x: np.ndarray, y: np.ndarray, what: str) -> np.ndarray:
    """``y`` as int64 class indices, refusing what would fail (or train wrongly) deep inside a
    stage."""
    y = np.asarray(y)
    if x.ndim < 2 or y.ndim != 1 or x.shape[0] != y.shape[0] or y.shape[0] == 0:
        raise DpledgerError(
            f"{what}: inputs of shape {x.shape} and labels of shape {y.shape}: expected (N, ...) "
            "inputs and N labels as a 1-D array of class indices 0..K-1 (not one-hot)"
        )
    if y.dtype != np.bool_ and not np.issubdtype(y.dtype, np.number):
        raise DpledgerError(
            f"{what}: labels have dtype {y.dtype}; expected integer class indices 0..K-1"
        )
    if y.dtype != np.bool_ and (
        not np.all(np.isfinite(y)) or np.any(y != np.round(y)) or y.min() < 0
    ):
        raise DpledgerError(
            f"{what}: labels must be integer class indices 0..K-1; found values in [{y.min()}, "
            f"{y.max()}]"
        )
    return y.astype(np.int64)


def _num_classes(labels: np.ndarray, what: str, fixed: int | None = None) -> int:
    """K for labels 0..K-1: ``fixed`` for formats that define it (CIFAR-10, MNIST: 10), else max +
    1.

    Labels that never use class 0 are refused: they are almost surely 1-based (1..K), which would
    silently train K+1 classes with one never seen; other absent classes are allowed (a rare class
    may be missing from a small file) and keep their output unit.
    """
    low, high = int(labels.min()), int(labels.max())
    if fixed is not None and high >= fixed:
        raise DpledgerError(f"{what}: labels must be class indices 0..{fixed - 1}; found {high}")
    if low > 0:
        raise DpledgerError(
            f"{what}: labels run {low}..{high} and class 0 never occurs; labels must be 0..K-1 "
            f"(1-based labels would add a class no example has: subtract {low} from every label)"
        )
    return fixed if fixed is not None else high + 1


def _npz_inputs(x: np.ndarray, what: str) -> np.ndarray:
    """npz inputs as the other loaders give them: numeric, finite, uint8 pixels scaled to [0, 1],
    (N, H, W) images given a channel axis."""
    if (
        x.dtype == np.bool_
        or not np.issubdtype(x.dtype, np.number)
        or np.iscomplexobj(x)
        or x.ndim < 2
    ):
        raise DpledgerError(
            f"{what}: inputs have dtype {x.dtype} and shape {x.shape}; expected real numbers (N, "
            "...)"
        )
    if x.dtype == np.uint8:
        x = x.astype(np.float32) / 255.0
    # a value beyond float32 becomes inf, which require_finite then names
    with np.errstate(over="ignore"):
        x = require_finite(x.astype(np.float32, copy=False), what)
    return channels_first(x[:, None, :, :] if x.ndim == 3 else x, what)


CHANNEL_COUNTS = (1, 3, 4)
"""Grey, RGB and RGBA: the channel counts an image array's layout is recognised by."""


def channels_first(x: np.ndarray, what: str) -> np.ndarray:
    """Images as (N, C, H, W): an (N, H, W, C) array (last axis 1, 3 or 4 channels, second axis not)
    is transposed, with a note on stderr; anything else is returned unchanged."""
    if x.ndim != 4 or x.shape[-1] not in CHANNEL_COUNTS or x.shape[1] in CHANNEL_COUNTS:
        return x
    converted = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    print(
        f"note: {what}: images of shape {x.shape} are channels-last (N, H, W, C); "
        f"read as (N, C, H, W) = {converted.shape}",
        file=sys.stderr,
    )
    return converted


def load_dataset(name: str, path: str | None, test_fraction: float, seed: int) -> Dataset:
    """Build the dataset named in params (``data`` section); file formats need ``data.path``."""
    from dpledger.data import loaders

    if name == "digits":
        x, y = loaders.load_digits()
        return split_dataset(x, y, test_fraction, seed, name)
    if path is None:
        raise ParamsError(
            f"params: data.path is missing: data.name = {name!r} reads its arrays from a file"
        )
    source = Path(path)
    if not source.exists():
        raise ParamsError(f"params: data.path = {path!r} does not exist")
    if name == "npz":
        arrays = loaders.load_npz(source)
        if "x_test" in arrays:
            x_train, x_test = (
                _npz_inputs(arrays["x_train"], f"{path}: x_train"),
                _npz_inputs(arrays["x_test"], f"{path}: x_test"),
            )
            y_train = _class_labels(x_train, arrays["y_train"], f"{path}: x_train, y_train")
            y_test = _class_labels(x_test, arrays["y_test"], f"{path}: x_test, y_test")
            if x_train.shape[1:] != x_test.shape[1:]:
                raise DpledgerError(
                    f"{path}: "
                    f"x_train has examples of shape {x_train.shape[1:]} but x_test {x_test.shape[1:]}"  # noqa: E501
                )
            return Dataset(
                x_train=np.ascontiguousarray(x_train, dtype=np.float32),
                y_train=y_train,
                x_test=np.ascontiguousarray(x_test, dtype=np.float32),
                y_test=y_test,
                num_classes=_num_classes(
                    np.concatenate([y_train, y_test]), f"{path}: y_train, y_test"
                ),
                name=name,
            )
        x = _npz_inputs(arrays["x"], f"{path}: x")
        y = _class_labels(x, arrays["y"], f"{path}: x, y")
        _num_classes(y, f"{path}: y")
        return split_dataset(x, y, test_fraction, seed, name)
    if name == "cifar10":
        x_train, y_train, x_test, y_test = loaders.load_cifar10_batches(source)
    elif name == "mnist":
        x_train, y_train, x_test, y_test = loaders.load_mnist_folder(source)
    else:
        raise validation.invalid(
            "data.name", name, "allowed values are digits, npz, cifar10, mnist", where="params"
        )
    labels = np.concatenate([y_train, y_test])
    return Dataset(
        x_train, y_train, x_test, y_test, _num_classes(labels, f"{path}: labels", fixed=10), name
    )
