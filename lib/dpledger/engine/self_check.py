"""Self-check: the BK engine proves its exactness on the user's own model before it trains.

The engine's clipped sum Σ_i C_i·w_i·g_i is exactly DP-SGD's only if every layer's rule is right for
the layers of THIS model: a rule that is wrong (a custom layer registered with a wrong rule, an
architecture no test covers) trains with a wrong private gradient and says nothing. So before the
first step the engine is run once, with noise off, on a copy of the model and a few of its actual
training examples, and compared with an oracle that shares nothing with it: a plain loop of one
forward and one backward pass per example by ordinary autograd, each trainable parameter's gradient
read from ``.grad``, clipped with the functions of :mod:`dpledger.engine.clipping` applied to the
loop's own norms.

What is compared, example by example and parameter by parameter: the per-example losses (batch vs
one example alone: a model that mixes examples or draws random numbers breaks per-example DP), the
per-example norms ‖w_i·g_i‖, and every trainable parameter's clipped sum. The copy:

- is float64 where it fits in memory (round-off ~1e-16 per operation), else the model's float32;
  a model that fails on an example in float64 (its own code fixes float32: ``x.float()``) is
  checked in float32, the precision it trains in;
- keeps exactly the trainable set of the user's model (or of ``only``: a subset, to bound the cost);
- runs in the modes training runs it in: the model's own when it is in training mode (a frozen
  BatchNorm put in eval mode stays so), else every module in training mode (the engine records
  nothing in eval mode, and eval mode changes what some layers compute);
- has every dropout off: dropout modules' ``p`` and every float ``*drop*`` attribute of a layer or
  its config (HF's ``attention_dropout``, ``layerdrop``, ``drop_path_rate``) set to 0, and every
  functional dropout called at rate 0 (a literal ``F.dropout(x, 0.1)``;
  :mod:`dpledger.engine.self_check_forward`, which also refuses ``F.batch_norm(training=True)``
  by name);
- has spectral_norm's power iteration off: its vectors are constants in the gradient, and
  iterating between the naive loop's examples would give each a different weight;
- gets the examples, plus one padding row of weight 0 (it must contribute exactly zero), as
  physical batches accumulated into one step (gradient accumulation) at the shapes training uses:
  for sequence inputs one batch as large as the padded sequence length (B = T), and one whose size
  is coprime to every other dimension of the inputs, the rows taken in turn (repeating where a
  batch is larger than the rows, so the naive loop still runs once per distinct row and each row
  counts as often as the engine saw it);
- forwards, where the caller gives it (``batch``), the physical batch training forwards first, at
  its full size and in training's precision (no more memory than training's own forward pass): the
  losses of its first, middle and last rows there must equal theirs alone. A model that mixes
  examples only in batches larger than the check's own (a normalisation over the batch switched on
  at B ≥ 9) is caught at the size training uses, for the cost of one forward pass without
  gradients.

It proves the engine exact on this model, these examples, at this precision; it does not prove other
inputs (a data-dependent branch not taken here) or another precision. The cost is one engine step
plus n + 1 naive forward and backward passes on n + 1 rows; with ``only`` it compares a subset of
parameters.

This module orchestrates the check (the copy, the precision, the engine's pass); the naive loop is
in :mod:`dpledger.engine.naive_loop`, the comparison, tolerances and record in
:mod:`dpledger.engine.self_check_compare` (their public names are importable from here too).
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import functools
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.nn.utils.parametrizations import _SpectralNorm as SpectralNorm
from torch.utils.hooks import RemovableHandle

from dpledger.engine.naive_loop import ExampleFailure, LossFn, clipping_groups, naive_loop
from dpledger.engine.self_check_compare import (
    LOSS_TOLERANCE_FACTOR,
    TOLERANCE,
    WORST_SHOWN,
    ZERO_GRADIENT_FLOOR,
    Arithmetic,
    EnginePass,
    NaiveResult,
    ParameterError,
    SelfCheckError,
    SelfCheckResult,
    compare,
    full_precision,
)
from dpledger.engine.self_check_forward import CheckedForward, uncopyable_attribute
from dpledger.engine.state_guard import check_state_unchanged, state_snapshot
from dpledger.errors import ParamsError

__all__ = [
    "LOSS_TOLERANCE_FACTOR",
    "MEMORY_SHARE",
    "PADDING_WEIGHT",
    "TOLERANCE",
    "WORST_SHOWN",
    "ZERO_GRADIENT_FLOOR",
    "LossFn",
    "ParameterError",
    "Precision",
    "SelfCheckError",
    "SelfCheckResult",
    "run_self_check",
    "training_arithmetic",
    "training_batches",
]

Precision = Literal["auto", "float64", "float32", "training"]
"""The proof's precision (``auto``: float64 where the copy fits, else float32); ``training``: no
proof, the comparison in training's precision only."""

MEMORY_SHARE = 0.5
"""A float64 copy is made only if its estimated size is at most this share of the free memory."""

PADDING_WEIGHT = 0.0


def run_self_check(
    model: nn.Module,
    loss_fn: LossFn,
    inputs: Tensor,
    targets: Tensor,
    weights: Tensor | None = None,
    *,
    clip_norm: float,
    clipping: str = "flat",
    automatic_gamma: float = 0.01,
    ghost: str = "auto",
    trainable: Sequence[str] | None = None,
    only: Sequence[str] = (),
    precision: Precision = "auto",
    autocast: torch.dtype | None = None,
    hidden_hooks: Sequence[RemovableHandle] = (),
    raise_on_mismatch: bool = True,
    batch: tuple[Tensor, Tensor] | None = None,
    engine_type: Callable[..., Any],
) -> SelfCheckResult:
    """Compare the engine with the naive per-example loop on a copy of ``model`` (the model is not
    changed): in float64 (``precision``), and again in the precision training uses.

    ``loss_fn(model, x, y)`` -> per-example losses (B,) (the train stage's ``task.losses``);
    ``inputs``, ``targets``, ``weights``: a few actual training rows (batch first; weights default
    to 1). ``trainable``: names of the parameters the engine trains (default: those with
    ``requires_grad``); ``only``: glob patterns over those names to check a subset (the others are
    frozen on the copy). ``autocast``: the dtype training's forward passes run under
    ``torch.autocast`` in (bf16 under ``train.precision: bf16`` on CUDA), None for none; the second
    comparison runs the copy in the model's own dtype under it (``SelfCheckResult.training``), as
    training does, so that a rule exact in float64 but not in float32 is caught.
    ``precision="training"`` runs that comparison only. ``hidden_hooks``: an attached engine's own
    hooks, left off the copy. A mismatch above the tolerance raises :class:`SelfCheckError` with
    one line, unless ``raise_on_mismatch`` is False. ``batch``: the inputs and targets of the
    physical batch training forwards first (padding rows included), whose rows' losses are compared
    with theirs alone in the comparison in training's precision (:func:`batch_losses`).
    ``engine_type``: the engine class under test (``BKEngine``; passed in, so that this module and
    the engine's ``self_check`` method do not import each other).
    """
    started = time.perf_counter()
    trainable, names = _checked_names(model, trainable, only)
    device = _device(model)
    rows = (inputs, targets, weights)
    clip = (clip_norm, clipping, automatic_gamma)
    checked = (trainable, names)
    training = training_arithmetic(model, names, autocast)
    hooks, at_training = hidden_hooks, (batch, training.label)
    check = _Check(engine_type, model, loss_fn, rows, checked, clip, ghost, hooks, at_training)
    # Nothing here may move the training's random streams: the run trains as without the check.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        proof = None if precision == "training" else _proof(check, precision)
        if proof is not None and proof.dtype == training.label:
            result = replace(proof, training=proof)  # the proof ran in training's precision
        else:
            _check_dtype(model, names, "training")  # refused in one line where it does not fit
            in_training = check.run(training)
            result = in_training
            if proof is not None:
                both = proof.passed and in_training.passed
                rows_checked = in_training.batch_rows  # the batch is training's alone
                result = replace(proof, passed=both, training=in_training, batch_rows=rows_checked)
    result = replace(result, seconds=time.perf_counter() - started)
    if not result.passed and raise_on_mismatch:
        raise SelfCheckError(result.failure())
    return result


def _proof(check: _Check, precision: Precision) -> SelfCheckResult:
    """The comparison in float64 where the copy fits (else float32, or as ``precision`` says)."""
    model, names = check.model, check.checked[1]
    dtype = _check_dtype(model, names, precision)
    try:
        return check.run(full_precision(dtype))
    except ExampleFailure:
        # a model whose own code fixes float32 (x.float(), a float32 constant) cannot run in
        # float64: it is checked in float32, the precision it trains in
        if precision != "auto" or dtype != torch.float64:
            raise
        return check.run(full_precision(torch.float32))


def training_arithmetic(
    model: nn.Module, names: Sequence[str], autocast: torch.dtype | None
) -> Arithmetic:
    """The precision training runs in: the checked parameters' own dtype (the copy is not cast),
    under ``autocast`` where training uses it (its tolerance is then the autocast dtype's)."""
    dtype = _parameter_dtype(model, names)
    if autocast is None:
        return Arithmetic(None, None, dtype, str(dtype).removeprefix("torch."))
    return Arithmetic(None, autocast, autocast, f"{str(autocast).removeprefix('torch.')} autocast")


@dataclass(frozen=True)
class _Check:
    """One self-check's model, loss, rows, parameters and clipping: what every comparison shares
    but its precision."""

    engine_type: Callable[..., Any]
    model: nn.Module
    loss_fn: LossFn
    rows: tuple[Tensor, Tensor, Tensor | None]
    checked: tuple[Sequence[str], Sequence[str]]
    clip: tuple[float, str, float]
    ghost: str
    hidden_hooks: Sequence[RemovableHandle]
    batch: tuple[tuple[Tensor, Tensor] | None, str] = (None, "")
    """The training batch and the label of the precision it is forwarded in (training's)."""

    def run(self, arithmetic: Arithmetic) -> SelfCheckResult:
        """The naive loop and the engine's pass on a copy of the model in ``arithmetic``,
        compared."""
        started = time.perf_counter()
        (inputs, targets, weights), (trainable, names) = self.rows, self.checked
        cast = arithmetic.cast
        replica = _replica(self.model, names, cast, self.hidden_hooks)
        x, y = _cast(inputs, cast), _cast(targets, cast)
        device = _device(self.model)
        ones = torch.ones(len(x), dtype=cast or _parameter_dtype(replica, names), device=device)
        w = ones if weights is None else _cast(weights, cast)
        x, y, w = _with_padding_row(x, y, w)
        groups = clipping_groups(replica, names)
        trained = [p for name, p in replica.named_parameters() if name in set(trainable)]
        state = state_snapshot(replica, trained)  # a model changing its own state is named as such
        batches = training_batches(x)
        counts = torch.bincount(torch.cat(batches), minlength=len(x)).tolist()
        forward = functools.partial(arithmetic.forward, device)
        rows = (x, y, w)
        with CheckedForward():
            clip = self.clip
            naive = naive_loop(replica, self.loss_fn, rows, names, groups, clip, counts, forward)
            check_state_unchanged(replica, trained, state)
            engine = _engine_pass(self, replica, rows, batches, forward)
            batch = self.batch[0] if arithmetic.label == self.batch[1] else None
            alone, together = batch_losses(replica, self.loss_fn, batch, cast, forward)
        seen = torch.cat(batches).cpu()
        naive = NaiveResult(
            torch.cat([naive.losses[seen], alone]), naive.norms[seen], naive.sums, naive.scales
        )
        engine = replace(engine, losses=torch.cat([engine.losses, together]))
        counts = (len(x) - 1, len(trainable))
        result = compare(naive, engine, names, replica, arithmetic, self.clip[1], started, counts)
        return replace(result, batch_rows=0 if batch is None else len(batch[0]))


BATCH_ROWS_COMPARED = 3
"""Rows of the training batch whose losses alone are compared with theirs in it: the first, the
middle and the last (a model mixing examples moves every row's loss; the ends catch one that moves
only the rows at an end, a causal mix across the batch or a last-row summary)."""


def batch_losses(
    model: nn.Module,
    loss_fn: LossFn,
    batch: tuple[Tensor, Tensor] | None,
    cast: torch.dtype | None,
    forward: Callable[[], contextlib.AbstractContextManager],
) -> tuple[Tensor, Tensor]:
    """The losses (float64, on the host) of up to :data:`BATCH_ROWS_COMPARED` rows of ``batch``,
    each forwarded alone, and the same rows' losses in ``batch`` forwarded whole, without gradients
    (the copy's dropout is off); two empty tensors without a batch."""
    if batch is None or len(batch[0]) == 0:
        empty = torch.zeros(0, dtype=torch.float64)
        return empty, empty
    x, y = _cast(batch[0], cast), _cast(batch[1], cast)
    picked = sorted({0, len(x) // 2, len(x) - 1})[:BATCH_ROWS_COMPARED]
    with torch.no_grad():
        with forward():
            whole = loss_fn(model, x, y).detach()
        alone = []
        for row in picked:
            with forward():
                alone.append(loss_fn(model, x[row : row + 1], y[row : row + 1]).detach())
    together = torch.stack([whole[row] for row in picked])  # on the device: views, no gather
    return torch.cat(alone).double().cpu(), together.double().cpu()


def _parameter_dtype(model: nn.Module, names: Sequence[str]) -> torch.dtype:
    """The dtype of the first checked parameter: training's (and the weights' of rows given
    none)."""
    return dict(model.named_parameters())[names[0]].dtype


def _checked_names(
    model: nn.Module, trainable: Sequence[str] | None, only: Sequence[str]
) -> tuple[list[str], list[str]]:
    """Full names (as ``named_parameters`` gives them, tied weights once) of the trainable
    parameters and of those to check (all of them, or those matching a pattern of ``only``)."""
    named = dict(model.named_parameters())
    if trainable is None:
        trainable = [name for name, p in named.items() if p.requires_grad]
    unknown = [name for name in trainable if name not in named]
    if unknown:
        raise ParamsError(f"self-check: {unknown[0]!r} is not a parameter of the model")
    if not trainable:
        raise ParamsError("self-check: the model has no trainable parameter")
    if not only:
        return list(trainable), list(trainable)
    chosen = [name for name in trainable if any(fnmatch.fnmatchcase(name, p) for p in only)]
    if not chosen:
        raise ParamsError(f"self-check: the patterns {list(only)} match no trainable parameter")
    return list(trainable), chosen


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _available_bytes(device: torch.device) -> int:
    """Free memory where the copy will live: the accelerator's, or the machine's available RAM
    (Linux's MemAvailable, which counts reclaimable page cache; else the free pages)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    meminfo = Path("/proc/meminfo")
    lines = meminfo.read_text().splitlines() if meminfo.exists() else []
    available = [int(line.split()[1]) * 1024 for line in lines if line.startswith("MemAvailable:")]
    return available[0] if available else os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _copy_bytes(model: nn.Module, names: Sequence[str], dtype: torch.dtype) -> int:
    """Estimated memory of the check: the copy (parameters and buffers) plus, per checked parameter,
    its naive gradient, the loop's running clipped sum, the engine's buffer and one per-example
    gradient."""
    size = torch.tensor([], dtype=dtype).element_size()
    named = dict(model.named_parameters())
    everything = sum(t.numel() for t in (*model.parameters(), *model.buffers()))
    return size * (everything + 4 * sum(named[n].numel() for n in names))


def _check_dtype(model: nn.Module, names: Sequence[str], precision: Precision) -> torch.dtype:
    """float64 where the copy fits (``auto``), else float32 (``training``: the parameters' own
    dtype); refused (one line) when none fits."""
    free = _available_bytes(_device(model))
    candidates = {
        "auto": (torch.float64, torch.float32),
        "float64": (torch.float64,),
        "float32": (torch.float32,),
        "training": (_parameter_dtype(model, names),),
    }
    if precision not in candidates:
        raise ParamsError(
            f"self-check: precision {precision!r} is invalid: auto, float64, float32, training"
        )
    for dtype in candidates[precision]:
        if _copy_bytes(model, names, dtype) <= MEMORY_SHARE * free:
            return dtype
    need = _copy_bytes(model, names, candidates[precision][-1])
    raise SelfCheckError(
        "self-check: "
        f"a {candidates[precision][-1]} copy of the model needs about {need / 2**30:.2f} GiB, "
        f"more than {MEMORY_SHARE:.0%} of the {free / 2**30:.2f} GiB free; "
        "check a subset of the parameters per run (train.self_check_parameters: glob patterns)"
    )


@contextlib.contextmanager
def _hooks_hidden(handles: Sequence[RemovableHandle]) -> Iterator[None]:
    """Take an attached engine's hooks out of the model's hook dicts while it is copied (a copied
    hook would copy the engine with it), then put every dict back as it was, in its order."""
    saved: dict[int, tuple[dict, dict]] = {}
    for handle in handles:
        for ref in (handle.hooks_dict_ref, *handle.extra_dict_ref):
            hooks = ref()
            if hooks is not None:
                saved.setdefault(id(hooks), (hooks, dict(hooks)))
                hooks.pop(handle.id, None)
    try:
        yield
    finally:
        for hooks, content in saved.values():
            hooks.clear()
            hooks.update(content)


def _replica(
    model: nn.Module,
    names: Sequence[str],
    dtype: torch.dtype | None,
    hidden_hooks: Sequence[RemovableHandle],
) -> nn.Module:
    """A deep copy in ``dtype`` (None: the model's own), dropout off, spectral_norm's power
    iteration off, trainable exactly where ``names`` say; in the modes training runs it in: the
    model's own when it is in training mode (a frozen BatchNorm put in eval mode stays so), else
    every module in training mode. A model that cannot be deep-copied (a lock in an attribute) is
    refused naming the attribute."""
    try:
        with _hooks_hidden(hidden_hooks), torch.no_grad():
            replica = copy.deepcopy(model)
    except Exception as error:  # noqa: BLE001 (deepcopy raises whatever an attribute's copy raises)
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        where = uncopyable_attribute(model)
        raise SelfCheckError(
            f"self-check: the model cannot be copied for the check ({first}): {where} cannot be deep-copied; keep it outside the model (or give its class a __deepcopy__), or turn the check off with train.self_check: false"  # noqa: E501
        ) from None
    checked = set(names)
    for name, parameter in replica.named_parameters():
        parameter.requires_grad_(name in checked)
        parameter.grad = None
    if dtype is not None:
        replica.to(dtype)
    if not replica.training:
        replica.train()
    _dropout_off(replica)
    for module in replica.modules():
        if isinstance(module, SpectralNorm):
            # its vectors are constants in the gradient; iterating between the naive loop's
            # examples would give each example a different weight
            module.n_power_iterations = 0
    return replica


def _dropout_off(model: nn.Module) -> None:
    """p = 0 in dropout modules, and 0.0 in every float attribute named ``*drop*`` of a layer and
    its config (functional dropout, stochastic depth and layer drop read those at each forward
    pass)."""
    seen: set[int] = set()

    def zero(owner: Any) -> None:
        if id(owner) in seen:
            return
        seen.add(id(owner))
        for attr, value in list(vars(owner).items()):
            if "drop" in attr.lower() and isinstance(value, float):
                setattr(owner, attr, 0.0)
            elif type(value).__name__.endswith("Config") and hasattr(value, "__dict__"):
                zero(value)

    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
        zero(module)


def _cast(tensor: Tensor, dtype: torch.dtype | None) -> Tensor:
    """Floating inputs and targets in the check's precision (None: as training gives them); token
    ids and labels as they are."""
    return tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor


def _with_padding_row(x: Tensor, y: Tensor, w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The rows plus a copy of the first one with weight 0 (a padding row: it must contribute
    exactly 0)."""
    return (
        torch.cat([x, x[:1]]),
        torch.cat([y, y[:1]]),
        torch.cat([w, torch.full_like(w[:1], PADDING_WEIGHT)]),
    )


def _engine_pass(
    check: _Check,
    model: nn.Module,
    rows: tuple[Tensor, Tensor, Tensor],
    batches: Sequence[Tensor],
    forward: Callable[[], contextlib.AbstractContextManager],
) -> EnginePass:
    """The engine's step with noise off (normalizer 1) over the physical ``batches`` (row indices)
    of the rows, accumulated; each forward pass in ``forward()`` (training's autocast)."""
    (x, y, w), (clip_norm, clipping, gamma) = rows, check.clip
    engine = check.engine_type(
        model,
        None,
        clip_norm=clip_norm,
        noise_multiplier=0.0,
        normalizer=1.0,
        clipping=clipping,
        automatic_gamma=gamma,
        ghost=check.ghost,  # type: ignore[arg-type]
    )
    try:
        losses, norms = [], []
        for batch in batches:
            with forward():
                batch_losses = check.loss_fn(model, x[batch], y[batch])
            norms.append(engine.backward(batch_losses, w[batch]).detach().double())
            losses.append(batch_losses.detach().double())
        engine.step()
        released = engine.last_noisy_sum
        assert released is not None  # a step was taken
        sums = {name: value.detach() for name, value in zip(engine.parameter_names, released)}
    finally:
        engine.detach()
    # the naive loop's losses and norms are host numbers: the engine's join them on the CPU
    return EnginePass(torch.cat(losses).cpu(), torch.cat(norms).cpu(), sums)


def _coprime(sizes: Sequence[int], avoid: Sequence[int]) -> int:
    """The smallest batch size of at least 2 coprime to every one of ``sizes`` and not in
    ``avoid``."""
    size = 2
    while any(math.gcd(size, d) != 1 for d in sizes if d > 1) or size in avoid:
        size += 1
    return size


def training_batches(x: Tensor) -> list[Tensor]:
    """Row indices of the engine's physical batches: one of the padded sequence length T (the second
    dimension of token ids (B, T) or of (B, T, ...) inputs), one of a size coprime to every other
    dimension of the inputs, and the rows left over, the rows taken in turn (repeating), each at
    least once."""
    dims = list(x.shape[1:])
    sequence = x.dim() >= 3 or (x.dim() == 2 and not x.is_floating_point())
    sizes = [dims[0]] if sequence and dims[0] > 1 else []
    sizes.append(_coprime(dims, sizes))
    if sum(sizes) < len(x):
        sizes.append(len(x) - sum(sizes))
    order = torch.arange(sum(sizes), device=x.device) % len(x)
    return list(order.split(sizes))
