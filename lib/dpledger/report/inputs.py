"""Everything the report reads, loaded defensively: a missing or unreadable output is 'not run',
never a crash.

The report reads what the other stages wrote (their flat metrics, detail JSONs and PNG plots) and
recomputes nothing but the seals of the calibration record and the schedule (``report.sealed``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpledger import paths
from dpledger.report.sealed import seal_problems

UPSTREAM_STAGES = ("calibrate", "schedule", "train", "verify", "audit")
DETAIL_FILES = {
    "calibrate": paths.CALIBRATION,
    "schedule": paths.SCHEDULE_HEADER,
    "verify": paths.VERIFY,
    "audit": paths.AUDIT,
}
_LARGEST_TRAIN_JSON = 1_000_000


@dataclass(frozen=True)
class ReportInputs:
    """The upstream outputs found under one project root.

    ``metrics[stage]`` is the stage's flat metrics ({} when absent); ``status[stage]`` is "ok",
    "not run" or "unreadable: <reason>". ``details[stage]`` is the detail JSON or None.
    ``train_files`` maps the name of each small JSON under artifacts/train/ to its content.
    ``plots[stage]`` lists the stage's PNGs in name order.
    """

    root: Path
    metrics: dict[str, dict[str, Any]]
    status: dict[str, str]
    details: dict[str, Any]
    train_files: dict[str, Any]
    plots: dict[str, list[Path]]
    problems: list[str] = field(default_factory=list)
    seal_problems: list[str] = field(default_factory=list)

    def ran(self, stage: str) -> bool:
        return self.status.get(stage) == "ok"

    def not_run(self) -> list[str]:
        return [stage for stage in UPSTREAM_STAGES if not self.ran(stage)]


def load_inputs(root: str | Path) -> ReportInputs:
    """Read every upstream output under ``root``."""
    root = Path(root)
    problems: list[str] = []
    metrics: dict[str, dict[str, Any]] = {}
    status: dict[str, str] = {}
    for stage in UPSTREAM_STAGES:
        loaded, state = _read_json(root, paths.metrics(stage), problems)
        if loaded is not None and not isinstance(loaded, dict):
            problems.append(f"metrics/{stage}.json is not a JSON object")
            loaded, state = None, "unreadable: not a JSON object"
        metrics[stage] = loaded or {}
        status[stage] = state
    details = {stage: _read_json(root, path, problems)[0] for stage, path in DETAIL_FILES.items()}
    record = details.get("calibrate")
    if isinstance(record, dict) and isinstance(record.get("description"), dict):
        # σ, sampler, mechanism read at the top level
        details["calibrate"] = {
            **record["description"],
            **record,
        }
    return ReportInputs(
        root=root,
        metrics=metrics,
        status=status,
        details=details,
        train_files=_read_train_files(root, problems),
        plots={
            stage: sorted((root / paths.plots(stage)).glob("*.png")) for stage in UPSTREAM_STAGES
        },
        problems=problems,
        seal_problems=seal_problems(root),
    )


def _read_json(root: Path, relative: Path, problems: list[str]) -> tuple[Any, str]:
    """(content, "ok"), (None, "not run") when absent, or (None, "unreadable: ...") noted in
    ``problems``."""
    path = root / relative
    if not path.is_file():
        return None, "not run"
    try:
        return json.loads(path.read_text()), "ok"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        reason = (str(error).splitlines() or [type(error).__name__])[0]
        problems.append(f"{relative.as_posix()} could not be read: {reason}")
        return None, f"unreadable: {reason}"


def _read_train_files(root: Path, problems: list[str]) -> dict[str, Any]:
    folder = root / paths.TRAIN_DIR
    if not folder.is_dir():
        return {}
    found = {}
    for path in sorted(folder.glob("*.json")):
        if path.stat().st_size <= _LARGEST_TRAIN_JSON:
            content, state = _read_json(root, path.relative_to(root), problems)
            if state == "ok":
                found[path.name] = content
    return found
