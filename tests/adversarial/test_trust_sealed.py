"""Issue 27 defects 1 and 2: every field a claim depends on is sealed (the schedule's sampler
fields, the checkpoint ledger's steps_done)."""

from __future__ import annotations

import json

import pytest
from test_trust_inputs import _edit_json, small_project

from dpledger.errors import DpledgerError
from dpledger.pipeline import run_stage
from helpers.train_project import make_project


@pytest.mark.parametrize(
    "change",
    [
        {"sampler": "poisson"},
        {"seed": 8},
        {"steps_per_epoch": 1},
        {"sampler_params": {"batch_size": 2}},
    ],
)
def test_a_relabelled_schedule_header_is_refused_by_train_and_audit(tmp_path, change):
    params = make_project(tmp_path, epochs=1, sampler="shuffle")
    header = tmp_path / "artifacts/schedule/schedule.json"
    raw = json.loads(header.read_text())
    assert raw["sampler"] == "shuffle" and "sha256" in raw["metadata"]
    _edit_json(header, **change)
    for stage in ("train", "audit"):
        with pytest.raises(DpledgerError) as refused:
            run_stage(stage, params, tmp_path)
        assert "\n" not in str(
            refused.value
        ) and "does not match the digest in schedule.json" in str(refused.value)
    assert not (tmp_path / "artifacts/train").exists()


def test_an_unedited_schedule_header_is_accepted(tmp_path):
    params = make_project(tmp_path, epochs=1)
    assert run_stage("train", params, tmp_path)["steps_done"] > 0


def test_a_rewound_ledger_is_refused_not_resumed(tmp_path):
    params, _, _ = small_project(tmp_path)
    assert run_stage("train", params, tmp_path)["steps_done"] == 10
    ledger_file = tmp_path / "artifacts/train/checkpoint.json"
    weights = ledger_file.with_name(json.loads(ledger_file.read_text())["weights_file"])
    before = weights.read_bytes()
    # still names checkpoint-step10.pt, whose digest is intact
    _edit_json(ledger_file, steps_done=4)
    with pytest.raises(DpledgerError) as refused:
        run_stage("train", params, tmp_path)
    message = str(refused.value)
    assert "\n" not in message and "steps_done = 4" in message and "steps_done = 10" in message
    assert weights.read_bytes() == before  # nothing trained, nothing written


@pytest.mark.parametrize(
    "field,value", [("epsilon_spent", 0.01), ("total_steps", 3), ("nonfinite_examples", 0)]
)
def test_any_other_edited_ledger_field_is_refused(tmp_path, field, value):
    params, _, _ = small_project(tmp_path)
    run_stage("train", params, tmp_path)
    ledger_file = tmp_path / "artifacts/train/checkpoint.json"
    raw = json.loads(ledger_file.read_text())
    _edit_json(ledger_file, **{field: value if raw[field] != value else value + 1})
    with pytest.raises(DpledgerError, match=field):
        run_stage("train", params, tmp_path)


def test_a_rewound_ledger_with_a_renamed_weights_file_is_refused(tmp_path):
    params, _, _ = small_project(tmp_path)
    run_stage("train", params, tmp_path)
    ledger_file = tmp_path / "artifacts/train/checkpoint.json"
    weights = ledger_file.with_name(json.loads(ledger_file.read_text())["weights_file"])
    weights.rename(weights.with_name("checkpoint-step4.pt"))
    _edit_json(ledger_file, steps_done=4, weights_file="checkpoint-step4.pt")
    with pytest.raises(DpledgerError, match="steps_done = 4"):
        run_stage("train", params, tmp_path)
