"""T3, the noise-calibration test, and its σ = 0 control: the distance between runs that differ
only in their noise must grow with the clip norm C, over a range of C that clips nothing.

Noisy runs share their data, initial model and hyper-parameters and differ only in the trainer's
``seed``; the same seeds are reused for every C (common random numbers), so a trainer whose noise
ignores C gives exactly equal distances at every C.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from dpledger.verify.heuristics import Heuristics
from dpledger.verify.noise_checks import noise_lr
from dpledger.verify.result import Check, Curve, Figure, TestResult
from dpledger.verify.runner import BatteryConfig, Runner
from dpledger.verify.stats import slope_test

CLIP_MARGIN = 1.5
"""T3: the smallest C exceeds the largest per-example gradient norm along the σ = 0 run by this
factor."""
CLIP_REFERENCE = 1e3
"""T3: the σ = 0 run whose gradient norms are measured has C = this × max(C*, the probe's norm)."""
CONTROL_TOLERANCE = 1e-3
"""T3 control: σ = 0 models at different C may differ by this fraction of their update (rounding
only)."""

T3 = Check(
    "t3_noise_calibration",
    "000 T3: mean pairwise distance of runs differing only in their noise grows with C (unclipped)",
    "t of the slope of pairwise distance on C",
)
T3_CONTROL = Check(
    "t3_control",
    "000 T3 control: with σ = 0 the models trained at every C of T3 must coincide",
    "max ‖θ_C − θ_C₀‖ / ‖θ_C₀ − θ_0‖ (C₀ the smallest C of T3)",
)


def t3_noise_multiplier(runner: Runner, config: BatteryConfig, heuristics: Heuristics) -> float:
    """σ for T3: the usual 1 under SGD; under Adam a small multiple of σ* so the noise does not
    saturate (App. E)."""
    if runner.optimizer == "adam" and heuristics.sigma_star is not None:
        return config.adam_sigma_factor * heuristics.sigma_star
    return config.sgd_t3_noise_multiplier


def run_t3(
    runner: Runner, config: BatteryConfig, heuristics: Heuristics, seed: int, significance: float
) -> tuple[TestResult, TestResult]:
    """T3 (000 §3.2): mean pairwise distance of noisy runs vs C ∈ [C₀, 10C₀], slope t-test; plus
    the σ = 0 control.

    C₀ is C* or, where larger, ``CLIP_MARGIN`` × the largest per-example gradient norm along the
    σ = 0 run (:meth:`Runner.largest_gradient_norm`), so no C of T3 clips (§3.2 step 2). Under
    Adam C* is where its normalised step stops changing, not where clipping stops, and the warm-up
    moves the model enough to raise the rows' gradient norms above C* (the digits MLP: from 5.3 to
    15 against C* = 5.5). σ is scaled by C*/C₀ so the noise at C₀ is the σ heuristic's; the
    learning rate is that of C*."""
    c_star = heuristics.c_star
    base_multiplier = t3_noise_multiplier(runner, config, heuristics)
    batch_size = config.t3_batch_size
    inputs, targets = runner.task.ordinary_rows(0, batch_size * config.t3_steps)
    lr = noise_lr(runner, config, c_star, base_multiplier, batch_size)
    steps_before = runner.steps_used
    reference = CLIP_REFERENCE * max(c_star, runner.task.probe_norm)
    unclipped = dict(clip_norm=reference, noise_multiplier=0.0, lr=lr, seed=seed)
    largest = runner.largest_gradient_norm(inputs, targets, batch_size=batch_size, **unclipped)
    clip_floor = max(c_star, CLIP_MARGIN * largest)
    noise_multiplier = base_multiplier * c_star / clip_floor
    clip_values = np.linspace(clip_floor, 10.0 * clip_floor, config.t3_clip_values)
    pair_c, pair_distance = _pairwise_distances(
        runner,
        (inputs, targets),
        clip_values,
        noise_multiplier,
        config.t3_seeds,
        batch_size,
        lr,
        seed,
    )
    t3_steps = runner.steps_used - steps_before
    test = slope_test(pair_c, pair_distance)
    scale = float(torch.linalg.vector_norm(runner.task.flat(runner.task.model)))
    no_noise = float(pair_distance.max()) <= 1e-9 * scale
    passed = not no_noise and not test.flat and test.slope > 0 and test.p_value < significance
    diagnosis = _t3_diagnosis(passed, no_noise, test.p_value)
    means = [float(pair_distance[pair_c == c].mean()) for c in clip_values]
    t3 = T3.slope(
        test,
        passed=passed,
        diagnosis=diagnosis,
        steps=t3_steps,
        details={
            "clip_norms": clip_values.tolist(),
            "mean_pairwise_distance": means,
            "noise_multiplier": noise_multiplier,
            "c_star": c_star,
            "largest_gradient_norm": largest,
            "slope": test.slope,
            "runs_per_clip_norm": config.t3_seeds,
            "steps_per_run": config.t3_steps,
        },
        figure=Figure(
            title="T3: pairwise parameter distance vs clip norm",
            xlabel="clip norm C",
            ylabel="‖θ_i − θ_j‖",
            kind="scatter",
            curves=(
                Curve(f"pairs (σ = {noise_multiplier:.3g})", tuple(pair_c), tuple(pair_distance)),
                Curve("mean", tuple(clip_values), tuple(means)),
            ),
        ),
    )
    return t3, _run_t3_control(runner, inputs, targets, clip_values, batch_size, lr, seed, largest)


def _pairwise_distances(
    runner: Runner,
    rows: tuple[torch.Tensor, torch.Tensor],
    clip_values: np.ndarray,
    noise_multiplier: float,
    seeds: int,
    batch_size: int,
    lr: float,
    seed: int,
) -> tuple[np.ndarray, np.ndarray]:
    """T3's samples: for each C, ``seeds`` noisy runs on ``rows`` and the distance between every
    pair of their final parameters, with the C of each pair."""
    pair_c, pair_distance = [], []
    for clip_norm in clip_values:
        finals = [
            runner.parameters_after(
                *rows,
                clip_norm=clip_norm,
                noise_multiplier=noise_multiplier,
                batch_size=batch_size,
                lr=lr,
                seed=seed + r,
            )
            for r in range(seeds)
        ]
        for a, b in itertools.combinations(finals, 2):
            pair_c.append(float(clip_norm))
            pair_distance.append(float(torch.linalg.vector_norm(a - b)))
    return np.array(pair_c), np.array(pair_distance)


def _t3_diagnosis(passed: bool, no_noise: bool, p_value: float) -> str:
    """T3's sentence: the noise scales with C, there is no noise, or it is uncalibrated."""
    if passed:
        return (
            f"the distance between noisy runs grows with C (slope p = {p_value:.2g}): "
            "the noise scales with the clip norm"
        )
    if no_noise:
        return (
            "runs with different seeds end at the same model: there is no noise, "
            "or it ignores the seed (a fixed noise seed is no noise to anyone who knows it)"
        )
    return (
        f"the distance between noisy runs does not grow with C (slope p = {p_value:.2g}): "
        "the noise is not multiplied by C (uncalibrated), so the accountant's ε, "
        "which assumes std σ·C, is wrong whenever C ≠ 1"
    )


def _run_t3_control(
    runner: Runner,
    inputs,
    targets,
    clip_values,
    batch_size: int,
    lr: float,
    seed: int,
    largest: float,
) -> TestResult:
    """000 §3.2 step 7: with σ = 0 the C range must not change training, else T3's slope could come
    from clipping.

    Every C of the range exceeds ``largest``, the largest per-example gradient norm along the run,
    so a trainer that clips at C gives the same model at each; one that does not clips beyond the
    gradients."""
    steps_before = runner.steps_used
    initial = runner.task.flat(runner.task.model)
    finals = [
        runner.parameters_after(
            inputs,
            targets,
            clip_norm=c,
            noise_multiplier=0.0,
            batch_size=batch_size,
            lr=lr,
            seed=seed,
        )
        for c in clip_values
    ]
    update = max(float(torch.linalg.vector_norm(finals[0] - initial)), 1e-30)
    deviations = np.array([float(torch.linalg.vector_norm(f - finals[0])) / update for f in finals])
    passed = bool(deviations.max() <= CONTROL_TOLERANCE)
    low, high = float(clip_values[0]), float(clip_values[-1])
    if passed:
        diagnosis = (
            f"with σ = 0 the models at every C in [{low:.3g}, {high:.3g}] coincide: "
            "this C range disables clipping, so T3's slope comes from the noise"
        )
    else:
        diagnosis = (
            f"with σ = 0 the model still changes with C in [{low:.3g}, {high:.3g}] "
            f"(relative deviation {deviations.max():.3g}) "
            f"although no per-example gradient norm along the run exceeds {largest:.3g}: "
            "clipping acts beyond the largest gradient norm, so the clip threshold is not C"
        )
    return T3_CONTROL.deterministic(
        statistic=float(deviations.max()),
        passed=passed,
        tolerance=CONTROL_TOLERANCE,
        details={
            "clip_norms": list(map(float, clip_values)),
            "relative_deviation": deviations.tolist(),
            "largest_gradient_norm": largest,
        },
        diagnosis=diagnosis,
        steps=runner.steps_used - steps_before,
        figure=Figure(
            title="T3 control (σ = 0): deviation from the model at C*",
            xlabel="clip norm C",
            ylabel="relative deviation",
            curves=(Curve("σ = 0", tuple(map(float, clip_values)), tuple(deviations)),),
        ),
    )
