"""Readers for the embedded digits and for standard on-disk formats (npz, CIFAR-10 python, MNIST
idx).

Inputs are scaled to [0, 1] and returned as float32; images keep a channel axis (N, C, H, W).
Nothing in a data file is executed: npz arrays are read with ``allow_pickle=False`` and CIFAR-10's
pickled batches with an unpickler that builds only numpy arrays and builtin containers. Every input
must be finite: clipping cannot bound the gradient of a NaN or infinite record, so one such record
would reveal its presence in the trained model.
"""

from __future__ import annotations

import gzip
import pickle
import struct
import zipfile
from pathlib import Path

import numpy as np

from dpledger.errors import DpledgerError


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1797 8x8 handwritten digits (shipped with the package), as (N, 1, 8, 8) in [0,
    1]."""
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    x = (bunch.images / 16.0).astype(np.float32)[:, None, :, :]
    return x, bunch.target.astype(np.int64)


def require_finite(x: np.ndarray, what: str) -> np.ndarray:
    """``x`` unchanged, or a one-line error naming ``what`` and the first example holding a NaN or
    inf."""
    if np.issubdtype(x.dtype, np.inexact):
        bad = ~np.isfinite(x.reshape(x.shape[0], -1)).all(axis=1) if x.ndim > 1 else ~np.isfinite(x)
        if bad.any():
            raise DpledgerError(
                f"{what}: example {int(np.flatnonzero(bad)[0])} holds a non-finite value "
                "(NaN or inf); every input must be finite "
                "(clipping cannot bound such a record's gradient), so fix or drop it"
            )
    return x


def load_npz(path: Path) -> dict[str, np.ndarray]:
    """An ``.npz`` with either ``x``/``y`` or ``x_train``/``y_train``/``x_test``/``y_test`` of
    numeric dtype."""
    if path.is_dir():
        raise DpledgerError(f"{path}: is a folder; data.name = npz reads one .npz file")
    try:
        archive = np.load(path, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise DpledgerError(
                f"{path}: is a single .npy array, not an .npz archive of named arrays"
            )
        with archive:
            arrays = {key: _npz_array(path, archive, key) for key in archive.files}
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as error:
        raise DpledgerError(
            f"{path}: is not a readable .npz archive (truncated or corrupt: {error})".splitlines()[
                0
            ]
        ) from None
    if {"x", "y"} <= arrays.keys() or {"x_train", "y_train", "x_test", "y_test"} <= arrays.keys():
        return arrays
    raise DpledgerError(
        f"{path}: an npz dataset needs arrays x and y, or x_train, y_train, x_test and y_test; "
        f"found {sorted(arrays)}"
    )


def _npz_array(path: Path, archive: np.lib.npyio.NpzFile, key: str) -> np.ndarray:
    try:
        return archive[key]
    except ValueError as error:
        if "allow_pickle" not in str(error):
            raise
        raise DpledgerError(
            f"{path}: array {key!r} holds Python objects (dtype=object); "
            "dpledger reads numeric arrays only and never unpickles a data file "
            "(save the array with a numeric dtype)"
        ) from None


class _ArraysOnlyUnpickler(pickle.Unpickler):
    """Builds dicts, lists, bytes, numbers and numpy arrays; any other global (the way a pickle runs
    code) is refused."""

    ALLOWED = frozenset(
        {
            # pickles written by numpy 1.x (CIFAR-10's own files)
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),  # and by numpy 2.x
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            # protocol-2 pickles spell bytes as _codecs.encode(str, "latin1")
            ("_codecs", "encode"),
        }
    )

    def find_class(self, module: str, name: str) -> type:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(
                f"it references {module}.{name}, which a CIFAR-10 batch never needs"
            )
        return super().find_class(module, name)


def _unpickle(path: Path) -> dict:
    try:
        with open(path, "rb") as handle:
            batch = _ArraysOnlyUnpickler(handle, encoding="bytes").load()
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        AttributeError,
        IndexError,
        OSError,
    ) as error:
        raise DpledgerError(
            f"{path}: not a CIFAR-10 python batch ({error})".splitlines()[0]
        ) from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise DpledgerError(
            f"{path}: not a CIFAR-10 python batch (a dict with b'data' and b'labels')"
        )
    return batch


def _cifar_arrays(path: Path, batch: dict) -> tuple[np.ndarray, np.ndarray]:
    try:
        data = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except (ValueError, TypeError) as error:
        raise DpledgerError(
            f"{path}: b'data' is not N rows of 3072 uint8 pixels, or b'labels' not integers "
            f"({error})"
        ) from None
    if labels.shape != (data.shape[0],):
        raise DpledgerError(f"{path}: {data.shape[0]} images but labels of shape {labels.shape}")
    return data.astype(np.float32) / 255.0, labels


def load_cifar10_batches(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """CIFAR-10's python version: ``data_batch_*`` for training and ``test_batch`` for test."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DpledgerError(
            f"{folder}: is not a folder; data.name = cifar10 reads the folder of python batches"
        )
    train_files = sorted(folder.glob("data_batch_*"))
    test_file = folder / "test_batch"
    if not train_files or not test_file.exists():
        raise DpledgerError(
            f"{folder}: expected CIFAR-10 python batches data_batch_1..5 and test_batch"
        )
    parts = [_cifar_arrays(path, _unpickle(path)) for path in train_files]
    x_train = np.concatenate([p[0] for p in parts])
    y_train = np.concatenate([p[1] for p in parts])
    x_test, y_test = _cifar_arrays(test_file, _unpickle(test_file))
    return x_train, y_train, x_test, y_test


def _open_maybe_gzip(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_idx(path: Path) -> np.ndarray:
    """Read one idx file (the MNIST family's format): magic, dims as big-endian uint32, then
    data."""
    dtypes = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    try:
        with _open_maybe_gzip(Path(path)) as handle:
            zero, dtype_code, ndim = struct.unpack(">HBB", handle.read(4))
            if zero != 0 or dtype_code not in dtypes:
                raise DpledgerError(f"{path}: not an idx file (bad magic number)")
            shape = struct.unpack(">" + "I" * ndim, handle.read(4 * ndim))
            data = np.frombuffer(handle.read(), dtype=dtypes[dtype_code])
    except (struct.error, OSError, EOFError, ValueError) as error:
        raise DpledgerError(
            f"{path}: not a readable idx file (truncated or corrupt: {error})"
        ) from None
    if data.size != int(np.prod(shape)):
        raise DpledgerError(
            f"{path}: idx header says {shape} but the file holds {data.size} values"
        )
    return data.reshape(shape)


def load_idx_pair(images: Path, labels: Path) -> tuple[np.ndarray, np.ndarray]:
    """An idx image file (N, H, W) and its label file, as (N, 1, H, W) in [0, 1] and int64."""
    x = read_idx(images)
    y = read_idx(labels).astype(np.int64)
    if x.shape[0] != y.shape[0]:
        raise DpledgerError(f"{images}: {x.shape[0]} images but {labels} has {y.shape[0]} labels")
    if x.ndim != 3 or y.ndim != 1:
        raise DpledgerError(
            f"{images}: expected (N, H, W) images and N labels; found {x.shape} and {y.shape}"
        )
    return require_finite((x.astype(np.float32) / 255.0)[:, None, :, :], str(images)), y


def _find(folder: Path, stem: str) -> Path:
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.exists():
            return candidate
    raise DpledgerError(f"{folder}: missing {stem} (or {stem}.gz)")


def load_mnist_folder(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """MNIST or Fashion-MNIST idx files under their standard names, optionally gzipped."""
    folder = Path(folder)
    x_train, y_train = load_idx_pair(
        _find(folder, "train-images-idx3-ubyte"), _find(folder, "train-labels-idx1-ubyte")
    )
    x_test, y_test = load_idx_pair(
        _find(folder, "t10k-images-idx3-ubyte"), _find(folder, "t10k-labels-idx1-ubyte")
    )
    return x_train, y_train, x_test, y_test
