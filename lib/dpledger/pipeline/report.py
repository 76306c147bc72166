"""report stage: render reports/report.md, reports/report.html and reports/figures/ from the other
stages' outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpledger import io, paths
from dpledger.params import Params
from dpledger.report import write_report


def run(params: Params, root: Path) -> dict[str, Any]:
    """Write the report and metrics/report.json (warning counts); return those metrics."""
    metrics = write_report(params, root).metrics()
    io.write_json(Path(root) / paths.metrics("report"), metrics)
    return metrics
