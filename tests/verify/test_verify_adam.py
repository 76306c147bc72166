"""verify.optimizer: adam with verify.model: train on the digits MLP: the Adam warm-up raises the
rows' gradient norms above T1's C* (Adam's plateau, not clipping's end), so T3's C range now starts
above the largest per-example gradient norm along the σ = 0 run; the correct engine passes
t3_control, and the flawed trainers are still caught."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from dpledger.params import load_params
from dpledger.pipeline import run_stage
from dpledger.pipeline.verify import battery_task
from dpledger.verify.battery import run_battery
from dpledger.verify.flawed_trainers import zoo_trainer
from dpledger.verify.protocol import load_trainer
from dpledger.verify.runner import BatteryConfig, Runner

ADAM = {"optimizer": "adam", "lr": 0.01}
REPO = Path(__file__).resolve().parents[2]


def _params(tmp_path, repo_root):
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())  # digits, the mlp
    raw["train"].update(ADAM)
    raw["verify"].update({"model": "train", "optimizer": "adam", "fail_pipeline": False})
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return battery_task(load_params(_params(tmp_path_factory.mktemp("adam"), REPO)))


def test_the_engine_passes_t3_control_under_adam_on_the_digits_model(tmp_path, repo_root):
    metrics = run_stage("verify", _params(tmp_path, repo_root), tmp_path)
    details = json.loads((tmp_path / "artifacts/verify/verify.json").read_text())
    assert metrics["passed"], details["verdict"]
    tests = {test["name"]: test for test in details["tests"]}
    t3, control = tests["t3_noise_calibration"]["details"], tests["t3_control"]
    assert control["statistic"] == 0.0  # the same model at every C, not merely within tolerance
    # The old range [C*, 10C*] clipped, so t3_control failed the correct engine:
    assert t3["largest_gradient_norm"] > t3["c_star"]
    assert control["details"]["clip_norms"][0] == pytest.approx(1.5 * t3["largest_gradient_norm"])


def test_the_largest_gradient_norm_is_where_clipping_starts(task):
    """Whatever the measurement: just above it a run equals the unclipped one, below it not."""
    runner = Runner(load_trainer("reference"), task, "adam", BatteryConfig())
    inputs, targets = task.ordinary_rows(0, 48)
    settings = dict(noise_multiplier=0.0, batch_size=16, lr=0.01, seed=0)
    largest = runner.largest_gradient_norm(inputs, targets, clip_norm=1e6, **settings)
    unclipped = runner.parameters_after(inputs, targets, clip_norm=1e6, **settings)
    above = runner.parameters_after(inputs, targets, clip_norm=1.01 * largest, **settings)
    below = runner.parameters_after(inputs, targets, clip_norm=0.99 * largest, **settings)
    assert torch.equal(above, unclipped) and not torch.equal(below, unclipped)
    initial_norms = task.ordinary_norms.max()
    # The warm-up raised them: the premise the old range relied on is false.
    assert largest > 2 * initial_norms


@pytest.mark.parametrize(
    "name, caught",
    [
        ("no_clipping", "t1_no_clipping"),
        ("uncalibrated_noise", "t3_noise_calibration"),
        ("fixed_noise_seed", "t3_noise_calibration"),
    ],
)
def test_flawed_trainers_are_still_caught_under_adam_on_the_digits_model(task, name, caught):
    settings = dict(seed=0, optimizer="adam", progress=False, task=task)
    result = run_battery(zoo_trainer(name), trainer_name=name, **settings)
    assert caught in result.failed_tests, result.findings
    assert "t3_control" not in result.failed_tests  # no flaw here clips beyond the gradients
