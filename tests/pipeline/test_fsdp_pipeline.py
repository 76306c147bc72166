"""The train stage with ``train.sharding: fsdp`` on 2 gloo ranks against the same stage in one
process (sharding none), with AdamW.

Noise on, same seed: the ledger is identical and the model equal to float32 rounding (the
tolerance of the data-parallel test, tests/pipeline/test_distributed_train.py); the schedule has
empty, odd-sized and one-row batches, so the ranks' shares are padded to equal sizes. The checkpoint
holds one process's full state, so the sharded run's last checkpoint equals the single process's;
what the sharded engine cannot run is refused before anything is written, naming the keys.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from test_distributed_train import REPO, _assert_same_run, _rank_pids, _uneven_schedule

from dpledger.errors import DpledgerError
from dpledger.pipeline import run_stage
from helpers.train_project import make_project

# threads: the ledger records the count (a spawned rank gets its share of the machine's)
ADAMW = {
    "optimizer": "adamw",
    "lr": 0.01,
    "weight_decay": 0.01,
    "checkpoint_every": 5,
    "threads": 1,
}


def _project(root: Path, train: dict, one_run: bool = False, **options) -> Path:
    params = make_project(root, schedule=_uneven_schedule(), epochs=1, train=train, **options)
    values = yaml.safe_load(params.read_text())
    values["audit"]["one_run"]["enabled"] = one_run
    params.write_text(yaml.safe_dump(values))
    return params


def _checkpoint(root: Path) -> dict:
    (weights,) = (root / "artifacts/train").glob("checkpoint-*.pt")
    return torch.load(weights, weights_only=False)


@pytest.mark.slow
def test_fsdp_on_two_processes_trains_the_single_process_model_and_ledger(tmp_path):
    single, sharded = tmp_path / "single", tmp_path / "fsdp"
    run_stage("train", _project(single, ADAMW), single)
    placed = {**ADAMW, "processes": 2, "sharding": "fsdp"}
    metrics = run_stage("train", _project(sharded, placed), sharded)
    assert metrics["steps_done"] == 16 and metrics["sharding"] == "fsdp" and metrics["ranks"] == 2
    assert len(metrics["peak_memory_mib_per_rank"]) == 2
    assert all(m > 0 for m in metrics["peak_memory_mib_per_rank"])
    assert metrics["self_check_ran"] and metrics["self_check_passed"]  # on the unsharded model
    tracked = json.loads((sharded / "metrics/train.json").read_text())
    assert tracked["sharding"] == "fsdp" and tracked["ranks"] == 2
    timing = json.loads((sharded / "timing/train.json").read_text())  # varies by machine
    assert timing["peak_memory_mib_per_rank"] == metrics["peak_memory_mib_per_rank"]
    _assert_same_run(single, sharded)
    saved_a, saved_b = _checkpoint(single), _checkpoint(sharded)
    for name, value in saved_a["model"].items():
        torch.testing.assert_close(saved_b["model"][name], value, rtol=1e-5, atol=1e-6)
    state_a, state_b = saved_a["optimizer"]["state"], saved_b["optimizer"]["state"]
    assert state_a.keys() == state_b.keys()
    for key, moments in state_a.items():
        for name, value in moments.items():  # step, exp_avg, exp_avg_sq: whole, not shards
            torch.testing.assert_close(state_b[key][name].cpu(), value.cpu(), rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize(
    ("train", "options", "one_run", "keys"),
    [
        (
            {"sharding": "fsdp", "processes": 2},
            {"mechanism": "banded", "mechanism_params": {"bands": 2}},
            False,
            "calibrate.mechanism",
        ),
        ({"sharding": "fsdp"}, {}, False, "train.sharding: fsdp needs several ranks"),
    ],
)
def test_what_the_sharded_engine_cannot_run_is_refused_naming_the_keys(
    tmp_path, train, options, one_run, keys
):
    params = _project(tmp_path, train, one_run=one_run, **options)
    with pytest.raises(DpledgerError) as refused:
        run_stage("train", params, tmp_path)
    message = str(refused.value)
    assert keys in message and "\n" not in message, message
    assert not (tmp_path / "artifacts/train/model.pt").exists()
    assert not (tmp_path / "metrics/train.json").exists()


@pytest.mark.slow
def test_a_killed_sharded_run_resumes_with_its_adam_state_and_ends_like_one_process(tmp_path):
    """The checkpoint's full AdamW state is cut back into the shards on resume: a sharded run
    killed mid-way and rerun ends with the uninterrupted single process's ledger and model."""
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    settings = {**ADAMW, "checkpoint_every": 1}
    _project(killed, {**settings, "processes": 2, "sharding": "fsdp"})
    run_stage("train", _project(clean, settings), clean)
    command = [sys.executable, "-m", "stages.train", "--params", "params.yaml", "--root", "."]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'lib'}:{REPO}"}
    process = subprocess.Popen(command, cwd=killed, env=env, stderr=subprocess.PIPE, text=True)
    ledger_file = killed / "artifacts/train/checkpoint.json"
    deadline = time.time() + 600
    while time.time() < deadline and process.poll() is None:
        if ledger_file.exists() and json.loads(ledger_file.read_text())["steps_done"] >= 6:
            break
        time.sleep(0.05)
    os.kill(_rank_pids(process.pid)[-1], signal.SIGKILL)
    process.communicate(timeout=300)
    partial = json.loads(ledger_file.read_text())["steps_done"]
    assert 0 < partial < 16, partial
    subprocess.run(command, cwd=killed, env=env, check=True, stderr=subprocess.DEVNULL)
    _assert_same_run(clean, killed)
    assert json.loads((killed / "metrics/train.json").read_text())["resumed_from_step"] == partial


@pytest.mark.slow
def test_lora_under_fsdp_trains_and_publishes_the_single_process_adapter(tmp_path):
    """Issue 38: ``train.lora`` with ``train.sharding: fsdp`` through the pipeline (a sharded frozen
    base, trained adapters): the state guard digests each rank's shard of the frozen base (it
    refused a DTensor before), and the run equals one process's, its adapter published."""
    from helpers.byo_helpers import lm_project, tiny_lm

    lm = tiny_lm(tmp_path / "lm")
    roots = {"single": {}, "fsdp": {"processes": 2, "sharding": "fsdp"}}
    for name, placed in roots.items():
        root = tmp_path / name
        root.mkdir()
        params = lm_project(root, lm, lora={"rank": 2, "alpha": 4}, threads=1, **placed)
        values = yaml.safe_load(params.read_text())
        values["audit"]["one_run"]["enabled"] = False
        params.write_text(yaml.safe_dump(values))
        metrics = run_stage("train", params, root)
        assert metrics["sharding"] == ("fsdp" if placed else "none")
    _assert_same_run(tmp_path / "single", tmp_path / "fsdp")
    published = tmp_path / "fsdp/artifacts/model"
    assert {"adapter_config.json", "adapter_model.safetensors", "privacy.json"} <= {
        p.name for p in published.iterdir()
    }


@pytest.mark.slow
def test_the_one_run_audits_canaries_under_fsdp_record_what_one_process_records(tmp_path):
    """Issue 38: the canaries watch coordinates of the whole released sum; under sharding each rank
    gathers those its shards hold and one all-reduce sums them. The record equals the single
    process's (the same noise key and seed: the same canaries, noise and clipped sums)."""
    import numpy as np

    single, sharded = tmp_path / "single", tmp_path / "fsdp"
    run_stage("train", _project(single, ADAMW, one_run=True), single)
    placed = {**ADAMW, "processes": 2, "sharding": "fsdp"}
    run_stage("train", _project(sharded, placed, one_run=True), sharded)
    records = [np.load(root / "artifacts/train/canaries.npz") for root in (single, sharded)]
    assert records[0]["raw"].shape == records[1]["raw"].shape and records[0]["raw"].size
    assert np.array_equal(records[0]["coordinates"], records[1]["coordinates"])
    for name in ("raw", "real"):
        assert not np.isnan(records[1][name]).any()
        np.testing.assert_allclose(records[1][name], records[0][name], rtol=1e-4, atol=1e-5)
    _assert_same_run(single, sharded)
