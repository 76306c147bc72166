"""Dataset loaders: the embedded digits and the standard formats, on small files the tests write."""

from __future__ import annotations

import gzip
import pickle
import struct

import numpy as np
import pytest

from dpledger.data import load_dataset
from dpledger.data.loaders import read_idx
from dpledger.errors import DpledgerError, ParamsError


def test_digits_are_embedded_scaled_and_split_deterministically():
    first = load_dataset("digits", None, 0.2, seed=3)
    again = load_dataset("digits", None, 0.2, seed=3)
    assert first.x_train.shape == (1438, 1, 8, 8) and first.x_test.shape == (359, 1, 8, 8)
    assert first.num_classes == 10
    assert 0.0 <= first.x_train.min() and first.x_train.max() <= 1.0
    np.testing.assert_array_equal(first.y_train, again.y_train)
    other = load_dataset("digits", None, 0.2, seed=4)
    assert not np.array_equal(first.y_train, other.y_train)


def test_npz_with_x_y_is_split(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(50, 3)), rng.integers(0, 4, size=50)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    data = load_dataset("npz", str(tmp_path / "d.npz"), 0.2, seed=0)
    assert data.train_size == 40 and data.x_test.shape == (10, 3)
    np.testing.assert_allclose(np.sort(np.concatenate([data.y_train, data.y_test])), np.sort(y))


def test_npz_with_explicit_split_keeps_it(tmp_path):
    x_train, x_test = np.ones((6, 2)), np.zeros((3, 2))
    np.savez(
        tmp_path / "d.npz",
        x_train=x_train,
        y_train=np.arange(6) % 3,
        x_test=x_test,
        y_test=np.array([0, 1, 2]),
    )
    data = load_dataset("npz", str(tmp_path / "d.npz"), 0.5, seed=0)
    np.testing.assert_array_equal(data.x_train, x_train)
    np.testing.assert_array_equal(data.y_test, [0, 1, 2])


def test_npz_with_wrong_keys_is_refused(tmp_path):
    np.savez(tmp_path / "d.npz", inputs=np.ones((2, 2)))
    with pytest.raises(DpledgerError, match="needs arrays x and y"):
        load_dataset("npz", str(tmp_path / "d.npz"), 0.2, seed=0)


def _write_cifar_batch(path, images: np.ndarray, labels: list[int]) -> None:
    with open(path, "wb") as handle:
        pickle.dump({b"data": images.reshape(len(labels), -1), b"labels": labels}, handle)


def test_cifar10_python_batches(tmp_path):
    rng = np.random.default_rng(1)
    train = [rng.integers(0, 256, size=(4, 3, 32, 32), dtype=np.uint8) for _ in range(2)]
    for i, images in enumerate(train, start=1):
        _write_cifar_batch(tmp_path / f"data_batch_{i}", images, [i, i, 0, 9])
    test_images = rng.integers(0, 256, size=(3, 3, 32, 32), dtype=np.uint8)
    _write_cifar_batch(tmp_path / "test_batch", test_images, [5, 6, 7])
    data = load_dataset("cifar10", str(tmp_path), 0.2, seed=0)
    assert data.x_train.shape == (8, 3, 32, 32) and data.num_classes == 10
    np.testing.assert_allclose(data.x_train[4], train[1][0] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(data.y_test, [5, 6, 7])


def _write_idx(path, array: np.ndarray, gz: bool) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(
        ">" + "I" * array.ndim, *array.shape
    )
    opener = gzip.open if gz else open
    with opener(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_idx_files(tmp_path, gz):
    rng = np.random.default_rng(2)
    suffix = ".gz" if gz else ""
    train_x = rng.integers(0, 256, size=(5, 28, 28))
    _write_idx(tmp_path / f"train-images-idx3-ubyte{suffix}", train_x, gz)
    _write_idx(tmp_path / f"train-labels-idx1-ubyte{suffix}", np.array([0, 1, 2, 3, 4]), gz)
    _write_idx(
        tmp_path / f"t10k-images-idx3-ubyte{suffix}", rng.integers(0, 256, size=(2, 28, 28)), gz
    )
    _write_idx(tmp_path / f"t10k-labels-idx1-ubyte{suffix}", np.array([9, 8]), gz)
    data = load_dataset("mnist", str(tmp_path), 0.2, seed=0)
    assert data.x_train.shape == (5, 1, 28, 28) and data.num_classes == 10
    np.testing.assert_allclose(data.x_train[:, 0] * 255.0, train_x, atol=1e-4)


def test_idx_with_bad_magic_is_refused(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04rest")
    with pytest.raises(DpledgerError, match="not an idx file"):
        read_idx(tmp_path / "bad")


def test_file_formats_need_an_existing_path(tmp_path):
    with pytest.raises(ParamsError, match="data.path is missing"):
        load_dataset("npz", None, 0.2, seed=0)
    with pytest.raises(ParamsError, match="does not exist"):
        load_dataset("mnist", str(tmp_path / "nowhere"), 0.2, seed=0)


def test_npz_uint8_images_are_scaled_and_get_a_channel_axis_like_mnist(tmp_path):
    # e.g. keras' mnist.npz: uint8 (N, 28, 28) pixels; the idx loader gives (N, 1, 28, 28) in [0, 1]
    rng = np.random.default_rng(5)
    x_train = rng.integers(0, 256, size=(6, 28, 28), dtype=np.uint8)
    x_test = rng.integers(0, 256, size=(2, 28, 28), dtype=np.uint8)
    np.savez(
        tmp_path / "mnist.npz",
        x_train=x_train,
        y_train=np.arange(6, dtype=np.uint8),
        x_test=x_test,
        y_test=np.array([1, 9], dtype=np.uint8),
    )
    data = load_dataset("npz", str(tmp_path / "mnist.npz"), 0.2, seed=0)
    assert data.x_train.shape == (6, 1, 28, 28) and data.x_test.shape == (2, 1, 28, 28)
    assert data.x_train.dtype == np.float32 and data.x_train.max() <= 1.0
    np.testing.assert_allclose(data.x_train[:, 0] * 255.0, x_train, atol=1e-4)
    assert data.num_classes == 10
    np.savez(tmp_path / "xy.npz", x=x_train, y=np.arange(6))
    split = load_dataset("npz", str(tmp_path / "xy.npz"), 0.5, seed=0)
    assert split.input_shape == (1, 28, 28) and split.x_train.max() <= 1.0


@pytest.mark.parametrize(
    "arrays, message",
    [
        # one-hot
        (
            {"x": np.ones((5, 3)), "y": np.eye(4)[[0, 1, 2, 3, 0]]},
            "1-D array of class indices",
        ),
        ({"x": np.ones((5, 3)), "y": np.arange(4)}, "labels of shape"),  # 5 inputs, 4 labels
        ({"x": np.ones((4, 3)), "y": np.array([0.0, 1.5, 2.0, 1.0])}, "integer class indices"),
        ({"x": np.ones((4, 3)), "y": np.array([0, -1, 2, 1])}, "integer class indices"),
        (
            {
                "x_train": np.ones((4, 3)),
                "y_train": np.arange(3),
                "x_test": np.ones((2, 3)),
                "y_test": np.arange(2),
            },
            "labels of shape",
        ),
        (
            {
                "x_train": np.ones((4, 3)),
                "y_train": np.arange(4),
                "x_test": np.ones((2, 5)),
                "y_test": np.arange(2),
            },
            "x_test",
        ),
    ],
)
def test_npz_with_bad_labels_or_shapes_is_one_clear_error(tmp_path, arrays, message):
    np.savez(tmp_path / "d.npz", **arrays)
    with pytest.raises(DpledgerError, match=message):
        load_dataset("npz", str(tmp_path / "d.npz"), 0.5, seed=0)
