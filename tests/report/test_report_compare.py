"""`dpledger report` and `dpledger report --compare REV` (old metrics read with git show, never
recomputed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpledger.cli import app
from dpledger.report.compare import HEADLINE_METRICS, compare_headlines
from helpers.report_fixtures import REPO_ROOT, Problems, fabricate_project

PARAMS = str(REPO_ROOT / "params.yaml")
GIT = [
    "git",
    "-c",
    "user.name=test",
    "-c",
    "user.email=test@example.com",
    "-c",
    "commit.gpgsign=false",
]


def _git(root: Path, *args: str) -> None:
    subprocess.run([*GIT, *args], cwd=root, check=True, capture_output=True)


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """A throwaway git repository whose first commit holds a clean run's metrics (without audit)."""
    root = fabricate_project(tmp_path, skip=("audit",))
    _git(root, "init", "-q")
    _git(root, "add", "metrics")
    _git(root, "commit", "-q", "-m", "baseline")
    fabricate_project(tmp_path, Problems(verify_failed=True))
    calibrate = json.loads((root / "metrics/calibrate.json").read_text())
    (root / "metrics/calibrate.json").write_text(json.dumps({**calibrate, "epsilon": 4.0}))
    return root


def invoke(*args: str):
    return CliRunner().invoke(app, ["report", *args, "--params", PARAMS], catch_exceptions=False)


def test_compare_renders_old_and_new_headline_side_by_side(repository):
    result = invoke("--compare", "HEAD", "--root", str(repository))
    assert result.exit_code == 0, result.output
    table = result.output
    # ε = 4 in metrics/calibrate.json beside the audit's 3.0000049: the sources disagree (issue 27)
    assert "| Warnings | none | sources-disagree, verify-failed | changed |" in table
    assert "| Claimed ε | 3.001 | 4 | +1 |" in table
    assert "| Implementation tests passed | yes | no | changed |" in table
    assert "| Implementation tests failed | 0 | 1 | +1 |" in table
    assert "| Empirical ε (lower bound) | not run | 0.83 |   |" in table
    assert "| Test accuracy | 88.61 % | 88.61 % |   |" in table
    # header, warnings, utility, one row per metric
    assert table.count("\n| ") == len(HEADLINE_METRICS) + 3
    assert not (repository / "reports").exists()  # --compare prints, it writes nothing


def test_compare_json(repository):
    result = invoke("--compare", "HEAD", "--root", str(repository), "--json")
    payload = json.loads(result.output)
    assert payload["new"] == "working tree" and payload["old"].startswith("HEAD (")
    rows = {row["label"]: row for row in payload["rows"]}
    assert rows["Sampler used"] == {
        "label": "Sampler used",
        "old": "poisson",
        "new": "poisson",
        "change": "",
    }


def test_compare_uses_the_same_checks_as_the_report():
    old = {
        "train": {
            "sampler_accounted": "poisson",
            "sampler_used": "poisson",
            "sampler_mismatch": False,
        }
    }
    new = {
        "train": {
            "sampler_accounted": "poisson",
            "sampler_used": "shuffle",
            "sampler_mismatch": True,
        }
    }
    for train in (old["train"], new["train"]):
        train["self_check_passed"] = True
    warnings = compare_headlines(old, new, mc_failure_warning=1e-6)[0]
    assert (warnings.old, warnings.new) == ("none", "sampler-mismatch")
    del new["train"]["self_check_passed"]  # a run without the engine's self-check is a warning too
    warnings = compare_headlines(old, new, mc_failure_warning=1e-6)[0]
    assert warnings.new == "sampler-mismatch, self-check-missing"


def test_compare_with_an_unknown_revision_is_one_line_and_exit_code_2(repository):
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from dpledger.cli import main; main()",
            "report",
            "--compare",
            "no-such-rev",
            "--root",
            str(repository),
            "--params",
            PARAMS,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: report --compare: 'no-such-rev' is not a git revision of the repository at "
        f"{repository}"
    ]


def test_plain_report_renders_the_current_tree(tmp_path):
    root = fabricate_project(tmp_path, Problems(sampler_mismatch=True))
    result = invoke("--root", str(root))
    assert result.exit_code == 0, result.output
    assert "1 warning(s): sampler-mismatch" in result.output
    assert (root / "reports/report.md").is_file() and (root / "reports/report.html").is_file()
    assert json.loads(invoke("--root", str(root), "--json").output)["figures"] == 7


def test_report_names_the_git_commit_it_was_rendered_from(repository):
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repository, capture_output=True, text=True
    ).stdout.strip()
    invoke("--root", str(repository))
    markdown = (repository / "reports/report.md").read_text()
    assert f"| git commit | `{head}` |" in markdown
    assert f"git checkout {head}" in markdown.split("## Reproduce", 1)[1]
