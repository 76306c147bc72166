"""Engine self-check in the battery (deterministic): dpledger's BK engine against a naive
per-example loop on the battery's model (with ``verify.model: train`` the user's own model, loss and
training rows), float64, flat, per-layer and automatic clipping, every parameter compared.

It checks the engine the train stage uses, whichever trainer the battery tests: a wrong per-layer
rule for this model would make every DP-SGD step of the pipeline wrong even when the trainer under
test is right. The clip norm is the median gradient norm of the rows, so both branches of min(1,
R/‖g‖) run.
"""

from __future__ import annotations

from dpledger.engine import run_self_check
from dpledger.engine.clipping import CLIPPING_MODES
from dpledger.errors import DpledgerError
from dpledger.verify.result import Check, TestResult, ratio_figure
from dpledger.verify.task import SyntheticTask

EXAMPLES = 4

ENGINE_SELF_CHECK = Check(
    "engine_self_check",
    "the BK engine's per-example norms and clipped sum (σ = 0) "
    "on the battery's model equal a naive per-example loop's, every parameter, flat, "
    "per-layer and automatic clipping",
    "max relative error / tolerance",
)


def run_engine_self_check(task: SyntheticTask) -> TestResult:
    """The self-check in each clipping mode on the task's first rows; fails on a mismatch or a
    refusal."""
    inputs, targets = task.inputs[:EXAMPLES], task.targets[:EXAMPLES]
    clip_norm = float(task.ordinary_norms[:EXAMPLES].median())
    ratios, details = [], {"examples": len(inputs), "clip_norm": clip_norm}
    for mode in CLIPPING_MODES:
        try:
            result = run_self_check(
                task.model,
                lambda model, x, y: task.loss_fn(model(x), y),
                inputs,
                targets,
                clip_norm=clip_norm,
                clipping=mode,
                trainable=task.trainable,
                raise_on_mismatch=False,
            )
        except DpledgerError as error:
            return ENGINE_SELF_CHECK.deterministic(
                passed=False,
                tolerance=0.0,
                details=details,
                statistic=float("inf"),
                steps=0,
                diagnosis=f"the engine cannot train this model ({mode} clipping): {error}",
            )
        ratios.append(result.max_relative_error / result.tolerance)
        details[mode] = result.to_dict()
        if not result.passed:
            return ENGINE_SELF_CHECK.deterministic(
                passed=False,
                tolerance=result.tolerance,
                details=details,
                statistic=ratios[-1],
                steps=0,
                diagnosis=f"{mode} clipping: {result.failure()}",
                figure=_figure(ratios),
            )
    return ENGINE_SELF_CHECK.deterministic(
        passed=True,
        tolerance=result.tolerance,
        details=details,
        statistic=max(ratios),
        steps=0,
        diagnosis=(
            f"the engine equals a naive per-example loop on {task.description} within {result.tolerance:g} "  # noqa: E501
            f"({result.dtype}; worst relative error {max(ratios) * result.tolerance:.3g})"
        ),
        figure=_figure(ratios),
    )


def _figure(ratios: list[float]):
    return ratio_figure(
        "engine vs naive per-example loop (flat, per-layer, automatic)",
        "clipping mode (0 flat, 1 per-layer, 2 automatic)",
        "max relative error / tolerance",
        ratios,
        "tolerance",
    )
