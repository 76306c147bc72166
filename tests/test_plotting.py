"""plotting.png: one size and style for every figure, written atomically."""

from __future__ import annotations

import matplotlib
import pytest
from matplotlib.image import imread

from dpledger import plotting


def test_png_is_written_at_the_shared_size_with_the_shared_style(tmp_path):
    path = tmp_path / "curve.png"
    with plotting.png(path) as axes:
        axes.plot([1, 2, 3], [3, 1, 2], label="a")
        axes.legend()
        grid_on = axes.xaxis.get_gridlines()[0].get_visible()
        top_spine = axes.spines["top"].get_visible()
    height, width = imread(path).shape[:2]
    assert (width, height) == (
        round(plotting.SIZE[0] * plotting.DPI),
        round(plotting.SIZE[1] * plotting.DPI),
    )
    assert grid_on and not top_spine
    assert not matplotlib.rcParams["axes.grid"]  # the style does not leak out of the block


def test_a_block_that_raises_writes_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with plotting.png(tmp_path / "broken.png") as axes:
            axes.plot([0, 1], [0, 1])
            raise RuntimeError("drawing failed")
    assert list(tmp_path.iterdir()) == []
