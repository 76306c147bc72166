"""Book-Keeping under PyTorch FSDP2: flat per-example clipping in ONE backward pass with the
parameters sharded by ``fully_shard``.

Why it fits: a rank's per-example norms need only its own examples' activations ``a`` and output
gradients ``b``, which FSDP leaves local, and the clipped sum aᵀ·diag(C)·b needs no weights. So the
engine's hooks capture ``a`` and ``b`` as in one process (FSDP unshards a block's weights for its
forward and backward; the ghost norms never read them), the clipping factors come from this rank's
norms alone (flat clipping is per example), and after the backward pass each layer's clipped sum is
reduce-scattered to the shards and the noise added once per shard (``fsdp_sum.py``).

- :func:`shard_model`: ``fully_shard`` per block — the classes in transformers'
  ``_no_split_modules`` of any module of the model (a wrapper or a peft model included) — then the
  root; for a model without that list (a plugin or zoo model),
  every element of every ``nn.ModuleList`` is a block (the usual stack of layers), and a model with
  neither is sharded as one unit at the root.
- :class:`FSDPEngine`: :class:`~dpledger.engine.bk.BKEngine` on a sharded model. The trainable
  parameters are the DTensor shards; their gradients are set as DTensors, so any torch optimizer
  steps on shards (its state is 1/N of a single process's). Layers under the generic rule
  (re-running their forward per example, e.g. LlamaRMSNorm) get their full weights by one
  all-gather each, after the backward pass, in the same order on every rank.
- :func:`full_state_dict`: the model gathered whole (every rank calls it; rank 0 publishes it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from dpledger.engine.bk import BKEngine
from dpledger.engine.fsdp_sum import ShardedNoisySum
from dpledger.engine.norms import LayerNorms
from dpledger.engine.owners import GENERIC
from dpledger.engine.recorder import GenericCall, Recorder
from dpledger.errors import ParamsError

__all__ = ["FSDPEngine", "block_modules", "full_state_dict", "full_tensors", "shard_model"]


def block_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The blocks ``shard_model`` shards one by one (the policy in the module docstring)."""
    classes = {
        name for m in model.modules() for name in getattr(m, "_no_split_modules", None) or ()
    }
    if classes:
        return [(n, m) for n, m in model.named_modules() if type(m).__name__ in classes]
    blocks: list[tuple[str, nn.Module]] = []
    inside: set[int] = set()
    for name, module in model.named_modules():  # outer lists first: their elements are the blocks
        if isinstance(module, nn.ModuleList) and id(module) not in inside:
            for key, child in module.named_children():
                blocks.append((f"{name}.{key}", child))
                inside.update(id(m) for m in child.modules())
    return blocks


def shard_model(
    model: nn.Module, *, param_dtype: torch.dtype | None = None, mesh: Any = None
) -> list[str]:
    """``fully_shard`` every block of ``model`` then the root, in place; returns the block names.

    ``param_dtype``: FSDP's mixed-precision policy (e.g. bfloat16): the unsharded weights of the
    forward and backward passes are cast to it, while the shards, the engine's clipped sums, noise
    and optimizer stay in the parameters' own dtype; the per-example norms are taken in float32
    from the captured activations and output gradients (``norms.norm_precision``) whatever the
    compute dtype, so the norm the clipping factors bound is that of the gradient actually summed.
    """
    policy = MixedPrecisionPolicy(param_dtype=param_dtype) if param_dtype is not None else None
    options: dict[str, Any] = {"mesh": mesh} if mesh is not None else {}
    if policy is not None:
        options["mp_policy"] = policy
    blocks = block_modules(model)
    for _, block in blocks:
        fully_shard(block, **options)
    fully_shard(model, **options)
    return [name for name, _ in blocks]


def full_tensors(tensors: list[Tensor]) -> list[Tensor]:
    """Each tensor whole: a DTensor all-gathered (a collective: every rank calls it), a plain
    tensor as it is."""
    return [t.full_tensor() if isinstance(t, DTensor) else t for t in tensors]


def full_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The state dict of a sharded model gathered whole, on the CPU (every rank must call it)."""
    return {
        name: (value.full_tensor() if isinstance(value, DTensor) else value).detach().cpu()
        for name, value in model.state_dict().items()
    }


def unsharded_aliases(model: nn.Module) -> dict[int, nn.Parameter]:
    """The id of every sharded parameter -> the unsharded parameter FSDP registers on its module
    during the forward and backward passes (one object for the whole run, its storage freed between
    uses); made by one unshard and reshard of each sharded module, in the same order on every
    rank."""
    aliases: dict[int, nn.Parameter] = {}
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        module.unshard()
        for group in module._get_fsdp_state()._fsdp_param_groups:
            for fsdp_param in group.fsdp_params:
                aliases[id(fsdp_param.sharded_param)] = fsdp_param.unsharded_param
        module.reshard()
    return aliases


def _guard_unsharded(recorder: Recorder, aliases: dict[int, nn.Parameter]) -> None:
    """Make the first-pass guard against trainable parameters used outside their layers
    (``validators.OutsideUses``) see the unsharded parameters the forward pass actually uses: they
    are named as their shards, and each hooked layer owns the unsharded forms of its own."""
    layout = recorder.layout
    owners = dict(layout.owners)
    owners.update(
        {id(aliases[key]): owner for key, owner in layout.owners.items() if key in aliases}
    )
    recorder.layout = dataclasses.replace(layout, owners=owners)
    for handle in recorder.check_handles[2:]:  # the layers' enter/leave hooks (bk's Recorder)
        handle.remove()
    del recorder.check_handles[2:]
    for module in layout.hooked_modules(recorder.model):
        params = layout.layer_params[id(module)].values()
        own = (
            frozenset(id(p) for p in params)
            | {id(aliases[id(p)]) for p in params if id(p) in aliases},
            layout.rules[id(module)] == GENERIC,
        )
        recorder.check_handles += [
            module.register_forward_pre_hook(lambda m, i, own=own: recorder._enter_layer(own)),
            module.register_forward_hook(lambda m, i, o: recorder._leave_layer(), always_call=True),
        ]


class ShardedNorms(LayerNorms):
    """The per-layer norms, with the full weights of generic-rule layers gathered for their
    per-example re-run (their shards would not run the layer's forward)."""

    @staticmethod
    def _generic_grads(call: GenericCall, batch: int, recorder: Recorder) -> Any:
        names = list(call.params)
        whole = dict(zip(names, full_tensors([call.params[n] for n in names])))
        return LayerNorms._generic_grads(dataclasses.replace(call, params=whole), batch, recorder)


class FSDPEngine(BKEngine):
    """:class:`BKEngine` on a model sharded by :func:`shard_model` (or ``fully_shard`` with its
    default Shard(0) placement): same arguments, ``process_group`` the group FSDP shards over (the
    default group when None).

    Differences from the data-parallel engine: ``last_noisy_sum`` holds this rank's shards (see
    :meth:`full_noisy_sum`); every rank adds its slice of the noise and of the canary, so a canary
    must be given to every rank; correlated noise and ``watch`` are refused."""

    sum_type = ShardedNoisySum
    norms_type = ShardedNorms

    def __init__(self, model: nn.Module, optimizer: Any = None, **options: Any) -> None:
        if options.get("process_group") is None:
            options["process_group"] = torch.distributed.group.WORLD
        super().__init__(model, optimizer, **options)
        _guard_unsharded(self._recorder, unsharded_aliases(model))

    def self_check(self, *args: Any, **options: Any) -> Any:
        """Refused by name: the check copies the model, and a copy of shards proves nothing about
        the whole. Check the same model unsharded (``BKEngine.self_check``) before
        :func:`shard_model`; the sharded engine itself is tested against the naive loop and the
        unsharded engine (tests/engine/test_fsdp_engine.py)."""
        raise ParamsError(
            "engine: self_check is not supported on a sharded model (FSDPEngine); run it with BKEngine on the same model before shard_model"  # noqa: E501
        )

    def full_noisy_sum(self) -> list[Tensor] | None:
        """The last released noisy sum, one whole tensor per parameter (a collective)."""
        shards = self._sum.last()
        if shards is None:
            return None
        return full_tensors(
            [
                DTensor.from_local(s, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
                if isinstance(p, DTensor)
                else s
                for s, p in zip(shards, self.params)
            ]
        )
