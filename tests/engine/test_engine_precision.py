"""The engine's norms and clipped sums in full precision whatever the caller's autocast or TF32
settings (issue 30): autocast state follows autograd into backward, and TF32 is a global switch.

Each model is float32 and its forward pass runs outside autocast, so a and b are the same float32
tensors either way; only ``engine.backward`` runs inside ``torch.autocast``. The engine must then
give the float32 result (to float32 rounding), not one computed in bf16/fp16.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

from dpledger.engine import BKEngine
from dpledger.engine.layers import linear
from dpledger.errors import ParamsError
from dpledger.precision import Float16Error, exact, tf32_enabled

B, T, D = 3, 8, 64


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D, D), nn.Tanh(), nn.Linear(D, D)).train()


def _inputs(scale: float = 1.0) -> torch.Tensor:
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(1)) * scale


def _run(model, inputs, clip_norm, context=None, ghost="always"):
    engine = BKEngine(
        model, None, clip_norm=clip_norm, noise_multiplier=0.0, normalizer=1.0, ghost=ghost
    )
    losses = model(inputs).square().sum((1, 2))
    with context or torch.autocast("cpu", enabled=False):
        norms = engine.backward(losses)
    engine.step()
    grads = torch.cat([p.grad.reshape(-1) for p in engine.params]).clone()
    engine.detach()
    return norms, grads, engine


@pytest.mark.parametrize("ghost", ["always", "never"])
def test_bf16_autocast_around_backward_leaves_norms_and_clipped_sums_in_float32(ghost):
    inputs = _inputs()
    norms, grads, _ = _run(_model(), inputs, 1.0, ghost=ghost)
    cast_norms, cast_grads, _ = _run(
        _model(), inputs, 1.0, torch.autocast("cpu", dtype=torch.bfloat16), ghost
    )
    assert torch.allclose(cast_norms, norms, rtol=1e-5, atol=0)
    assert torch.allclose(cast_grads, grads, rtol=1e-4, atol=1e-6 * float(grads.abs().max()))


def test_a_clipped_contribution_stays_within_r_under_bf16_autocast():
    """One example, norm far above R: the clipped gradient's norm is R to float32 rounding, not
    1.001·R."""
    model = _model()
    clip_norm = 1e-3
    for i in range(B):
        engine = BKEngine(
            model, None, clip_norm=clip_norm, noise_multiplier=0.0, normalizer=1.0, ghost="always"
        )
        losses = model(_inputs()[i : i + 1]).square().sum((1, 2))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            engine.backward(losses)
        engine.step()
        norm = torch.cat([p.grad.reshape(-1).double() for p in engine.params]).norm()
        engine.detach()
        assert float(norm) <= clip_norm * (1 + 1e-5)


def test_fp16_autocast_does_not_overflow_a_large_squared_norm_into_a_dropped_example():
    """‖g‖² above fp16's 65504 stays finite: the example is clipped, not silently dropped."""
    inputs = _inputs(30.0)
    norms, grads, _ = _run(_model(), inputs, 1.0)
    cast_norms, cast_grads, engine = _run(
        _model(), inputs, 1.0, torch.autocast("cpu", dtype=torch.float16)
    )
    assert float(norms.min()) ** 2 > 65504
    assert engine.nonfinite_examples == 0
    assert torch.allclose(cast_norms, norms, rtol=1e-5, atol=0)
    assert torch.allclose(cast_grads, grads, rtol=1e-4, atol=1e-6 * float(grads.abs().max()))


@pytest.fixture
def precision_settings():
    """Set torch's per-backend float32 precision settings (``set(name, value)``, name 'cuda',
    'cudnn' or 'mkldnn'); every one is put back after the test."""
    leaves = {
        "cuda": torch.backends.cuda.matmul,
        "cudnn": torch.backends.cudnn.conv,
        "mkldnn": torch.backends.mkldnn.matmul,
    }
    saved = {name: leaf.fp32_precision for name, leaf in leaves.items()}

    def set_precision(name: str, value: str) -> None:
        leaves[name].fp32_precision = value

    yield set_precision
    for name, value in saved.items():
        leaves[name].fp32_precision = value


def _caller_turns_tf32_on(set_precision) -> None:
    """What a GPU user writes."""
    for name in ("cuda", "cudnn", "mkldnn"):
        set_precision(name, "tf32")


def test_the_ghost_norm_and_clipped_sum_run_without_tf32_and_the_callers_setting_comes_back(
    monkeypatch, precision_settings
):
    seen = []

    def spy(function):
        def wrapper(*args, **kwargs):
            seen.append((function.__name__, tf32_enabled()))
            return function(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(linear, "sequence_ghost_norm", spy(linear.sequence_ghost_norm))
    monkeypatch.setattr(linear, "add_scaled_product", spy(linear.add_scaled_product))
    _caller_turns_tf32_on(precision_settings)
    assert tf32_enabled()
    _run(_model(), _inputs(), 1.0)
    assert (
        torch.backends.cuda.matmul.fp32_precision
        == torch.backends.mkldnn.matmul.fp32_precision
        == "tf32"
    )
    assert {name for name, _ in seen} == {"sequence_ghost_norm", "add_scaled_product"}
    assert not any(flag for _, flag in seen), seen


def test_exact_restores_autocast_and_tf32_even_on_an_error(precision_settings):
    _caller_turns_tf32_on(precision_settings)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(ValueError), exact():
            assert not tf32_enabled() and not torch.is_autocast_enabled("cpu")
            raise ValueError
        assert (
            torch.is_autocast_enabled("cpu") and torch.backends.cudnn.conv.fp32_precision == "tf32"
        )


def test_exact_works_where_torchs_legacy_precision_getter_raises(precision_settings):
    """cuBLAS in IEEE but oneDNN in TF32 (legacy and per-backend settings mixed): torch's global
    getter raises; the engine must neither raise nor leave the state changed."""
    precision_settings("cuda", "ieee")
    precision_settings("mkldnn", "tf32")
    with pytest.raises(RuntimeError):
        torch.get_float32_matmul_precision()
    _run(_model(), _inputs(), 1.0)
    assert torch.backends.mkldnn.matmul.fp32_precision == "tf32"


def test_a_model_moved_or_cast_after_the_engine_was_built_is_one_line():
    """p.grad would be a view of a buffer on the old device or dtype: refused before any work (issue
    30)."""
    model = _model()
    engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=1.0, normalizer=1.0)
    model.double()
    losses = model(_inputs().double()).square().sum((1, 2))
    with pytest.raises(ParamsError) as error:
        engine.backward(losses)
    assert (
        "\n" not in str(error.value)
        and "float64" in str(error.value)
        and "float32" in str(error.value)
    )


def test_a_model_split_over_devices_is_refused_when_the_engine_is_built():
    model = _model()
    model[2].to("meta")
    with pytest.raises(ParamsError) as error:
        BKEngine(model, None, clip_norm=1.0, noise_multiplier=1.0, normalizer=1.0)
    assert "\n" not in str(error.value) and "meta" in str(error.value) and "cpu" in str(error.value)


class _AutocastInside(nn.Module):
    """A model that enters fp16 autocast itself: only its layers' hooks can see it."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _model()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.float16):
            return self.net(x)


@pytest.mark.parametrize("inside", [False, True])
def test_a_forward_pass_under_fp16_autocast_is_refused_in_one_line_naming_bf16(inside):
    """fp16 without loss scaling underflows an LM head's ~1e-7 output gradients: the standalone API
    refuses it as train.precision does (issue 30), before the backward pass (before any layer runs,
    for the caller's)."""
    model = _AutocastInside().train() if inside else _model()
    engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    with pytest.raises(Float16Error) as error:
        with contextlib.nullcontext() if inside else torch.autocast("cpu", dtype=torch.float16):
            model(_inputs())
    message = str(error.value)
    assert "\n" not in message and "bfloat16" in message
    assert "torch.autocast(dtype=torch.float16)" in message
    assert ("layer net.0 (Linear)" if inside else "forward pass of Sequential") in message
    engine.detach()


def test_a_float16_model_is_refused_naming_its_first_layer():
    model = _model().half()
    engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    with pytest.raises(Float16Error) as error:
        model(_inputs().half())
    assert "layer 0 (Linear)" in str(error.value) and "bfloat16" in str(error.value)
    engine.detach()


def test_bf16_autocast_in_the_forward_pass_still_trains():
    model = _model()
    engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        losses = model(_inputs()).float().square().sum((1, 2))
    norms = engine.private_step(losses)
    assert torch.isfinite(norms).all() and all(torch.isfinite(p.grad).all() for p in engine.params)


def test_fp16_autocast_in_an_evaluation_pass_is_left_alone():
    model = _model()
    engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        assert model(_inputs()).dtype == torch.float16
    engine.detach()


def test_a_training_pass_on_meta_tensors_is_not_mistaken_for_autocast():
    """The autocast question has no answer on the meta device (torch raises): the check skips it."""
    with torch.device("meta"):
        model = _model()
    engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    assert model(torch.empty(B, T, D, device="meta")).device.type == "meta"
    engine.detach()
