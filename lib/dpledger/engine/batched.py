"""Few kernel launches and no host sync per step: the pieces of a BK step that would
otherwise cost one launch per parameter, and the masking that replaces a data-dependent branch.

On a GPU a step's cost is bounded below by its launches (about 5 µs each) and by every host sync,
which drains the queue and lets the next launches start on an idle GPU. A 12-layer GPT-2 has about
150 trainable tensors, most of them small (biases and normalisation weights): one launch per tensor
for its per-example norm, one for its clipped sum and one for its clipping factor made most of the
engine's launches.

- :func:`stacked_sum`: a sum of many (B,) tensors in two launches instead of one per term.
- :class:`Packed`: the small instantiated per-example gradients side by side in one (B, N) matrix:
  one norm, one mask and one matrix-vector product for all of them, added into the flat buffer by
  one ``_foreach_add_`` (flat and automatic clipping: one factor per example for every parameter).
- :func:`keep_rows`: rows of dropped examples (a non-finite norm, or weight 0) zeroed by
  ``masked_fill`` always, instead of testing ``.any()`` on the host first (0·NaN = NaN, so a factor
  of 0 is not enough).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

PACK_LIMIT = 1 << 16
"""Per-example gradients of at most this many entries are packed (copying them costs less than the
launches saved); larger ones (instantiated weight matrices) keep their own norm and product, without
a copy."""


def stacked_sum(values: list[Tensor]) -> Tensor:
    """Σ of same-shaped tensors in two launches (stack, sum)."""
    return values[0] if len(values) == 1 else torch.stack(values).sum(0)


def keep_rows(tensor: Tensor, dropped: Tensor) -> Tensor:
    """``tensor`` (batch first) with the rows of ``dropped`` examples set to zero, out of place (a
    saved activation may be the caller's tensor)."""
    return tensor.masked_fill(dropped.view(-1, *[1] * (tensor.dim() - 1)), 0)


@dataclass
class Packed:
    """Small per-example gradients of several parameters as one (B, N) matrix; ``keys`` (parameter
    ids) and ``sizes`` give each parameter's columns, in order."""

    keys: list[int]
    sizes: list[int]
    matrix: Tensor

    @classmethod
    def of(cls, per_example: dict[int, Tensor], batch: int, dtype: torch.dtype) -> Packed | None:
        """The gradients in ``per_example`` of ``dtype`` with at most PACK_LIMIT entries per example
        (two or more, else None); they are removed from ``per_example``."""
        keys = [
            k
            for k, g in per_example.items()
            if g.dtype == dtype and g.numel() <= PACK_LIMIT * batch
        ]
        if len(keys) < 2:
            return None
        grads = [per_example.pop(k).reshape(batch, -1) for k in keys]
        return cls(keys, [g.shape[1] for g in grads], torch.cat(grads, 1))

    def norm_sq(self) -> Tensor:
        """Σ over the packed parameters of each example's squared gradient norm, (B,)."""
        return self.matrix.square().sum(1)

    def add_clipped(self, slices: list[Tensor], factors: Tensor, dropped: Tensor) -> None:
        """slices[j] += Σ_i factors[i]·g_i of parameter ``keys[j]`` (its flat slice of the sum
        buffer)."""
        total = torch.mv(keep_rows(self.matrix, dropped).T, factors.to(self.matrix.dtype))
        torch._foreach_add_(slices, total.split(self.sizes))
