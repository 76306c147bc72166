"""Accounting speed and the privacy-utility tables of issue 3, on n = 2048 steps (16 epochs × 128
bins).

Run ``python -m benchmarks.bench_accounting`` (``--quick`` skips the RMSE and group tables).

1. σ calibration with 2²⁰ Monte Carlo samples, C = I and 64-banded (target ≤ 10 s each). Baseline,
   measured in the same run: the naive O(n·b) sampler (Z ∈ R^n, x = m_bin + σZ, losses by x·M),
   timed on 2¹² samples for one δ̂ evaluation and scaled linearly to 2²⁰ samples × the δ̂
   evaluations a bisection needs (30); the ratio is naive / fast.
2. Optimizing a 3-buffer BLT for the amplified RMSE, 300 gradient steps, 2¹⁴ fresh samples per step
   (target ≤ 120 s).
3. RMSE (σ‖AC⁻¹‖_F/√n) at ε ∈ {0.5, …, 16}, δ = 1e-5: identity, the best w-banded C (square root or
   optimized without amplification, ``best_bands``) and the optimized BLT (started from a fit to
   that width's square root; 2¹⁴ samples per step for ε <= 2, 2¹⁶ above, where 2¹⁴ samples make σ
   too noisy) under balls-in-bins (σ recalibrated on 2²⁰ samples), the best unamplified, and the
   best banded C under cyclic Poisson sampling (004 Fig. 3b's baseline: banded C optimized without
   amplification for each w).
4. Group-level ε for T = 2000, q = 0.01, δ = 1e-5, σ ∈ {0.5, 1, 2}, k ≤ 32: MoG vs conversion vs
   k·ε₁.
5. ``--only verified`` (issue 22): σ calibrated by the allocation accountant (b = 100, E = 20; 004's
   C = I); Monte Carlo σ search plus EVR verification with failure probability 1e-6 on ``--device``
   (auto | cpu | cuda, one code path) for 004's C = I and 64-banded and two small settings where
   importance sampling applies; plain verification timed in full in the same run, and the ratio
   plain / auto.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch
from matplotlib.axes import Axes

from dpledger import plotting
from dpledger.accounting import describe, group_table
from dpledger.accounting import montecarlo as mc
from dpledger.accounting.accountants.pld import PldAccountant
from dpledger.accounting.calibrate import calibrate_noise
from dpledger.accounting.mc_search import calibrate_sigma
from dpledger.accounting.optimize import (
    RmseSetting,
    amplified_rmse,
    best_bands,
    optimize_banded,
    optimize_blt_unamplified,
    optimize_matrix,
    unamplified_rmse,
)
from dpledger.accounting.pld import gaussian_noise_for
from dpledger.mechanisms import banded_params, coefficients
from dpledger.mechanisms.rmse import prefix_rmse
from tests.helpers.oracles import naive_losses

BINS, EPOCHS, DELTA = 128, 16, 1e-5
STEPS = BINS * EPOCHS
SAMPLES = 1 << 20
BISECTION_EVALUATIONS = 30
RESULTS = Path(__file__).resolve().parent / "results"


def naive_seconds_per_evaluation(values: np.ndarray, sigma: float, samples: int = 1 << 12) -> float:
    """Seconds of one δ̂ evaluation with the O(n·b) sampler, scaled to SAMPLES samples."""
    modes = mc.toeplitz_modes(torch.as_tensor(values, dtype=torch.float64), BINS, STEPS).numpy()
    started = time.perf_counter()
    naive_losses(modes, sigma, samples, seed=0)
    return (time.perf_counter() - started) * SAMPLES / samples


def bench_calibration() -> list[str]:
    lines = [
        "| C | σ (ε = 1, δ = 1e-5) | fast calibration (s) | naive estimate (s) | ratio naive/fast "
        "| samples kept |",
        "|---|---|---|---|---|---|",
    ]
    for label, mechanism, params in (
        ("identity", "identity", {}),
        ("64-banded", "banded", banded_params(64)),
    ):
        values = coefficients(mechanism, params, STEPS)
        pair = mc.fixed_bins_pair(values, BINS, STEPS)
        upper = gaussian_noise_for(pair.max_sensitivity(), 1.0, DELTA)
        started = time.perf_counter()
        search = calibrate_sigma(pair, 1.0, DELTA, SAMPLES, seed=0, upper=upper)
        fast = time.perf_counter() - started
        naive = (
            naive_seconds_per_evaluation(values, search.noise_multiplier) * BISECTION_EVALUATIONS
        )
        lines.append(
            f"| {label} | {search.noise_multiplier:.4f} | {fast:.2f} | {naive:.0f} | "
            f"{naive / fast:.0f}× | "
            f"{search.survivors} |"
        )
        print(lines[-1], flush=True)
    return lines


def bench_optimization() -> tuple[list[str], float]:
    started = time.perf_counter()
    result = optimize_matrix("blt", 1.0, DELTA, BINS, EPOCHS, steps=300, samples=1 << 14, buffers=3)
    seconds = time.perf_counter() - started
    line = (
        f"BLT (3 buffers), 300 steps, 2^14 samples/step, ε = 1: {seconds:.1f} s; "
        f"RMSE {result.history[0]:.4f} → {result.rmse:.4f}; params {result.mechanism_params}"
    )
    print(line, flush=True)
    return [line], seconds


def banded_poisson_rmse(epsilon: float) -> tuple[float, int]:
    """RMSE and width of the best w-banded C under cyclic Poisson sampling (Choquette-Choo et al.
    2024a), the baseline of 004 Fig. 3b: C optimized for each w without amplification
    (``optimize_banded``), the data split into w classes, class t mod w sampled at rate w/b in step
    t, so an example joins n/w steps whose columns of C do not overlap, and the mechanism is DP-SGD
    with n/w steps at rate w/b and sensitivity ‖c_{0:w}‖ (PLD, exact calibration)."""
    results = []
    for width in (2**i for i in range(int(math.log2(BINS)) + 1)):  # rate w/b <= 1
        values = coefficients("banded", optimize_banded(width, BINS, EPOCHS), STEPS)
        description = describe(sampler="poisson", sample_rate=width / BINS, steps=STEPS // width)
        sigma = calibrate_noise(PldAccountant(), description, epsilon, DELTA).noise_multiplier
        results.append((prefix_rmse(values, sigma * float(np.linalg.norm(values[:width]))), width))
    return min(results)


def best_unamplified_rmse(epsilon: float) -> tuple[float, int]:
    """RMSE and width of the best w-banded C without amplification (every example in a fixed slot of
    every epoch, data in arbitrary order): the Gaussian mechanism with sensitivity max_i ‖m_i‖,
    calibrated exactly; w over powers of two, each C both the banded square root and optimized for
    this objective."""
    return min(
        (unamplified_rmse("banded", params, epsilon, DELTA, BINS, EPOCHS), width)
        for width in (2**i for i in range(int(math.log2(STEPS)) + 1))
        for params in (banded_params(width), optimize_banded(width, BINS, EPOCHS))
    )


def bench_rmse(epsilons: list[float]) -> list[str]:
    lines = [
        "| ε | unamplified (best banded) | optimized banded + cyclic Poisson (w) | identity | "
        "best banded (w) | optimized BLT | BLT ≤ banded + Poisson | BLT ≤ banded | "
        "b-in-b < unamplified |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for epsilon in epsilons:
        final = RmseSetting(epsilon, DELTA, BINS, EPOCHS, SAMPLES, seed=11)
        identity = amplified_rmse("identity", {}, final)
        candidates = [2**i for i in range(12)]
        banded_search = best_bands(
            RmseSetting(epsilon, DELTA, BINS, EPOCHS, 1 << 16, seed=3), candidates=candidates
        )
        width = len(banded_search.mechanism_params["coefficients"])
        family = "sqrt" if banded_search.mechanism_params == banded_params(width) else "opt"
        banded = amplified_rmse("banded", banded_search.mechanism_params, final)
        unamplified, _ = best_unamplified_rmse(epsilon)
        poisson, poisson_width = banded_poisson_rmse(epsilon)
        samples = 1 << 14 if epsilon <= 2 else 1 << 16
        blt = optimize_matrix(
            "blt",
            epsilon,
            DELTA,
            BINS,
            EPOCHS,
            steps=300,
            samples=samples,
            buffers=3,
            init_bands=width,
        )
        blt_final = amplified_rmse("blt", blt.mechanism_params, final)
        best_amplified = min(identity.rmse, banded.rmse, blt_final.rmse)
        lines.append(
            f"| {epsilon:g} | {unamplified:.4f} | {poisson:.4f} ({poisson_width}) | "
            f"{identity.rmse:.4f} | "
            f"{banded.rmse:.4f} ({width}, {family}) | {blt_final.rmse:.4f} | "
            f"{'yes' if blt_final.rmse <= poisson else 'no'} | "
            f"{'yes' if blt_final.rmse <= banded.rmse else 'no'} | "
            f"{'yes' if best_amplified < unamplified else 'no'} |"
        )
        print(lines[-1], flush=True)
    return lines


def bench_baselines(epsilons: list[float]) -> list[str]:
    """The deterministic columns, and the 3-buffer BLT optimized for the same unamplified objective
    as the banded C (its geometric tail's cost: the BLT cannot end at lag b as a b-banded C
    does)."""
    lines = [
        "| ε | unamplified (w) | optimized banded + cyclic Poisson (w) "
        "| unamplified 3-buffer BLT |",
        "|---|---|---|---|",
    ]
    blt = optimize_blt_unamplified(3, BINS, EPOCHS, init_bands=BINS)
    for epsilon in epsilons:
        unamplified, unamplified_width = best_unamplified_rmse(epsilon)
        poisson, poisson_width = banded_poisson_rmse(epsilon)
        blt_rmse = unamplified_rmse("blt", blt, epsilon, DELTA, BINS, EPOCHS)
        lines.append(
            f"| {epsilon:g} | {unamplified:.4f} ({unamplified_width}) | {poisson:.4f} "
            f"({poisson_width}) | "
            f"{blt_rmse:.4f} |"
        )
        print(lines[-1], flush=True)
    return lines


def bench_group(plot_path: Path = RESULTS / "accounting_group.png") -> list[str]:
    lines = ["| σ | k | ε MoG | ε conversion | k·ε₁ | seconds |", "|---|---|---|---|---|---|"]
    with plotting.png(plot_path) as axes:
        _group_rows(axes, lines)
    return lines


def _group_rows(axes: Axes, lines: list[str]) -> None:
    """ε of a group of k by each method at three σ: rows appended to ``lines``, curves on
    ``axes``."""
    for sigma in (0.5, 1.0, 2.0):
        rows = []
        description = describe(
            sampler="poisson", noise_multiplier=sigma, sample_rate=0.01, steps=2000
        )
        for k in (1, 2, 4, 8, 16, 32):
            started = time.perf_counter()
            interval = 1e-3 if k <= 4 else 1e-2 if k <= 16 else 5e-2
            row = group_table(description, DELTA, [k], discretization=interval)[0]
            rows.append(row)
            lines.append(
                f"| {sigma} | {k} | {row.mog:.4g} | {row.conversion:.4g} | {row.linear:.4g} | "
                f"{time.perf_counter() - started:.1f} |"
            )
            assert math.isfinite(row.mog) and row.mog <= row.conversion
            print(lines[-1], flush=True)
        sizes = [r.group_size for r in rows]
        line = axes.plot(
            sizes, [r.mog for r in rows], "o-", label=f"σ = {sigma}: mixture of Gaussians"
        )
        color = line[0].get_color()
        finite = [(r.group_size, r.conversion) for r in rows if math.isfinite(r.conversion)]
        if finite:
            axes.plot(
                *zip(*finite), "s--", color=color, label=f"σ = {sigma}: conversion (∞ elsewhere)"
            )
        axes.plot(sizes, [r.linear for r in rows], ":", color=color)
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("group size k")
    axes.set_ylabel("ε (δ = 1e-5, T = 2000, q = 0.01); dotted: k·ε₁")
    axes.legend(fontsize=7)


def bench_verified(device: str) -> list[str]:
    """Issue 22: allocation calibration; Monte Carlo σ search + EVR at β = 1e-6 (or ε at a fixed σ),
    with ``verification`` auto and plain timed in full in the same run (where auto picks plain, one
    run)."""
    from dpledger.accounting import get_accountant, importance
    from dpledger.accounting.allocation import _bounds, _on_grid

    lines = [
        "| case | accountant | σ | ε (claim) | lower ε | seconds |",
        "|---|---|---|---|---|---|",
    ]

    def allocation(label: str, description) -> float:
        _bounds.cache_clear()
        _on_grid.cache_clear()
        started = time.perf_counter()
        calibration = calibrate_noise(get_accountant("allocation"), description, 1.0, DELTA)
        seconds = time.perf_counter() - started
        lines.append(
            f"| {label} | allocation | {calibration.noise_multiplier:.4f} | "
            f"{calibration.result.epsilon:.4f} | "
            f"{calibration.result.details['epsilon_lower']:.4f} | {seconds:.1f} |"
        )
        print(lines[-1], flush=True)
        return calibration.noise_multiplier

    allocation(
        "b = 100, E = 20, redrawn",
        describe(sampler="balls-in-bins-redrawn", batches_per_epoch=100, epochs=20),
    )
    fixed = describe(sampler="balls-in-bins", batches_per_epoch=BINS, epochs=EPOCHS)
    allocation("004, C = I", fixed)
    banded = describe(
        sampler="balls-in-bins",
        batches_per_epoch=BINS,
        epochs=EPOCHS,
        mechanism="banded",
        mechanism_params=banded_params(64),
    )
    small = describe(sampler="balls-in-bins", noise_multiplier=1.0, batches_per_epoch=10, epochs=1)
    small_banded = describe(
        sampler="balls-in-bins",
        batches_per_epoch=8,
        epochs=4,
        mechanism="banded",
        mechanism_params=banded_params(4),
    )
    lines += [
        "",
        (
            "| case | σ | ε | IS bound M (remove / add) | verification (auto) | "
            "fresh draws per attempt | attempts | seconds (auto) | plain draws | seconds (plain) | "
            "ratio plain / auto | device |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, description, fixed_sigma in (
        ("b = 10, E = 1, C = I, σ = 1", small, True),
        ("b = 8, E = 4, 4-banded", small_banded, False),
        ("004, C = I", fixed, False),
        ("004, 64-banded", banded, False),
    ):
        runs = {}
        for verification in ("auto", "plain"):
            accountant = get_accountant(
                "montecarlo", samples=1 << 18, device=device, verification=verification
            )
            pair = accountant.pair(description)
            started = time.perf_counter()
            if fixed_sigma:
                result = accountant.epsilon(description, DELTA)
                sigma = description.noise_multiplier
            else:
                sigma, result = accountant.calibrate(description, 1.0, DELTA)
            runs[verification] = (
                time.perf_counter() - started,
                result.details,
                sigma,
                result.epsilon,
            )
            if runs["auto"][1]["verification"] == "plain":
                break  # auto already is plain: the same run
        seconds, details, sigma, epsilon = runs["auto"]
        bounds = importance.proposals(
            torch.as_tensor(pair.grams[0], dtype=torch.float64), sigma, epsilon
        )
        plain_seconds = runs.get("plain", runs["auto"])[0]
        lines.append(
            f"| {label} | {sigma:.4f} | {epsilon:.4f} | "
            f"{bounds[0].bound:.3g} / {bounds[1].bound:.3g} | {details['verification']} | "
            f"{details['verify_samples']} | {details['evr_attempts']} | {seconds:.1f} | "
            f"{details['verify_samples_plain']} | {plain_seconds:.1f} | "
            f"{plain_seconds / seconds:.1f}× | {device} |"
        )
        print(lines[-1], flush=True)
    lines.append(
        "failure probability 1e-6 in all (β/3 per EVR attempt, KL bound; "
        "per direction for importance sampling)"
    )
    print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="speed benchmarks only")
    parser.add_argument(
        "--only",
        choices=["speed", "rmse", "baselines", "group", "verified"],
        help="run one part (baselines: only the RMSE table's deterministic columns, "
        "unamplified and banded + cyclic Poisson)",
    )
    parser.add_argument(
        "--epsilons",
        type=float,
        nargs="+",
        default=[0.5, 1.0, 2.0, 4.0, 8.0, 16.0],
        help="ε values of the RMSE table",
    )
    parser.add_argument(
        "--device", default="auto", help="Monte Carlo device for --only verified: auto | cpu | cuda"
    )
    args = parser.parse_args()
    if args.only == "verified":
        bench_verified(args.device)
        return
    print(
        f"torch threads: {torch.get_num_threads()}; Monte Carlo code runs single-threaded",
        flush=True,
    )
    if args.only in (None, "speed"):
        bench_calibration()
        bench_optimization()
    if not args.quick and args.only in (None, "rmse"):
        bench_rmse(args.epsilons)
    if args.only == "baselines":
        bench_baselines(args.epsilons)
    if not args.quick and args.only in (None, "group"):
        bench_group()


if __name__ == "__main__":
    main()
