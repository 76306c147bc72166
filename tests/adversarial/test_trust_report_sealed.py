"""Issue 27 defects 1 and 3: the report re-derives the claim from the sealed record and every
verdict from the numbers it shows; it never says "No warnings" when an ε, δ, sampler or step count
it shows disagrees with the record it came from."""

from __future__ import annotations

import json

import pytest

from dpledger.report import write_report
from helpers.report_fixtures import Problems, fabricate_project, report_params
from helpers.train_project import make_project


def _rewrite(path, **changes):
    content = json.loads(path.read_text()) if path.exists() else {}
    content.update(changes)
    path.write_text(json.dumps(content))


def _warnings(root) -> tuple[list[str], str]:
    report = write_report(report_params(), root)
    return [f.kind for f in report.findings if f.severity == "warning"], report.markdown


def test_an_epsilon_edited_in_the_three_metrics_files_is_not_printed_as_proven(tmp_path):
    root = fabricate_project(tmp_path)
    _rewrite(root / "metrics/calibrate.json", epsilon=0.5)
    _rewrite(root / "metrics/train.json", epsilon_claimed=0.5, epsilon_spent=0.5)
    _rewrite(root / "metrics/audit.json", epsilon_claimed=0.5)
    kinds, markdown = _warnings(root)
    assert (
        "sources-disagree" in kinds
        and "audit-contradicted" in kinds
        and "No warnings" not in markdown
    )
    headline = markdown.split("## Headline")[1]
    claim_row, spent_row = (
        next(line for line in headline.splitlines() if line.startswith(f"| **{label}**"))
        for label in ("Claimed ε", "Privacy spent")
    )
    # the record's claim, doubted
    assert "**ε = 3.001 at δ = 1e-5**" in claim_row and "proven" not in claim_row
    assert "within budget" not in spent_row
    assert (
        "claimed ε: calibration record 3, calibrate metrics 0.5, train metrics 0.5, audit metrics "
        "0.5" in markdown
    )


def test_an_empirical_epsilon_above_the_claim_is_contradicted_whatever_the_audit_wrote(tmp_path):
    root = fabricate_project(tmp_path)
    _rewrite(root / "metrics/audit.json", epsilon_emp=3.5, verdict="consistent")
    kinds, markdown = _warnings(root)
    assert "audit-contradicted" in kinds and "No warnings" not in markdown
    audit_row = next(line for line in markdown.splitlines() if line.startswith("| **Empirical ε**"))
    assert "contradicted" in audit_row and "consistent" not in audit_row


def test_an_invalid_threshold_still_gives_no_contradiction(tmp_path):
    root = fabricate_project(tmp_path)
    _rewrite(
        root / "metrics/audit.json", epsilon_emp=3.5, verdict="inconclusive", threshold_valid=False
    )
    kinds, _ = _warnings(root)
    assert "audit-contradicted" not in kinds


@pytest.mark.parametrize(
    "relative,change",
    [
        ("metrics/calibrate.json", {"delta": 1e-3}),
        ("metrics/train.json", {"delta": 1e-3}),
        ("metrics/calibrate.json", {"sampler": "fixed"}),
        ("metrics/audit.json", {"sampler_accounted": "fixed"}),
        ("metrics/schedule.json", {"sampler": "fixed"}),
        ("artifacts/schedule/schedule.json", {"sampler": "fixed"}),
        ("metrics/calibrate.json", {"steps": 100}),
        ("metrics/schedule.json", {"num_steps": 100}),
        ("metrics/train.json", {"steps_total": 100}),
        ("artifacts/train/ledger.json", {"steps_done": 100, "total_steps": 225}),
        ("artifacts/train/ledger.json", {"epsilon_spent": 1.0}),
    ],
)
def test_any_shown_quantity_that_disagrees_with_its_record_is_a_warning(tmp_path, relative, change):
    root = fabricate_project(tmp_path)
    kinds, markdown = _warnings(root)
    assert kinds == [] and "No warnings" in markdown  # the fabricated project agrees with itself
    _rewrite(root / relative, **change)
    kinds, markdown = _warnings(root)
    assert "sources-disagree" in kinds and "No warnings" not in markdown


def test_a_consistent_run_with_a_ledger_has_no_warnings(tmp_path):
    root = fabricate_project(tmp_path)
    ledger = {
        "steps_done": 225,
        "total_steps": 225,
        "epsilon_spent": 3.0000049,
        "noise_multiplier": 1.0731,
    }
    (root / "artifacts/train/ledger.json").write_text(json.dumps(ledger))
    kinds, _ = _warnings(root)
    assert kinds == []


def test_a_broken_seal_of_the_record_or_the_schedule_is_a_warning(tmp_path):
    make_project(tmp_path, epochs=1)
    # metrics only; the real artifacts stay
    fabricate = fabricate_project(tmp_path / "other", Problems())
    for stage in ("calibrate", "schedule", "train", "verify", "audit"):
        (tmp_path / "metrics").mkdir(exist_ok=True)
        (tmp_path / f"metrics/{stage}.json").write_text(
            (fabricate / f"metrics/{stage}.json").read_text()
        )
    from dpledger.report.sealed import seal_problems

    assert seal_problems(tmp_path) == []
    header = tmp_path / "artifacts/schedule/schedule.json"
    _rewrite(header, seed=99)
    assert seal_problems(tmp_path) == [
        "artifacts/schedule/schedule.json does not match its digest (relabelled or edited)"
    ]
    record = tmp_path / "artifacts/calibration/calibration.json"
    _rewrite(record, epsilon=0.5)
    assert len(seal_problems(tmp_path)) == 2
    kinds, markdown = _warnings(tmp_path)
    assert "sources-disagree" in kinds and "differs from the record calibrate sealed" in markdown
