"""The batch trace of a :class:`~dpledger.engine.recorder.Recorder`: the probe runs of the model at
batch sizes 2 and 3 for each new input shape, their record of every call, the claims of layers whose
tensors carry no batch, and each training call's traced layout (``provenance.py`` holds the rules).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from dpledger.engine import provenance, validators
from dpledger.engine.layers import generic
from dpledger.engine.owners import GENERIC
from dpledger.engine.validators import UnsupportedLayerError

PROBE_ERRORS = (RuntimeError, IndexError, ValueError, TypeError)
"""What a model's forward raises on a batch size it cannot take."""


class Tracing:
    """The tracing half of the recorder (its hooks call these); the attributes are the
    recorder's."""

    def _trace_for(
        self, entry: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], first: Tensor
    ) -> provenance.Trace:
        """The trace of this input shape: cached, or made now by two probe runs of ``entry``."""
        batch = first.shape[0]
        key = (id(entry), provenance.signature(args, kwargs, batch))
        if key in self.traces:
            return self.traces[key]
        ancestors = self.layout.ancestors(self.model)
        temporary = [
            m.register_forward_hook(self._probe_other, with_kwargs=True) for m in ancestors
        ]
        temporary += [
            m.register_forward_pre_hook(self._refuse_call, with_kwargs=True)
            for m in self.layout.hooked_modules(self.model)
            if self.layout.rules[id(m)] == GENERIC
        ]
        # the probes must leave no trace: buffers a forward pass updates (spectral_norm's vectors)
        state = [(b, b.clone()) for b in self.model.buffers()]
        try:
            probes = self._probes(entry, args, kwargs, first)
        finally:
            self.probe = None
            for handle in temporary:
                handle.remove()
            with torch.no_grad():
                for buffer, saved in state:
                    buffer.copy_(saved)
        trace = provenance.combine(*probes)
        self._claim_unbatched(trace)
        while len(self.traces) >= provenance.CACHE_SIZE:
            self.traces.pop(next(iter(self.traces)))
        self.traces[key] = trace
        return trace

    def _probes(
        self, entry: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], first: Tensor
    ) -> list[provenance.Probe]:
        """The probe runs of ``entry`` at :data:`provenance.PROBE_BATCHES`. Where a run fails after
        rule layers' size-1 outputs were expanded to the probe's batch, those layers are kept whole
        (their leading 1 is not a shared input: Longformer's global-attention projections see
        sequence-first (globals, B, d) rows) and the runs start again; a failure with nothing new
        to keep whole is refused, in one line."""
        devices = [first.device] if first.device.type == "cuda" else []
        batch = first.shape[0]
        while True:
            probes, expanded = [], []
            try:
                for size in provenance.PROBE_BATCHES:
                    self.probe = provenance.Probe(size)
                    probe_args, probe_kwargs = provenance.probe_inputs(args, kwargs, batch, size)
                    with torch.random.fork_rng(devices=devices):
                        entry(*probe_args, **probe_kwargs)
                    expanded += self.probe.expanded
                    probes.append(self.probe)
                return probes
            except (*PROBE_ERRORS, UnsupportedLayerError) as error:
                expanded += self.probe.expanded if self.probe is not None else []
                if self.check is not None:
                    self.check.broadcast.clear()  # the probes' expansions: not the model's pass
                fresh = set(expanded) - self.kept_whole
                if not fresh:
                    if isinstance(error, UnsupportedLayerError):
                        raise
                    raise UnsupportedLayerError(validators.probe_failure_message(error)) from error
                self.kept_whole |= fresh

    def _refuse_call(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        """Before a probe runs a generic-rule layer: refuse, naming it, inputs it cannot split."""
        reason = generic.check_call(module, args, kwargs)
        if reason:
            name = self.layout.module_names[id(module)]
            raise UnsupportedLayerError(f"engine: layer {name} ({type(module).__name__}): {reason}")

    def _probe_other(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        """A probe run's record of a module the engine does not hook (a possible claimant)."""
        if self.probe is not None:
            self.probe.add(module, (args, kwargs), output)

    def _claim_unbatched(self, trace: provenance.Trace) -> None:
        """Give the parameters of each layer whose traced calls carry no batch at all (and no
        size-1 dimension the engine can broadcast: none, or one whose expansion made the model
        fail) to the nearest enclosing module that returns the batch, under the generic rule;
        refuse the layer by name when there is none."""
        names = dict(self.model.named_modules())
        called = {key[0] for key in trace.calls}
        for module in self.layout.hooked_modules(self.model):
            calls = [t for (m, _), t in trace.calls.items() if m == id(module)]
            whole = id(module) in self.kept_whole  # its size-1 output cannot be expanded
            if not calls or not all(
                t.problem is None and t.shared and (whole or not provenance.broadcastable(t))
                for t in calls
            ):
                continue
            name = self.layout.module_names[id(module)]
            parent = provenance.claimant(name, names, trace, called)
            if parent is None or self.layout.rules.get(id(parent), GENERIC) != GENERIC:
                raise UnsupportedLayerError(
                    validators.unbatched_message(f"{name} ({type(module).__name__})")
                )
            self.layout.claim(module, parent, names)
            self.module_handles.pop(id(module)).remove()
            if id(parent) not in self.module_handles:
                self._hook(parent)

    def _traced(self, module: nn.Module, label: str) -> provenance.Traced:
        """This call's trace (the module's k-th call of the pass), or a refusal naming the
        layer."""
        count = self.counts.get(id(module), 0)
        self.counts[id(module)] = count + 1
        traced = None if self.trace is None else self.trace.calls.get((id(module), count))
        if traced is None:
            raise UnsupportedLayerError(validators.untraced_message(label))
        if traced.problem is not None:
            raise UnsupportedLayerError(validators.provenance_message(label, traced.problem))
        return traced

    def _probe_hook(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> Any:
        """A probe run's record of a hooked layer's call (``provenance.py``); size-1 outputs are
        broadcast to the probe's batch as the training pass will broadcast them."""
        probe, name = self.probe, self.layout.module_names[id(module)]
        grad = torch.is_grad_enabled()
        if self.layout.rules[id(module)] == GENERIC:
            probe.add(module, (args, kwargs), output)
            leaves, spec = tree_flatten(output)
            if not grad:
                return None
            leaves = [
                self._broadcast(v, 0, name, probe.batch)
                if isinstance(v, Tensor) and v.is_floating_point()
                else v
                for v in leaves
            ]
            return tree_unflatten(leaves, spec)
        inputs = args[0] if args else next(iter(kwargs.values()), None)
        if not isinstance(inputs, Tensor) or not isinstance(output, Tensor):
            probe.add(module, (args, kwargs), output)
            return None
        rule = self.layout.rules[id(module)]
        rows = validators.flattened_rows(inputs, output, probe.batch) if rule.rowwise else None
        probe.add(module, inputs, output, rows)
        if (
            grad
            and id(module) not in self.kept_whole
            and provenance.leading_one(inputs.shape)
            and provenance.leading_one(output.shape)
            and probe.batch > 1
        ):
            probe.expanded.append(id(module))
            return self._broadcast(output, 0, name, probe.batch)
        return None


def generic_dims(
    label: str,
    leaves: list[Any],
    traced: list[provenance.Template | None],
    batch: int | None,
    rows_shared: bool = False,
) -> list[int | None]:
    """The batch dimension of each leaf of a generic-rule call (None: shared by the examples), from
    the trace; refused where the shapes are not the traced ones or an input holds (B·k) rows (an
    output of rows is taken as not splittable, refused only if it gets a gradient)."""
    if len(leaves) != len(traced) or batch is None:
        raise UnsupportedLayerError(validators.untraced_shape_message(label))
    dims: list[int | None] = []
    for leaf, shape in zip(leaves, traced):
        if not isinstance(leaf, Tensor):
            dims.append(None)
            continue
        if not provenance.fits(tuple(leaf.shape), shape, batch):
            raise UnsupportedLayerError(validators.untraced_shape_message(label))
        where = provenance.batch_dim(shape)
        if where is not None and where[1] > 1:
            if not rows_shared:
                raise UnsupportedLayerError(validators.rows_message(label, where[1]))
            where = None
        dims.append(None if where is None else where[0])
    return dims
