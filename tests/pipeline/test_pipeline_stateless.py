"""The statelessness check before training: a model that carries a cross-batch memory in a plain
attribute (MoCo-style) is refused with one line; ordinary models (dropout, BatchNorm in train mode)
pass, and the check leaves their buffers and the RNG as they were."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpledger.engine import SelfCheckError
from dpledger.models.tasks import Task
from dpledger.pipeline.self_check import check_fresh_copy, check_stateless

TASK = Task("classification")


class MemoryModel(nn.Module):
    """Mixes the mean feature of earlier batches (a plain Python attribute) into the logits."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 3)
        self.memory: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.linear(x)
        mixed = features + (torch.stack(self.memory).mean(0) if self.memory else 0.0)
        self.memory.append(features.detach().mean(0))
        return mixed


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(6, 8, generator=generator), torch.tensor([0, 1, 2, 0, 1, 2])


def test_a_cross_batch_memory_is_refused_in_one_line():
    x, y = _batch()
    with pytest.raises(SelfCheckError, match="not stateless") as error:
        check_stateless(MemoryModel(), TASK, x, y)
    assert "\n" not in str(error.value)


def test_dropout_and_batchnorm_in_train_mode_pass_and_nothing_changes():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.5), nn.Linear(16, 3))
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.random.get_rng_state()
    check_stateless(model, TASK, *_batch())
    assert torch.equal(torch.random.get_rng_state(), rng)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "buffers must be restored"


class FillingMemory(nn.Module):
    """Stores the mean logits of each training forward of a large batch (with gradients, B ≥ 9) in a
    plain attribute and adds their mean to every later output. Nothing before the first step sees it
    (the memory is empty), and the spot self-check's copy holds the memory constant (its passes are
    small or without gradients), so only a copy built anew differs from the live model."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 3)
        self.memory: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        mixed = out + (torch.stack(self.memory).mean(0) if self.memory else 0.0)
        if torch.is_grad_enabled() and len(x) >= 9:
            self.memory.append(out.detach().mean(0) + 1.0)
        return mixed


def make_filling_memory(input_shape, num_classes):
    """A plugin model factory (train.model: test_pipeline_stateless:make_filling_memory)."""
    assert input_shape == (8,) and num_classes == 3
    return FillingMemory()


def test_a_fresh_copy_agrees_with_a_live_model_without_hidden_state():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 3))
    model[0].register_buffer("scale", torch.ones(16))
    model[0].scale.mul_(3.0)  # a buffer training changed: the copy takes it over
    fresh = lambda: nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 3))  # noqa: E731
    rng = torch.random.get_rng_state()
    check_fresh_copy(model, _with_scale(fresh), TASK, *_batch(), step=3)
    assert torch.equal(torch.random.get_rng_state(), rng)


def _with_scale(fresh):
    def build():
        model = fresh()
        model[0].register_buffer("scale", torch.ones(16))
        return model

    return build


def test_a_memory_that_fills_during_training_differs_from_a_fresh_copy():
    model = FillingMemory()
    x, y = _batch()
    with torch.enable_grad():
        model(torch.randn(12, 8))  # a training forward fills it
    with pytest.raises(SelfCheckError, match=r"after 4 steps .* built anew") as caught:
        check_fresh_copy(model, FillingMemory, TASK, x, y, step=4)
    assert "\n" not in str(caught.value)


def test_a_run_whose_model_fills_a_memory_stops_at_the_spot_step(tmp_path):
    from adversarial.test_trust_inputs import small_project
    from dpledger.pipeline import run_stage
    from pipeline.test_spot_self_check import _spot

    plugin = {"model": "test_pipeline_stateless:make_filling_memory"}
    params, _, _ = small_project(tmp_path, train=plugin)
    with pytest.raises(SelfCheckError, match=rf"after {_spot(params)} steps .* built anew"):
        run_stage("train", params, tmp_path)
    assert not (tmp_path / "metrics").exists()
