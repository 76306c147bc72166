"""The report's headline says how the run was placed: one process, data-parallel or FSDP, and over
how many ranks (metrics/train.json's ``sharding`` and ``ranks``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpledger.pipeline.report import run
from helpers.report_fixtures import fabricate_project, report_params


def _placement_row(root: Path, placement: dict) -> str:
    fabricate_project(root)
    path = root / "metrics/train.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | placement))
    run(report_params(), root)
    headline = (root / "reports/report.md").read_text().split("## Headline", 1)[1]
    return next(line for line in headline.splitlines() if "Placement" in line)


@pytest.mark.parametrize(
    ("placement", "said"),
    [
        ({"sharding": "fsdp", "ranks": 4}, "FSDP over 4 ranks"),
        ({"sharding": "none", "ranks": 2}, "data-parallel over 2 ranks"),
        ({"sharding": "none", "ranks": 1}, "one process"),
    ],
)
def test_the_placement_row_says_how_the_run_was_sharded(tmp_path, placement, said):
    row = _placement_row(tmp_path, placement)
    assert said in row, row
    assert ("FSDP" in row) is (placement["sharding"] == "fsdp")
