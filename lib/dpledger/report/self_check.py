"""The engine's self-check in the report: a headline row, and a warning when it failed or
did not run (then nothing shows that this model's private gradients are exactly DP-SGD's).

Reads only train's flat metrics (``self_check_*``), so ``dpledger report --compare`` applies it to
old runs.
"""

from __future__ import annotations

from typing import Any

from dpledger.report.document import Badge, Strong, Text, text
from dpledger.report.formatting import MISSING, format_percent, format_value
from dpledger.report.tables import NOT_RUN


def _checked(train: dict[str, Any]) -> str:
    """'4 examples · training batch of 16 rows · 13 of 13 parameters · float64 · training dtype
    float32: 1.6e-07 · spot check at step 7: 1.2e-07 · 0.21 s (1.6 % of training)' (the training
    batch, training dtype and spot parts where the metrics have them: older runs' do not)."""
    seconds, wall = train.get("self_check_seconds"), train.get("wall_time_s")
    batch = train.get("self_check_batch_rows")
    parts = [
        f"{format_value(train.get('self_check_examples'))} examples",
        *([f"training batch of {format_value(batch)} rows"] if batch else []),
        f"{format_value(train.get('self_check_parameters_checked'))} of {format_value(train.get('self_check_parameters_trainable'))} parameters",  # noqa: E501
        format_value(train.get("self_check_dtype")),
    ]
    if "self_check_training_dtype" in train:
        parts.append(
            f"training dtype {format_value(train['self_check_training_dtype'])}: {format_value(train.get('self_check_training_max_relative_error'))}"  # noqa: E501
        )
    if "self_check_spot_step" in train:
        parts.append(
            f"spot check at step {format_value(train['self_check_spot_step'])}{' (and a copy built anew)' if train.get('self_check_spot_fresh_copy') else ''}: {format_value(train.get('self_check_spot_max_relative_error'))}"  # noqa: E501
        )
    if seconds is not None:  # a run from before the wall times left the tracked metrics
        parts.append(f"{format_value(seconds)} s")
    if isinstance(seconds, (int, float)) and isinstance(wall, (int, float)) and wall > 0:
        parts[-1] += f" ({format_percent(seconds / wall)} of training)"
    return " · ".join(parts)


def self_check_row(
    metrics: dict[str, dict[str, Any]], train_ran: bool, ledger: Any = None
) -> tuple[Text, ...]:
    """Headline row: the worst relative error of the engine against the naive per-example loop.
    Cross-checked against the training ledger where one is given: a result the ledger does not
    record is never shown as exact."""
    label = text(Strong("Engine exactness"))
    if not train_ran:
        return label, text(MISSING), text(), text(NOT_RUN)
    train = metrics.get("train", {})
    passed = train.get("self_check_passed")
    if isinstance(ledger, dict) and "self_check" in ledger and passed is not None:
        recorded = ledger.get("self_check") if isinstance(ledger.get("self_check"), dict) else {}
        if recorded.get("passed") is not passed:
            return (
                label,
                text("not recorded" if not recorded else "disagrees with the ledger"),
                text("train metrics state a self-check result the training ledger does not hold"),
                text(Badge("sources disagree", "bad")),
            )
    if passed is None:
        return (
            label,
            text("not checked"),
            text("train.self_check was off"),
            text(Badge("unchecked", "warn")),
        )
    error = format_value(train.get("self_check_max_relative_error"))
    result = text(f"max relative error {error} vs a naive per-example loop")
    badge = Badge("exact", "good") if passed is True else Badge("mismatch", "bad")
    if passed is True and _partial(train) is not None:
        badge = Badge(f"exact on {_partial(train)} parameters only", "warn")
    return label, result, text(_checked(train)), text(badge)


def _partial(train: dict[str, Any]) -> str | None:
    """'2 of 4' when the self-check compared fewer parameters than the model trains, else None."""
    checked = train.get("self_check_parameters_checked")
    trainable = train.get("self_check_parameters_trainable")
    if isinstance(checked, int) and isinstance(trainable, int) and checked < trainable:
        return f"{checked} of {trainable}"
    return None


def self_check_findings(metrics: dict[str, dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(kind, title, message) of a failed or missing self-check of a run that trained; else
    nothing."""
    train = metrics.get("train", {})
    if not train:
        return []
    passed = train.get("self_check_passed")
    if passed is False:
        error = format_value(train.get("self_check_max_relative_error"))
        return [
            (
                "self-check-failed",
                "Engine self-check failed",
                "The engine's private gradient on this model differed from a naive per-example loop "  # noqa: E501
                f"(relative error {error}): the clipped sum may not be DP-SGD's, "
                "so neither is the claim.",
            )
        ]
    if passed is True:
        partial = _partial(train)
        if partial is None:
            return []
        return [
            (
                "self-check-partial",
                "Engine exactness checked on part of the model only",
                f"The self-check compared {partial} trainable parameters "
                "(train.self_check_parameters): the others' private gradients are unchecked, and a layer the engine gets wrong there would pass. Empty the list to check them all.",  # noqa: E501
            )
        ]
    return [
        (
            "self-check-missing",
            "Engine exactness not checked on this model",
            "The train stage ran without the engine's self-check (train.self_check: false, "
            "or outputs of an older version): "
            "nothing shows that this model's private gradients are exactly DP-SGD's. "
            "Set train.self_check: true and rerun train.",
        )
    ]
