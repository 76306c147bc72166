"""Every ε, δ, sampler and step count the report shows, held against the sealed records behind them.

The calibration record (sealed by calibrate, ``seal.json``) and the schedule header (its own digest)
are what train and audit verified; the metrics files are flat copies anyone can edit. The report
therefore checks both seals and compares each number it shows with its record: an ε of 0.5 written
into the metrics while the record says 3, a relabelled sampler or a rewound step count is a warning
at the top, never "No warnings". (σ has its own check, ``checks.sigma_sources``.)
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from dpledger import paths
from dpledger.accounting.record import CalibrationRecord
from dpledger.errors import DpledgerError
from dpledger.seals import SEAL, record_digest, verified_schedule

_RELATIVE_SLACK = 1e-9


def seal_problems(root: Path) -> list[str]:
    """One sentence per sealed input that differs from its seal (a missing seal is not checked)."""
    problems = []
    record, seal = root / paths.CALIBRATION, root / paths.CALIBRATION.parent / SEAL
    if record.is_file() and seal.is_file():
        try:
            matches = json.loads(seal.read_text())["record_sha256"] == record_digest(
                CalibrationRecord.from_dict(json.loads(record.read_text()))
            )
        except (OSError, ValueError, TypeError, KeyError):
            matches = False
        if not matches:
            problems.append(
                f"{paths.CALIBRATION.as_posix()} differs from the record calibrate sealed"
            )
    if (root / paths.SCHEDULE_DIR / "schedule.npz").is_file():
        try:
            verified_schedule(root / paths.SCHEDULE_DIR, "report")
        except DpledgerError:
            problems.append(
                f"{paths.SCHEDULE_HEADER.as_posix()} does not match its digest "
                "(relabelled or edited)"
            )
    return problems


def disagreements(
    metrics: dict[str, dict[str, Any]], details: dict[str, Any], train_files: dict[str, Any]
) -> list[str]:
    """One sentence per quantity whose stated values differ between the record and the outputs."""
    record = _mapping(details.get("calibrate"))
    header = _mapping(details.get("schedule"))
    ledger = _mapping(train_files.get("ledger.json"))
    calibrate, schedule = metrics.get("calibrate", {}), metrics.get("schedule", {})
    train, audit = metrics.get("train", {}), metrics.get("audit", {})
    quantities = {
        "claimed ε": [
            ("calibration record", record.get("epsilon")),
            ("calibrate metrics", calibrate.get("epsilon")),
            ("train metrics", train.get("epsilon_claimed")),
            ("audit metrics", audit.get("epsilon_claimed")),
        ],
        "δ": [
            ("calibration record", record.get("delta")),
            ("calibrate metrics", calibrate.get("delta")),
            ("train metrics", train.get("delta")),
            ("audit metrics", audit.get("delta")),
        ],
        "sampler accounted": [
            ("calibration record", record.get("sampler")),
            ("calibrate metrics", calibrate.get("sampler")),
            ("train metrics", train.get("sampler_accounted")),
            ("audit metrics", audit.get("sampler_accounted")),
        ],
        "sampler used": [
            ("schedule header", header.get("sampler")),
            ("schedule metrics", schedule.get("sampler")),
            ("train metrics", train.get("sampler_used")),
        ],
        "accounted steps": [
            ("calibration record", record.get("steps")),
            ("calibrate metrics", calibrate.get("steps")),
        ],
        "schedule steps": [
            ("schedule header", header.get("num_steps")),
            ("schedule metrics", schedule.get("num_steps")),
            ("train metrics", train.get("steps_total")),
            ("training ledger", ledger.get("total_steps")),
        ],
        "ε across runs": [
            ("train metrics", train.get("epsilon_composed")),
            ("training ledger", _composed_epsilon(ledger)),
        ],
        "steps done": [
            ("train metrics", train.get("steps_done")),
            ("training ledger", ledger.get("steps_done")),
        ],
        "ε spent": [
            ("train metrics", train.get("epsilon_spent")),
            ("training ledger", ledger.get("epsilon_spent")),
            (
                "calibration record at the steps done",
                _spent(record, train.get("steps_done", ledger.get("steps_done"))),
            ),
        ],
    }
    found = _self_check_disagreement(train, ledger)
    for quantity, sources in quantities.items():
        stated = [(source, value) for source, value in sources if value is not None]
        if any(not _same(stated[0][1], value) for _, value in stated[1:]):
            found.append(
                f"{quantity}: " + ", ".join(f"{source} {_shown(value)}" for source, value in stated)
            )
    return found


def _composed_epsilon(ledger: dict[str, Any]) -> Any:
    """The ε across runs the training ledger records (``across_runs``), or None."""
    across = _mapping(ledger.get("across_runs"))
    return _mapping(across.get("composed")).get("epsilon")


def _self_check_disagreement(train: dict[str, Any], ledger: dict[str, Any]) -> list[str]:
    """The self-check train's metrics state against the one its ledger records: a passed check in
    the metrics beside a ledger that records none (or another result) is an edited file."""
    if not ledger or "self_check" not in ledger or train.get("self_check_passed") is None:
        return []
    record = _mapping(ledger.get("self_check"))
    if not record:
        return [
            f"self-check: train metrics self_check_passed {_shown(train['self_check_passed'])}, "
            "training ledger records no self-check"
        ]
    found = []
    for key in (
        "passed",
        "batch_rows",
        "max_relative_error",
        "training_max_relative_error",
        "spot_max_relative_error",
    ):
        stated = train.get(f"self_check_{key}")
        if stated is not None and not _same(stated, record.get(key)):
            found.append(
                f"self-check {key}: train metrics {_shown(stated)}, training ledger {_shown(record.get(key))}"  # noqa: E501
            )
    return found


def _spent(record: dict[str, Any], steps_done: Any) -> float | None:
    """ε after ``steps_done`` steps as train reads it from the record's curve
    (``pipeline.train.epsilon_spent``): the first point at or past the step, else the full claim;
    None when the record or step count is unknown."""
    steps, curve = _real(steps_done), record.get("epsilon_curve")
    if steps is None or _real(record.get("epsilon")) is None or not isinstance(curve, list):
        return None
    if steps <= 0:
        return 0.0
    points = [
        p
        for p in curve
        if isinstance(p, list) and len(p) == 2 and all(_real(v) is not None for v in p)
    ]
    at_or_after = [(s, e) for s, e in points if s >= steps]
    return float(min(at_or_after)[1]) if at_or_after else float(record["epsilon"])


def _same(a: Any, b: Any) -> bool:
    if _real(a) is not None and _real(b) is not None:
        return math.isclose(float(a), float(b), rel_tol=_RELATIVE_SLACK) or (
            math.isnan(a) and math.isnan(b)
        )
    return a == b


def _real(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _shown(value: Any) -> str:
    return f"{value:.6g}" if _real(value) is not None else str(value)


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
