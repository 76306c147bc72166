"""Issue 27 defects 4 (a model that mixes the batch before its first layer) and 6 (``verify.model:
train`` on image inputs): the battery runs on 4-D image batches, and its sensitivity test catches a
model that mixes the examples of a batch, which no state check can see."""

from __future__ import annotations

import pytest
import torch
import yaml
from torch import nn

from dpledger.pipeline import run_stage
from dpledger.verify.errors import BugFoundError


class MixesTheBatch(nn.Module):
    """Subtracts the batch mean before its first layer: each example's output depends on the
    others."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, classes)

    def forward(self, x):
        x = x.flatten(1)
        return self.linear(x - x.mean(0, keepdim=True))


class PerExample(nn.Module):
    """The same model without the mixing: each example on its own."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, classes)

    def forward(self, x):
        return self.linear(x.flatten(1))


def mixes_the_batch(input_shape, num_classes):
    return MixesTheBatch(int(torch.tensor(input_shape).prod()), num_classes)


def per_example(input_shape, num_classes):
    return PerExample(int(torch.tensor(input_shape).prod()), num_classes)


def _project(tmp_path, repo_root, model: str, optimizer: str = "sgd"):
    params = yaml.safe_load((repo_root / "params.yaml").read_text())  # digits: 1×8×8 images
    params["train"]["model"] = model
    params["train"]["model_options"] = {}
    params["verify"].update({"model": "train", "optimizer": optimizer, "fail_pipeline": True})
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def test_verify_model_train_runs_on_the_default_image_model(tmp_path, repo_root):
    metrics = run_stage("verify", _project(tmp_path, repo_root, "mlp"), tmp_path)
    assert (
        metrics["passed"] is True
        and metrics["tests_failed"] == 0
        and "mlp" in metrics["battery_model"]
    )


def test_the_adam_warm_up_rows_keep_the_image_shape(repo_root):
    from dpledger.params import load_params
    from dpledger.pipeline.verify import battery_task
    from dpledger.verify.runner import BatteryConfig, Runner

    params = load_params(repo_root / "params.yaml")
    params = params.model_copy(
        update={"verify": params.verify.model_copy(update={"model": "train"})}
    )
    task = battery_task(params)
    assert task.inputs.ndim == 4
    inputs, targets = Runner(lambda *a, **k: None, task, "adam", BatteryConfig())._warmup_rows(3)
    assert inputs.shape == (15, *task.inputs.shape[1:]) and targets.shape == (
        15,
        task.targets.shape[1],
    )
    assert torch.equal(inputs[7], task.inputs[0])


def test_a_model_that_mixes_the_batch_fails_the_sensitivity_test(tmp_path, repo_root):
    with pytest.raises(BugFoundError):
        run_stage("verify", _project(tmp_path, repo_root, f"{__name__}:mixes_the_batch"), tmp_path)
    import json

    tests = {
        t["name"]: t
        for t in json.loads((tmp_path / "artifacts/verify/verify.json").read_text())["tests"]
    }
    assert tests["sensitivity"]["passed"] is False
    assert "mixes the examples of a batch" in tests["sensitivity"]["diagnosis"]


def test_the_same_model_without_mixing_passes(tmp_path, repo_root):
    metrics = run_stage(
        "verify", _project(tmp_path, repo_root, f"{__name__}:per_example"), tmp_path
    )
    assert metrics["passed"] is True
