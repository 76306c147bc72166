"""The self-check's oracle: a plain loop of one forward and one backward pass per example by
ordinary autograd, each trainable parameter's gradient read from ``.grad`` and clipped with the
functions of :mod:`dpledger.engine.clipping` applied to the loop's own norms. It shares nothing
with the engine's per-layer rules, so an engine that agrees with it is exact on the model it ran on.

Used by :mod:`dpledger.engine.self_check`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from dpledger.engine.clipping import clip_factors, group_threshold
from dpledger.engine.layers import generic
from dpledger.engine.self_check_compare import NaiveResult, SelfCheckError

LossFn = Callable[[nn.Module, Tensor, Tensor], Tensor]


class ExampleFailure(SelfCheckError):
    """The model failed on one example alone in the naive loop (the message names torch's
    error)."""


def clipping_groups(model: nn.Module, names: Sequence[str]) -> dict[str, int]:
    """Per-layer clipping groups as the engine documents them: each parameter belongs to the first
    layer (``named_modules`` order) that owns it, a generic-rule layer owning the children it
    claims; a layer whose parameters all belong to earlier layers (tied weights) is no group of its
    own."""
    checked = {id(p): n for n, p in model.named_parameters() if n in set(names)}
    group: dict[str, int] = {}
    claimed: set[int] = set()
    for _, module in model.named_modules():
        if id(module) in claimed:
            continue
        children = generic.claimed_children(module)
        claimed.update(id(getattr(module, child)) for child in children)
        own = [
            *module.parameters(recurse=False),
            *(p for c in children for p in getattr(module, c).parameters()),
        ]
        fresh = [checked[id(p)] for p in own if id(p) in checked and checked[id(p)] not in group]
        if fresh:
            count = len(set(group.values()))
            group.update({name: count for name in fresh})
    return group


def naive_loop(
    model: nn.Module,
    loss_fn: LossFn,
    rows: tuple[Tensor, Tensor, Tensor],
    names: Sequence[str],
    groups: dict[str, int],
    clip: tuple[float, str, float],
    counts: Sequence[int],
    forward: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> NaiveResult:
    """One forward and one backward pass per example by plain autograd; Σ_i C_i·w_i·g_i accumulated
    with the clipping factors of the loop's own norms (flat, per layer over ``groups`` with R/√L,
    automatic), row i counted ``counts[i]`` times (as often as the engine's batches hold it). Each
    forward pass runs in ``forward()`` (training's autocast), the backward pass outside it, as
    training runs them."""
    (x, y, w), (clip_norm, clipping, gamma) = rows, clip
    params = dict(model.named_parameters())
    sums = {n: torch.zeros_like(params[n]) for n in names}
    scales = {n: torch.zeros((), dtype=torch.float64, device=params[n].device) for n in names}
    threshold = group_threshold(clipping, clip_norm, len(set(groups.values())))
    losses, norms = [], []
    for i in range(len(x)):
        model.zero_grad(set_to_none=True)
        try:
            with forward():
                loss = loss_fn(model, x[i : i + 1], y[i : i + 1])
            (loss.sum() * w[i].to(loss.dtype)).backward()
        except (RuntimeError, ValueError) as error:
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            message = f"self-check: the naive loop failed on one example: {first}"
            raise ExampleFailure(message) from error
        grads = {n: _grad_or_zero(params[n]) for n in names}
        by_group: dict[int, Tensor] = {}
        for n, g in grads.items():
            key = groups[n] if clipping == "per-layer" else 0
            by_group[key] = by_group.get(key, 0) + g.double().square().sum()
        factor = {key: _factor(sq, threshold, clipping, gamma) for key, sq in by_group.items()}
        if w[i] == 0:  # a padding row: factor 0 in every group
            factor = dict.fromkeys(factor, 0.0)
        norm = math.sqrt(float(sum(by_group.values())))
        for n, g in grads.items():
            f = counts[i] * factor[groups[n] if clipping == "per-layer" else 0]
            if f != 0 and math.isfinite(norm):
                sums[n] += f * g
                scales[n] += f * g.double().norm()
        losses.append(float(loss.detach().double().sum()))
        norms.append(norm)
    model.zero_grad(set_to_none=True)
    return NaiveResult(
        torch.tensor(losses, dtype=torch.float64),
        torch.tensor(norms, dtype=torch.float64),
        sums,
        scales,
    )


def _grad_or_zero(parameter: nn.Parameter) -> Tensor:
    return parameter.grad if parameter.grad is not None else torch.zeros_like(parameter)


def _factor(norm_sq: Tensor, threshold: float, clipping: str, gamma: float) -> float:
    """C(‖g‖) of one example's (group's) squared norm, by engine/clipping.py's function."""
    return float(clip_factors(norm_sq.reshape(1), threshold, clipping, gamma)[0])
