"""Clipping tests (σ = 0, deterministic): the paper's T1 and T2, and the per-example sensitivity
bound."""

from __future__ import annotations

import copy

import numpy as np
import torch

from dpledger.verify.heuristics import plateau_start
from dpledger.verify.result import Check, Curve, Figure, TestResult, ratio_figure, skipped_result
from dpledger.verify.runner import BatteryConfig, Runner
from dpledger.verify.stats import slope_test
from dpledger.verify.task import SyntheticTask

LINEARITY_TOLERANCE = 0.1
"""T1/T2: the probe's loss after the largest step may depart from its first-order change by this
fraction."""
LINEARITY_SHRINKS = 3
"""T1/T2: the probe's step is shrunk tenfold at most this many times (to 0.01 % of its loss)."""
SENSITIVITY_TOLERANCE = 1e-3
"""Relative slack for the sensitivity bound: float32 rounding, far below any clipping bug's
excess."""

T1 = Check(
    "t1_no_clipping",
    "000 T1: ΔL after one step must depend on C while C < ‖g‖ (σ = 0, B = 1)",
    "t of the slope of ΔL on C below the plateau",
)
T2 = Check(
    "t2_minibatch_clipping",
    "000 T2: with B − 1 zero-gradient rows and one large-gradient row, ΔL must shrink like 1/B",
    "t of the slope of ΔL on 1/B",
)
SENSITIVITY = Check(
    "sensitivity",
    "beyond 000: σ = 0, one large-gradient example may move an SGD model by at most η·C/B",
    "max ‖θ(D) − θ(D')‖ / (η·C/B) over contexts",
)


def _probe_lr(runner: Runner, clip_norm_times_norm: float, config: BatteryConfig) -> float:
    """SGD step so that a full step moves the probe's loss by at most 10 % and to first order: ΔL
    linear in C/B is what T1 and T2 test. The probe's largest update, of length lr·C along its
    gradient (B = 1), is shrunk tenfold while the probe's loss after it departs from the first-order
    change by more than ``LINEARITY_TOLERANCE`` (measured on the model by the harness: a fresh LoRA
    adapter, B = 0, is far from linear at a 10 % step)."""
    if runner.optimizer == "adam":
        return config.adam_lr
    task = runner.task
    lr = 0.1 * task.probe_loss / clip_norm_times_norm
    for _ in range(LINEARITY_SHRINKS):
        length = lr * clip_norm_times_norm / task.probe_norm
        if probe_first_order_error(task, length) <= LINEARITY_TOLERANCE:
            break
        lr /= 10.0
    return lr


def probe_first_order_error(task: SyntheticTask, length: float) -> float:
    """|L(θ − length·ĝ) − L(θ) + length·‖g‖| / (length·‖g‖) on the probe (ĝ its unit gradient over
    the trainable parameters): how far a step of that length is from the first-order loss change."""
    model = copy.deepcopy(task.model)
    named = dict(model.named_parameters())
    trained = [named[name] for name in task.trainable]
    loss = task.loss_fn(model(task.probe_input), task.probe_target).sum()
    gradients = torch.autograd.grad(loss, trained, allow_unused=True)
    with torch.no_grad():
        for parameter, gradient in zip(trained, gradients):
            if gradient is not None:
                parameter -= (length / task.probe_norm) * gradient
    change = float(task.losses(model, task.probe_input, task.probe_target).sum()) - task.probe_loss
    first_order = length * task.probe_norm
    return abs(change + first_order) / first_order


def run_t1(
    runner: Runner, config: BatteryConfig, seed: int, significance: float
) -> tuple[TestResult, float]:
    """T1 (000 §3.1): one step on the probe alone (B = 1, σ = 0) for C on a log grid; returns
    (result, C*)."""
    task = runner.task
    low, high = np.log10(config.t1_grid_span)
    grid = task.probe_norm * np.logspace(low, high, config.t1_grid_size)
    lr = _probe_lr(runner, task.probe_norm**2, config)
    steps_before = runner.steps_used
    changes = np.array(
        [
            runner.loss_change(
                task.probe_input,
                task.probe_target,
                task.probe_input,
                task.probe_target,
                clip_norm=c,
                noise_multiplier=0.0,
                batch_size=1,
                lr=lr,
                seed=seed,
            )
            for c in grid
        ]
    )
    plateau = plateau_start(changes)
    clipped = slice(0, plateau)
    test = slope_test(grid[clipped], changes[clipped]) if plateau >= 3 else None
    varies = test is not None and not test.flat
    passed = varies and (runner.optimizer == "adam" or test.p_value < significance)
    c_star = float(grid[plateau])
    if passed:
        diagnosis = (
            f"the loss change depends on C below C* = {c_star:.3g} "
            f"(probe gradient norm {task.probe_norm:.3g}) and is constant above: "
            "gradients are clipped"
        )
    elif varies:
        diagnosis = (
            "the loss change varies with C but not as clipping predicts "
            "(ΔL not monotone in C below the plateau)"
        )
    else:
        diagnosis = (
            "the loss change is the same for every C (σ = 0, B = 1): gradients are not clipped, "
            "so one example's influence is unbounded and no ε holds"
        )
    figure = Figure(
        title="T1: loss change vs clip norm (σ = 0, B = 1)",
        xlabel="clip norm C",
        ylabel="ΔL on the probe",
        curves=(
            Curve("trainer under test", tuple(grid), tuple(changes)),
            Curve(
                "C* (plateau start)", (c_star, c_star), (float(changes.min()), float(changes.max()))
            ),
        ),
        log_x=True,
    )
    result = T1.slope(
        test,
        passed=passed,
        diagnosis=diagnosis,
        steps=runner.steps_used - steps_before,
        details={
            "clip_norms": grid.tolist(),
            "loss_changes": changes.tolist(),
            "c_star": c_star,
            "lr": lr,
            "decision": "pass iff ΔL is not flat below the plateau (SGD: "
            "and the slope's p < the significance)",
        },
        figure=figure,
    )
    return result, c_star


def run_t2(runner: Runner, config: BatteryConfig, seed: int, significance: float) -> TestResult:
    """T2 (000 §3.1, App. A): B − 1 zero-gradient rows plus the probe, σ = 0, C ≪ ‖g‖/max B; ΔL vs
    B."""
    task = runner.task
    batch_sizes = np.array(config.t2_batch_sizes)
    clip_norm = task.probe_norm / (4.0 * batch_sizes.max())
    lr = _probe_lr(runner, clip_norm * task.probe_norm, config)
    steps_before = runner.steps_used
    changes = []
    for batch_size in batch_sizes:
        zero_inputs, zero_targets = task.zero_rows(int(batch_size) - 1)
        inputs = torch.cat([zero_inputs, task.probe_input])
        targets = torch.cat([zero_targets, task.probe_target])
        changes.append(
            runner.loss_change(
                inputs,
                targets,
                task.probe_input,
                task.probe_target,
                clip_norm=clip_norm,
                noise_multiplier=0.0,
                batch_size=int(batch_size),
                lr=lr,
                seed=seed,
            )
        )
    changes = np.array(changes)
    test = slope_test(1.0 / batch_sizes, changes)
    passed = not test.flat and (runner.optimizer == "adam" or test.p_value < significance)
    if passed:
        diagnosis = (
            "the loss change shrinks with B as per-example clipping predicts (update ∝ C/B, "
            "000 Eq. 6)"
        )
    elif test.flat:
        diagnosis = (
            "the loss change does not depend on B: clipping happens after averaging "
            "(mini-batch clipping), so the guarantee is weaker by up to a factor of B"
        )
    else:
        diagnosis = (
            f"the loss change varies with B but not like 1/B (slope p = {test.p_value:.3g}): "
            "clipping or averaging is wrong"
        )
    return T2.slope(
        test,
        passed=passed,
        diagnosis=diagnosis,
        steps=runner.steps_used - steps_before,
        details={
            "batch_sizes": batch_sizes.tolist(),
            "loss_changes": changes.tolist(),
            "clip_norm": clip_norm,
            "lr": lr,
            "regressor": "1/B (000 Eq. 6 predicts ΔL linear in 1/B)",
        },
        figure=Figure(
            title="T2: loss change vs batch size (σ = 0)",
            xlabel="batch size B",
            ylabel="ΔL on the probe",
            curves=(
                Curve("trainer under test", tuple(float(b) for b in batch_sizes), tuple(changes)),
            ),
        ),
    )


def _sensitivity_contexts(
    runner: Runner, batch_size: int
) -> list[tuple[str, torch.Tensor, torch.Tensor, int, torch.Tensor]]:
    """Batches with the probe at some row: (label, inputs, targets, probe row, neighbour's inputs);
    the neighbour zeroes that row's weight. In the last context the neighbour's row also holds
    another input: a zero-weight row contributes nothing whatever its input, unless the model mixes
    the batch (e.g. subtracts the batch mean before its first layer), where the other rows'
    gradients change with it and the ratio exceeds 1."""
    task = runner.task
    ordinary_inputs, ordinary_targets = task.ordinary_rows(0, batch_size)
    zero_inputs, zero_targets = task.zero_rows(batch_size)
    other_input = task.ordinary_rows(batch_size, 1)[0][0]
    contexts = []
    for label, inputs, targets, row, replace_input in (
        (f"B={batch_size}, ordinary rows", ordinary_inputs, ordinary_targets, 0, False),
        (f"B={batch_size}, zero-gradient rows", zero_inputs, zero_targets, batch_size // 2, False),
        ("B=1", zero_inputs[:1], zero_targets[:1], 0, False),
        (
            f"B={batch_size}, ordinary rows, neighbour's input replaced",
            ordinary_inputs,
            ordinary_targets,
            0,
            True,
        ),
    ):
        inputs, targets = inputs.clone(), targets.clone()
        inputs[row], targets[row] = task.probe_input[0], task.probe_target[0]
        neighbour_inputs = inputs.clone()
        if replace_input:
            neighbour_inputs[row] = other_input
        contexts.append((label, inputs, targets, row, neighbour_inputs))
    return contexts


def run_sensitivity(runner: Runner, config: BatteryConfig, seed: int) -> TestResult:
    """Beyond the paper: with σ = 0 one example may move an SGD model by at most η·C/B (zero-out
    neighbours).

    The probe's gradient is far above C, so a correct trainer moves the model by exactly η·C/B; any
    clipping bug (none, after averaging, per tensor, wrong threshold, missing 1/B) shows as a ratio
    above 1.
    """
    task = runner.task
    if runner.optimizer == "adam":
        return skipped_result(
            SENSITIVITY.name, "Adam normalises its update, so no η·C/B bound exists (000 App. E)"
        )
    clip_norm = float(torch.median(task.ordinary_norms))
    lr = 0.05
    steps_before = runner.steps_used
    labels, ratios = [], []
    for label, inputs, targets, row, neighbour_inputs in _sensitivity_contexts(
        runner, config.sensitivity_batch_size
    ):
        settings = dict(
            clip_norm=clip_norm, noise_multiplier=0.0, batch_size=inputs.shape[0], lr=lr, seed=seed
        )
        with_probe = runner.parameters_after(inputs, targets, **settings)
        neighbour_targets = targets.clone()
        neighbour_targets[row] = 0.0
        without_probe = runner.parameters_after(neighbour_inputs, neighbour_targets, **settings)
        bound = lr * clip_norm / inputs.shape[0]
        labels.append(label)
        ratios.append(float(torch.linalg.vector_norm(with_probe - without_probe)) / bound)
    worst = int(np.argmax(ratios))
    ratio = ratios[worst]
    passed = ratio <= 1.0 + SENSITIVITY_TOLERANCE
    if passed:
        diagnosis = (
            f"one example moves the model by at most {ratio:.4g}× η·C/B: "
            "per-example sensitivity is bounded by C"
        )
        if ratio < 1.0 - SENSITIVITY_TOLERANCE:
            diagnosis += (
                " (less than the bound: clipped to less than C or over-normalised, "
                "so accuracy is lost)"
            )
    else:
        cause = (
            "the update is not divided by B, or clipping happens after averaging"
            if abs(ratio - config.sensitivity_batch_size) < 0.05 * config.sensitivity_batch_size
            else "the model mixes the examples of a batch, "
            "so one example moves the others' gradients"
            if "input replaced" in labels[worst]
            else "clipping does not bound each example's gradient norm by C"
        )
        diagnosis = (
            f"one example moves the model by {ratio:.4g}× the bound η·C/B ({labels[worst]}): "
            f"{cause}; "
            f"the true sensitivity is {ratio:.3g}× the one the accountant assumes"
        )
    return SENSITIVITY.deterministic(
        statistic=ratio,
        passed=passed,
        tolerance=SENSITIVITY_TOLERANCE,
        details={"contexts": labels, "ratios": ratios, "clip_norm": clip_norm},
        note=" (σ = 0)",
        diagnosis=diagnosis,
        steps=runner.steps_used - steps_before,
        figure=ratio_figure(
            "Sensitivity: influence of one example / (η·C/B)", "context", "ratio", ratios, "bound"
        ),
    )
