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
- keeps exactly the trainable set of the user's model (or of ``only``: a subset, to bound the cost);
- runs in training mode (the engine records nothing in eval mode, and eval mode changes what some
  layers compute) with every dropout off: dropout modules' ``p`` and every float ``*drop*``
  attribute of a layer or its config (HF's ``attention_dropout``, ``layerdrop``, ``drop_path_rate``)
  set to 0;
- gets the examples, plus one padding row of weight 0 (it must contribute exactly zero), as
  physical batches accumulated into one step (gradient accumulation) at the shapes training uses:
  for sequence inputs one batch as large as the padded sequence length (B = T), and one whose size
  is coprime to every other dimension of the inputs, the rows taken in turn (repeating where a
  batch is larger than the rows, so the naive loop still runs once per distinct row and each row
  counts as often as the engine saw it).

It proves the engine exact on this model, these examples, at this precision; it does not prove other
inputs (a data-dependent branch not taken here) or another precision. The cost is one engine step
plus n + 1 naive forward and backward passes on n + 1 rows; with ``only`` it compares a subset of
parameters.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from dpledger.engine.clipping import clip_factors, group_threshold
from dpledger.engine.layers import generic
from dpledger.engine.validators import UnsupportedLayerError, check_state_unchanged, state_snapshot
from dpledger.errors import ParamsError

LossFn = Callable[[nn.Module, Tensor, Tensor], Tensor]
Precision = Literal["auto", "float64", "float32"]

TOLERANCE: dict[torch.dtype, float] = {torch.float64: 1e-9, torch.float32: 1e-3}
"""Largest relative error accepted, per precision of the check.

float64: the engine and the loop sum the same terms in different orders, so they differ by
round-off, ~1e-16 per operation; measured at most 6e-16 on the zoo, tiny GPT-2 and BERT and the
digits and LM examples (1e-12 on a gradient that cancels exactly), so 1e-9 is three orders above
round-off and seven below a 1 % error in a rule. float32: round-off is ~6e-8 per operation and
grows through depth and with B·T-term sums (measured at most 4e-7 on the same models); 1e-3
separates that from a wrong rule (errors of a rule are of the order of the gradient itself: a
missing term, a wrong factor), not from a slip below 0.1 %."""

ZERO_GRADIENT_FLOOR: dict[torch.dtype, float] = {torch.float64: 1e-5, torch.float32: 1e-3}
"""A parameter's error is relative to the sum of the examples' clipped contributions to it, but at
least to this share of the whole sum's: a gradient that is zero in exact arithmetic (an attention
key's bias: softmax ignores a shift shared by all keys) comes out as round-off in both computations,
~eps × the terms that cancel, and its own scale would turn that into relative errors of order 1.
With a floor f, round-off up to tolerance·f of the whole sum passes (f = 1e-5: 1e-14, ~90·eps in
float64; 1e-3: 1e-6, ~16·eps in float32) and a 5 % error is still caught on any parameter carrying
more than 2e-13 (float64) or 2e-5 (float32) of it."""

LOSS_TOLERANCE_FACTOR = 10.0
"""The losses of one example alone and in the batch are the same operations on the same numbers
except for batched-kernel reduction orders: their tolerance is the precision's, times this margin,
relative."""

MEMORY_SHARE = 0.5
"""A float64 copy is made only if its estimated size is at most this share of the free memory."""

PADDING_WEIGHT = 0.0
WORST_SHOWN = 3


class SelfCheckError(UnsupportedLayerError):
    """The engine's private gradient on the user's model differs from the naive per-example loop
    (the message names the worst parameters, their layers and the relative error)."""


@dataclass(frozen=True)
class ParameterError:
    """One trainable parameter's relative error: ‖engine − loop‖ / Σ_i ‖C_i·w_i·g_i‖ over its
    coordinates (at least ``ZERO_GRADIENT_FLOOR`` of the same sum over all parameters)."""

    name: str
    layer: str
    relative_error: float


@dataclass(frozen=True)
class SelfCheckResult:
    """What the self-check compared and found; ``passed`` when every error is within ``tolerance``.

    ``max_relative_error`` is the largest of: the whole clipped sum's ‖Δ‖/‖S‖, the worst parameter's
    error, the worst per-example norm's |Δ|/‖w_i·g_i‖ and the worst per-example loss's."""

    passed: bool
    max_relative_error: float
    sum_relative_error: float
    norm_relative_error: float
    loss_relative_error: float
    worst_parameters: tuple[ParameterError, ...]
    examples: int
    padding_rows: int
    parameters_checked: int
    parameters_trainable: int
    elements_checked: int
    dtype: str
    tolerance: float
    clipping: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the ledger's ``self_check`` entry)."""
        return {
            "passed": self.passed,
            "max_relative_error": self.max_relative_error,
            "sum_relative_error": self.sum_relative_error,
            "norm_relative_error": self.norm_relative_error,
            "loss_relative_error": self.loss_relative_error,
            "worst_parameters": [asdict(worst) for worst in self.worst_parameters],
            "examples": self.examples,
            "padding_rows": self.padding_rows,
            "parameters_checked": self.parameters_checked,
            "parameters_trainable": self.parameters_trainable,
            "elements_checked": self.elements_checked,
            "dtype": self.dtype,
            "tolerance": self.tolerance,
            "clipping": self.clipping,
            "seconds": self.seconds,
        }

    def failure(self) -> str:
        """One line naming what differs (empty when passed)."""
        if self.passed:
            return ""
        where = f"{self.examples} examples, {self.dtype}, tolerance {self.tolerance:g}"
        if self.loss_relative_error > self.tolerance * LOSS_TOLERANCE_FACTOR:
            return (
                "self-check: each example's loss alone differs from its loss in the batch "
                f"(relative error {self.loss_relative_error:.3g}; {where}): "
                "the model mixes examples or is random with dropout off, "
                "so per-example clipping bounds nothing; "
                "make each example's loss depend on it alone"
            )
        failing = [w for w in self.worst_parameters if w.relative_error > self.tolerance]
        if not failing:
            return (
                "self-check: "
                "the engine's per-example norms differ from the naive per-example loop's "
                f"(relative error {self.norm_relative_error:.3g}; {where}); "
                "do not train privately with this model"
            )
        layers = ", ".join(dict.fromkeys(w.layer for w in failing))
        worst = ", ".join(f"{w.name} {w.relative_error:.3g}" for w in failing)
        return (
            "self-check: the engine's private gradient of layer(s) "
            f"{layers} differs from the naive per-example loop (relative error {worst}; {where}): "
            "its per-layer rule is wrong for this model; fix or unregister the rule, "
            "or freeze the layer"
        )


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
    hidden_hooks: Sequence[RemovableHandle] = (),
    raise_on_mismatch: bool = True,
    engine_type: Callable[..., Any],
) -> SelfCheckResult:
    """Compare the engine with the naive per-example loop on a copy of ``model`` (the model is not
    changed).

    ``loss_fn(model, x, y)`` -> per-example losses (B,) (the train stage's ``task.losses``);
    ``inputs``, ``targets``, ``weights``: a few actual training rows (batch first; weights default
    to 1). ``trainable``: names of the parameters the engine trains (default: those with
    ``requires_grad``); ``only``: glob patterns over those names to check a subset (the others are
    frozen on the copy). ``hidden_hooks``: an attached engine's own hooks, left off the copy. A
    mismatch above the tolerance raises :class:`SelfCheckError` with one line, unless
    ``raise_on_mismatch`` is False. ``engine_type``: the engine class under test (``BKEngine``;
    passed in, so that this module and the engine's ``self_check`` method do not import each other).
    """
    started = time.perf_counter()
    trainable, names = _checked_names(model, trainable, only)
    dtype = _check_dtype(model, names, precision)
    device = _device(model)
    # Nothing here may move the training's random streams: the run trains as without the check.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        replica = _replica(model, names, dtype, hidden_hooks)
        x, y = _cast(inputs, dtype), _cast(targets, dtype)
        ones = torch.ones(len(x), dtype=dtype, device=device)
        w = ones if weights is None else _cast(weights, dtype)
        x, y, w = _with_padding_row(x, y, w)
        groups = _clipping_groups(replica, names)
        clip = (clip_norm, clipping, automatic_gamma)
        trained = [p for name, p in replica.named_parameters() if name in set(trainable)]
        state = state_snapshot(replica, trained)  # a model changing its own state is named as such
        batches = training_batches(x)
        counts = torch.bincount(torch.cat(batches), minlength=len(x)).tolist()
        naive = _naive_loop(replica, loss_fn, (x, y, w), names, groups, clip, counts)
        check_state_unchanged(replica, trained, state)
        engine = _engine_pass(engine_type, replica, loss_fn, (x, y, w), clip, ghost, batches)
        seen = torch.cat(batches).cpu()
        naive = _Naive(naive.losses[seen], naive.norms[seen], naive.sums, naive.scales)
        counts = (len(x) - 1, len(trainable))
        result = _compare(naive, engine, names, replica, dtype, clipping, started, counts)
        if not result.passed and raise_on_mismatch:
            raise SelfCheckError(result.failure())
        return result


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
    """float64 where the copy fits (``auto``), else float32; refused (one line) when neither
    fits."""
    free = _available_bytes(_device(model))
    candidates = {
        "auto": (torch.float64, torch.float32),
        "float64": (torch.float64,),
        "float32": (torch.float32,),
    }
    if precision not in candidates:
        raise ParamsError(f"self-check: precision {precision!r} is invalid: auto, float64, float32")
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
    dtype: torch.dtype,
    hidden_hooks: Sequence[RemovableHandle],
) -> nn.Module:
    """A deep copy in ``dtype``, training mode, dropout off, trainable exactly where ``names``
    say."""
    with _hooks_hidden(hidden_hooks), torch.no_grad():
        replica = copy.deepcopy(model)
    checked = set(names)
    for name, parameter in replica.named_parameters():
        parameter.requires_grad_(name in checked)
        parameter.grad = None
    replica.to(dtype).train()
    _dropout_off(replica)
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


def _cast(tensor: Tensor, dtype: torch.dtype) -> Tensor:
    """Floating inputs and targets in the check's precision; token ids and labels as they are."""
    return tensor.to(dtype) if tensor.is_floating_point() else tensor


def _with_padding_row(x: Tensor, y: Tensor, w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The rows plus a copy of the first one with weight 0 (a padding row: it must contribute
    exactly 0)."""
    return (
        torch.cat([x, x[:1]]),
        torch.cat([y, y[:1]]),
        torch.cat([w, torch.full_like(w[:1], PADDING_WEIGHT)]),
    )


def _clipping_groups(model: nn.Module, names: Sequence[str]) -> dict[str, int]:
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


@dataclass
class _Naive:
    """The oracle's results: losses and norms per example, per parameter the clipped sum and its
    scale."""

    losses: Tensor
    norms: Tensor
    sums: dict[str, Tensor]
    scales: dict[str, Tensor]


def _naive_loop(
    model: nn.Module,
    loss_fn: LossFn,
    rows: tuple[Tensor, Tensor, Tensor],
    names: Sequence[str],
    groups: dict[str, int],
    clip: tuple[float, str, float],
    counts: Sequence[int],
) -> _Naive:
    """One forward and one backward pass per example by plain autograd; Σ_i C_i·w_i·g_i accumulated
    with the clipping factors of the loop's own norms (flat, per layer over ``groups`` with R/√L,
    automatic), row i counted ``counts[i]`` times (as often as the engine's batches hold it)."""
    (x, y, w), (clip_norm, clipping, gamma) = rows, clip
    params = dict(model.named_parameters())
    sums = {n: torch.zeros_like(params[n]) for n in names}
    scales = {n: torch.zeros((), dtype=torch.float64, device=params[n].device) for n in names}
    threshold = group_threshold(clipping, clip_norm, len(set(groups.values())))
    losses, norms = [], []
    for i in range(len(x)):
        model.zero_grad(set_to_none=True)
        try:
            loss = loss_fn(model, x[i : i + 1], y[i : i + 1])
            (loss.sum() * w[i].to(loss.dtype)).backward()
        except RuntimeError as error:
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            message = f"self-check: the naive loop failed on one example: {first}"
            raise SelfCheckError(message) from error
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
    return _Naive(
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


@dataclass
class _EnginePass:
    losses: Tensor
    norms: Tensor
    sums: dict[str, Tensor]


def _engine_pass(
    engine_type: Callable[..., Any],
    model: nn.Module,
    loss_fn: LossFn,
    rows: tuple[Tensor, Tensor, Tensor],
    clip: tuple[float, str, float],
    ghost: str,
    batches: Sequence[Tensor],
) -> _EnginePass:
    """The engine's step with noise off (normalizer 1) over the physical ``batches`` (row indices)
    of the rows, accumulated."""
    (x, y, w), (clip_norm, clipping, gamma) = rows, clip
    engine = engine_type(
        model,
        None,
        clip_norm=clip_norm,
        noise_multiplier=0.0,
        normalizer=1.0,
        clipping=clipping,
        automatic_gamma=gamma,
        ghost=ghost,  # type: ignore[arg-type]
    )
    try:
        losses, norms = [], []
        for rows in batches:
            batch_losses = loss_fn(model, x[rows], y[rows])
            norms.append(engine.backward(batch_losses, w[rows]).detach().double())
            losses.append(batch_losses.detach().double())
        engine.step()
        released = engine.last_noisy_sum
        assert released is not None  # a step was taken
        sums = {name: value.detach() for name, value in zip(engine.parameter_names, released)}
    finally:
        engine.detach()
    # the naive loop's losses and norms are host numbers: the engine's join them on the CPU
    return _EnginePass(torch.cat(losses).cpu(), torch.cat(norms).cpu(), sums)


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


def _relative(difference: Tensor, scale: Tensor, floor: float = 0.0) -> float:
    """|difference| / max(scale, floor), elementwise max; 0/0 = 0 (nothing compared), x/0 = inf."""
    difference, scale = difference.double().abs(), scale.double().abs().clamp_min(floor)
    undefined = torch.where(difference > 0, math.inf, 0.0)
    ratio = torch.where(scale > 0, difference / scale.clamp_min(1e-300), undefined)
    return float(ratio.max()) if ratio.numel() else 0.0


def _compare(
    naive: _Naive,
    engine: _EnginePass,
    names: Sequence[str],
    model: nn.Module,
    dtype: torch.dtype,
    clipping: str,
    started: float,
    counts: tuple[int, int],
) -> SelfCheckResult:
    """The record: errors per parameter (worst first), of the whole sum, the norms and the losses.
    ``counts``: real examples checked and trainable parameters of the user's model."""
    tolerance = TOLERANCE[dtype]
    floor = ZERO_GRADIENT_FLOOR[dtype] * float(sum(naive.scales.values()))
    modules = dict(model.named_modules())
    errors = []
    errors_of = {n: engine.sums[n].double() - naive.sums[n].double() for n in names}
    for name in names:
        difference = errors_of[name].norm()
        layer = name.rsplit(".", 1)[0] if "." in name else ""
        label = f"{layer or '<model>'} ({type(modules[layer]).__name__})"
        errors.append(ParameterError(name, label, _relative(difference, naive.scales[name], floor)))
    errors.sort(key=lambda e: e.relative_error, reverse=True)
    whole = math.sqrt(sum(float(errors_of[n].square().sum()) for n in names))
    size = math.sqrt(sum(float(naive.sums[n].double().square().sum()) for n in names))
    sum_error = _relative(torch.tensor(whole), torch.tensor(size), floor)
    norm_error = _relative(engine.norms - naive.norms, naive.norms)
    loss_floor = ZERO_GRADIENT_FLOOR[dtype] * float(naive.losses.abs().max())
    loss_error = _relative(engine.losses - naive.losses, naive.losses, loss_floor)
    worst = max(sum_error, norm_error, errors[0].relative_error)
    passed = worst <= tolerance and loss_error <= tolerance * LOSS_TOLERANCE_FACTOR
    return SelfCheckResult(
        passed=passed,
        max_relative_error=max(worst, loss_error),
        sum_relative_error=sum_error,
        norm_relative_error=norm_error,
        loss_relative_error=loss_error,
        worst_parameters=tuple(errors[:WORST_SHOWN]),
        examples=counts[0],
        padding_rows=1,
        parameters_checked=len(names),
        parameters_trainable=counts[1],
        elements_checked=sum(naive.sums[n].numel() for n in names),
        dtype=str(dtype).removeprefix("torch."),
        tolerance=tolerance,
        clipping=clipping,
        seconds=time.perf_counter() - started,
    )
