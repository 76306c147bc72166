"""Wall times out of the tracked metrics: they differ on every run and machine, so a tracked
``metrics/<stage>.json`` holding them made every ``make repro`` a change to commit.

After a stage runs, :func:`split_timing` moves each timing key (a wall time, a duration in seconds,
a throughput) from ``metrics/<stage>.json`` into ``timing/<stage>.json``, which git ignores; the
tracked metrics keep only what the run computed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpledger import io

TIMING_DIR = Path("timing")
"""Untracked (git-ignored) folder of each stage's wall times."""


def is_timing(key: str) -> bool:
    """Whether a metric is a time (or a peak memory) measurement rather than a computed result."""
    measured = key.startswith(("throughput_", "peak_memory_"))
    return key.endswith(("_s", "_seconds")) or measured


def split_timing(root: Path, stage: str, returned: dict[str, Any]) -> dict[str, Any]:
    """Move the timing keys of ``metrics/<stage>.json`` (and the returned ``stage_wall_time_s``)
    into ``timing/<stage>.json``; returns the timing written."""
    path = root / "metrics" / f"{stage}.json"
    timing = {key: value for key, value in returned.items() if is_timing(key)}
    if path.is_file():
        metrics = json.loads(path.read_text())
        timing |= {key: value for key, value in metrics.items() if is_timing(key)}
        kept = {key: value for key, value in metrics.items() if not is_timing(key)}
        if len(kept) != len(metrics):
            io.write_json(path, kept)
    if timing:
        io.write_json(root / TIMING_DIR / f"{stage}.json", timing)
    return timing
