"""The train stage's self-check in the training dtype beside float64 (issue 41, item 1), and its
spot check on the live model at a step drawn from the seed (issue 40, item 4): both refuse in one
line, both are recorded, and the spot check leaves training bit for bit as without it."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from adversarial.test_trust_inputs import small_project
from dpledger.engine import SelfCheckError
from dpledger.engine.layers import register
from dpledger.engine.layers.linear import RULE as LINEAR_RULE
from dpledger.errors import DpledgerError
from dpledger.pipeline import run_stage
from helpers.wrong_rules import make_float32_blind_model

__all__ = ["make_drifting_model", "make_float32_blind_model"]  # plugin factories of these tests

DRIFT_FACTOR = 1.2


class DriftingLinear(nn.Module):
    """A linear map whose registered rule is exact while the weight is at its initial value and 20 %
    off once training has moved it: the check before the first step passes, only a check of the
    live model later can see it."""

    def __init__(self, d: int, p: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(p, d) / math.sqrt(d))
        self.bias = nn.Parameter(torch.zeros(p))
        self.initial = self.weight.detach().clone()

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


def _factor(layer: DriftingLinear) -> float:
    at_start = torch.equal(layer.weight.detach().to(layer.initial.dtype), layer.initial)
    return 1.0 if at_start else DRIFT_FACTOR


def _drifting_grads(layer, a, b, names):
    grads = LINEAR_RULE.per_example_grads(layer, a, b, names)
    return {n: _factor(layer) * g if n == "weight" else g for n, g in grads.items()}


def _drifting_sum(layer, a, b, factors, out):
    LINEAR_RULE.clipped_sum(layer, a, b, _factor(layer) * factors, out)


register(
    DriftingLinear,
    rule=dataclasses.replace(
        LINEAR_RULE, per_example_grads=_drifting_grads, clipped_sum=_drifting_sum
    ),
)


def make_drifting_model(input_shape, num_classes):
    """A plugin model factory (train.model: test_spot_self_check:make_drifting_model)."""
    first = nn.Linear(math.prod(input_shape), 8)
    return nn.Sequential(nn.Flatten(), first, nn.Tanh(), DriftingLinear(8, num_classes))


def _spot(params) -> int:
    """The step the run's seed draws for the spot check (one epoch of 10 steps)."""
    from dpledger.pipeline.self_check import (
        spot_step,
    )  # imported here: the tests run on code without it

    return spot_step(yaml.safe_load(params.read_text())["seed"], 10)


def test_a_rule_wrong_only_in_float32_refuses_training_in_one_line(tmp_path):
    plugin = {"model": "test_spot_self_check:make_float32_blind_model", "clip_norm": 0.05}
    params, _, _ = small_project(tmp_path, train=plugin)
    pattern = r"self-check in the training dtype \(the float64 check passed\): .*float32"
    with pytest.raises(DpledgerError, match=pattern) as caught:
        run_stage("train", params, tmp_path)
    assert "\n" not in str(caught.value) and not (tmp_path / "metrics").exists()


def test_both_precisions_and_the_spot_check_are_in_the_ledger_and_metrics(tmp_path):
    params, _, _ = small_project(tmp_path)
    metrics = run_stage("train", params, tmp_path)
    record = json.loads((tmp_path / "artifacts/train/ledger.json").read_text())["self_check"]
    assert record["dtype"] == "float64" and record["training_dtype"] == "float32"
    assert record["passed"] is True and record["training_passed"] is True
    assert 0 < record["training_max_relative_error"] < 1e-5
    assert 1 <= record["spot_step"] == _spot(params) < 10 and record["spot_passed"] is True
    assert record["spot_dtype"] == "float32" and record["spot_max_relative_error"] < 1e-5
    for key in ("training_dtype", "training_max_relative_error", "spot_step", "spot_passed"):
        assert metrics[f"self_check_{key}"] == record[key]


def test_the_spot_check_changes_nothing_the_run_trains(tmp_path, monkeypatch):
    from dpledger.pipeline import train as train_stage

    (tmp_path / "with").mkdir()
    (tmp_path / "without").mkdir()
    checked, _, _ = small_project(tmp_path / "with")
    unchecked, _, _ = small_project(tmp_path / "without")
    calls = []
    real = train_stage.spot_check
    monkeypatch.setattr(train_stage, "spot_check", lambda *a: calls.append(a[4]) or real(*a))
    run_stage("train", checked, tmp_path / "with")
    assert calls == [_spot(checked)]
    monkeypatch.setattr(train_stage, "spot_step", lambda seed, steps: None)
    run_stage("train", unchecked, tmp_path / "without")
    assert calls == [_spot(checked)]  # the second run made no spot check
    models = [torch.load(root / "artifacts/train/model.pt") for root in tmp_path.iterdir()]
    assert models[0].keys() == models[1].keys()
    assert all(torch.equal(models[0][name], models[1][name]) for name in models[0])
    files = [root / "artifacts/train/checkpoint.json" for root in tmp_path.iterdir()]
    losses = [json.loads(file.read_text())["history"]["loss"] for file in files]
    assert losses[0] == losses[1] and len(losses[0]) == 10


def test_a_rule_that_goes_wrong_as_the_model_trains_stops_the_run_at_the_spot_step(tmp_path):
    plugin = {"model": "test_spot_self_check:make_drifting_model", "clip_norm": 1000.0}
    params, _, _ = small_project(tmp_path, train=plugin)
    with pytest.raises(SelfCheckError) as caught:
        run_stage("train", params, tmp_path)
    pattern = (
        rf"self-check at step {_spot(params)} on the live model \(spot check\): .*DriftingLinear"
    )
    assert re.match(pattern, str(caught.value)) and "float32" in str(caught.value)
    assert "\n" not in str(caught.value)
