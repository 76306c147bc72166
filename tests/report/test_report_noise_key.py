"""The report's headline says where the noise key came from, and a key derivable from the
repository is a red 'public' verdict with its warning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpledger.ledger import PUBLIC_KEY_WARNING
from dpledger.pipeline.report import run
from helpers.report_fixtures import fabricate_project, report_params


def _headline(root: Path, source: str | None, public: bool) -> tuple[str, str]:
    fabricate_project(root)
    path = root / "metrics/train.json"
    metrics = json.loads(path.read_text())
    if source is not None:
        metrics |= {"noise_key_source": source, "noise_key_public": public}
    path.write_text(json.dumps(metrics))
    run(report_params(), root)
    markdown = (root / "reports/report.md").read_text()
    html = (root / "reports/report.html").read_text()
    return markdown.split("## Headline", 1)[1].split("###", 1)[0], html


@pytest.mark.parametrize("public", [False, True])
def test_the_noise_key_row_names_the_source_and_warns_when_public(tmp_path, public):
    source = "derived from the tracked seed = 0" if public else "the operating system's CSPRNG"
    headline, html = _headline(tmp_path, source, public)
    row = next(line for line in headline.splitlines() if "Noise key" in line)
    assert source in row
    assert (PUBLIC_KEY_WARNING in row) is public
    assert ("public" in row) is public and ("secret" in row) is not public
    assert (PUBLIC_KEY_WARNING in html) is public


def test_a_run_without_a_recorded_key_source_shows_it_missing(tmp_path):
    headline, _ = _headline(tmp_path, None, False)
    row = next(line for line in headline.splitlines() if "Noise key" in line)
    assert "secret" not in row and "public" not in row
