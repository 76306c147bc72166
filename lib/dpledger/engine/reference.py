"""Reference DP-SGD: exact per-example gradients by ``torch.func`` (vmap of grad), clipped one by
one.

Slow and simple on purpose: it is the independent computation the BK engine is tested against
(float64, 1e-10 relative) and the foundation's trainer. Same update rule and noise as the engine:
p.grad = (Σ_i C_i·w_i·g_i + σ·R·z_t) / normalizer, with z_t from :class:`NoiseSource`.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from dpledger.engine.clipping import check_clipping, clip_factors, group_threshold
from dpledger.engine.noise import NoiseSource

LossFn = Callable[[Tensor, Tensor], Tensor]


def per_example_gradients(
    model: nn.Module, loss_fn: LossFn, inputs: Tensor, targets: Tensor
) -> dict[str, Tensor]:
    """{parameter name: (B, *shape)} — ∂L_i/∂θ for each example i separately."""
    params = {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}
    buffers = dict(model.named_buffers())

    def example_loss(params: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        output = functional_call(model, (params, buffers), (x.unsqueeze(0),))
        return loss_fn(output, y.unsqueeze(0)).sum()

    return vmap(grad(example_loss), in_dims=(None, 0, 0))(params, inputs, targets)


def clipped_sum(
    per_example: dict[str, Tensor],
    clip_norm: float,
    *,
    weights: Tensor | None = None,
    clipping: str = "flat",
    automatic_gamma: float = 0.01,
) -> dict[str, Tensor]:
    """Σ_i C_i·w_i·g_i; per-layer groups are the parameters' owning modules (name up to the last
    dot)."""
    check_clipping(clipping, clip_norm, automatic_gamma)
    if weights is not None:
        per_example = {
            n: g * weights.to(g.dtype).reshape(-1, *[1] * (g.dim() - 1))
            for n, g in per_example.items()
        }
    groups = {n: (n.rsplit(".", 1)[0] if clipping == "per-layer" else "") for n in per_example}
    distinct = sorted(set(groups.values()))
    threshold = group_threshold(clipping, clip_norm, len(distinct))
    batch = next(iter(per_example.values())).shape[0]
    factors = {}
    for group in distinct:
        norm_sq = sum(
            g.reshape(batch, -1).square().sum(1)
            for n, g in per_example.items()
            if groups[n] == group
        )
        factor = clip_factors(norm_sq, threshold, clipping, automatic_gamma)
        factors[group] = factor if weights is None else factor * (weights != 0).to(factor.dtype)
    return {n: torch.tensordot(factors[groups[n]], g, dims=1) for n, g in per_example.items()}


class ReferenceTrainer:
    """DP-SGD step by step with the per-example reference; the same protocol as the BK engine."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        loss_fn: LossFn,
        clip_norm: float,
        noise_multiplier: float,
        normalizer: float,
        seed: int = 0,
        clipping: str = "flat",
    ) -> None:
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.clip_norm, self.noise_multiplier, self.normalizer, self.clipping = (
            clip_norm,
            noise_multiplier,
            normalizer,
            clipping,
        )
        self.params = [p for p in model.parameters() if p.requires_grad]
        reference = self.params[0]
        self.noise = NoiseSource(
            sum(p.numel() for p in self.params),
            seed=seed,
            device=reference.device,
            dtype=reference.dtype,
        )
        self.steps_taken = 0

    def step(self, inputs: Tensor, targets: Tensor, weights: Tensor | None = None) -> None:
        sums = clipped_sum(
            per_example_gradients(self.model, self.loss_fn, inputs, targets),
            self.clip_norm,
            weights=weights,
            clipping=self.clipping,
        )
        flat = torch.cat(
            [sums[name].reshape(-1) for name, p in self.model.named_parameters() if p.requires_grad]
        )
        if self.noise_multiplier > 0:
            flat = flat + self.noise_multiplier * self.clip_norm * self.noise.draw(self.steps_taken)
        offset = 0
        for p in self.params:
            p.grad = (flat[offset : offset + p.numel()] / self.normalizer).view_as(p)
            offset += p.numel()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps_taken += 1
