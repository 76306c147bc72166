"""One CSV (for ``dvc plots``) and one PNG (for the report) per test, plus the σ heuristic's
curve."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy import stats

from dpledger import plotting
from dpledger.io import write_csv
from dpledger.verify.result import BatteryResult, Curve, Figure


def heuristic_figure(result: BatteryResult) -> Figure:
    """000 App. B's σ sweep: loss change after one step at C* for each σ."""
    heuristics = result.heuristics
    sigmas = tuple(heuristics["sigma_grid"])
    return Figure(
        title=f"σ heuristic at C* = {heuristics['c_star']:.3g} (σ* = {heuristics['sigma_star']})",
        xlabel="noise multiplier σ",
        ylabel="ΔL on the batch",
        log_x=True,
        curves=(
            Curve("σ > 0", sigmas, tuple(heuristics["sigma_loss_changes"])),
            Curve("σ = 0", (sigmas[0], sigmas[-1]), (heuristics["sigma_zero_loss_change"],) * 2),
        ),
    )


def write_plots(result: BatteryResult, folder: Path) -> list[Path]:
    """Write ``<test>.csv`` and ``<test>.png`` for every test with a figure; returns the PNG
    paths."""
    figures = {test.name: test.figure for test in result.tests if test.figure is not None}
    figures["heuristic_sigma"] = heuristic_figure(result)
    written = []
    for name, figure in figures.items():
        rows = [[curve.label, x, y] for curve in figure.curves for x, y in zip(curve.x, curve.y)]
        write_csv(folder / f"{name}.csv", ["series", "x", "y"], rows)
        written.append(_write_png(figure, folder / f"{name}.png", _verdict_label(result, name)))
    return written


def _verdict_label(result: BatteryResult, name: str) -> str:
    for test in result.tests:
        if test.name == name:
            return f"{'passed' if test.passed else 'FAILED'} (p = {test.p_value:.3g})"
    return ""


def _write_png(figure: Figure, path: Path, verdict: str) -> Path:
    with plotting.png(path) as axes:
        if figure.kind == "cdf":
            grid = np.linspace(-4, 4, 200)
            axes.plot(grid, stats.norm.cdf(grid), "k--", label="N(0, 1)")
        for curve in figure.curves:
            style = "o" if figure.kind == "scatter" and curve is figure.curves[0] else "-"
            axes.plot(curve.x, curve.y, style, label=curve.label)
        if figure.log_x:
            axes.set_xscale("log")
        axes.set_xlabel(figure.xlabel)
        axes.set_ylabel(figure.ylabel)
        axes.set_title(f"{figure.title}\n{verdict}" if verdict else figure.title)
        axes.legend()
    return path
