"""A resumed run is bit-identical to the uninterrupted one whatever the thread count of the process
that resumes it: the ledger records the count the steps ran at and the resume takes it back.

The count matters: a step's CPU reductions and MKL's products round differently at 1 and 2 threads
(and MKL's dynamic threading, on in a process that never set a count, differs again), which is why
the kill-9 test's resumed model once differed from the uninterrupted run's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dpledger.pipeline import run_stage
from helpers.train_project import make_project

SETTINGS = {"checkpoint_every": 1}


class _Killed(Exception):
    pass


def _model(root: Path) -> dict[str, torch.Tensor]:
    return torch.load(root / "artifacts/train/model.pt")


def _differs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    return [name for name in a if not torch.equal(a[name], b[name])]


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_a_run_resumed_at_another_thread_count_ends_bit_identical(
    tmp_path, monkeypatch, restore_threads
):
    from dpledger.pipeline import train as train_stage

    roots = {name: tmp_path / name for name in ("killed", "two", "one")}
    for name, root in roots.items():
        make_project(root, epochs=1, train={**SETTINGS, "threads": 1 if name == "one" else 2})
    real_save = train_stage.save_checkpoint

    def save_then_die(path, ledger, *args, **kwargs):
        real_save(path, ledger, *args, **kwargs)
        if ledger.steps_done == 4:
            raise _Killed

    with monkeypatch.context() as patch:
        patch.setattr(train_stage, "save_checkpoint", save_then_die)
        with pytest.raises(_Killed):
            run_stage("train", roots["killed"] / "params.yaml", roots["killed"])
    ledger = json.loads((roots["killed"] / "artifacts/train/checkpoint.json").read_text())
    assert ledger["threads"] == 2
    params = (roots["killed"] / "params.yaml").read_text().replace("threads: 2", "threads: null")
    (roots["killed"] / "params.yaml").write_text(params)
    torch.set_num_threads(1)  # the resuming process's own count differs
    resumed = run_stage("train", roots["killed"] / "params.yaml", roots["killed"])
    assert resumed["resumed_from_step"] == 4
    assert torch.get_num_threads() == 1  # given back after the run
    for name in ("two", "one"):
        run_stage("train", roots[name] / "params.yaml", roots[name])
    assert _differs(_model(roots["killed"]), _model(roots["two"])) == []
    assert _differs(_model(roots["two"]), _model(roots["one"])) != []  # the count does matter
