"""Issue 21 defects 1, 2, 5 (checkpoint), 7 and 8: the train stage verifies what it reads and loads
nothing executable."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dpledger.errors import DpledgerError
from dpledger.pipeline import run_stage
from dpledger.sampling.schedule import Schedule
from helpers.train_project import make_project

CALIBRATION = "artifacts/calibration/calibration.json"


def _edit_json(path, **changes):
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw))


def test_an_edited_sigma_is_refused_with_one_line(tmp_path):
    params = make_project(tmp_path, epochs=1, noise_multiplier=1.244)
    _edit_json(tmp_path / CALIBRATION, noise_multiplier=0.3)
    with pytest.raises(DpledgerError) as refused:
        run_stage("train", params, tmp_path)
    assert "\n" not in str(refused.value) and "calibrat" in str(refused.value)
    assert not (tmp_path / "artifacts/train").exists()


def test_an_edited_sigma_with_a_resealed_record_is_refused_by_recomputing_the_claim(tmp_path):
    from dataclasses import replace

    from dpledger.accounting.record import CalibrationRecord
    from dpledger.seals import seal_record

    params = make_project(tmp_path, epochs=1, noise_multiplier=1.244)
    record = CalibrationRecord.load(tmp_path / CALIBRATION)
    seal_record(
        tmp_path / "artifacts/calibration",
        replace(record, description=record.description.with_noise(0.3)),
    )
    with pytest.raises(DpledgerError, match=r"gives ε = "):
        run_stage("train", params, tmp_path)


def test_an_edited_schedule_is_refused(tmp_path):
    params = make_project(tmp_path, epochs=1)
    folder = tmp_path / "artifacts/schedule"
    with np.load(folder / "schedule.npz") as arrays:
        indices, offsets, padding = arrays["indices"].copy(), arrays["offsets"], arrays["padding"]
    indices[offsets[:-1]] = 0  # example 0 first in every batch
    np.savez_compressed(folder / "schedule.npz", indices=indices, offsets=offsets, padding=padding)
    with pytest.raises(DpledgerError, match="schedule.npz does not match"):
        run_stage("train", params, tmp_path)
    with pytest.raises(DpledgerError, match="schedule.npz does not match"):
        run_stage("audit", params, tmp_path)


def test_metrics_and_ledger_record_the_sigma_used(tmp_path):
    params, _, _ = small_project(tmp_path, noise_multiplier=1.244)
    metrics = run_stage("train", params, tmp_path)
    ledger = json.loads((tmp_path / "artifacts/train/ledger.json").read_text())
    assert metrics["noise_multiplier"] == ledger["noise_multiplier"] == 1.244
    assert metrics["nonfinite_examples"] == ledger["nonfinite_examples"] == 0
    assert metrics["loss_diverged"] is False


class _Payload:
    def __reduce__(self):
        return (open, ("PAYLOAD_RAN", "w"))


def test_a_crafted_pickle_checkpoint_runs_nothing(tmp_path, monkeypatch):
    params, _, _ = small_project(tmp_path)
    run_stage("train", params, tmp_path)
    ledger_file = tmp_path / "artifacts/train/checkpoint.json"
    checkpoint = ledger_file.with_name(json.loads(ledger_file.read_text())["weights_file"])
    monkeypatch.chdir(tmp_path)
    torch.save({"model": _Payload(), "optimizer": {}}, checkpoint)
    import hashlib

    _edit_json(ledger_file, weights_sha256=hashlib.sha256(checkpoint.read_bytes()).hexdigest())
    with pytest.raises(DpledgerError) as refused:
        run_stage("train", params, tmp_path)
    assert "\n" not in str(refused.value) and "delete" in str(refused.value)
    assert not (tmp_path / "PAYLOAD_RAN").exists()
    # without the matching digest the file is never opened: training starts over
    pickle_file = checkpoint.read_bytes()
    checkpoint.write_bytes(pickle_file + b"x")
    assert run_stage("train", params, tmp_path)["resumed_from_step"] == 0
    assert not (tmp_path / "PAYLOAD_RAN").exists()


def test_a_truncated_checkpoint_restarts_from_step_0_and_says_so(tmp_path, capsys):
    params, _, _ = small_project(tmp_path, train={"checkpoint_every": 5})
    run_stage("train", params, tmp_path)
    ledger_file = tmp_path / "artifacts/train/checkpoint.json"
    checkpoint = ledger_file.with_name(json.loads(ledger_file.read_text())["weights_file"])
    # older ones gone
    assert [p.name for p in ledger_file.parent.glob("checkpoint-step*.pt")] == [checkpoint.name]
    checkpoint.write_bytes(checkpoint.read_bytes()[:100])
    assert run_stage("train", params, tmp_path)["resumed_from_step"] == 0
    assert "starting over from step 0" in capsys.readouterr().err
    # a ledger naming a file outside its folder
    _edit_json(ledger_file, weights_file="../../params.yaml")
    assert run_stage("train", params, tmp_path)["resumed_from_step"] == 0
    assert "cannot be read" in capsys.readouterr().err
    (tmp_path / "artifacts/train/checkpoint.json").write_text("{not json")
    assert run_stage("train", params, tmp_path)["resumed_from_step"] == 0


def test_temporaries_of_an_interrupted_write_are_removed(tmp_path):
    params, _, _ = small_project(tmp_path)
    stale = tmp_path / "artifacts/train/.checkpoint-step5.pt.abc123.tmp"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"half")
    run_stage("train", params, tmp_path)
    assert not stale.exists()
    assert not list((tmp_path / "artifacts/train").glob(".*"))


def small_project(root, noise_multiplier: float = 1.0, train: dict | None = None):
    """A 200-example npz project (160 training examples, batch 16, one epoch of 10 steps): fast to
    train."""
    import yaml

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(200, 8)).astype(np.float32), rng.integers(0, 3, 200)
    np.savez(root / "data.npz", x=x, y=y)
    params = make_project(
        root, epochs=1, batch_size=16, schedule=_schedule(160, 16, 1), train=train
    )
    raw = yaml.safe_load(params.read_text())
    raw["data"] = {"name": "npz", "path": str(root / "data.npz"), "test_fraction": 0.2}
    params.write_text(yaml.safe_dump(raw))
    _retarget_record(root, 160, noise_multiplier)
    return params, x, y


def test_changed_data_restarts_training_from_step_0(tmp_path):
    params, x, y = small_project(tmp_path)
    assert run_stage("train", params, tmp_path)["resumed_from_step"] == 0
    assert run_stage("train", params, tmp_path)["resumed_from_step"] == 10
    np.savez(tmp_path / "data.npz", x=x, y=(y + 1) % 3)  # same path, new labels
    assert run_stage("train", params, tmp_path)["resumed_from_step"] == 0


def _schedule(n: int, batch_size: int, epochs: int) -> Schedule:
    from dpledger.sampling import build_schedule

    return build_schedule("poisson", dataset_size=n, batch_size=batch_size, epochs=epochs, seed=3)


def _retarget_record(root, dataset_size, noise_multiplier):
    from dpledger.accounting.record import CalibrationRecord
    from dpledger.seals import seal_record
    from helpers.train_project import genuine_record

    old = CalibrationRecord.load(root / CALIBRATION)
    seal_record(
        root / "artifacts/calibration",
        genuine_record(
            noise_multiplier=noise_multiplier,
            sampler="poisson",
            steps=old.steps,
            batch_size=old.batch_size,
            dataset_size=dataset_size,
            epochs=old.epochs,
        ),
    )
