"""Capture of each hooked layer's activations and output gradients during one forward and backward
pass.

Forward hooks keep each layer's input ``a`` (a :class:`Call`) and pass its output through
:func:`capture.tap`, whose backward hands the output gradient ``b`` to the engine's per-layer norms
(``norms.py``) at once. A layer under the generic rule keeps all its inputs, outputs and their
gradients (a :class:`GenericCall`). The tap hangs off a zero-dimensional "origin" leaf so the
backward graph reaches every layer, even the first (003 §3.2). A size-1 batch dimension is broadcast
to the batch so each example gets its own gradient; (T, B, ...) inputs and (B·k)-row inputs are
reshaped batch-first for the rules. The first training pass of the model also runs the guards of
``validators.py`` (parameters used outside their layers); every training pass refuses layers whose
forward changes the model from the data, and float16 (``precision.refuse_float16``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm
from torch.utils._pytree import tree_flatten, tree_unflatten

from dpledger.engine import capture, provenance, tracing, validators
from dpledger.engine.layers import LayerRule, generic
from dpledger.engine.owners import GENERIC, Layout
from dpledger.engine.validators import UnsupportedLayerError
from dpledger.precision import refuse_float16, refuse_float16_autocast


@dataclass
class Call:
    """One forward call of a hooked layer: its input, and later the gradient of its output."""

    name: str
    module: nn.Module
    rule: LayerRule
    params: dict[str, nn.Parameter]
    activations: Tensor | None
    backprops: Tensor | None = None
    version: int = 0
    reached: bool = False  # its output gradient arrived


@dataclass
class GenericCall:
    """One forward call of a layer under the generic rule: all its inputs, its outputs and their
    gradients."""

    name: str
    module: nn.Module
    params: dict[str, nn.Parameter]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    versions: list[tuple[Tensor, int]]
    layout: generic.Layout
    outputs: list[Tensor | None]
    out_grads: list[Tensor | None]
    output_versions: list[int | None]
    autocast: list[tuple[str, torch.dtype]] = field(default_factory=list)


class Recorder(tracing.Tracing):
    """The forward hooks of one engine: the calls of the last training forward pass, for its
    backward.

    ``on_backprops(call, grad)`` receives each :class:`Call`'s output gradient during the backward
    pass. ``handles`` are the hooks that capture; ``check_handles`` those of the first-pass check,
    removed by :meth:`take` once it has passed. ``recomputing`` is set while the generic rule
    re-runs a layer's forward.
    """

    def __init__(
        self,
        model: nn.Module,
        layout: Layout,
        on_backprops: Callable[[Call, Tensor], None],
    ) -> None:
        self.model, self.layout, self.on_backprops = model, layout, on_backprops
        self.calls: list[Call | GenericCall] = []
        self.late: list[Call | GenericCall] = []  # recorded while a backward pass runs
        self.origins: dict[tuple[torch.device, torch.dtype], Tensor] = {}
        self.recomputing = False
        self.in_backward = False
        self.model_batch: int | None = None
        self.row_sources: dict[
            int, tuple[Any, int]
        ] = {}  # this forward's taps of proved (B·k)-row outputs: k
        self.traces: dict[tuple, provenance.Trace] = {}
        self.trace: provenance.Trace | None = None
        self.probe: provenance.Probe | None = None
        # rule layers whose leading size-1 dimension is not broadcast in the probes: expanding it
        # made the model fail, so it is taken as it is (a sequence-first (1, B, d) input)
        self.kept_whole: set[int] = set()
        self.counts: dict[int, int] = {}
        self.taken: set[int] = set()  # parameters of the calls handed to the current backward
        self.module_handles: dict[int, Any] = {}
        self.handles: list[Any] = []
        for module in layout.hooked_modules(model):
            self._hook(module)
        self.inside = False  # the model's forward is running
        self.handles.append(model.register_forward_pre_hook(self._note_batch, with_kwargs=True))
        self.handles.append(model.register_forward_hook(self._leave_model, always_call=True))
        self.handles += [
            module.register_forward_pre_hook(
                functools.partial(validators.refuse_data_dependent_state, model)
            )
            for module in model.modules()
            if isinstance(module, (_BatchNorm, _InstanceNorm, nn.Embedding))
        ]
        self.check: validators.OutsideUses | None = None
        self.check_passed = False
        self.check_handles = [
            model.register_forward_pre_hook(self._begin_check),
            model.register_forward_hook(self._end_check, always_call=True),
        ]
        for module in layout.hooked_modules(model):
            own = (
                frozenset(id(p) for p in layout.layer_params[id(module)].values()),
                layout.rules[id(module)] == GENERIC,
            )
            self.check_handles += [
                module.register_forward_pre_hook(lambda m, i, own=own: self._enter_layer(own)),
                module.register_forward_hook(lambda m, i, o: self._leave_layer(), always_call=True),
            ]

    def _hook(self, module: nn.Module) -> None:
        handle = module.register_forward_hook(self._forward_hook, with_kwargs=True)
        self.module_handles[id(module)] = handle
        self.handles.append(handle)

    def take(self) -> list[Call | GenericCall]:
        """The calls recorded since the last take, for the backward pass about to run (calls
        recorded during it are :meth:`take_late`'s); removes the first-pass check's hooks once it
        has passed."""
        if self.check_passed:
            for handle in self.check_handles:
                handle.remove()
            self.check_handles = []
        calls, self.calls = self.calls, []
        self.taken = {id(p) for c in calls for p in c.params.values()}
        self.in_backward, self.counts, self.late = True, {}, []
        return calls

    def take_late(self) -> list[GenericCall]:
        """After the backward pass: the generic-rule calls that a reentrant gradient checkpoint
        recorded while re-running its forward during the pass and whose outputs got a gradient
        (rule layers among them were handled as their gradients arrived); calls whose outputs got
        none (a non-reentrant checkpoint's recomputation, which only restores saved tensors) are
        dropped. A parameter used both there and elsewhere in the step is refused: its per-example
        norm would be formed from separate uses."""
        late, self.late = self.late, []
        live = [
            c
            for c in late
            if (c.reached if isinstance(c, Call) else any(g is not None for g in c.out_grads))
        ]
        seen = set(self.taken)
        for call in live:
            ids = {id(p) for p in call.params.values()}
            if ids & seen:
                raise UnsupportedLayerError(validators.checkpoint_reuse_message(_label(call)))
            seen |= ids
        return [c for c in live if isinstance(c, GenericCall)]

    def clear_origin_grads(self) -> None:
        """After the backward pass (also ends its recording of late calls)."""
        self.in_backward = False
        for origin in self.origins.values():
            origin.grad = None

    def remove(self) -> None:
        """Remove every hook."""
        for handle in self.handles + self.check_handles:
            handle.remove()
        self.handles = self.check_handles = []
        self.module_handles = {}

    def _origin(self, like: Tensor) -> Tensor:
        """A zero-dimensional leaf that requires grad, an input of the tap on a layer output that
        would otherwise not need a gradient (the first layers), so the backward graph reaches every
        layer (003 §3.2 origin trick)."""
        key = (like.device, like.dtype)
        if key not in self.origins:
            self.origins[key] = torch.zeros(
                (), device=like.device, dtype=like.dtype, requires_grad=True
            )
        return self.origins[key]

    def _begin_check(self, model: nn.Module, inputs: tuple[Any, ...]) -> None:
        """First training forward pass of the model: watch for parameters used outside their
        layers."""
        if (
            self.check is None
            and not self.check_passed
            and torch.is_grad_enabled()
            and self.model.training
        ):
            self.check = validators.OutsideUses(
                {key: o.name for key, o in self.layout.owners.items()}
            )
            self.check.__enter__()

    def _enter_layer(self, own: tuple[frozenset[int], bool]) -> None:
        if self.check is not None:
            self.check.running.append(own)

    def _leave_layer(self) -> None:
        if self.check is not None and self.check.running:
            self.check.running.pop()

    def _end_check(self, model: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
        check, self.check = self.check, None
        if check is None:
            return
        check.__exit__(None, None, None)
        if output is None:
            # the forward pass raised (torch calls this hook without output): check the next one
            return
        if check.found is not None:
            self.calls = []
            raise UnsupportedLayerError(validators.outside_use_message(check.found))
        # its hooks are removed by the next take: not while torch iterates over them
        self.check_passed = True

    def _note_batch(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The batch size B of this forward pass (the leading size of the model's first tensor
        input) and, for a training pass, the trace of its input shape (``provenance.py``)."""
        if self.probe is not None:  # the model's own probe runs
            return
        self.inside = True
        self._begin_pass(model, args, kwargs)

    def _leave_model(self, model: nn.Module, args: Any, output: Any) -> None:
        if self.probe is None:
            self.inside = False

    def _begin_pass(self, entry: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A forward pass of ``entry`` (the model, or a layer called on its own) begins: its batch
        size B (the leading size of its first tensor input) and, for a training pass, the trace of
        its input shape (``provenance.py``)."""
        first = next(
            (
                leaf
                for leaf in tree_flatten((args, kwargs))[0]
                if isinstance(leaf, Tensor) and leaf.dim()
            ),
            None,
        )
        self.model_batch = None if first is None else first.shape[0]
        self.row_sources, self.counts = {}, {}
        if torch.is_grad_enabled() and self.model.training:  # fp16 autocast: refused at once
            where = f"the training forward pass of {type(entry).__name__}"
            refuse_float16_autocast(where, None if first is None else first.device)
            self.trace = None if first is None else self._trace_for(entry, args, kwargs, first)

    def _broadcast(self, tensor: Tensor, dim: int, name: str, batch: int | None) -> Tensor:
        """A tensor of size 1 along ``dim`` that carries no batch (BERT's position embeddings, T5's
        relative position bias) as B copies, so that its gradient is each example's own rather than
        their sum; downstream it broadcasts the same."""
        if batch is None or batch <= 1 or tensor.dim() <= dim or tensor.shape[dim] != 1:
            return tensor
        # the first pass: a model that cannot take the expanded tensor is named
        if self.check is not None:
            self.check.broadcast.append(name)
        return tensor.expand(*tensor.shape[:dim], batch, *tensor.shape[dim + 1 :]).contiguous()

    def _forward_hook(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> Any:
        # The model's mode, not the layer's: a layer put in eval mode inside a training model still
        # trains (skipping it would leave its parameters only noise); an evaluation pass of the
        # model is skipped.
        if self.recomputing or not self.model.training:
            return None
        if self.probe is not None:
            return self._probe_hook(module, args, kwargs, output)
        if not torch.is_grad_enabled():
            return None
        name, rule = self.layout.module_names[id(module)], self.layout.rules[id(module)]
        label = f"{name} ({type(module).__name__})"
        for leaf in tree_flatten(output)[0]:  # a float16 model, or autocast entered inside it
            if isinstance(leaf, Tensor):
                refuse_float16(f"layer {label}", leaf)
        if not self.inside and not self.in_backward:  # a layer called outside the model's forward
            self._begin_pass(module, args, kwargs)
        traced = self._traced(module, label)
        if rule == GENERIC:
            return self._record_generic(name, module, args, kwargs, output, traced)
        return self._record_rule(name, module, rule, args, kwargs, output, traced)

    def _record_rule(
        self,
        name: str,
        module: nn.Module,
        rule: LayerRule,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any,
        traced: provenance.Traced,
    ) -> Tensor:
        """Keep a rule layer's input batch-first (from its traced batch position) and tap its
        output, whose gradient reaches the rule batch-first too."""
        label = f"{name} ({type(module).__name__})"
        inputs = args[0] if args else next(iter(kwargs.values()), None)
        if not isinstance(inputs, Tensor) or not isinstance(output, Tensor):
            raise UnsupportedLayerError(
                f"engine: layer {label} was called without a tensor input or output"
            )
        batch = self.model_batch
        if not (
            provenance.fits(tuple(inputs.shape), traced.inputs[0], batch)
            and provenance.fits(tuple(output.shape), traced.outputs[0], batch)
        ):
            raise UnsupportedLayerError(validators.untraced_shape_message(label))
        where = provenance.batch_dim(traced.inputs[0]), provenance.batch_dim(traced.outputs[0])
        if where == (None, None) and provenance.broadcastable(traced):
            inputs = self._broadcast(inputs, 0, name, batch)
            output = self._broadcast(output, 0, name, batch)
            where = ((0, 1), (0, 1))
        dim, rows = self._position(rule, label, where, traced, inputs, output)
        version = inputs._version
        inputs = provenance.batch_first(inputs, dim, rows)
        params = self.layout.layer_params[id(module)]
        call = Call(name, module, rule, params, inputs.detach(), version=version)
        (self.late if self.in_backward else self.calls).append(call)
        sink = functools.partial(self._sink, call, tuple(inputs.shape), dim, rows)
        tapped = capture.tap(output, sink, self._origin(output))
        if rows > 1:
            # its output rows are proved example-major too: layers after elementwise ops use them
            self.row_sources[id(tapped.grad_fn)] = (tapped.grad_fn, rows)
        return tapped

    def _position(
        self,
        rule: LayerRule,
        label: str,
        where: tuple[tuple[int, int] | None, tuple[int, int] | None],
        traced: provenance.Traced,
        inputs: Tensor,
        output: Tensor,
    ) -> tuple[int, int]:
        """(dimension, rows per example) of the batch in a rule layer's input and output, from the
        trace; refused by name where the rule cannot take it batch-first."""
        given, returned = where
        if given is None or given != returned:
            why = provenance.mismatch(where)
            raise UnsupportedLayerError(validators.provenance_message(label, why))
        dim, rows = given
        if rows > 1:
            proved = traced.rows or rows == validators.rows_of_proved_rows(
                inputs, output, self.model_batch, self.row_sources
            )
            if dim != 0 or not rule.rowwise or not proved:
                raise UnsupportedLayerError(validators.rows_message(label, rows))
        elif dim != 0 and not rule.rowwise:
            raise UnsupportedLayerError(
                validators.provenance_message(
                    label, f"its batch is dimension {dim}, and its rule takes it only first"
                )
            )
        return dim, rows

    def _sink(
        self,
        call: Call,
        shape: tuple[int, ...],
        dim: int,
        rows: int,
        grad: Tensor,
    ) -> None:
        """The tap's backward: the output gradient, batch-first, to ``on_backprops``; a rule given a
        layout it does not know is refused naming the layer."""
        call.reached = True
        try:
            self.on_backprops(call, provenance.batch_first(grad, dim, rows))
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, IndexError) as error:
            raise UnsupportedLayerError(
                validators.rule_failure_message(_label(call), shape, error)
            ) from error

    def _record_generic(
        self,
        name: str,
        module: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any,
        traced: provenance.Traced,
    ) -> Any:
        """Keep every input and output of a generic-rule call, each with its traced batch
        dimension; hooks collect each output's gradient."""
        label = f"{name} ({type(module).__name__})"
        reason = generic.check_call(module, args, kwargs)
        if reason:
            raise UnsupportedLayerError(f"engine: layer {label}: {reason}")
        input_leaves, input_spec = tree_flatten((args, kwargs))
        leaves, spec = tree_flatten(output)
        batch = self.model_batch
        in_dims = tracing.generic_dims(label, input_leaves, traced.inputs, batch)
        out_dims = tracing.generic_dims(label, leaves, traced.outputs, batch, rows_shared=True)
        input_leaves = [v.detach() if isinstance(v, Tensor) else v for v in input_leaves]
        call = GenericCall(
            name,
            module,
            self.layout.layer_params[id(module)],
            *tree_unflatten(input_leaves, input_spec),
            versions=[(t, t._version) for t in input_leaves if isinstance(t, Tensor)],
            layout=generic.Layout(in_dims, out_dims),
            outputs=[None] * len(leaves),
            out_grads=[None] * len(leaves),
            output_versions=[None] * len(leaves),
            autocast=[
                (device, torch.get_autocast_dtype(device))
                for device in ("cpu", "cuda")
                if torch.is_autocast_enabled(device)
            ],
        )
        for k, leaf in enumerate(leaves):
            if not isinstance(leaf, Tensor) or not leaf.is_floating_point():
                continue
            if out_dims[k] is None and provenance.leading_one(leaf.shape):
                leaf, out_dims[k] = self._broadcast(leaf, 0, name, batch), 0
            # A fresh node (capture.tap): a hook on the module's own tensor would also collect the
            # gradient of the module's internal uses of it (attention weights it multiplies by the
            # values), which the re-run forward counts again, and would miss the gradient when the
            # output is changed in place afterwards.
            sink = lambda grad, k=k: call.out_grads.__setitem__(k, grad.detach())  # noqa: E731
            leaf = leaves[k] = capture.tap(leaf, sink, self._origin(leaf))
            call.outputs[k] = leaf.detach()
            call.output_versions[k] = leaf._version
        (self.late if self.in_backward else self.calls).append(call)
        return tree_unflatten(leaves, spec)


def _label(call: Call | GenericCall) -> str:
    return f"{call.name} ({type(call.module).__name__})"
