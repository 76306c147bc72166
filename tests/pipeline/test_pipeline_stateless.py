"""The statelessness check before training: a model that carries a cross-batch memory in a plain
attribute (MoCo-style) is refused with one line; ordinary models (dropout, BatchNorm in train mode)
pass, and the check leaves their buffers and the RNG as they were."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpledger.engine import SelfCheckError
from dpledger.models.tasks import Task
from dpledger.pipeline.self_check import check_stateless

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
