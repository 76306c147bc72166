"""Issue 21: the report never says "No warnings" when the σ used differs from the σ claimed, when a
loss is NaN, or when an example was dropped for a non-finite norm."""

from __future__ import annotations

import json

import pytest

from dpledger.report import write_report
from dpledger.report.checks import find_findings
from helpers.report_fixtures import fabricate_project, report_params


def _rewrite(path, **changes):
    content = json.loads(path.read_text())
    content.update(changes)
    path.write_text(json.dumps(content))


def _warning_kinds(root) -> tuple[list[str], str]:
    report = write_report(report_params(), root)
    return [f.kind for f in report.findings if f.severity == "warning"], report.markdown


def test_a_clean_project_has_no_warnings(tmp_path):
    root = fabricate_project(tmp_path)
    kinds, markdown = _warning_kinds(root)
    assert kinds == [] and "No warnings" in markdown


def test_sigma_used_different_from_sigma_claimed_is_a_warning_and_shown(tmp_path):
    root = fabricate_project(tmp_path)
    claimed = json.loads((root / "metrics/calibrate.json").read_text())["noise_multiplier"]
    _rewrite(root / "metrics/train.json", noise_multiplier=0.3)
    (root / "artifacts/train/ledger.json").write_text(json.dumps({"noise_multiplier": 0.3}))
    kinds, markdown = _warning_kinds(root)
    assert "sigma-mismatch" in kinds and "No warnings" not in markdown
    assert "σ used 0.3" in markdown and "does not hold as stated" in markdown
    assert f"calibrate metrics σ = {claimed:.4g}" in markdown


def test_an_edited_record_sigma_is_a_warning(tmp_path):
    root = fabricate_project(tmp_path)
    _rewrite(root / "artifacts/calibration/calibration.json", noise_multiplier=0.3)
    kinds, _ = _warning_kinds(root)
    assert "sigma-mismatch" in kinds


@pytest.mark.parametrize(
    "change",
    [{"final_train_loss": float("nan")}, {"loss_diverged": True}, {"test_loss": float("inf")}],
)
def test_a_diverged_loss_is_a_warning(tmp_path, change):
    root = fabricate_project(tmp_path)
    _rewrite(root / "metrics/train.json", **change)
    kinds, markdown = _warning_kinds(root)
    assert "loss-diverged" in kinds and "No warnings" not in markdown


def test_examples_dropped_for_a_nonfinite_norm_are_a_warning(tmp_path):
    root = fabricate_project(tmp_path)
    _rewrite(root / "metrics/train.json", nonfinite_examples=3)
    kinds, markdown = _warning_kinds(root)
    assert "nonfinite-examples" in kinds and "No warnings" not in markdown


def test_findings_from_the_ledger_alone():
    metrics = {"calibrate": {"noise_multiplier": 1.244}, "train": {}}
    ledger = {"ledger.json": {"noise_multiplier": 0.3, "nonfinite_examples": 1}}
    kinds = {f.kind for f in find_findings(metrics, mc_failure_warning=1e-6, train_files=ledger)}
    assert {"sigma-mismatch", "nonfinite-examples"} <= kinds


def test_the_engine_self_check_is_in_the_headline_and_its_absence_or_failure_is_a_warning(tmp_path):
    root = fabricate_project(tmp_path)
    kinds, markdown = _warning_kinds(root)
    assert kinds == [] and "Engine exactness" in markdown
    assert "max relative error 2.1e-16" in markdown
    train = json.loads((root / "metrics/train.json").read_text())
    failed = {"self_check_passed": False, "self_check_max_relative_error": 0.031}
    _rewrite(root / "metrics/train.json", **failed)
    kinds, markdown = _warning_kinds(root)
    assert "self-check-failed" in kinds and "No warnings" not in markdown and "mismatch" in markdown
    assert "does not hold as stated" in markdown
    unchecked = {k: v for k, v in train.items() if not k.startswith("self_check")}
    (root / "metrics/train.json").write_text(json.dumps(unchecked | {"self_check_ran": False}))
    kinds, markdown = _warning_kinds(root)
    assert kinds == ["self-check-missing"] and "unchecked" in markdown
    assert "No warnings" not in markdown
