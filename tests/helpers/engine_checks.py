"""Independent computations the engine tests compare against: a naive per-example autograd loop (no
tests here)."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from dpledger.engine import BKEngine


def sum_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-example loss that works for any output shape: Σ over non-batch axes of output ·
    target."""
    return (output * target).reshape(output.shape[0], -1).sum(1)


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output, target, reduction="none")


def naive_per_example(model: nn.Module, loss_fn, inputs, targets) -> list[dict[str, torch.Tensor]]:
    """One autograd call per example; tied parameters appear once (named_parameters
    deduplicates)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    out = []
    for i in range(inputs.shape[0]):
        loss = loss_fn(model(inputs[i : i + 1]), targets[i : i + 1]).sum()
        grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
        out.append(
            {n: (g if g is not None else torch.zeros_like(p)) for (n, p), g in zip(named, grads)}
        )
    return out


def naive_clipped_sum(
    model, loss_fn, inputs, targets, clip_norm, *, clipping="flat", weights=None, gamma=0.01
):
    """Σ_i C_i w_i g_i written out example by example, with the clipping rules restated
    independently."""
    per_example = naive_per_example(model, loss_fn, inputs, targets)
    names = list(per_example[0])
    layers = sorted({n.rsplit(".", 1)[0] for n in names})
    total = {n: torch.zeros_like(per_example[0][n]) for n in names}
    for i, grads in enumerate(per_example):
        w = 1.0 if weights is None else float(weights[i])
        grads = {n: w * g for n, g in grads.items()}
        if clipping == "per-layer":
            for layer in layers:
                members = [n for n in names if n.rsplit(".", 1)[0] == layer]
                norm = torch.sqrt(sum((grads[n] ** 2).sum() for n in members))
                limit = clip_norm / len(layers) ** 0.5
                factor = min(1.0, limit / float(norm)) if norm > 0 else 1.0
                for n in members:
                    total[n] += factor * grads[n]
            continue
        norm = float(torch.sqrt(sum((g**2).sum() for g in grads.values())))
        if clipping == "automatic":
            factor = clip_norm / (norm + gamma)
        else:
            factor = min(1.0, clip_norm / norm) if norm > 0 else 1.0
        for n in names:
            total[n] += factor * grads[n]
    return total


def bk_clipped_sum(model, loss_fn, inputs, targets, clip_norm, *, weights=None, **engine_options):
    """The engine's clipped sum (noise off, normalizer 1), read back from p.grad; returns (sums,
    engine)."""
    engine = BKEngine(
        model, None, clip_norm=clip_norm, noise_multiplier=0.0, normalizer=1.0, **engine_options
    )
    engine.private_step(loss_fn(model(inputs), targets), weights)
    names = engine.parameter_names
    sums = {n: p.grad.clone() for n, p in zip(names, engine.params)}
    engine.detach()
    return sums, engine


def relative_error(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    num = torch.sqrt(sum(((a[n] - b[n]) ** 2).sum() for n in a))
    den = torch.sqrt(sum((b[n] ** 2).sum() for n in b))
    return float(num / den)


def median_norm(model, loss_fn, inputs, targets) -> float:
    """A clip norm that clips about half of the examples (so both branches of min(1, R/‖g‖) run)."""
    per_example = naive_per_example(model, loss_fn, inputs, targets)
    norms = [float(torch.sqrt(sum((g**2).sum() for g in grads.values()))) for grads in per_example]
    return float(torch.tensor(norms).median()) + 1e-12


def compare(
    model, loss_fn, inputs, targets, *, clipping="flat", weights=None, **engine_options
) -> tuple[float, BKEngine]:
    """Relative error of the BK clipped sum against the naive loop, on float64 copies of the
    model."""
    model = copy.deepcopy(model).double()
    inputs = inputs.double() if inputs.is_floating_point() else inputs
    targets = targets.double() if targets.is_floating_point() else targets
    clip_norm = median_norm(model, loss_fn, inputs, targets)
    expected = naive_clipped_sum(
        model, loss_fn, inputs, targets, clip_norm, clipping=clipping, weights=weights
    )
    got, engine = bk_clipped_sum(
        model,
        loss_fn,
        inputs,
        targets,
        clip_norm,
        weights=weights,
        clipping=clipping,
        **engine_options,
    )
    return relative_error(got, expected), engine


def check_every_parameter(model, loss_fn, inputs, targets, *, clipping="flat", **engine_options):
    """Float64 copies; the whole sum to 1e-10 and each trainable parameter exact and non-zero where
    the naive loop's gradient is (the engine refusing instead raises, naming the parameter)."""
    torch.manual_seed(0)
    model = copy.deepcopy(model).double().train()
    inputs = inputs.double() if inputs.is_floating_point() else inputs
    clip_norm = median_norm(model, loss_fn, inputs, targets)
    expected = naive_clipped_sum(model, loss_fn, inputs, targets, clip_norm, clipping=clipping)
    got, engine = bk_clipped_sum(
        model, loss_fn, inputs, targets, clip_norm, clipping=clipping, **engine_options
    )
    assert set(got) == {n for n, p in model.named_parameters() if p.requires_grad}
    assert relative_error(got, expected) < 1e-10
    # One by one: a parameter left at zero or unclipped would hide in the whole sum. A gradient that
    # is zero in exact arithmetic (an attention key bias) is rounding noise in both: below 1e-8 of
    # the largest it must only stay that small.
    floor = 1e-8 * max(float(g.abs().max()) for g in expected.values())
    for name in got:
        scale = float(expected[name].abs().max())
        assert float((got[name] - expected[name]).abs().max()) <= 1e-9 * max(scale, floor), name
        if scale > floor:
            assert float(got[name].abs().max()) > 0, name
    return engine
