"""The report re-derives its headline verdicts from the numbers and cross-checks them against the
sealed artifacts: an edited verdict in metrics/audit.json or an edited self-check in
metrics/train.json never earns a green badge."""

from __future__ import annotations

import json
from pathlib import Path

from test_report_render import render

from helpers.report_fixtures import fabricate_project


def _edit(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def _row(markdown: str, label: str) -> str:
    return next(line for line in markdown.splitlines() if line.startswith(f"| **{label}**"))


def test_an_edited_one_run_verdict_is_re_derived(tmp_path):
    """ε_emp = 9 against a proven ε ≤ 3 rendered "✅ consistent" because the file said so."""
    root = fabricate_project(tmp_path)
    _edit(
        root / "metrics/audit.json",
        epsilon_emp_one_run=9.0,
        one_run_verdict="consistent",
        one_run_confidence=0.95,
        one_run_canaries=10000,
        one_run_ceiling=12.0,
    )
    metrics, markdown, _ = render(root)
    row = _row(markdown, "This run")
    assert "contradicted" in row and "✅" not in row
    assert "The run's own canaries contradict the claimed ε" in markdown
    assert "contradicted" in _row(markdown, "Claimed ε")


def test_no_green_verdict_above_the_audit_power_ceiling(tmp_path):
    """A claim above the most ε_emp the audit could show is not evidence for it."""
    root = fabricate_project(tmp_path)
    _edit(
        root / "metrics/audit.json",
        epsilon_emp_one_run=1.0,
        one_run_verdict="consistent",
        one_run_ceiling=2.5,
    )
    _, markdown, _ = render(root)
    row = _row(markdown, "This run")
    assert "cannot test the claim" in row and "✅" not in row and "power ceiling" in row
    _edit(root / "metrics/audit.json", one_run_ceiling=6.6)
    _, markdown, _ = render(root)
    assert "✅" in _row(markdown, "This run")


def test_an_edited_dpsgd_verdict_reaches_the_headline(tmp_path):
    root = fabricate_project(tmp_path)
    _edit(root / "metrics/audit.json", dpsgd_epsilon_emp=1.1, dpsgd_verdict="contradicted")
    _, markdown, _ = render(root)
    assert "DP-SGD audit ε_emp" in _row(markdown, "Empirical ε")
    assert "contradicted" in _row(markdown, "Empirical ε")
    assert "contradicted" in _row(markdown, "Claimed ε")
    assert "The DP-SGD audit contradicts the claimed ε" in markdown


def test_a_self_check_the_ledger_does_not_record_is_not_exact(tmp_path):
    root = fabricate_project(tmp_path)
    ledger = {"steps_done": 225, "total_steps": 225, "self_check": {}}
    (root / "artifacts/train/ledger.json").write_text(json.dumps(ledger))
    _, markdown, _ = render(root)
    row = _row(markdown, "Engine exactness")
    assert "exact" not in row.split("|")[4] and "sources disagree" in row
    assert "training ledger records no self-check" in markdown


def test_a_partial_self_check_says_so_and_warns(tmp_path):
    root = fabricate_project(tmp_path)
    _edit(root / "metrics/train.json", self_check_parameters_checked=2)
    _, markdown, _ = render(root)
    assert "exact on 2 of 4 parameters only" in _row(markdown, "Engine exactness")
    assert "Engine exactness checked on part of the model only" in markdown


def test_the_training_dtype_and_spot_checks_show_and_are_cross_checked(tmp_path):
    root = fabricate_project(tmp_path)
    checks = {
        "self_check_training_dtype": "float32",
        "self_check_training_max_relative_error": 1.6e-7,
        "self_check_spot_step": 7,
        "self_check_spot_max_relative_error": 1.2e-7,
        "self_check_batch_rows": 16,
    }
    _edit(root / "metrics/train.json", **checks)
    record = {"passed": True, "max_relative_error": 2.1e-16}
    record |= {key.removeprefix("self_check_"): value for key, value in checks.items()}
    ledger = {"steps_done": 225, "total_steps": 225, "self_check": record}
    (root / "artifacts/train/ledger.json").write_text(json.dumps(ledger))
    _, markdown, _ = render(root)
    row = _row(markdown, "Engine exactness")
    assert "training dtype float32: 1.6e-7" in row and "spot check at step 7: 1.2e-7" in row
    assert "training batch of 16 rows" in row and "sources disagree" not in row
    _edit(root / "metrics/train.json", self_check_training_max_relative_error=1e-12)
    _, markdown, _ = render(root)
    assert "self-check training_max_relative_error: train metrics" in markdown
    _edit(root / "metrics/train.json", self_check_training_max_relative_error=1.6e-7)
    _edit(root / "metrics/train.json", self_check_batch_rows=64)
    _, markdown, _ = render(root)
    assert "self-check batch_rows: train metrics 64, training ledger 16" in markdown


def test_a_model_continuing_earlier_private_runs_shows_its_epsilon_across_runs(tmp_path):
    """Issue 40, item 3: the composed ε is a headline row, cross-checked against the ledger."""
    root = fabricate_project(tmp_path)
    _, markdown, _ = render(root)
    assert "ε across runs" not in markdown  # a run alone: no row
    across = {
        "epsilon_composed": 4.2,
        "delta_composed": 1e-5,
        "composition": "PLD composition (dp-accounting)",
        "prior_runs_composed": 1,
        "prior_runs_declared_disjoint": 0,
    }
    _edit(root / "metrics/train.json", **across)
    ledger = {"steps_done": 225, "total_steps": 225, "across_runs": {"composed": {"epsilon": 4.2}}}
    (root / "artifacts/train/ledger.json").write_text(json.dumps(ledger))
    _, markdown, _ = render(root)
    row = _row(markdown, "ε across runs")
    assert "ε = 4.2" in row and "1 earlier private run(s) on overlapping data" in row
    assert "composed" in row and "sources disagree" not in markdown
    _edit(root / "metrics/train.json", epsilon_composed=3.0)  # edited below the ledger's
    _, markdown, _ = render(root)
    assert "ε across runs: train metrics 3, training ledger 4.2" in markdown
