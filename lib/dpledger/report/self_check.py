"""The engine's self-check in the report (issue 26): a headline row, and a warning when it failed or
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
    """'4 examples · 13 of 13 parameters · float64 · 0.21 s (1.6 % of training)'."""
    seconds, wall = train.get("self_check_seconds"), train.get("wall_time_s")
    parts = [
        f"{format_value(train.get('self_check_examples'))} examples",
        f"{format_value(train.get('self_check_parameters_checked'))} of "
        f"{format_value(train.get('self_check_parameters_trainable'))} parameters",
        format_value(train.get("self_check_dtype")),
    ]
    if seconds is not None:  # a run from before the wall times left the tracked metrics
        parts.append(f"{format_value(seconds)} s")
    if isinstance(seconds, (int, float)) and isinstance(wall, (int, float)) and wall > 0:
        parts[-1] += f" ({format_percent(seconds / wall)} of training)"
    return " · ".join(parts)


def self_check_row(metrics: dict[str, dict[str, Any]], train_ran: bool) -> tuple[Text, ...]:
    """Headline row: the worst relative error of the engine against the naive per-example loop."""
    label = text(Strong("Engine exactness"))
    if not train_ran:
        return label, text(MISSING), text(), text(NOT_RUN)
    train = metrics.get("train", {})
    passed = train.get("self_check_passed")
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
    return label, result, text(_checked(train)), text(badge)


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
                "The engine's private gradient on this model differed from a naive per-example "
                f"loop (relative error {error}): the clipped sum may not be DP-SGD's, so neither "
                "is the claim.",
            )
        ]
    if passed is True:
        return []
    return [
        (
            "self-check-missing",
            "Engine exactness not checked on this model",
            "The train stage ran without the engine's self-check (train.self_check: false, or "
            "outputs of an older version): nothing shows that this model's private gradients are "
            "exactly DP-SGD's. "
            "Set train.self_check: true and rerun train.",
        )
    ]
