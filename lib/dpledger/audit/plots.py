"""Figures of an audit, each as a CSV (for ``dvc plots``) and a PNG (for the report).

- trade-off: the empirical (FPR, FNR) curve with its Clopper–Pearson upper bounds, against the
  boundary of the (ε, δ) region of the claim and of ε_emp: FNR ≥ max(0, 1 − δ − e^ε·FPR, e^−ε(1 − δ
  − FPR)).
- ε_emp vs N: measured on prefixes of the games, and projected beyond N (power planning).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpledger import io, plotting


def region_boundary(fpr: np.ndarray, epsilon: float, delta: float) -> np.ndarray:
    """Smallest FNR an (ε, δ)-DP mechanism allows at each FPR (Kairouz et al.; 002 §2)."""
    return np.maximum.reduce(
        [
            np.zeros_like(fpr),
            1.0 - delta - np.exp(epsilon) * fpr,
            np.exp(-epsilon) * (1.0 - delta - fpr),
        ]
    )


def write_tradeoff(
    folder: Path,
    points: np.ndarray,
    *,
    epsilon_claimed: float,
    epsilon_emp: float,
    delta: float,
    title: str,
) -> None:
    """``tradeoff.csv`` (fpr, fnr, fpr_upper, fnr_upper, fnr_claimed_bound) and ``tradeoff.png``."""
    claimed = region_boundary(points[:, 2], epsilon_claimed, delta)
    io.write_csv(
        folder / "tradeoff.csv",
        ["fpr", "fnr", "fpr_upper", "fnr_upper", "fnr_claimed_bound"],
        np.column_stack([points, claimed]),
    )
    grid = np.geomspace(max(points[:, 0].min(), 1e-9), 1.0, 300)
    with plotting.png(folder / "tradeoff.png") as axes:
        axes.plot(points[:, 0], points[:, 1], label="empirical (raw)", color="tab:blue", alpha=0.5)
        axes.plot(points[:, 2], points[:, 3], label="empirical (95% CP upper)", color="tab:blue")
        axes.plot(
            grid,
            region_boundary(grid, epsilon_claimed, delta),
            "--",
            color="tab:green",
            label=f"claimed ε = {epsilon_claimed:.3g}",
        )
        axes.plot(
            grid,
            region_boundary(grid, epsilon_emp, delta),
            ":",
            color="tab:red",
            label=f"ε_emp = {epsilon_emp:.3g}",
        )
        axes.set_xscale("log")
        axes.set_xlabel("false positive rate")
        axes.set_ylabel("false negative rate")
        axes.set_ylim(0.0, 1.02)
        axes.set_title(title)
        axes.legend()


def write_epsilon_vs_observations(
    folder: Path,
    measured: list[tuple[int, float]],
    projected: list[tuple[int, float]],
    *,
    epsilon_claimed: float,
) -> None:
    """``epsilon_vs_observations.csv`` (observations, epsilon_emp, kind) and its PNG."""
    rows = [[n, eps, "measured"] for n, eps in measured] + [
        [n, eps, "projected"] for n, eps in projected
    ]
    io.write_csv(
        folder / "epsilon_vs_observations.csv", ["observations", "epsilon_emp", "kind"], rows
    )
    with plotting.png(folder / "epsilon_vs_observations.png") as axes:
        axes.plot(*zip(*measured), "o-", label="measured (prefixes of the games)")
        axes.plot(
            *zip(*projected), "s--", alpha=0.7, label="projected (rates observed at N; a floor)"
        )
        axes.axhline(
            epsilon_claimed,
            color="tab:green",
            linestyle=":",
            label=f"claimed ε = {epsilon_claimed:.3g}",
        )
        axes.set_xscale("log")
        axes.set_xlabel("observations N")
        axes.set_ylabel("ε_emp (lower bound)")
        axes.legend()
