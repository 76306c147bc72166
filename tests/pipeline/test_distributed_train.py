"""The train stage on 2 gloo ranks (train.processes: 2) against the same stage in one process.

Noise on, same seed: the ledger is identical and the model equal to float32 rounding of the
reordered sums (|Δ| ≤ 1e-6 + 1e-5·|value| after 16 steps); the schedule has empty, odd-sized and
one-row batches, so ranks with no rows join the all-reduce. kill -9 of one rank stops the run with a
line naming it; a rerun resumes from rank 0's checkpoint and ends with the same ledger and schedule
position as an uninterrupted run.
"""

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

from dpledger.pipeline import run_stage
from dpledger.sampling.schedule import Schedule
from helpers.train_project import TRAIN_SIZE, make_project

REPO = Path(__file__).resolve().parents[2]
# 16 steps: empty, uneven, one-row batches
SIZES = [
    0,
    5,
    1,
    64,
    63,
    0,
    70,
    2,
    33,
    64,
    65,
    3,
    60,
    61,
    7,
    64,
]


def _uneven_schedule() -> Schedule:
    rng = np.random.default_rng(3)
    batches = [rng.choice(TRAIN_SIZE, size, replace=False) for size in SIZES]
    offsets = np.concatenate([[0], np.cumsum(SIZES)])
    return Schedule(
        indices=np.concatenate(batches),
        offsets=offsets,
        padding=np.zeros(sum(SIZES), bool),
        sampler="poisson",
        sampler_params={"batch_size": 64, "epochs": 1},
        seed=3,
        dataset_size=TRAIN_SIZE,
        steps_per_epoch=22,
    )


def _outputs(root: Path) -> tuple[dict, dict]:
    """The ledger without its self-check record (that run's timing and, resumed, the resume step's
    batch: evidence about the run, not privacy bookkeeping; it must have passed) and its thread
    count, and the weights."""
    ledger = json.loads((root / "artifacts/train/ledger.json").read_text())
    assert ledger.pop("self_check")["passed"] is True
    assert ledger.pop("threads") >= 1  # each rank's share of the cores: how it ran, not privacy
    return ledger, torch.load(root / "artifacts/train/model.pt")


def _assert_same_run(root_a: Path, root_b: Path) -> None:
    (ledger_a, model_a), (ledger_b, model_b) = _outputs(root_a), _outputs(root_b)
    assert ledger_a == ledger_b
    for name in model_a:
        torch.testing.assert_close(model_b[name], model_a[name], rtol=1e-5, atol=1e-6)


def test_two_processes_train_the_single_process_model_with_the_same_noise_and_ledger(tmp_path):
    roots = {n: tmp_path / f"processes{n}" for n in (1, 2)}
    for processes, root in roots.items():
        params = make_project(
            root,
            schedule=_uneven_schedule(),
            epochs=1,
            # threads: the ledger records the count, and a spawned rank gets its share
            train={"processes": processes, "threads": 1},
        )
        metrics = run_stage("train", params, root)
        assert metrics["steps_done"] == 16
    _assert_same_run(roots[1], roots[2])
    losses = [
        np.genfromtxt(root / "plots/train/loss.csv", delimiter=",", names=True)["loss"]
        for root in roots.values()
    ]
    # summed over the ranks: the logical batch's loss
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    assert not list((roots[2] / "artifacts/train").glob(".*"))  # no temporaries left


def _rank_pids(parent: int) -> list[int]:
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    ranks = []
    for pid in map(int, children):
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"spawn_main" in command:
            ranks.append(pid)
    return sorted(ranks)


@pytest.mark.slow
def test_kill_9_of_one_rank_mid_epoch_then_rerun_ends_like_an_uninterrupted_run(tmp_path):
    settings = {"checkpoint_every": 1, "processes": 2, "model_options": {"hidden": [256]}}
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    for root in (killed, clean):
        make_project(root, epochs=1, train=settings)
    command = [sys.executable, "-m", "stages.train", "--params", "params.yaml", "--root", "."]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'lib'}:{REPO}"}
    process = subprocess.Popen(command, cwd=killed, env=env, stderr=subprocess.PIPE, text=True)
    ledger_file = killed / "artifacts/train/checkpoint.json"
    deadline = time.time() + 600  # a loaded 2-core machine takes minutes to the third step
    while time.time() < deadline and process.poll() is None:
        if ledger_file.exists() and json.loads(ledger_file.read_text())["steps_done"] >= 3:
            break
        time.sleep(0.05)
    os.kill(_rank_pids(process.pid)[-1], signal.SIGKILL)  # one rank, not the launcher
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 2 and "died (signal SIGKILL)" in stderr, stderr
    partial = json.loads(ledger_file.read_text())["steps_done"]
    assert 0 < partial < 22, partial  # mid-epoch (one epoch = 22 steps)
    subprocess.run(command, cwd=killed, env=env, check=True, stderr=subprocess.DEVNULL)
    run_stage("train", clean / "params.yaml", clean)
    (ledger_k, model_k), (ledger_c, model_c) = _outputs(killed), _outputs(clean)
    assert ledger_k == ledger_c and ledger_k["schedule_position"] == 22
    for name in model_c:
        torch.testing.assert_close(model_k[name], model_c[name], rtol=1e-5, atol=1e-6)
    assert json.loads((killed / "metrics/train.json").read_text())["resumed_from_step"] == partial
