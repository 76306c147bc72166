"""Figures of an audit, each as a CSV (for ``dvc plots``) and a PNG (for the report).

- trade-off: the empirical (FPR, FNR) curve with its Clopper–Pearson upper bounds, against the
  boundary of the (ε, δ) region of the claim and of ε_emp: FNR ≥ max(0, 1 − δ − e^ε·FPR, e^−ε(1 − δ − FPR)).
- ε_emp vs N: measured on prefixes of the games, and projected beyond N (power planning).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from dpledger import io  # noqa: E402


def region_boundary(fpr: np.ndarray, epsilon: float, delta: float) -> np.ndarray:
    """Smallest FNR an (ε, δ)-DP mechanism allows at each FPR (Kairouz et al.; 002 §2)."""
    return np.maximum.reduce(
        [np.zeros_like(fpr), 1.0 - delta - np.exp(epsilon) * fpr, np.exp(-epsilon) * (1.0 - delta - fpr)]
    )


def write_tradeoff(
    folder: Path, points: np.ndarray, *, epsilon_claimed: float, epsilon_emp: float, delta: float, title: str
) -> None:
    """``tradeoff.csv`` (fpr, fnr, fpr_upper, fnr_upper, fnr_claimed_bound) and ``tradeoff.png``."""
    claimed = region_boundary(points[:, 2], epsilon_claimed, delta)
    io.write_csv(
        folder / "tradeoff.csv",
        ["fpr", "fnr", "fpr_upper", "fnr_upper", "fnr_claimed_bound"],
        np.column_stack([points, claimed]),
    )
    grid = np.geomspace(max(points[:, 0].min(), 1e-9), 1.0, 300)
    figure, axis = plt.subplots(figsize=(5.5, 4.2))
    axis.plot(points[:, 0], points[:, 1], label="empirical (raw)", color="tab:blue", alpha=0.5)
    axis.plot(points[:, 2], points[:, 3], label="empirical (95% CP upper)", color="tab:blue")
    axis.plot(
        grid,
        region_boundary(grid, epsilon_claimed, delta),
        "--",
        color="tab:green",
        label=f"claimed ε = {epsilon_claimed:.3g}",
    )
    axis.plot(grid, region_boundary(grid, epsilon_emp, delta), ":", color="tab:red", label=f"ε_emp = {epsilon_emp:.3g}")
    axis.set_xscale("log")
    axis.set_xlabel("false positive rate")
    axis.set_ylabel("false negative rate")
    axis.set_ylim(0.0, 1.02)
    axis.set_title(title, fontsize=9)
    axis.legend(fontsize=8)
    _save(figure, folder / "tradeoff.png")


def write_epsilon_vs_observations(
    folder: Path, measured: list[tuple[int, float]], projected: list[tuple[int, float]], *, epsilon_claimed: float
) -> None:
    """``epsilon_vs_observations.csv`` (observations, epsilon_emp, kind) and its PNG."""
    rows = [[n, eps, "measured"] for n, eps in measured] + [[n, eps, "projected"] for n, eps in projected]
    io.write_csv(folder / "epsilon_vs_observations.csv", ["observations", "epsilon_emp", "kind"], rows)
    figure, axis = plt.subplots(figsize=(5.5, 4.2))
    axis.plot(*zip(*measured), "o-", label="measured (prefixes of the games)")
    axis.plot(*zip(*projected), "s--", alpha=0.7, label="projected (rates observed at N; a floor)")
    axis.axhline(epsilon_claimed, color="tab:green", linestyle=":", label=f"claimed ε = {epsilon_claimed:.3g}")
    axis.set_xscale("log")
    axis.set_xlabel("observations N")
    axis.set_ylabel("ε_emp (lower bound)")
    axis.legend(fontsize=8)
    _save(figure, folder / "epsilon_vs_observations.png")


def _save(figure: plt.Figure, path: Path) -> None:
    with io.atomic_path(path) as tmp:
        figure.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(figure)
