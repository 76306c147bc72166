"""Which dimension of every recorded tensor is the batch: traced, never inferred from a size.

Before the first training forward pass of each new input shape, the model is run twice more, in
training mode with gradients enabled (the code path of training), on the first 2 and the first 3 of
its examples (repeated when the batch is smaller), with the random streams forked and the buffers
restored afterwards. Every hooked layer's call records the shape of each of its input and output
tensors in both runs. A dimension whose size is the same in both runs
does not come from the batch (a (T, T) relative-position table, the sequence of a (T, B, d)
tensor); one whose size is 2k in the first and 3k in the second holds k rows of each example (k = 1:
the batch itself, at whatever position: sequence-first layouts put it at 1); any other change is a
size that depends on the data (tokens gathered per expert) and is refused. Only those two runs'
sizes are compared, and they differ from each other wherever the batch enters, so a batch size that
equals another dimension (B = T) can no longer be mistaken for it: the training pass then only
checks that its shapes fit the traced template, with the batch at the traced position.

A layer whose input and output carry no batch dimension at all (an embedding of relative positions,
broadcast over the batch afterwards) gets no per-example output gradient; its parameters are then
claimed by the nearest enclosing module whose output does carry the batch, which trains them by the
generic rule (re-running its forward per example, ``layers/generic.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten, tree_unflatten

PROBE_BATCHES = (2, 3)
"""The two batch sizes of the trace: distinct, so every dimension that follows the batch changes."""

CACHE_SIZE = 16
"""Input shapes whose traces are kept (dynamic padding gives one shape per sequence length)."""

Template = tuple[int, ...]
"""A traced shape: a non-negative entry is a size shared by every example; -k marks the batch
dimension, holding k rows of each example (size B·k at batch size B)."""


class ProvenanceError(Exception):
    """The batch dimension of a layer's tensor cannot be traced (the engine names the layer)."""


def template(first: tuple[int, ...], second: tuple[int, ...]) -> Template | str:
    """The :data:`Template` of a tensor of shape ``first`` at batch 2 and ``second`` at batch 3, or
    why it has none."""
    if len(first) != len(second):
        return f"its rank changes with the batch size ({first} at batch 2, {second} at batch 3)"
    sizes: list[int] = []
    for a, b in zip(first, second):
        if a == b:
            sizes.append(a)
        elif a % 2 == 0 and b % 3 == 0 and a // 2 == b // 3:
            sizes.append(-(a // 2))
        else:
            return f"its size {a} at batch 2 and {b} at batch 3 is not a multiple of the batch, so it depends on the data (tokens gathered per expert, a data-dependent selection)"  # noqa: E501
    if sum(s < 0 for s in sizes) > 1:
        return (
            f"several of its dimensions follow the batch ({first} at batch 2), so it mixes examples"
        )
    return tuple(sizes)


def batch_dim(shape: Template | None) -> tuple[int, int] | None:
    """(dimension, rows per example) of the batch in a template, or None when it has none."""
    if shape is None:
        return None
    return next(((d, -s) for d, s in enumerate(shape) if s < 0), None)


def fits(shape: tuple[int, ...], traced: Template | None, batch: int) -> bool:
    """``shape`` at batch size ``batch`` is the traced template (None: a non-tensor leaf)."""
    return traced is not None and (
        len(shape) == len(traced)
        and all(s == (batch * -t if t < 0 else t) for s, t in zip(shape, traced))
    )


@dataclass
class Seen:
    """One module call in one probe run: its tensor leaves' shapes (None for other leaves) and, for
    a rule layer, the k of its (B·k)-row input proved example-major by memory layout."""

    inputs: list[tuple[int, ...] | None]
    outputs: list[tuple[int, ...] | None]
    rows: int | None = None


@dataclass
class Traced:
    """One module call, traced: each leaf's :data:`Template` (None for non-tensor leaves), or
    ``problem``, why it has none; ``rows``: its (B·k)-row input proved example-major in both
    runs."""

    inputs: list[Template | None]
    outputs: list[Template | None]
    problem: str | None = None
    rows: bool = False

    @property
    def shared(self) -> bool:
        """No tensor of the call carries the batch."""
        return all(batch_dim(t) is None for t in (*self.inputs, *self.outputs))


Key = tuple[int, int]
"""(id of the module, its k-th call in the forward pass)."""


@dataclass
class Trace:
    """Every traced call of one input shape, by :data:`Key`."""

    calls: dict[Key, Traced] = field(default_factory=dict)


def _leaf_shapes(values: Any) -> list[tuple[int, ...] | None]:
    return [tuple(v.shape) if isinstance(v, Tensor) else None for v in tree_flatten(values)[0]]


def _merge(first: Seen, second: Seen) -> Traced:
    """The traced call from its two probe runs."""
    parts: list[list[Template | None]] = []
    for a, b in ((first.inputs, second.inputs), (first.outputs, second.outputs)):
        if len(a) != len(b):
            return Traced([], [], "its arguments change with the batch size")
        leaves: list[Template | None] = []
        for x, y in zip(a, b):
            if (x is None) != (y is None):
                return Traced([], [], "its arguments change with the batch size")
            shape = None if x is None else template(x, y)
            if isinstance(shape, str):
                return Traced([], [], shape)
            leaves.append(shape)
        parts.append(leaves)
    rows = first.rows is not None and first.rows == second.rows
    return Traced(parts[0], parts[1], rows=rows)


class Probe:
    """The record of one probe run: calls by :data:`Key`, in the order their forward ended."""

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.seen: dict[Key, Seen] = {}
        self.expanded: list[int] = []  # rule layers whose size-1 output this run expanded
        self._count: dict[int, int] = {}

    def add(self, module: nn.Module, args: Any, output: Any, rows: int | None = None) -> None:
        k = self._count.get(id(module), 0)
        self._count[id(module)] = k + 1
        self.seen[(id(module), k)] = Seen(_leaf_shapes(args), _leaf_shapes(output), rows)


def combine(first: Probe, second: Probe) -> Trace:
    """The trace of the two probe runs; a call seen in one only is traced with its problem."""
    trace = Trace()
    for key in dict.fromkeys([*first.seen, *second.seen]):
        if key in first.seen and key in second.seen:
            trace.calls[key] = _merge(first.seen[key], second.seen[key])
        else:
            trace.calls[key] = Traced([], [], "whether it runs depends on the batch size or data")
    return trace


def signature(args: tuple[Any, ...], kwargs: dict[str, Any], batch: int) -> tuple:
    """What a trace is reused for: the model inputs' structure, dtypes and shapes (their batch size
    left out) and the plain values of the other arguments."""
    leaves, spec = tree_flatten((args, kwargs))
    parts: list[Any] = [str(spec)]
    for leaf in leaves:
        if isinstance(leaf, Tensor):
            shape = tuple(leaf.shape)
            if shape and shape[0] == batch:
                shape = (-1, *shape[1:])
            parts.append((shape, leaf.dtype, leaf.device.type))
        elif isinstance(leaf, (int, float, bool, str, type(None))):
            parts.append(leaf)
        else:
            parts.append(type(leaf).__name__)
    return tuple(parts)


def probe_inputs(
    args: tuple[Any, ...], kwargs: dict[str, Any], batch: int, size: int
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The model's inputs cut to ``size`` examples (the first ones, repeated when the batch is
    smaller): every tensor whose leading dimension is the batch (the model's inputs are batch-first,
    as its losses are), the others unchanged."""
    leaves, spec = tree_flatten((args, kwargs))
    index = None
    out = []
    for leaf in leaves:
        if isinstance(leaf, Tensor) and leaf.dim() and leaf.shape[0] == batch:
            if index is None or index.device != leaf.device:
                index = torch.arange(size, device=leaf.device) % batch
            leaf = leaf.index_select(0, index)
        out.append(leaf)
    return tree_unflatten(out, spec)


def claimant(
    name: str, names: dict[str, nn.Module], trace: Trace, seen: set[int]
) -> nn.Module | None:
    """The nearest module enclosing ``name`` whose traced call returns the batch (and so whose
    re-run per example gives the claimed parameters' per-example gradients), or None."""
    parts = name.split(".") if name and name != "<model>" else []
    for depth in range(len(parts) - 1, -1, -1):
        module = names[".".join(parts[:depth])]
        if id(module) not in seen:
            continue
        calls = [t for (m, _), t in trace.calls.items() if m == id(module)]
        if calls and all(_returns_batch(t) for t in calls):
            return module
    return None


def _returns_batch(traced: Traced) -> bool:
    """The call's outputs carry the batch (one row per example, somewhere), and its inputs hold no
    (B·k)-row tensors, which the generic rule cannot split."""
    dims = [batch_dim(t) for t in traced.outputs]
    return (
        traced.problem is None
        and any(d is not None for d in dims)
        and all(d is None or d[1] == 1 for d in dims)
        and all(d is None or d[1] == 1 for d in map(batch_dim, traced.inputs))
    )


def leading_one(shape: tuple[int, ...]) -> bool:
    return len(shape) > 0 and shape[0] == 1


def broadcastable(traced: Traced) -> bool:
    """A call that carries no batch whose outputs (and, for a rule layer, its input) have a leading
    size 1 the engine broadcasts to the batch."""
    outputs = [t for t in traced.outputs if t is not None]
    return bool(outputs) and all(
        leading_one(t) for t in (*outputs, *traced.inputs[:1]) if t is not None
    )


def batch_first(tensor: Tensor, dim: int, rows: int) -> Tensor:
    """A tensor with the batch at ``dim`` (or as (B·rows) leading rows) as (B, ...)."""
    if rows > 1:
        return tensor.unflatten(0, (-1, rows))
    return tensor.movedim(dim, 0) if dim else tensor


def mismatch(where: tuple[tuple[int, int] | None, tuple[int, int] | None]) -> str:
    given, returned = (
        "no dimension"
        if w is None
        else f"dimension {w[0]}" + (f" ({w[1]} rows each)" if w[1] > 1 else "")
        for w in where
    )
    return f"the batch is {given} of its input but {returned} of its output"
