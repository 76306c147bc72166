"""Readers for the embedded digits and for standard on-disk formats (npz, CIFAR-10 python, MNIST idx).

Inputs are scaled to [0, 1] and returned as float32; images keep a channel axis (N, C, H, W).
"""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np

from dpledger.errors import DpledgerError


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1797 8x8 handwritten digits (shipped with the package), as (N, 1, 8, 8) in [0, 1]."""
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    x = (bunch.images / 16.0).astype(np.float32)[:, None, :, :]
    return x, bunch.target.astype(np.int64)


def load_npz(path: Path) -> dict[str, np.ndarray]:
    """An ``.npz`` with either ``x``/``y`` or ``x_train``/``y_train``/``x_test``/``y_test``."""
    with np.load(path, allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files}
    if {"x", "y"} <= arrays.keys() or {"x_train", "y_train", "x_test", "y_test"} <= arrays.keys():
        return arrays
    raise DpledgerError(
        f"{path}: an npz dataset needs arrays x and y, or x_train, y_train, x_test and y_test; found {sorted(arrays)}"
    )


def _unpickle(path: Path) -> dict:
    with open(path, "rb") as handle:
        return pickle.load(handle, encoding="bytes")


def _cifar_arrays(batch: dict) -> tuple[np.ndarray, np.ndarray]:
    data = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
    return data.astype(np.float32) / 255.0, labels


def load_cifar10_batches(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """CIFAR-10's python version: ``data_batch_*`` for training and ``test_batch`` for test."""
    folder = Path(folder)
    train_files = sorted(folder.glob("data_batch_*"))
    test_file = folder / "test_batch"
    if not train_files or not test_file.exists():
        raise DpledgerError(f"{folder}: expected CIFAR-10 python batches data_batch_1..5 and test_batch")
    parts = [_cifar_arrays(_unpickle(path)) for path in train_files]
    x_train = np.concatenate([p[0] for p in parts])
    y_train = np.concatenate([p[1] for p in parts])
    x_test, y_test = _cifar_arrays(_unpickle(test_file))
    return x_train, y_train, x_test, y_test


def _open_maybe_gzip(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_idx(path: Path) -> np.ndarray:
    """Read one idx file (the MNIST family's format): magic, dims as big-endian uint32, then data."""
    dtypes = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    with _open_maybe_gzip(Path(path)) as handle:
        zero, dtype_code, ndim = struct.unpack(">HBB", handle.read(4))
        if zero != 0 or dtype_code not in dtypes:
            raise DpledgerError(f"{path}: not an idx file (bad magic number)")
        shape = struct.unpack(">" + "I" * ndim, handle.read(4 * ndim))
        data = np.frombuffer(handle.read(), dtype=dtypes[dtype_code])
    if data.size != int(np.prod(shape)):
        raise DpledgerError(f"{path}: idx header says {shape} but the file holds {data.size} values")
    return data.reshape(shape)


def load_idx_pair(images: Path, labels: Path) -> tuple[np.ndarray, np.ndarray]:
    """An idx image file (N, H, W) and its label file, as (N, 1, H, W) in [0, 1] and int64."""
    x = read_idx(images)
    y = read_idx(labels).astype(np.int64)
    if x.shape[0] != y.shape[0]:
        raise DpledgerError(f"{images}: {x.shape[0]} images but {labels} has {y.shape[0]} labels")
    return (x.astype(np.float32) / 255.0)[:, None, :, :], y


def _find(folder: Path, stem: str) -> Path:
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.exists():
            return candidate
    raise DpledgerError(f"{folder}: missing {stem} (or {stem}.gz)")


def load_mnist_folder(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """MNIST or Fashion-MNIST idx files under their standard names, optionally gzipped."""
    folder = Path(folder)
    x_train, y_train = load_idx_pair(_find(folder, "train-images-idx3-ubyte"), _find(folder, "train-labels-idx1-ubyte"))
    x_test, y_test = load_idx_pair(_find(folder, "t10k-images-idx3-ubyte"), _find(folder, "t10k-labels-idx1-ubyte"))
    return x_train, y_train, x_test, y_test
