"""Hostile data files (issue 21): non-finite inputs, crafted pickles, corrupt npz, object arrays,
1-based labels.

Each case was a traceback, a silent misreading or code execution before; each must now be one line
naming the file (and, for non-finite inputs, the first bad example).
"""

from __future__ import annotations

import pickle
import struct

import numpy as np
import pytest
import yaml

from dpledger.data import load_dataset
from dpledger.errors import DpledgerError, ParamsError
from dpledger.params import parse_params


def _one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e300])
def test_npz_with_one_non_finite_input_names_the_file_and_the_example(tmp_path, bad):
    x = np.zeros((20, 3))
    x[13, 1] = bad  # 1e300 overflows float32 to inf
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(20) % 2)
    with pytest.raises(DpledgerError) as error:
        load_dataset("npz", str(tmp_path / "d.npz"), 0.2, seed=0)
    assert _one_line(error).startswith(
        f"{tmp_path / 'd.npz'}: x: example 13 holds a non-finite value"
    )


def test_npz_split_names_which_array_holds_the_non_finite_input(tmp_path):
    x_test = np.zeros((3, 2))
    x_test[2, 0] = np.nan
    np.savez(
        tmp_path / "d.npz",
        x_train=np.zeros((4, 2)),
        y_train=np.arange(4) % 2,
        x_test=x_test,
        y_test=np.array([0, 1, 0]),
    )
    with pytest.raises(DpledgerError, match=r"x_test: example 2 holds a non-finite value"):
        load_dataset("npz", str(tmp_path / "d.npz"), 0.2, seed=0)


def test_mnist_float_idx_with_nan_names_the_image_file(tmp_path):
    def write(name, array, code):
        header = struct.pack(">HBB", 0, code, array.ndim) + struct.pack(
            ">" + "I" * array.ndim, *array.shape
        )
        (tmp_path / name).write_bytes(header + array.tobytes())

    images = np.zeros((3, 4, 4), dtype=">f4")
    images[1, 2, 3] = np.nan
    write("train-images-idx3-ubyte", images, 0x0D)
    write("train-labels-idx1-ubyte", np.array([0, 1, 2], dtype=np.uint8), 0x08)
    write("t10k-images-idx3-ubyte", np.zeros((1, 4, 4), dtype=np.uint8), 0x08)
    write("t10k-labels-idx1-ubyte", np.array([0], dtype=np.uint8), 0x08)
    with pytest.raises(
        DpledgerError, match=r"train-images-idx3-ubyte: example 1 holds a non-finite value"
    ):
        load_dataset("mnist", str(tmp_path), 0.2, seed=0)


class _Payload:
    """Unpickling this runs ``exec``: a CIFAR-10 batch from a shared remote could carry it."""

    def __reduce__(self):
        return (
            exec,
            (
                "import pathlib; "
                "pathlib.Path(__import__('os').environ['PAYLOAD_MARK']).write_text('ran')",
            ),
        )


def test_a_crafted_cifar_batch_runs_no_code(tmp_path, monkeypatch):
    mark = tmp_path / "payload_ran"
    monkeypatch.setenv("PAYLOAD_MARK", str(mark))
    folder = tmp_path / "cifar"
    folder.mkdir()
    images = np.zeros((2, 3 * 32 * 32), dtype=np.uint8)
    for name in ("data_batch_1", "test_batch"):
        with open(folder / name, "wb") as handle:
            pickle.dump({b"data": images, b"labels": [0, 1], b"x": _Payload()}, handle)
    with pytest.raises(DpledgerError) as error:
        load_dataset("cifar10", str(folder), 0.2, seed=0)
    assert "data_batch_1: not a CIFAR-10 python batch" in _one_line(
        error
    ) and "builtins.exec" in str(error.value)
    assert not mark.exists()
    # the same batch without the payload loads: the unpickler still builds numpy arrays (numpy 2
    # pickles)
    for name in ("data_batch_1", "test_batch"):
        with open(folder / name, "wb") as handle:
            pickle.dump({b"data": images, b"labels": [0, 1]}, handle, protocol=2)
    assert load_dataset("cifar10", str(folder), 0.2, seed=0).num_classes == 10


@pytest.mark.parametrize(
    "content", [b"", b"\x80\x04garbage", pickle.dumps([1, 2, 3]), pickle.dumps({b"data": b"x"})]
)
def test_a_truncated_or_foreign_cifar_batch_is_one_line(tmp_path, content):
    (tmp_path / "data_batch_1").write_bytes(content)
    (tmp_path / "test_batch").write_bytes(content)
    with pytest.raises(DpledgerError) as error:
        load_dataset("cifar10", str(tmp_path), 0.2, seed=0)
    assert "data_batch_1: not a CIFAR-10 python batch" in _one_line(error)


def _good_npz_bytes(tmp_path) -> bytes:
    np.savez(tmp_path / "good.npz", x=np.zeros((10, 3)), y=np.arange(10) % 2)
    return (tmp_path / "good.npz").read_bytes()


@pytest.mark.parametrize("cut", [0, 10, 100, -30])
def test_a_truncated_npz_is_one_line(tmp_path, cut):
    data = _good_npz_bytes(tmp_path)
    (tmp_path / "d.npz").write_bytes(data[:cut])
    with pytest.raises(DpledgerError) as error:
        load_dataset("npz", str(tmp_path / "d.npz"), 0.2, seed=0)
    assert _one_line(error).startswith(f"{tmp_path / 'd.npz'}: ")


def test_object_arrays_are_refused_without_unpickling(tmp_path):
    np.savez(tmp_path / "d.npz", x=np.array([[1, "a"], [2, "b"]], dtype=object), y=np.array([0, 1]))
    with pytest.raises(DpledgerError) as error:
        load_dataset("npz", str(tmp_path / "d.npz"), 0.2, seed=0)
    assert "array 'x' holds Python objects (dtype=object)" in _one_line(error)


def test_an_npz_path_that_is_a_folder_is_one_line(tmp_path):
    with pytest.raises(DpledgerError, match="is a folder; data.name = npz reads one .npz file"):
        load_dataset("npz", str(tmp_path), 0.2, seed=0)


def test_string_inputs_in_an_npz_are_refused(tmp_path):
    np.savez(tmp_path / "d.npz", x=np.array([["a", "b"], ["c", "d"]]), y=np.array([0, 1]))
    with pytest.raises(DpledgerError, match="expected real numbers"):
        load_dataset("npz", str(tmp_path / "d.npz"), 0.2, seed=0)


def test_one_based_labels_are_refused_not_read_as_one_more_class(tmp_path):
    np.savez(tmp_path / "d.npz", x=np.zeros((20, 3)), y=np.arange(20) % 10 + 1)  # labels 1..10
    with pytest.raises(DpledgerError) as error:
        load_dataset("npz", str(tmp_path / "d.npz"), 0.2, seed=0)
    assert "labels run 1..10 and class 0 never occurs" in _one_line(error)
    np.savez(tmp_path / "d.npz", x=np.zeros((20, 3)), y=np.arange(20) % 10)
    assert load_dataset("npz", str(tmp_path / "d.npz"), 0.2, seed=0).num_classes == 10


def test_cifar_labels_beyond_its_ten_classes_are_refused(tmp_path):
    images = np.zeros((2, 3 * 32 * 32), dtype=np.uint8)
    for name, labels in (("data_batch_1", [0, 10]), ("test_batch", [0, 1])):
        with open(tmp_path / name, "wb") as handle:
            pickle.dump({b"data": images, b"labels": labels}, handle)
    with pytest.raises(DpledgerError, match="labels must be class indices 0..9; found 10"):
        load_dataset("cifar10", str(tmp_path), 0.2, seed=0)


def _params(**data) -> dict:
    raw = yaml.safe_load(open("params.yaml"))
    raw["data"] = data
    return raw


def test_a_path_given_with_digits_is_refused_not_ignored():
    with pytest.raises(ParamsError) as error:
        parse_params(_params(name="digits", path="mine.npz", test_fraction=0.2))
    assert _one_line(error) == (
        "params: data.path = 'mine.npz' is invalid: data.name = digits is embedded and reads no "
        "file "
        "(set data.path: null)"
    )
    with pytest.raises(ParamsError, match="data.name = npz reads its arrays from a file"):
        parse_params(_params(name="npz", path=None, test_fraction=0.2))
