"""Every PNG figure dpledger writes, in one style and one size, drawn without pyplot and saved
atomically.

Each stage writes a figure's data as a CSV (what ``dvc plots`` reads) and the figure as a PNG (what
the report embeds). Drawing goes through matplotlib's object API (``Figure``), not pyplot: no global
backend switch, no figure registry to close, nothing shared between calls but the style below, which
every figure is drawn under so that the calibrate, schedule, train, verify and audit plots read
alike in one report.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from dpledger import io

SIZE = (6.0, 4.0)
"""Inches; at :data:`DPI` the report shows every figure at its natural width."""
DPI = 110
STYLE = {
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "lines.markersize": 4,
}


@contextmanager
def png(path: str | Path) -> Iterator[Axes]:
    """Axes to draw one figure on; when the block ends the figure is laid out and written to
    ``path`` as a PNG (atomically: a block that raises writes nothing)."""
    with matplotlib.rc_context(STYLE):
        figure = Figure(figsize=SIZE)
        axes = figure.add_subplot()
        yield axes
        figure.tight_layout()
        with io.atomic_path(path) as tmp:
            figure.savefig(tmp, format="png", dpi=DPI)
