"""The step's noisy sum: one flat buffer holding σ·R·z_t + Σ_i C_i·w_i·g_i (+ canary), divided by
the normalizer.

When a step begins the buffer is filled with the noise (zeros without noise, or on a rank that adds
none); the clipped sums are formed directly into it by book-keeping (aᵀ·diag(C)·b of each ghost
layer, 003 §3.1) and the instantiated gradients' weighted sums; :meth:`NoisySum.release` adds the
canary, all-reduces it over the ranks and hands it to the optimizer as ``p.grad`` (views of the one
buffer). It also counts the logical steps (the privacy ledger) and the real examples dropped for a
non-finite norm. :func:`factors` are the clipping factors. :meth:`NoisySum.watch` keeps each step's
released and clipped sums at a few coordinates (the one-run audit).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from dpledger.engine import validators
from dpledger.engine.batched import Packed, keep_rows, stacked_sum
from dpledger.engine.clipping import clip_factors, group_threshold, nonfinite_rows
from dpledger.engine.distributed import GroupSum, group_sum
from dpledger.engine.layers import add_weighted_sum
from dpledger.engine.noise import NoiseSource
from dpledger.engine.norms import norm_precision
from dpledger.engine.owners import Owner
from dpledger.engine.recorder import Call
from dpledger.engine.tensor_cores import promoted_dtype
from dpledger.precision import exactly


def factors(
    owners: dict[int, Owner],
    norm_sq: dict[int, Tensor],
    flat: Tensor,
    dropped: Tensor,
    *,
    clipping: str,
    clip_norm: float,
    automatic_gamma: float,
    groups: int,
    normalizer: float,
) -> dict[int, Tensor]:
    """Clipping factor / ``normalizer`` of every parameter's group, per example (zero for
    ``dropped`` rows, in every group); one group (flat and automatic clipping): one tensor for all
    parameters."""
    threshold = group_threshold(clipping, clip_norm, groups)
    if groups == 1:
        factor = clip_factors(flat, threshold, clipping, automatic_gamma)
        return dict.fromkeys(owners, factor.masked_fill(dropped, 0) / normalizer)
    group_sq: dict[int, list[Tensor]] = {}
    for key, value in norm_sq.items():
        group_sq.setdefault(owners[key].group, []).append(value)
    group_factors = {
        g: clip_factors(stacked_sum(v), threshold, clipping, automatic_gamma).masked_fill(
            dropped, 0
        )
        / normalizer
        for g, v in group_sq.items()
    }
    return {key: group_factors[owners[key].group] for key in norm_sq}


class NoisySum:
    """The flat buffer of ``params`` (in order, laid out by ``owners``), its noise and its release.

    ``process_group``: with one, each rank's clipped sum is all-reduced once per step and only the
    group's rank 0 (``adds_noise``) adds the noise and the canary."""

    def __init__(
        self,
        params: list[nn.Parameter],
        owners: dict[int, Owner],
        names: list[str],
        *,
        noise: NoiseSource,
        noise_multiplier: float,
        clip_norm: float,
        normalizer: float,
        process_group: torch.distributed.ProcessGroup | GroupSum | None,
    ) -> None:
        self.params, self.noise = params, noise
        self.noise_multiplier, self.clip_norm, self.normalizer = (
            noise_multiplier,
            clip_norm,
            normalizer,
        )
        reference = params[0]
        numel = sum(p.numel() for p in params)
        self.buffer = torch.zeros(numel, device=reference.device, dtype=reference.dtype)
        self.ranks = None if process_group is None else group_sum(process_group)
        if self.ranks is not None:
            self.ranks.check_layout(numel, names, reference.device)
        self.adds_noise = self.ranks is None or self.ranks.adds_noise
        spans = [(owners[id(p)].offset, owners[id(p)].numel) for p in params]
        self.views = [
            self.buffer[start : start + size].view_as(p) for p, (start, size) in zip(params, spans)
        ]
        self._view_of = {id(p): view for p, view in zip(params, self.views)}
        self._slice_of = {id(p): view.view(-1) for p, view in zip(params, self.views)}
        self.nonfinite = torch.zeros((), dtype=torch.int64, device=reference.device)
        self.pending = False
        self.steps_taken = 0
        self._select: Callable[[list[Tensor]], Tensor] | None = None
        self._noise_watched: Tensor | None = None
        self.last_watched: Tensor | None = None

    def watch(self, select: Callable[[list[Tensor]], Tensor]) -> None:
        """Keep, for each step, the released sum and this rank's clipped sum at the coordinates
        ``select`` gathers from the per-parameter views: ``last_watched``, (2 × coordinates) in the
        units of :meth:`last`, on the buffer's device (no host copy, and no parameter-sized copy as
        :meth:`last` makes). The clipped sum is the buffer there just before the canary and the
        all-reduce minus the buffer there right after the noise draw: two gathers, not released sum
        minus noise, so a fault that alters the noise between its draw and the release still shows
        in released sum minus it."""
        self._select = select

    def drop(self, flat: Tensor, weights: Tensor | None) -> Tensor:
        """The rows whose factor is zero: a non-finite flat norm or weight 0; the real ones of the
        former counted."""
        nonfinite = nonfinite_rows(flat)
        dropped = nonfinite if weights is None else nonfinite | (weights == 0)
        self.nonfinite += (nonfinite if weights is None else nonfinite & (weights != 0)).sum()
        return dropped

    def _open(self) -> Tensor:
        """The buffer; when a step begins it is filled with the noise σ·R·z_t/normalizer (zeros
        without noise), and the clipped sums and the canary, each scaled by 1/normalizer on the way
        in, are then added in place.

        It finally holds the gradients (``p.grad`` are views), so a step allocates no
        parameter-sized tensor and makes no separate pass to zero the buffer, add the noise or
        divide."""
        if not self.pending:
            if self.noise_multiplier > 0 and self.adds_noise:
                scale = self.noise_multiplier * self.clip_norm / self.normalizer
                self.noise.draw_into(self.buffer, self.steps_taken, scale)
            else:
                self.buffer.zero_()
            if self._select is not None:
                self._noise_watched = self._select(self.views)
            self.pending = True
        return self.buffer

    @exactly
    def add_clipped(
        self,
        factors: dict[int, Tensor],
        per_example: dict[int, Tensor],
        ghost_calls: list[Call],
        packed: Packed | None,
        dropped: Tensor,
    ) -> None:
        """Σ_i factors[i]·g_i of every parameter into the step's buffer; rows not kept are zeroed
        first."""
        self._open()
        for key, grads in per_example.items():
            grads = keep_rows(grads, dropped)
            self._accumulate(
                key, grads.dtype, lambda out, f=factors[key], g=grads: add_weighted_sum(out, f, g)
            )
        if packed is not None:
            packed.add_clipped(
                [self._slice_of[k] for k in packed.keys], factors[packed.keys[0]], dropped
            )
        for call in ghost_calls:
            key = id(call.params["weight"])
            half = call.rule.half_operands  # else promoted: the operands its norm came from
            a, b = (
                keep_rows(t if half else norm_precision(t), dropped)
                for t in (call.activations, call.backprops)
            )
            self._accumulate(
                key,
                promoted_dtype(b.dtype),
                lambda out, c=call, a=a, b=b, f=factors[key]: c.rule.clipped_sum(
                    c.module, a, b, f, out
                ),
            )
            call.activations = call.backprops = None

    def _accumulate(self, key: int, dtype: torch.dtype, add: Callable[[Tensor], None]) -> None:
        """Run ``add`` on the buffer view of parameter ``key`` (its id); through a temporary of
        ``dtype`` when the parameter is stored in another precision (e.g. half parameters, float32
        norms)."""
        view = self._view_of[key]
        if view.dtype == dtype:
            add(view)
            return
        temporary = torch.zeros_like(view, dtype=dtype)
        add(temporary)
        view.add_(temporary)

    def last(self) -> list[Tensor] | None:
        """The noisy sum released by the last step, one tensor per parameter; None before the first
        step and once the next step has begun."""
        if self.steps_taken == 0 or self.pending:
            return None
        return [view * self.normalizer for view in self.views]

    def release(
        self, canary: Sequence[Tensor] | None, optimizer: torch.optim.Optimizer | None
    ) -> None:
        """Finish the step: add ``canary`` (rank 0 only), all-reduce, set each ``p.grad`` to its
        view, step ``optimizer``, count the step."""
        self._open()
        clipped = None if self._select is None else self._select(self.views) - self._noise_watched
        if canary is not None:
            validators.check_canary(canary, len(self.params))
            for view, vector in zip(self.views, canary if self.adds_noise else ()):
                view.add_(
                    vector.reshape(view.shape).to(view.device, view.dtype),
                    alpha=1 / self.normalizer,
                )
        if self.ranks is not None:
            self.ranks.all_reduce(self.buffer)
        if clipped is not None:
            self.last_watched = torch.stack([self._select(self.views), clipped]) * self.normalizer
        for param, grad in zip(self.params, self.views):
            param.grad = grad
        if optimizer is not None:
            optimizer.step()
            for param in self.params:
                param.grad = None
        self.pending = False
        self.steps_taken += 1
