"""The train stage: outputs, ε ledger, sampler guard, and resuming a killed run to the same end
state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dpledger.accounting.description import describe
from dpledger.accounting.record import CalibrationRecord
from dpledger.errors import DpledgerError, SamplerMismatchError
from dpledger.pipeline import run_stage
from dpledger.pipeline.train import epsilon_spent
from dpledger.sampling.schedule import Schedule
from dpledger.seals import seal_record
from helpers.train_project import TRAIN_SIZE, genuine_record, make_project, poisson_schedule

REPO = Path(__file__).resolve().parents[2]


def _state(root: Path) -> tuple[dict, dict]:
    ledger = json.loads((root / "artifacts/train/ledger.json").read_text())
    return ledger, torch.load(root / "artifacts/train/model.pt")


def test_stage_trains_and_writes_metrics_plots_and_ledger(tmp_path):
    params = make_project(tmp_path, epochs=3)
    metrics = run_stage("train", params, tmp_path)
    flat = json.loads((tmp_path / "metrics/train.json").read_text())
    for key in (
        "test_accuracy",
        "final_train_loss",
        "epsilon_spent",
        "steps_done",
        "sampler_accounted",
        "sampler_used",
        "sampler_mismatch",
    ):
        assert key in flat
    assert all(not isinstance(v, (dict, list)) for v in flat.values())
    timing = json.loads((tmp_path / "timing/train.json").read_text())  # untracked: varies by run
    assert {"throughput_examples_per_s", "wall_time_s"} <= set(timing) and not set(timing) & set(
        flat
    )
    assert metrics["test_accuracy"] > 0.8
    claimed = json.loads((tmp_path / "artifacts/calibration/calibration.json").read_text())[
        "epsilon"
    ]
    assert metrics["steps_done"] == 66 and metrics["epsilon_spent"] == pytest.approx(claimed)
    assert metrics["sampler_mismatch"] is False
    ledger, _ = _state(tmp_path)
    assert ledger["steps_done"] == ledger["schedule_position"] == 66
    for name in ("loss.csv", "accuracy.csv", "loss.png", "accuracy.png"):
        assert (tmp_path / "plots/train" / name).stat().st_size > 0
    losses = np.genfromtxt(tmp_path / "plots/train/loss.csv", delimiter=",", names=True)
    assert len(losses) == 66 and losses["loss"][-5:].mean() < losses["loss"][:5].mean()


def test_epsilon_spent_reads_the_curve_pessimistically():
    description = describe(
        sampler="poisson", noise_multiplier=1.0, dataset_size=100, batch_size=10, epochs=10
    )
    record = CalibrationRecord(
        description=description,
        epsilon=3.0,
        delta=1e-5,
        accountant="pld",
        assumptions=[],
        epsilon_curve=[(10, 0.5), (50, 1.5), (90, 2.5)],
    )
    assert epsilon_spent(record, 0) == 0.0
    assert epsilon_spent(record, 10) == 0.5
    assert epsilon_spent(record, 11) == 1.5  # not interpolated down
    assert epsilon_spent(record, 91) == 3.0  # past the curve: the full claim


def test_sampler_mismatch_stops_before_writing_unless_allowed(tmp_path):
    params = make_project(tmp_path, sampler="shuffle", accounted="poisson", epochs=1)
    with pytest.raises(SamplerMismatchError, match="allow_sampler_mismatch"):
        run_stage("train", params, tmp_path)
    assert not (tmp_path / "artifacts/train").exists() and not (tmp_path / "metrics").exists()
    params = make_project(
        tmp_path,
        sampler="shuffle",
        accounted="poisson",
        epochs=1,
        train={"allow_sampler_mismatch": True},
    )
    assert run_stage("train", params, tmp_path)["sampler_mismatch"] is True


def test_schedule_longer_than_the_accounted_steps_is_refused(tmp_path):
    params = make_project(tmp_path, epochs=1)
    record = CalibrationRecord.load(tmp_path / "artifacts/calibration/calibration.json")
    shorter = genuine_record(
        noise_multiplier=record.noise_multiplier,
        sampler="poisson",
        steps=record.steps - 1,
        batch_size=record.batch_size,
        dataset_size=record.dataset_size,
        epochs=record.epochs,
    )
    seal_record(tmp_path / "artifacts/calibration", shorter)
    with pytest.raises(DpledgerError, match="accounted for"):
        run_stage("train", params, tmp_path)


@pytest.mark.parametrize("batch_size,epochs", [(128, 4), (96, 2)])
def test_schedule_built_for_other_sizes_is_refused(tmp_path, batch_size, epochs):
    # calibrated for B = 64, 2 epochs (44 steps); B = 128 over 4 epochs is also 44 steps but q is
    # twice the accounted one (and the engine divided its sum by 64); B = 96 over 2 epochs fits in
    # 30 steps
    params = make_project(tmp_path, epochs=2, batch_size=64)
    other = poisson_schedule(TRAIN_SIZE, batch_size, epochs, seed=7)
    other.save(tmp_path / "artifacts/schedule")
    with pytest.raises(DpledgerError, match=f"batch_size {batch_size} \\(accounted 64\\)"):
        run_stage("train", params, tmp_path)
    assert not (tmp_path / "artifacts/train").exists()


def test_pad_truncate_schedule_normalises_by_fixed_batch_size_and_ignores_padding(tmp_path):
    rng = np.random.default_rng(0)
    steps, size = 45, 32  # one epoch of b = ⌈1438 / 32⌉ bins
    indices = rng.integers(0, TRAIN_SIZE, steps * size)
    padding = rng.random(steps * size) < 0.2
    schedule = Schedule(
        indices=indices,
        offsets=np.arange(0, steps * size + 1, size),
        padding=padding,
        sampler="balls-in-bins",
        sampler_params={"batch_size": size, "epochs": 1, "pad_truncate": True},
        seed=0,
        dataset_size=TRAIN_SIZE,
        steps_per_epoch=steps,
        normalizer=size,
    )
    params = make_project(
        tmp_path, schedule=schedule, accounted="balls-in-bins", batch_size=size, epochs=1
    )
    assert run_stage("train", params, tmp_path)["steps_done"] == steps


def test_changed_config_restarts_instead_of_resuming(tmp_path):
    params = make_project(tmp_path, epochs=1)
    run_stage("train", params, tmp_path)
    # finished run: nothing left to do
    assert run_stage("train", params, tmp_path)["resumed_from_step"] == 22
    params = make_project(tmp_path, epochs=1, train={"lr": 0.25})
    assert run_stage("train", params, tmp_path)["resumed_from_step"] == 0


def test_changed_training_code_restarts_instead_of_resuming(tmp_path, monkeypatch):
    from dpledger.pipeline import train_prepare

    code = tmp_path / "engine_source.py"
    code.write_text("version = 1\n")
    monkeypatch.setattr(train_prepare, "training_code", lambda: [code])
    params = make_project(tmp_path, epochs=1)
    run_stage("train", params, tmp_path)
    assert run_stage("train", params, tmp_path)["resumed_from_step"] == 22
    code.write_text("version = 2\n")
    assert run_stage("train", params, tmp_path)["resumed_from_step"] == 0


def test_training_code_covers_the_engine_and_the_stage():
    from dpledger.pipeline import train_prepare

    names = {path.as_posix() for path in train_prepare.training_code()}
    assert any(name.endswith("engine/bk.py") for name in names)
    assert any(name.endswith("pipeline/train.py") for name in names)


@pytest.mark.slow
def test_kill_9_mid_epoch_then_rerun_ends_like_an_uninterrupted_run(tmp_path):
    settings = {"checkpoint_every": 1, "model_options": {"hidden": [512, 512]}}
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    for root in (killed, clean):
        root.mkdir()
        make_project(root, epochs=1, train=settings)
    command = [sys.executable, "-m", "stages.train", "--params", "params.yaml", "--root", "."]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'lib'}{os.pathsep}{REPO}"}
    process = subprocess.Popen(command, cwd=killed, env=env, stderr=subprocess.DEVNULL)
    ledger_file = killed / "artifacts/train/checkpoint.json"
    deadline = time.time() + 600  # a loaded 2-core machine takes minutes to the third step
    while time.time() < deadline and process.poll() is None:
        if ledger_file.exists() and json.loads(ledger_file.read_text())["steps_done"] >= 3:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    partial = json.loads(ledger_file.read_text())["steps_done"]
    assert 0 < partial < 22, partial  # mid-epoch (one epoch = 22 steps)
    subprocess.run(command, cwd=killed, env=env, check=True, stderr=subprocess.DEVNULL)
    run_stage("train", clean / "params.yaml", clean)
    (ledger_k, model_k), (ledger_c, model_c) = _state(killed), _state(clean)
    assert ledger_k["steps_done"] == ledger_c["steps_done"] == 22
    assert ledger_k["schedule_position"] == ledger_c["schedule_position"]
    assert ledger_k["epsilon_spent"] == ledger_c["epsilon_spent"]
    for name in model_c:
        assert torch.equal(model_k[name], model_c[name]), name
    assert json.loads((killed / "metrics/train.json").read_text())["resumed_from_step"] == partial


def test_the_engine_self_check_runs_before_training_and_is_recorded(tmp_path):
    params = make_project(tmp_path, epochs=1)
    metrics = run_stage("train", params, tmp_path)
    ledger, _ = _state(tmp_path)
    record = ledger["self_check"]
    assert record["passed"] is True and record["dtype"] == "float64" and record["examples"] == 4
    assert record["max_relative_error"] < 1e-12
    assert record["parameters_checked"] == record["parameters_trainable"]
    assert metrics["self_check_ran"] is True and metrics["self_check_passed"] is True
    assert metrics["self_check_max_relative_error"] == record["max_relative_error"]
    assert 0 < metrics["self_check_seconds"] < metrics["wall_time_s"]


def test_a_wrong_layer_rule_refuses_training_in_one_line_and_writes_nothing(tmp_path):
    model = {"model": "helpers.wrong_rules:make_nudged_model", "clip_norm": 1000.0}
    params = make_project(tmp_path, epochs=1, train=model)
    with pytest.raises(DpledgerError, match=r"self-check: .*NudgedLinear") as caught:
        run_stage("train", params, tmp_path)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "artifacts/train").exists() and not (tmp_path / "metrics").exists()


def test_self_check_off_trains_and_says_it_did_not_run(tmp_path):
    params = make_project(tmp_path, epochs=1, train={"self_check": False})
    metrics = run_stage("train", params, tmp_path)
    assert metrics["self_check_ran"] is False and "self_check_passed" not in metrics
    assert _state(tmp_path)[0]["self_check"] == {}
