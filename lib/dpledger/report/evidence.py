"""The evidence behind the headline: the privacy claim and its assumptions, the batches used, the
audit, the implementation tests, training, group-level epsilon and the noise mechanism.

Detail JSONs are read defensively: a missing or oddly shaped field is skipped or shown as it is.
"""

from __future__ import annotations

from typing import Any

from dpledger.report.document import (
    Badge,
    Block,
    BulletList,
    Code,
    Details,
    Heading,
    Paragraph,
    Table,
    Text,
    text,
)
from dpledger.report.formatting import flatten, format_upper, format_value, is_table
from dpledger.report.inputs import ReportInputs
from dpledger.report.tables import (
    NOT_RUN,
    json_blocks,
    key_value_table,
    metrics_table,
    records_table,
)


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def privacy_claim(inputs: ReportInputs) -> list[Block]:
    """Assumptions of the claim, every accountant's epsilon, and the batches actually used."""
    blocks: list[Block] = [Heading(3, "Privacy claim")]
    record = inputs.details.get("calibrate")
    if isinstance(record, dict):
        assumptions = tuple(text(str(a)) for a in record.get("assumptions") or [])
        blocks += [
            Paragraph(text("The claimed ε rests on these assumptions:")),
            BulletList(assumptions or (text("none stated"),)),
        ]
        blocks += _accountants(record)
    else:
        blocks.append(
            Paragraph(text(NOT_RUN, " artifacts/calibration/calibration.json is missing."))
        )
    blocks += metrics_table("calibrate", inputs, "All calibrate metrics")
    blocks.append(Heading(3, "Batches used"))
    header = inputs.details.get("schedule")
    if isinstance(header, dict):
        blocks.append(
            key_value_table([(key, value) for key, value in flatten(header) if value != {}])
        )
    blocks += metrics_table("schedule", inputs, "All schedule metrics")
    return blocks


def _accountants(record: dict[str, Any]) -> list[Block]:
    accountants = [a for a in record.get("accountants") or [] if isinstance(a, dict)]
    if not accountants:
        return []
    shared = set(str(s) for s in record.get("assumptions") or [])

    def own_assumptions(accountant: dict[str, Any]) -> str:
        own = [str(s) for s in accountant.get("assumptions") or [] if str(s) not in shared]
        return "; ".join(own) or "as listed above"

    rows = tuple(
        (
            text(Code(format_value(a.get("accountant")))),
            text(format_upper(a.get("epsilon"))),
            text(format_value(a.get("delta"))),
            text(own_assumptions(a)),
        )
        for a in accountants
    )
    intro = text(
        "ε of every accountant run (the claim is the ",
        Code(str(record.get("accountant"))),
        " one):",
    )
    return [
        Paragraph(intro),
        Table(("accountant", "ε", "δ", "assumptions beyond those above"), rows),
    ]


def audit_details(inputs: ReportInputs) -> list[Block]:
    """The audit's metrics and, collapsed, whatever artifacts/audit/audit.json holds."""
    blocks: list[Block] = [
        Heading(3, "Empirical audit"),
        *metrics_table("audit", inputs, "All audit metrics"),
    ]
    details = inputs.details.get("audit")
    if details is not None:
        blocks.append(
            Details("Audit details (artifacts/audit/audit.json)", tuple(json_blocks(details)))
        )
    return blocks


def verify_details(inputs: ReportInputs) -> list[Block]:
    """One row per implementation test (p-value, verdict, diagnosis) and the battery's findings."""
    blocks: list[Block] = [Heading(3, "Implementation tests")]
    details = _mapping(inputs.details.get("verify"))
    tests = [t for t in details.get("tests") or [] if isinstance(t, dict)]
    if details.get("trainer"):
        blocks.append(Paragraph(text("Trainer under test: ", Code(str(details["trainer"])), ".")))
    if tests:
        header = ("test", "p-value", "statistic", "steps", "verdict", "diagnosis")
        blocks.append(Table(header, tuple(_verify_test_row(t) for t in tests)))
    findings = _mapping(details.get("verdict")).get("findings")
    if isinstance(findings, list) and findings:
        blocks.append(BulletList(tuple(text(str(f)) for f in findings)))
    return blocks + metrics_table("verify", inputs, "All verify metrics")


def _verify_test_row(test: dict[str, Any]) -> tuple[Text, ...]:
    passed = test.get("passed")
    if test.get("skipped") is True:
        badge = Badge("skipped", "neutral")
    else:
        badge = (
            Badge("passed", "good")
            if passed is True
            else Badge("failed", "bad")
            if passed is False
            else NOT_RUN
        )
    return (
        text(Code(format_value(test.get("name")))),
        text(format_value(test.get("p_value"))),
        text(format_value(test.get("statistic"))),
        text(format_value(test.get("steps"))),
        text(badge),
        text(format_value(test.get("diagnosis"))),
    )


def training_details(inputs: ReportInputs) -> list[Block]:
    """Training metrics and, collapsed, each small JSON under artifacts/train/."""
    blocks: list[Block] = [
        Heading(3, "Training"),
        *metrics_table("train", inputs, "All train metrics"),
    ]
    for name, content in inputs.train_files.items():
        blocks.append(Details(f"artifacts/train/{name}", tuple(json_blocks(content))))
    return blocks


def group_section(inputs: ReportInputs) -> list[Block]:
    """Epsilon for a group of k examples (one user's data), as calibrate computed it."""
    blocks: list[Block] = [Heading(2, "Group-level ε")]
    record = inputs.details.get("calibrate")
    group = _mapping(record).get("group")
    if not isinstance(record, dict):
        blocks.append(Paragraph(text(NOT_RUN)))
    elif is_table(group):
        intro = (
            "ε when one user contributes k examples (group privacy), per method, "
            "as computed by calibrate:"
        )
        blocks += [Paragraph(text(intro)), records_table(group, _group_cell)]
    else:
        blocks.append(Paragraph(text("calibrate reported no group-level ε.")))
    return blocks


def _group_cell(key: str, value: Any) -> str:
    """Every real number in the group table is an epsilon: rounded up. Sizes are integers, shown as
    they are."""
    return format_upper(value) if isinstance(value, float) else format_value(value)


def mechanism_section(inputs: ReportInputs) -> list[Block]:
    """The noise mechanism, its RMSE (from the calibrate metrics or mechanism parameters) and its
    parameters."""
    blocks: list[Block] = [Heading(2, "Mechanism")]
    record = inputs.details.get("calibrate")
    if not isinstance(record, dict):
        return [*blocks, Paragraph(text(NOT_RUN))]
    mechanism = str(record.get("mechanism", "identity"))
    meaning = (
        "independent noise each step (DP-SGD)"
        if mechanism == "identity"
        else "correlated noise C⁻¹z"
    )
    sigma = format_value(record.get("noise_multiplier"))
    blocks.append(
        Paragraph(
            text(
                "Noise mechanism: ", Code(mechanism), f" — {meaning}; noise multiplier σ = {sigma}."
            )
        )
    )
    params = flatten(_mapping(record.get("mechanism_params")))
    calibrate_metrics = inputs.metrics["calibrate"].items()
    rmse = [
        (f"metrics/calibrate.json: {k}", v) for k, v in calibrate_metrics if "rmse" in k.lower()
    ]
    rmse += [(f"mechanism_params.{k}", v) for k, v in params if "rmse" in k.lower()]
    if rmse:
        blocks.append(key_value_table(rmse))
    else:
        blocks.append(
            Paragraph(
                text(
                    "RMSE: ", Badge("not reported", "neutral"), " (calibrate wrote no rmse value)."
                )
            )
        )
    other = [(k, v) for k, v in params if "rmse" not in k.lower() and v != {}]
    if other:
        blocks.append(Details("Mechanism parameters", (key_value_table(other),)))
    return blocks
