"""Atomic writes: a failure while writing leaves the previous output (or nothing) in place."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dpledger import io


def test_failed_write_leaves_old_file_untouched(tmp_path):
    target = tmp_path / "out.json"
    io.write_json(target, {"a": 1})
    with pytest.raises(RuntimeError):
        with io.atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("interrupted")
    assert io.read_json(target) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_json_converts_numpy_values(tmp_path):
    io.write_json(tmp_path / "m.json", {"x": np.float64(0.5), "v": np.arange(3), "n": np.int64(2)})
    assert io.read_json(tmp_path / "m.json") == {"x": 0.5, "v": [0, 1, 2], "n": 2}


def test_npz_and_csv_round_trip(tmp_path):
    io.write_npz(tmp_path / "a.npz", values=np.arange(5))
    with np.load(tmp_path / "a.npz") as arrays:
        np.testing.assert_array_equal(arrays["values"], np.arange(5))
    io.write_csv(tmp_path / "c.csv", ["step", "loss"], [[1, 0.25], [2, 0.125]])
    assert (tmp_path / "c.csv").read_text() == "step,loss\n1,0.25\n2,0.125\n"


def test_failed_directory_write_keeps_previous_directory(tmp_path):
    folder = tmp_path / "artifacts"
    with io.atomic_dir(folder) as tmp:
        (tmp / "a.txt").write_text("first")
    with pytest.raises(RuntimeError):
        with io.atomic_dir(folder) as tmp:
            (tmp / "a.txt").write_text("second")
            raise RuntimeError("interrupted")
    assert (folder / "a.txt").read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["artifacts"]


def test_outputs_get_ordinary_permissions(tmp_path):
    io.write_text(tmp_path / "r.md", "x")
    with io.atomic_dir(tmp_path / "figures") as tmp:
        (tmp / "a.png").write_bytes(b"")
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "r.md").stat().st_mode & 0o777 == 0o666 & ~mask
    assert (tmp_path / "figures").stat().st_mode & 0o777 == 0o777 & ~mask
