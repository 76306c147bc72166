"""The self-check at the training batch's size (issue 41, item 2): a model that mixes examples only
in batches larger than the check's own passes the check on its few examples, and is refused once the
physical batch training forwards is given; models that do not mix pass at that size, dropout
included, and the record says how large the batch was."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpledger.engine import SelfCheckError, run_self_check

MIXES_FROM = 9
"""The smallest batch the model below mixes: above every batch of the check's own on 4 examples."""


class LargeBatchMixer(nn.Module):
    """Subtracts the batch mean from its features, but only in batches of at least ``MIXES_FROM``
    rows: each example's loss then depends on the others."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 16)
        self.second = nn.Linear(16, 3)

    def forward(self, x):
        h = torch.tanh(self.first(x))
        if len(x) >= MIXES_FROM:
            h = h - h.mean(0, keepdim=True)
        return self.second(h)


class LastRowSummary(nn.Module):
    """Adds the batch mean to the last row only (a summary token appended at the batch's end)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 3)

    def forward(self, x):
        h = self.linear(x)
        if len(x) > 1:
            h = torch.cat([h[:-1], h[-1:] + h.mean(0, keepdim=True)])
        return h


class DropoutModel(nn.Module):
    """Dropout as a module and as a literal rate: rate 0 in the check, so alone equals in batch."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 16)
        self.drop = nn.Dropout(0.5)
        self.out = nn.Linear(16, 3)

    def forward(self, x):
        return self.out(F.dropout(self.drop(torch.relu(self.linear(x))), 0.3))


def classification_loss(model, x, y):
    return F.cross_entropy(model(x), y, reduction="none")


def _rows(count: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(count, 8, generator=generator), torch.randint(0, 3, (count,))


def _check(model: nn.Module, batch=None, **options):
    return run_self_check(
        model,
        classification_loss,
        *_rows(4),
        clip_norm=1.0,
        batch=batch,
        **options,
    )


def test_without_the_training_batch_a_large_batch_mixer_passes():
    torch.manual_seed(0)
    assert _check(LargeBatchMixer()).passed  # the gap this option closes


def test_the_training_batch_catches_a_model_that_mixes_only_at_its_size():
    torch.manual_seed(0)
    with pytest.raises(SelfCheckError, match="mixes examples") as caught:
        _check(LargeBatchMixer(), batch=_rows(16, seed=1))
    assert "training batch of 16 rows" in str(caught.value) and "\n" not in str(caught.value)


def test_a_batch_just_below_the_mixing_size_passes():
    torch.manual_seed(0)
    result = _check(LargeBatchMixer(), batch=_rows(MIXES_FROM - 1, seed=1))
    assert result.passed and result.batch_rows == MIXES_FROM - 1


def test_a_mix_into_the_last_row_only_is_caught():
    torch.manual_seed(0)
    with pytest.raises(SelfCheckError, match="mixes examples"):
        _check(LastRowSummary(), batch=_rows(12, seed=1))


@pytest.mark.parametrize("precision", ["auto", "training"])
def test_models_that_do_not_mix_pass_at_the_training_batch_and_record_it(precision):
    torch.manual_seed(0)
    result = _check(DropoutModel(), batch=_rows(32, seed=1), precision=precision)
    assert result.passed and result.batch_rows == 32
    assert result.to_dict()["batch_rows"] == 32
    assert result.loss_relative_error < 1e-5


def test_bfloat16_autocast_at_the_training_batch_passes_a_model_that_does_not_mix():
    torch.manual_seed(0)
    result = _check(DropoutModel(), batch=_rows(64, seed=1), autocast=torch.bfloat16)
    assert result.passed and result.training is not None
    assert result.training.batch_rows == 64 and result.training.dtype == "bfloat16 autocast"
