"""Models the self-check used to end in a raw traceback or refuse falsely (issue 41, item 7): each
is now exact against the naive per-example loop, or refused in one line naming what to change."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpledger.engine import BKEngine, UnsupportedLayerError
from dpledger.engine.self_check import SelfCheckError, run_self_check
from dpledger.engine.state_guard import check_state_unchanged, state_snapshot


def _losses(model, x, y):
    return F.cross_entropy(model(x), y, reduction="none")


def _check(model, **options):
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(5, 4, generator=generator), torch.randint(0, 3, (5,), generator=generator)
    return run_self_check(model, _losses, x, y, clip_norm=1.0, engine_type=BKEngine, **options)


class FunctionalBatchNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden, self.out = nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x):
        return self.out(F.batch_norm(self.hidden(x), None, None, training=True))


class Locked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out, self.lock = nn.Linear(4, 3), threading.Lock()

    def forward(self, x):
        with self.lock:
            return self.out(x)


class CastsToFloat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(4, 3)

    def forward(self, x):
        return self.out(x.float())


class LiteralDropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden, self.out = nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x):
        return self.out(F.dropout(torch.tanh(self.hidden(x)), 0.3, training=self.training))


def _frozen_batchnorm() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 3))
    model[1].eval().requires_grad_(False)
    return model


def _spectral(parametrized: bool) -> nn.Module:
    torch.manual_seed(0)
    norm = nn.utils.parametrizations.spectral_norm if parametrized else nn.utils.spectral_norm
    return nn.Sequential(norm(nn.Linear(4, 4)), nn.Tanh(), nn.Linear(4, 3))


def _one_line(error: pytest.ExceptionInfo) -> str:
    assert "\n" not in str(error.value)
    return str(error.value)


def test_a_frozen_batchnorm_in_eval_mode_is_checked_in_eval_mode_and_exact():
    model = _frozen_batchnorm()
    result = _check(model)
    assert result.passed and result.dtype == "float64"
    assert not model[1].training  # the user's model is untouched


def test_functional_batch_norm_with_batch_statistics_is_one_line_in_check_and_training():
    with pytest.raises(UnsupportedLayerError) as error:
        _check(FunctionalBatchNorm())
    assert "F.batch_norm with training=True" in _one_line(error)
    model = FunctionalBatchNorm()
    engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    with pytest.raises(UnsupportedLayerError) as error:
        engine.backward(_losses(model, torch.randn(6, 4), torch.randint(0, 3, (6,))))
    assert "F.batch_norm with training=True" in _one_line(error)


def test_a_model_holding_a_lock_is_one_line_naming_the_attribute():
    with pytest.raises(SelfCheckError) as error:
        _check(Locked())
    assert "attribute lock of module <model> (a lock) cannot be deep-copied" in _one_line(error)


def test_a_forward_casting_to_float32_is_checked_in_float32_and_exact():
    result = _check(CastsToFloat())
    assert result.passed and result.dtype == "float32"
    with pytest.raises(SelfCheckError, match="naive loop failed"):
        _check(CastsToFloat(), precision="float64")  # asked for float64: refused, not downgraded


def test_a_literal_functional_dropout_is_off_in_the_check_and_exact():
    torch.manual_seed(0)
    assert _check(LiteralDropout()).passed


def test_spectral_norm_trains_and_is_exact_with_its_power_iteration_on():
    model = _spectral(parametrized=True)
    assert _check(model).passed
    trained = [p for p in model.parameters() if p.requires_grad]
    before = state_snapshot(model, trained)
    engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    vector = model[0].parametrizations.weight[0]._u.clone()
    engine.private_step(_losses(model, torch.randn(6, 4), torch.randint(0, 3, (6,))))
    assert not torch.equal(model[0].parametrizations.weight[0]._u, vector)  # it iterated
    check_state_unchanged(model, trained, before)  # computed from the weights: not refused


def test_state_written_into_a_spectral_norm_subclass_is_still_refused():
    class Leaky(type(_spectral(True)[0].parametrizations.weight[0])):
        pass

    model = _spectral(parametrized=True)
    model[0].parametrizations.weight[0].__class__ = Leaky
    before = state_snapshot(model, list(model.parameters()))
    model[0].parametrizations.weight[0]._u.add_(1.0)
    with pytest.raises(Exception, match=r"buffer 0.parametrizations.weight.0._u changed"):
        check_state_unchanged(model, list(model.parameters()), before)


def test_the_hook_based_spectral_norm_is_one_line_naming_the_parametrization():
    with pytest.raises(UnsupportedLayerError) as error:
        BKEngine(
            _spectral(parametrized=False), None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0
        )
    assert "use torch.nn.utils.parametrizations.spectral_norm" in _one_line(error)
