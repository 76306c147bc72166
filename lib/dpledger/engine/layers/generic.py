"""The generic exact rule: per-example gradients of ONE module's own parameters by re-running its
forward.

For a module that owns trainable parameters no specific rule covers (custom norms such as
LlamaRMSNorm or T5LayerNorm, ViTEmbeddings' cls token and position embeddings, layer-scale
parameters, torch's MultiheadAttention and RNNs), example i's gradient is the vector-Jacobian
product of the module's forward on example i's slice of the saved inputs (every positional and
keyword argument) with example i's output gradient: ``torch.func.vjp`` under ``vmap`` over the
examples, or a loop over them where ``vmap`` cannot batch the forward (torch's fused RNN kernels, a
mixture-of-experts block's data-dependent dispatch, any forward ``vmap`` fails on: :func:`looped`).
Only the module's own parameters (and those of children it uses functionally,
:data:`CLAIMED_CHILDREN`) are differentiated; its child layers run with their real weights and keep
their own (ghost) rules, so this is never one fallback over the whole model.

Batch layout: each input and output tensor is batched along the dimension the engine traced for it
(``provenance.py``: 1 for torch's RNNs and MultiheadAttention with ``batch_first=False`` and for RNN
hidden states, none for masks and position ids shared by every example), never along a dimension
guessed from its size. The recomputed outputs must equal the ones the forward pass produced: a
module that mixes examples, or whose layout is not the one assumed, is refused naming it rather
than given a wrong gradient. That check is formed on the device (:attr:`Recomputed.matches`) and
read by the engine once for all generic-rule calls of a backward pass, before any clipping (one
host sync instead of three per call, about 325 per step of a 32-layer Llama).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, vjp, vmap
from torch.utils._pytree import tree_flatten, tree_unflatten

CLAIMED_CHILDREN: dict[str, Callable[[nn.Module], tuple[str, ...]]] = {
    "torch.nn.modules.activation.MultiheadAttention": lambda m: ("out_proj",),
    "transformers.models.t5.modeling_t5.T5Attention": (
        lambda m: ("relative_attention_bias",) if m.has_relative_attention_bias else ()
    ),
    "transformers.models.swin.modeling_swin.SwinLayer": lambda m: ("attention",),
    "transformers.models.deberta_v2.modeling_deberta_v2.DebertaV2Encoder": (
        lambda m: (
            tuple(c for c in ("rel_embeddings", "LayerNorm") if hasattr(m, c))
            if m.relative_attention
            else ()
        )
    ),
    "transformers.models.deberta_v2.modeling_deberta_v2.DisentangledSelfAttention": (
        lambda m: tuple(c for c in ("pos_key_proj", "pos_query_proj") if hasattr(m, c))
    ),
}
"""Children (with all their descendants) whose parameters a module uses functionally, not by calling
them (MultiheadAttention passes ``out_proj.weight`` to ``F.multi_head_attention_forward``), or on
inputs without a batch dimension whose outputs are folded with the batch (T5's relative attention
bias is looked up from (query, key) positions and broadcast over the batch; DeBERTa's relative
position projections run on a (1, 2k, d) table ``repeat``-ed to B·heads rows; Swin's attention sees
B·windows rows and adds a (1, heads, N, N) bias): their parameters belong to the parent's generic
rule, whose forward takes batch-first inputs. Keyed by qualified class name so that nothing imports
``transformers``."""


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def claimed_children(module: nn.Module) -> tuple[str, ...]:
    """Names of the children of ``module`` whose parameters its generic rule differentiates: those
    of :data:`CLAIMED_CHILDREN`, and every child of a mixture-of-experts block
    (:func:`is_experts_block`)."""
    for cls in type(module).__mro__:
        claim = CLAIMED_CHILDREN.get(qualified_name(cls))
        if claim is not None:
            return claim(module)
    if is_experts_block(module):
        return tuple(name for name, _ in module.named_children())
    if is_state_space_mixer(module):
        return tuple(name for name in SSM_FUNCTIONAL_CHILDREN if hasattr(module, name))
    return ()


SSM_FUNCTIONAL_CHILDREN = ("conv1d", "dt_proj")
"""The children of a state-space mixer whose weights it passes to its kernels as plain tensors."""


def is_state_space_mixer(module: nn.Module) -> bool:
    """A Mamba-style mixer (Mamba, Mamba2, FalconMamba, Jamba's, ...): a state matrix ``A_log`` of
    its own beside a depthwise ``conv1d``. It hands ``conv1d.weight`` and ``dt_proj.weight`` and
    ``bias`` to its causal convolution and selective scan as plain tensors, outside those layers'
    forward, so its generic rule differentiates them with its own parameters."""
    conv = getattr(module, "conv1d", None)
    return (
        isinstance(module._parameters.get("A_log"), nn.Parameter)
        and isinstance(conv, nn.Conv1d)
        and conv.groups == conv.in_channels
    )


def is_experts_block(module: nn.Module) -> bool:
    """A mixture-of-experts block: a module with an ``experts`` child beside the router that
    dispatches to it (``gate`` or ``router``), as transformers' sparse MoE blocks (Mixtral, OLMoE,
    Qwen-MoE, ...) are built. Inside it the tokens are flattened to (B·T, d) rows, routed and
    gathered per expert, a data-dependent layout no rule can take batch-first; the block itself
    takes and returns batch-first hidden states, so its generic rule (one example at a time: the
    dispatch has no batching rule) differentiates the router, the experts and any shared expert
    exactly. Their per-example gradients are instantiated: B times the block's trainable
    parameters in memory."""
    children = dict(module.named_children())
    return isinstance(children.get("experts"), nn.Module) and any(
        isinstance(children.get(name), nn.Module) for name in ("gate", "router")
    )


class GenericRuleError(Exception):
    """The generic rule cannot form exact per-example gradients for this call (the engine names the
    layer)."""


@dataclass
class Recomputed:
    """Per-example gradients of one call, {parameter path: (B, *shape)}, and for each output the
    recomputation was checked on (``outputs``, flattened indices) whether it matched the forward's:
    ``matches``, a bool device tensor, read by the caller (:func:`mismatch_message`) so that many
    calls cost one host sync."""

    grads: dict[str, Tensor]
    outputs: list[int]
    matches: Tensor


def mismatch_message(output: int) -> str:
    return (
        f"recomputing output {output} one example at a time does not give the batch's output, "
        "so the layer mixes examples or its inputs are not batch-first"
    )


@dataclass
class Layout:
    """The batch dimension of each flattened input and output tensor of one call, as traced
    (``provenance.py``): None for a tensor shared by every example (masks, position ids)."""

    inputs: list[int | None]
    outputs: list[int | None]


def check_call(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Why this call's inputs cannot be split per example, or None."""
    if isinstance(module, nn.RNNBase) and any(
        isinstance(a, nn.utils.rnn.PackedSequence) for a in args
    ):
        return "a PackedSequence input has no per-example layout; pad the batch instead"
    if isinstance(module, nn.MultiheadAttention):
        mask = kwargs.get("attn_mask", args[5] if len(args) > 5 else None)
        if isinstance(mask, Tensor) and mask.dim() == 3:
            return "a 3-D attn_mask (batch × heads, L, S) mixes the batch and head dimensions; use a 2-D mask"  # noqa: E501
    return None


def per_example_grads(
    module: nn.Module,
    params: dict[str, Tensor],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    layout: Layout,
    outputs: list[Tensor | None],
    out_grads: list[Tensor | None],
    batch: int,
) -> Recomputed:
    """Per-example gradients of ``params`` (paths relative to ``module``) from the saved call, and
    whether the recomputed outputs match the saved ones (on the device: :class:`Recomputed`).

    ``layout``: the traced batch dimensions of the call; ``outputs``/``out_grads``: the forward's
    flattened output tensors and their gradients (None where the output got none or is not a
    floating tensor)."""
    input_leaves, input_spec = tree_flatten((args, kwargs))
    in_dims = layout.inputs
    used = [k for k, g in enumerate(out_grads) if g is not None]
    for k in used:
        if layout.outputs[k] is None:
            raise GenericRuleError(
                f"output {k} (shape {tuple(outputs[k].shape)}) carries no batch dimension, so its gradient is the sum over the examples"  # noqa: E501
            )
    out_dims = [layout.outputs[k] for k in used]
    tensor_slots = [i for i, d in enumerate(in_dims) if d is not None]
    primals = {name: p.detach() for name, p in params.items()}
    # called, but none of its outputs reached the loss: every example's gradient is zero
    if not used:
        zeros = {name: p.new_zeros(batch, *p.shape) for name, p in primals.items()}
        return Recomputed(zeros, [], torch.ones(0, dtype=torch.bool))

    def example(
        batched: list[Tensor], cotangents: list[Tensor]
    ) -> tuple[dict[str, Tensor], list[Tensor]]:
        leaves = list(input_leaves)
        for slot, value in zip(tensor_slots, batched):
            leaves[slot] = value.unsqueeze(in_dims[slot])
        call_args, call_kwargs = tree_unflatten(leaves, input_spec)

        def forward(weights: dict[str, Tensor]) -> tuple[Tensor, ...]:
            flat = tree_flatten(functional_call(module, weights, call_args, call_kwargs))[0]
            return tuple(flat[k].squeeze(dim) for k, dim in zip(used, out_dims))

        recomputed, pullback = vjp(forward, primals)
        return pullback(tuple(c.to(r.dtype) for c, r in zip(cotangents, recomputed)))[0], list(
            recomputed
        )

    batched_inputs = [input_leaves[i] for i in tensor_slots]
    cotangents = [out_grads[k] for k in used]

    def one_at_a_time() -> tuple[dict[str, Tensor], list[Tensor]]:
        results = [
            example(
                [x.select(in_dims[s], i) for s, x in zip(tensor_slots, batched_inputs)],
                [g.select(d, i) for g, d in zip(cotangents, out_dims)],
            )
            for i in range(batch)
        ]
        grads = {name: torch.stack([r[0][name] for r in results]) for name in primals}
        recomputed = [
            torch.stack([r[1][j] for r in results], dim=d) for j, d in enumerate(out_dims)
        ]
        return grads, recomputed

    batched = functools.partial(
        vmap(
            example,
            in_dims=([in_dims[i] for i in tensor_slots], out_dims),
            out_dims=(0, out_dims),
            randomness="error",
        ),
        batched_inputs,
        cotangents,
    )
    grads, recomputed = _vmapped_or_looped(module, batched, one_at_a_time)
    matches = torch.stack([close(value, outputs[k]) for k, value in zip(used, recomputed)])
    return Recomputed(grads, used, matches)


def _vmapped_or_looped(
    module: nn.Module,
    batched: Callable[[], tuple[dict[str, Tensor], list[Tensor]]],
    one_at_a_time: Callable[[], tuple[dict[str, Tensor], list[Tensor]]],
) -> tuple[dict[str, Tensor], list[Tensor]]:
    """The per-example re-runs under ``vmap`` (``batched``), or one example at a time where the
    module is :func:`looped` or ``vmap`` fails on it (the module is then remembered); a random
    operation under ``vmap`` is refused, not retried (the re-runs would draw other numbers)."""
    if looped(module):
        return one_at_a_time()
    try:
        return batched()
    except RuntimeError as error:
        if "random" in str(error):
            raise
    LOOPED.add(module)
    return one_at_a_time()


LOOPED: weakref.WeakSet[nn.Module] = weakref.WeakSet()
"""Modules whose forward ``vmap`` could not batch (an operator without a batching rule, a shape
read from the input to build a tensor of the batch's size): re-run one example at a time from the
first failure on, without trying ``vmap`` again."""


def looped(module: nn.Module) -> bool:
    """Whether the module's per-example re-runs go one example at a time: torch's fused RNN kernels
    have no batching rule, a mixture-of-experts block's dispatch has data-dependent shapes, and a
    module ``vmap`` failed on (:data:`LOOPED`)."""
    return isinstance(module, nn.RNNBase) or is_experts_block(module) or module in LOOPED


def batch_outputs(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The flattened outputs of ``module`` re-run on the whole batch (no gradient), for checking the
    per-example recomputation where the saved outputs were changed in place after the call."""
    with torch.no_grad():
        return tree_flatten(module(*args, **kwargs))[0]


def close(recomputed: Tensor, saved: Tensor) -> Tensor:
    """Same up to rounding, as a 0-dim bool tensor on the device (no host sync): relative 1e-6 in
    float64, 1e-3 in float32, 3e-2 in half precision, of the largest finite saved entry (at least
    1). Non-finite entries must be non-finite in both (an example with a NaN input is then dropped
    by the engine, not mistaken for a layer that mixes examples)."""
    if not saved.numel():
        return torch.ones((), dtype=torch.bool, device=saved.device)
    recomputed = recomputed.to(saved.dtype)
    finite = torch.isfinite(saved)
    same_finite = torch.eq(finite, torch.isfinite(recomputed)).all()
    tolerance = {torch.float64: 1e-6, torch.float32: 1e-3}.get(saved.dtype, 3e-2)
    error = torch.where(finite, recomputed - saved, 0).abs().amax()
    scale = torch.where(finite, saved, 0).abs().amax().clamp_min(1.0)
    return same_finite & (error <= tolerance * scale)
