"""What the engine refuses, kept apart from the engine (as Opacus keeps ``validators/``), and the
one fix it offers.

Checks that run on construction (options, layers the engine cannot train), on the first training
forward pass (parameters used outside their layers, batch statistics from ``F.batch_norm``), during
training (layers whose forward pass
changes the model from the data; losses that are not per-example; canaries of the wrong length) and
after the backward pass (inputs changed in place, layers whose batch dimension is not the losses'),
plus :func:`replace_batchnorm`, the explicit one-call fix for BatchNorm (which mixes examples, so no
per-example gradient exists). The state a private step must not change is guarded in
:mod:`dpledger.engine.state_guard`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm
from torch.nn.utils.spectral_norm import SpectralNorm as HookSpectralNorm
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from dpledger.engine.clipping import check_clipping
from dpledger.engine.layers import LayerRule
from dpledger.engine.layers.embedding import MAX_NORM_REASON
from dpledger.errors import DpledgerError, ParamsError


class UnsupportedLayerError(DpledgerError):
    """A trainable parameter sits in a layer the engine cannot train privately (it names the layer
    and why)."""


GHOST_MODES = ("auto", "always", "never")
BATCHNORM_FIX = (
    "replace it with GroupNorm by dpledger.engine.replace_batchnorm(model), "
    "or put it in eval mode with running statistics and freeze it"
)


def check_options(
    clipping: str,
    clip_norm: float,
    automatic_gamma: float,
    noise_multiplier: float,
    normalizer: float,
    ghost: str,
) -> None:
    """The engine's numeric and mode options, each refused with one line naming it."""
    check_clipping(clipping, clip_norm, automatic_gamma)
    if not noise_multiplier >= 0:
        raise ParamsError(
            f"engine: noise_multiplier = {noise_multiplier!r} is invalid: it must be >= 0"
        )
    if not normalizer > 0:
        raise ParamsError(f"engine: normalizer = {normalizer!r} is invalid: it must be > 0")
    if ghost not in GHOST_MODES:
        raise ParamsError(
            f"engine: ghost = {ghost!r} is invalid: allowed values are {', '.join(GHOST_MODES)}"
        )


def layer_refusal(
    module: nn.Module, label: str, names: list[str], rule: LayerRule | None, attrs: list[str]
) -> str | None:
    """Why a layer owning the trainable parameters ``names`` (attributes ``attrs``) cannot be
    trained, or None: a BatchNorm (it mixes examples; the fix is :func:`replace_batchnorm`), the
    hook-based ``torch.nn.utils.spectral_norm`` (the parametrization is the fix), or a rule that
    refuses this layer's configuration or does not know one of its parameters. Layers without a
    rule get the generic rule."""
    if isinstance(module, _BatchNorm):
        return (
            f"engine: trainable parameter {', '.join(names)} is in layer {label}, a BatchNorm: "
            f"it mixes examples, so no per-example gradient exists; {BATCHNORM_FIX}"
        )
    if any(isinstance(hook, HookSpectralNorm) for hook in module._forward_pre_hooks.values()):
        return f"engine: layer {label} uses torch.nn.utils.spectral_norm, whose weight a forward pre-hook recomputes outside any rule, so its per-example gradients cannot be formed; use torch.nn.utils.parametrizations.spectral_norm, which the engine trains"  # noqa: E501
    if rule is None:
        return None
    reason = rule.validate(module) if rule.validate else None
    unknown = [attr for attr in attrs if attr not in rule.parameters]
    if reason or unknown:
        why = (
            reason or f"the rule knows only {', '.join(rule.parameters)}, not {', '.join(unknown)}"
        )
        return f"engine: layer {label} cannot be trained privately: {why}"
    return None


def data_dependent_state(module: nn.Module) -> str | None:
    """Why ``module`` (a BatchNorm, InstanceNorm or Embedding), run while the model trains and even
    with frozen parameters, changes the model from the data without noise or mixes examples; None
    when it does not:

    - a BatchNorm that normalises with (and updates running stats from) the batch: every example's
      gradient then depends on the other examples and the padding rows, so clipping no longer bounds
      one example's contribution (and the running stats in the released model come from the data);
    - an InstanceNorm that tracks running statistics (its normalisation is per example, but the
      running stats in the released model are computed from the data without noise);
    - an Embedding with ``max_norm``, which renormalises the looked-up rows in place."""
    if isinstance(module, _BatchNorm):
        return (
            None
            if not module.training and module.running_mean is not None
            else (
                "normalises with batch statistics, which mix examples (and padding rows) "
                f"into every per-example gradient; {BATCHNORM_FIX}"
            )
        )
    if isinstance(module, _InstanceNorm):
        return (
            None
            if not (module.training and module.track_running_stats)
            else (
                "updates its running statistics from the private batch without noise; "
                "use track_running_stats=False or put it in eval mode"
            )
        )
    return None if module.max_norm is None else f"{MAX_NORM_REASON}; use max_norm=None"


def refuse_data_dependent_state(
    model: nn.Module, module: nn.Module, inputs: tuple[object, ...]
) -> None:
    """Forward pre-hook: refuse, while ``model`` trains and even with frozen parameters, a layer
    whose forward pass changes the model from the data without noise or mixes examples (the cases:
    :func:`data_dependent_state`)."""
    if not model.training:
        return
    reason = data_dependent_state(module)
    if reason:
        name = next((n for n, m in model.named_modules() if m is module), "?") or "<model>"
        raise UnsupportedLayerError(f"engine: layer {name} ({type(module).__name__}) {reason}")


BATCH_STATISTICS = "engine: the model calls F.batch_norm with training=True, which normalises with the statistics of the batch: they mix examples (and padding rows) into every per-example gradient, so clipping bounds no example's contribution; pass training=False with fixed running statistics, or normalise each example on its own (F.group_norm, F.layer_norm)"  # noqa: E501


def batch_statistics(func: object, args: tuple, kwargs: dict) -> bool:
    """Whether a call seen by a torch function mode is a batch normalisation with the batch's own
    statistics: ``F.batch_norm`` or ``torch.batch_norm`` with ``training`` true (argument 5 of
    both)."""
    if func is not F.batch_norm and func is not torch.batch_norm:
        return False
    return bool(kwargs["training"] if "training" in kwargs else len(args) > 5 and args[5])


def check_losses(losses: Tensor) -> None:
    """``engine.backward`` takes per-example losses, shape (B,), not their mean."""
    if losses.dim() != 1:
        raise ParamsError(
            f"engine: losses must be per-example, shape (B,), got {tuple(losses.shape)}"
        )


NO_FORWARD = (
    "engine: no forward pass of the model was recorded since the last backward; "
    "run it in training mode (model.train()) with gradients enabled before engine.backward"
)


def batch_mismatch_message(label: str, rows: int, batch: int) -> str:
    """A layer whose input's leading dimension is not the batch and could not be proved to be rows
    of it."""
    return (
        f"engine: layer {label} saw batch dimension {rows} but there are {batch} losses; "
        "its input must be batch-first (or of size 1 there, shared by the batch), "
        "or its rows a contiguous view of a batch-first tensor (x.view(-1, d) of x (B, T, d)), "
        "where the engine can prove which example each row belongs to"
    )


def check_canary(canary: object, parameters: int) -> None:
    """A canary has one tensor per trainable parameter."""
    if len(canary) != parameters:
        raise ParamsError(
            f"engine: a canary needs {parameters} tensors (one per parameter), got {len(canary)}"
        )


def outside_use_message(name: str) -> str:
    return (
        f"engine: trainable parameter {name} is used outside the forward of its layer (e.g. "
        "a head tied by F.linear(h, embed.weight)), where it would get no gradient; "
        "tie modules instead (head.weight = embed.weight), or use it under torch.no_grad() "
        "or detached"
    )


def in_place_message(label: str) -> str:
    """The saved input was changed in place after the layer used it (e.g. ``h += layer(h)``). With
    the parameters not requiring gradients torch's own backward of a Linear never reads that input,
    so only the engine's version check stops the per-example gradients being formed from the changed
    values."""
    return (
        f"engine: layer {label}: its input was changed in place after the layer used it (e.g. "
        "h += layer(h)), so its per-example gradients cannot be formed; "
        "use an out-of-place operation (h = h + layer(h))"
    )


def flattened_rows(inputs: Tensor, output: object, batch: int) -> int | None:
    """k when the (B·k, ...) rows of ``inputs`` provably belong to the examples in order, k rows
    each: ``inputs`` is a contiguous view covering all of a contiguous tensor whose leading
    dimension is the batch (x.view(-1, d) of x (B, T, d)), so row r lies inside example r // k's
    memory; None otherwise (the layer is then refused). As everywhere in the engine, a leading
    dimension of size B is taken to be the batch."""
    base = inputs._base
    rows = inputs.shape[0] if inputs.dim() > 1 else 0
    if (
        base is None
        or not rows
        or rows == batch
        or rows % batch
        or base.dim() == 0
        or base.shape[0] != batch
        or not (base.is_contiguous() and inputs.is_contiguous())
        or inputs.data_ptr() != base.data_ptr()
        or inputs.numel() != base.numel()
        or not isinstance(output, Tensor)
        or output.dim() == 0
        or output.shape[0] != rows
    ):
        return None
    return rows // batch


ROW_PRESERVING = frozenset(
    f"{name}Backward0"
    for name in (
        "Relu",
        "Gelu",
        "Tanh",
        "Sigmoid",
        "Silu",
        "Elu",
        "LeakyRelu",
        "Hardtanh",
        "Softplus",
        "Neg",
        "Clone",
    )
) | {"ToCopyBackward0"}
"""Autograd nodes of unary elementwise operations: row r of their output depends on row r of their
one input."""


def rows_of_proved_rows(
    inputs: Tensor, output: object, batch: int, sources: dict[int, tuple[object, int]]
) -> int | None:
    """k when ``inputs`` (B·k, ...) is the output of a layer whose rows were proved example-major
    (``sources``: id of its output's tap node -> (node, k)), through unary elementwise operations
    only (OPT's fc2(relu(fc1(rows)))); None otherwise. Any other operation on the way (a binary one,
    a view, an in-place copy) could move rows between examples, so it ends the proof."""
    rows = inputs.shape[0] if inputs.dim() > 1 else 0
    if (
        not rows
        or rows % batch
        or not isinstance(output, Tensor)
        or output.dim() == 0
        or output.shape[0] != rows
    ):
        return None
    node = inputs.grad_fn
    while node is not None and id(node) not in sources:
        parents = [parent for parent, _ in node.next_functions if parent is not None]
        if type(node).__name__ not in ROW_PRESERVING or len(parents) != 1:
            return None
        node = parents[0]
    source, per_example = sources.get(id(node), (None, 0))
    return (
        per_example if node is not None and source is node and per_example * batch == rows else None
    )


def provenance_message(label: str, why: str) -> str:
    """A layer's batch dimension, traced at two batch sizes, is not one its rule can take."""
    return f"engine: layer {label}: the engine cannot trace which dimension is the batch: {why}"


def untraced_message(label: str) -> str:
    """A layer called in training that the trace at batch sizes 2 and 3 did not see."""
    return f"engine: layer {label} ran in a training pass but not when the engine traced the model at batch sizes 2 and 3 (call it only inside the model's forward, the same way for every batch), so which dimension of its tensors is the batch is unknown"  # noqa: E501


def untraced_shape_message(label: str) -> str:
    """A layer whose tensors at this batch size are not the traced ones with the batch resized."""
    return f"engine: layer {label}: its tensors' shapes at this batch size are not the ones traced at batch sizes 2 and 3 with the batch resized, so its layout depends on the batch or the data and which dimension is the batch is unknown"  # noqa: E501


def rows_message(label: str, rows: int) -> str:
    """(B·k) rows whose example order the engine cannot prove."""
    return (
        f"engine: layer {label} sees {rows} rows per example flattened into its leading dimension, "
        "and the engine can prove which example each row belongs to only for a contiguous view of a batch-first tensor (x.view(-1, d) of x (B, T, d)) or unary elementwise operations of such rows"  # noqa: E501
    )


def unbatched_message(label: str) -> str:
    """A layer whose tensors carry no batch and no module around it returns the batch."""
    return f"engine: layer {label}: none of its tensors carries the batch (a table shared by every example) and no module enclosing it returns the batch, so its per-example gradients cannot be formed; freeze its parameters (requires_grad=False)"  # noqa: E501


def probe_failure_message(error: Exception) -> str:
    """The model failed on 2 or 3 of its examples, which the batch trace runs it on."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"engine: the model fails on 2 or 3 of its examples ({first}), which the engine runs it on to trace which dimension of every layer's tensors is the batch; its forward must accept any batch size"  # noqa: E501


def checkpoint_reuse_message(label: str) -> str:
    """A parameter of a reentrant checkpoint's layer also used elsewhere in the step."""
    return f"engine: layer {label} runs inside a reentrant gradient checkpoint and its parameters are also used elsewhere in the same step, so their per-example norm cannot be formed from the separate uses; use use_reentrant=False, or do not share the parameters"  # noqa: E501


def rule_failure_message(label: str, shape: tuple[int, ...], error: Exception) -> str:
    """A layer's per-example rule raised on the input it was given (e.g. an unbatched vector whose
    size happens to be the batch size): one line naming the layer instead of torch's error from
    inside the engine."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (
        f"engine: layer {label}: its per-example rule cannot use its input of shape {shape} "
        f"({first}); "
        "its input must be batch-first (B, ...), or of batch size 1 shared by the batch"
    )


def broadcast_failure_message(layers: list[str], error: Exception) -> str:
    """The model failed after the engine expanded a batch-size-1 layer output to the batch (so that
    each example gets its own gradient): its code folds that tensor with the batch in a way the
    engine cannot follow."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (
        f"engine: the model fails ({first}) "
        f"on the output of layer {', '.join(dict.fromkeys(layers))} (one of them), "
        "which sees inputs of batch size 1 shared by the batch and whose output the engine expands to the batch so each example gets its own gradient; "  # noqa: E501
        "freeze that layer's parameters (requires_grad=False)"
    )


def _allowed(running: list[tuple[frozenset[int], bool]]) -> frozenset[int]:
    """The parameters a differentiable operation may use now: the innermost running layer's, and
    those of every enclosing generic-rule layer (re-running its whole forward per example
    differentiates nested uses too, e.g. DeBERTa's relative embeddings passed down to its attention
    layers)."""
    inner = running[-1][0] if running else frozenset()
    return inner.union(*(own for own, generic in running if generic))


_GRADIENT_FREE = {Tensor.detach, Tensor.detach_, Tensor.data.__get__, Tensor.grad.__get__}


class OutsideUses(TorchFunctionMode):
    """Active during the first recorded forward pass: finds the first trainable parameter that a
    differentiable operation uses outside the forward of a layer owning it (e.g. a head tied by
    ``F.linear(h, embed.weight)``). Ghost differentiation turns requires_grad off, so such a use
    would get no gradient at all, silently; only the layers' own uses reach the per-example
    rules. A functional batch normalisation with the batch's statistics is refused at once (a
    BatchNorm module in training mode is refused by its own pre-hook)."""

    def __init__(self, names: dict[int, str]) -> None:
        super().__init__()
        self.names = names
        # (parameter ids, generic rule?) of the hooked layers whose forward is running, innermost
        # last
        self.running: list[tuple[frozenset[int], bool]] = []
        self.found: str | None = None
        self.broadcast: list[
            str
        ] = []  # layers whose batch-size-1 outputs the engine expanded to the batch

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if batch_statistics(func, args, kwargs):
            raise UnsupportedLayerError(BATCH_STATISTICS)
        try:
            result = func(*args, **kwargs)
        except (RuntimeError, IndexError) as error:
            if self.broadcast:
                raise UnsupportedLayerError(
                    broadcast_failure_message(self.broadcast, error)
                ) from error
            raise
        if (
            self.found is None
            and torch.is_grad_enabled()
            and func not in _GRADIENT_FREE
            and any(
                isinstance(r, Tensor) and (r.is_floating_point() or r.is_complex())
                for r in tree_flatten(result)[0]
            )
        ):
            allowed = _allowed(self.running)
            for value in tree_flatten((args, kwargs))[0]:
                if (
                    isinstance(value, Tensor)
                    and id(value) in self.names
                    and id(value) not in allowed
                ):
                    self.found = self.names[id(value)]
                    break
        return result


MAX_GROUPS = 32
"""GroupNorm's usual group count (Wu & He 2018); fewer when the channel count has no such
divisor."""


def _group_count(channels: int) -> int:
    """The largest divisor of ``channels`` that is at most :data:`MAX_GROUPS`."""
    return max(g for g in range(1, min(channels, MAX_GROUPS) + 1) if channels % g == 0)


def replace_batchnorm(model: nn.Module) -> nn.Module:
    """Replace every BatchNorm (1d/2d/3d, SyncBatchNorm) of ``model`` in place by a GroupNorm over
    the same channels (the largest group count ≤ 32 dividing them), with the same ``eps`` and
    ``affine``; returns ``model``.

    GroupNorm normalises each example on its own, so per-example gradients exist and the engine
    trains it exactly. Fresh weights (ones, zeros): a pretrained BatchNorm's statistics do not carry
    over; fine-tune afterwards."""
    for name, child in list(model.named_children()):
        if isinstance(child, _BatchNorm):
            norm = nn.GroupNorm(
                _group_count(child.num_features),
                child.num_features,
                eps=child.eps,
                affine=child.affine,
            )
            reference = child.weight if child.affine else next(iter(child.buffers()), None)
            if reference is not None:
                norm = norm.to(device=reference.device, dtype=reference.dtype)
            setattr(model, name, norm)
        else:
            replace_batchnorm(child)
    return model
