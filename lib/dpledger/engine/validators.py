"""What the engine refuses, kept apart from the engine (as Opacus keeps ``validators/``), and the one fix it offers.

Checks that run on construction (options, layers without an exact per-example rule) and during training
(layers whose forward pass changes the model from the data), plus :func:`replace_batchnorm`, the explicit
one-call fix for BatchNorm (which mixes examples, so no per-example gradient exists).
"""

from __future__ import annotations

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

MAX_GROUPS = 32
"""GroupNorm's usual group count (Wu & He 2018); fewer when the channel count has no such divisor."""


def _group_count(channels: int) -> int:
    """The largest divisor of ``channels`` that is at most :data:`MAX_GROUPS`."""
    return max(g for g in range(1, min(channels, MAX_GROUPS) + 1) if channels % g == 0)


def replace_batchnorm(model: nn.Module) -> nn.Module:
    """Replace every BatchNorm (1d/2d/3d, SyncBatchNorm) of ``model`` in place by a GroupNorm over the same channels
    (the largest group count ≤ 32 dividing them), with the same ``eps`` and ``affine``; returns ``model``.

    GroupNorm normalises each example on its own, so per-example gradients exist and the engine trains it exactly.
    Fresh weights (ones, zeros): a pretrained BatchNorm's statistics do not carry over; fine-tune afterwards."""
    for name, child in list(model.named_children()):
        if isinstance(child, _BatchNorm):
            norm = nn.GroupNorm(_group_count(child.num_features), child.num_features, eps=child.eps, affine=child.affine)
            reference = child.weight if child.affine else next(iter(child.buffers()), None)
            if reference is not None:
                norm = norm.to(device=reference.device, dtype=reference.dtype)
            setattr(model, name, norm)
        else:
            replace_batchnorm(child)
    return model
