"""The train stage keeps each module's mode through evaluation, and a resume without the self-check
drops the earlier run's record (issue 41, item 7)."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from torch import nn

from adversarial.test_trust_inputs import small_project
from dpledger.models import Task
from dpledger.models.utility import predictions
from dpledger.pipeline import run_stage


class _Killed(Exception):
    pass


def _frozen_batchnorm() -> nn.Module:
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    model[1].eval().requires_grad_(False)
    return model


def test_evaluation_puts_every_module_back_in_its_own_mode():
    model, x = _frozen_batchnorm(), torch.randn(6, 8)
    Task("classification").evaluate(model, x, torch.randint(0, 3, (6,)))
    predictions(Task("classification"), model, x)
    assert model.training and model[0].training and not model[1].training


def test_a_resume_without_the_self_check_drops_the_earlier_record(tmp_path, monkeypatch):
    from dpledger.pipeline import train as train_stage

    params, _, _ = small_project(tmp_path, train={"checkpoint_every": 1})
    real_save = train_stage.save_checkpoint

    def save_then_die(path, ledger, *args, **kwargs):
        real_save(path, ledger, *args, **kwargs)
        if ledger.steps_done == 4:
            raise _Killed

    with monkeypatch.context() as patch:
        patch.setattr(train_stage, "save_checkpoint", save_then_die)
        with pytest.raises(_Killed):
            run_stage("train", params, tmp_path)
    checkpoint = json.loads((tmp_path / "artifacts/train/checkpoint.json").read_text())
    assert checkpoint["self_check"]["passed"] is True  # the first run was checked
    raw = yaml.safe_load(params.read_text())
    raw["train"]["self_check"] = False
    params.write_text(yaml.safe_dump(raw))
    metrics = run_stage("train", params, tmp_path)
    assert metrics["resumed_from_step"] == 4 and metrics["self_check_ran"] is False
    ledger = json.loads((tmp_path / "artifacts/train/ledger.json").read_text())
    assert ledger["self_check"] == {}
