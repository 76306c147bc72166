"""Per-example norms of every layer, computed during the one backward pass (003 §3.2–3.3).

Each hooked layer's output gradient arrives (``recorder.py``) and its per-example squared norms are
formed at once: of a weight by the ghost norm where 2T² < p·d (keeping a and b for book-keeping), by
instantiating per-example gradients elsewhere (then a and b are freed right away). A weight shared
by several layers keeps the ghost norm with cross terms between its uses (``ghost_dot``) or is
instantiated and summed; biases and normalisation parameters are always instantiated. Layers under
the generic rule get their per-example gradients after the pass by re-running their forward per
example (``layers/generic.py``). :meth:`LayerNorms.flat` then sums every parameter's squared norms
into the flat per-example norm with few launches and no host sync.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from dpledger.engine import parametrized, validators
from dpledger.engine.batched import Packed, stacked_sum
from dpledger.engine.layers import generic, ghost_dot
from dpledger.engine.owners import GENERIC
from dpledger.engine.recorder import Call, GenericCall, Recorder
from dpledger.engine.tensor_cores import HALF, promoted
from dpledger.engine.validators import UnsupportedLayerError
from dpledger.errors import ParamsError
from dpledger.precision import exactly

GhostMode = Literal["auto", "always", "never"]


@dataclass
class Pass:
    """What one backward pass collects: squared norms and instantiated gradients per parameter (by
    id), the ghost-norm calls kept for book-keeping, the first call whose batch dimension is wrong
    and the first call whose input was changed in place after the layer saw it."""

    batch: int
    use_count: Counter
    norm_sq: dict[int, Tensor]
    per_example: dict[int, Tensor]
    ghost_calls: list[Call]
    mismatch: Call | None = None
    modified: Call | None = None
    generic_calls: list[GenericCall] = field(default_factory=list)
    tied: dict[int, list[Call]] = field(default_factory=dict)


norm_precision = promoted
"""Half-precision activations and gradients are promoted so norms are computed in float32."""


def _as_the_product_used(activations: Tensor, backprops: Tensor) -> Tensor:
    """A float32 input of a layer whose output gradient is half precision, rounded to that
    precision: the layer ran under autocast, which cast its input so before the product."""
    if backprops.dtype in HALF and activations.dtype == torch.float32:
        return activations.to(backprops.dtype)
    return activations


def _add_to(store: dict[int, Tensor], key: int, value: Tensor) -> None:
    store[key] = store[key] + value if key in store else value


class LayerNorms:
    """The backward pass's book-keeping: ghost or instantiate per layer, tied weights, generic-rule
    gradients.

    ``ghost``: "auto", "always" or "never" (see ``BKEngine``). ``layer_methods`` names each layer's
    method; ``last_workspace_elements`` is the per-example workspace the last pass chose (003
    §3.3)."""

    def __init__(self, ghost: GhostMode) -> None:
        self.ghost = ghost
        self.layer_methods: dict[str, str] = {}
        self.last_workspace_elements = 0
        self._pass: Pass | None = None

    def begin(self, calls: list[Call | GenericCall], batch: int) -> Pass:
        """The state of the backward pass over ``calls`` about to run; norms are taken while it is
        open."""
        use_count = Counter(id(p) for c in calls for p in c.params.values())
        state = self._pass = Pass(batch, use_count, {}, {}, [])
        state.generic_calls = [c for c in calls if isinstance(c, GenericCall)]
        state.tied = self._tied_ghost(calls, use_count)
        self.last_workspace_elements = 0
        return state

    def end(self) -> None:
        """The backward pass is over: later output gradients are not counted."""
        self._pass = None

    def finish(self, state: Pass, recorder: Recorder) -> None:
        """After the pass: refuse what it found wrong, add the cross terms of tied ghost weights and
        the generic-rule layers' gradients (their forward re-run with ``recorder``'s hooks idle)."""
        if state.mismatch is not None:
            call = state.mismatch
            label = f"{call.name} ({type(call.module).__name__})"
            raise ParamsError(
                validators.batch_mismatch_message(label, call.activations.shape[0], state.batch)
            )
        if state.modified is not None:
            call = state.modified
            raise UnsupportedLayerError(
                validators.in_place_message(f"{call.name} ({type(call.module).__name__})")
            )
        for key, tied_calls in state.tied.items():
            # a use whose output got no gradient adds nothing
            factors = [
                c.rule.tied_factors(
                    c.module, norm_precision(c.activations), norm_precision(c.backprops)
                )
                for c in tied_calls
                if c.backprops is not None
            ]
            for first in range(len(factors)):
                for second in range(first + 1, len(factors)):
                    state.norm_sq[key] = state.norm_sq[key] + 2 * ghost_dot(
                        factors[first], factors[second]
                    )
        checks = []
        # calls recorded during the pass (a reentrant checkpoint's recomputation): trained now
        for call in state.generic_calls + recorder.take_late():
            self.layer_methods[call.name] = GENERIC
            recomputed = self._generic_grads(call, state.batch, recorder)
            for attr, grads in recomputed.grads.items():
                _add_to(state.per_example, id(call.params[attr]), grads)
            checks.append((call, recomputed))
        _refuse_mismatches(checks)

    @staticmethod
    def flat(
        state: Pass, dtype: torch.dtype, groups: int, like: Tensor
    ) -> tuple[Packed | None, Tensor]:
        """Every parameter's squared norms (into ``state.norm_sq``) and their flat sum per example.
        Few launches and no host sync from here on (batched.py): small per-example gradients packed
        (one group only), one stacked sum of the norms."""
        batch, norm_sq = state.batch, state.norm_sq
        packed = Packed.of(state.per_example, batch, dtype) if groups == 1 else None
        for key, grads in state.per_example.items():
            norm_sq[key] = grads.reshape(batch, -1).square().sum(1)
        terms = list(norm_sq.values()) + ([packed.norm_sq()] if packed is not None else [])
        return packed, stacked_sum(terms) if terms else like.new_zeros(batch)

    def _tied_ghost(
        self, calls: list[Call | GenericCall], use_count: Counter
    ) -> dict[int, list[Call]]:
        """Shared weights kept on the ghost norm (id -> the calls using them): every use is a layer
        whose rule writes its gradient as ``tied_factors``, and ("auto") the Grams (2T² per use,
        2·T·T' per pair) are smaller than one instantiated gradient. Other shared weights are
        instantiated and summed."""
        if self.ghost == "never":
            return {}
        users: dict[int, list[Call]] = {}
        for call in calls:
            if (
                isinstance(call, Call)
                and "weight" in call.params
                and use_count[id(call.params["weight"])] > 1
            ):
                users.setdefault(id(call.params["weight"]), []).append(call)
        tied = {}
        for key, group in users.items():
            if len(group) != use_count[key] or any(c.rule.tied_factors is None for c in group):
                continue
            steps = [c.rule.ghost_cost(c.module, c.activations)[0] for c in group]
            if (
                self.ghost == "always"
                or sum(steps) * len(group)
                < group[0].rule.ghost_cost(group[0].module, group[0].activations)[1]
            ):
                tied[key] = group
        return tied

    def _use_ghost(self, call: Call, shared: bool, tied: bool = False) -> bool:
        """Ghost norm or instantiation for this call; adds the chosen branch's per-example workspace
        (2T² Gram entries or p·d gradient entries, 003 §3.3) to ``last_workspace_elements``."""
        batch = call.activations.shape[0]
        if not call.rule.has_ghost or "weight" not in call.params:
            self.last_workspace_elements += batch * sum(p.numel() for p in call.params.values())
            return False
        ghost_elements, instantiated_elements = call.rule.ghost_cost(call.module, call.activations)
        if tied:  # the weight's group chose the ghost norm (_tied_ghost)
            use = True
        elif shared or self.ghost == "never":
            use = False
        elif self.ghost == "always":
            use = True
        else:
            use = ghost_elements < instantiated_elements
        self.last_workspace_elements += batch * (ghost_elements if use else instantiated_elements)
        return use

    # autocast follows into backward, TF32 is global: norms in full precision (precision.py)
    @exactly
    def take_backprops(self, call: Call, grad: Tensor) -> None:
        """Backward hook: this call's per-example norms now, so instantiated layers free a and b at
        once."""
        call.backprops = grad.detach()
        state = self._pass
        if state is None:
            return
        if call.activations.shape[0] != state.batch:
            state.mismatch = state.mismatch or call
            return
        if call.activations._version != call.version:  # see validators.in_place_message
            state.modified = state.modified or call
            return
        # Half-precision a and b are promoted for the computations only; a ghost call keeps them as
        # they came (GPT-2's head keeps a B × T × vocabulary b until book-keeping: twice the memory
        # in float32). A rule with half operands gets a rounded as its product used it (autocast),
        # so that its norm and its clipped sum both come from the operands the model multiplied.
        if call.rule.half_operands:
            call.activations = _as_the_product_used(call.activations, call.backprops)
        kept = call.activations, call.backprops
        promoted = norm_precision(call.activations), norm_precision(call.backprops)
        shared = any(state.use_count[id(p)] > 1 for p in call.params.values())
        tied = "weight" in call.params and id(call.params["weight"]) in state.tied
        names = frozenset(call.params)
        ghost = self._use_ghost(call, shared, tied)
        self.layer_methods[call.name] = "ghost" if ghost else "instantiate"
        if ghost:
            operands = kept if call.rule.half_operands else promoted
            norm_sq = call.rule.ghost_norm(call.module, *operands)
            _add_to(state.norm_sq, id(call.params["weight"]), norm_sq)
            state.ghost_calls.append(call)
            names -= {"weight"}
        if names:
            instantiated = parametrized.per_example_grads(call.rule, call.module, *promoted, names)
            for attr, grads in instantiated.items():
                _add_to(state.per_example, id(call.params[attr]), grads)
        call.activations, call.backprops = kept if ghost else (None, None)

    @staticmethod
    def _generic_grads(call: GenericCall, batch: int, recorder: Recorder) -> generic.Recomputed:
        """Per-example gradients of a generic-rule call (their check still on the device), or a
        refusal naming its layer."""
        label = _label(call)
        if any(t._version != version for t, version in call.versions):
            raise UnsupportedLayerError(validators.in_place_message(label))
        recorder.recomputing = True
        try:
            with contextlib.ExitStack() as stack:
                for device, dtype in call.autocast:
                    stack.enter_context(torch.autocast(device, dtype=dtype))
                _refresh_changed_outputs(call)
                return generic.per_example_grads(
                    call.module,
                    call.params,
                    call.args,
                    call.kwargs,
                    call.layout,
                    call.outputs,
                    call.out_grads,
                    batch,
                )
        except generic.GenericRuleError as error:
            raise UnsupportedLayerError(
                f"engine: layer {label} cannot be trained privately: {error}"
            ) from None
        except RuntimeError as error:
            first = (
                str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            )
            raise UnsupportedLayerError(
                f"engine: layer {label}: re-running its forward one example at a time "
                f"(generic rule) failed: {first} "
                "(random operations such as dropout inside it must be off)"
            ) from error
        finally:
            recorder.recomputing = False


def _label(call: GenericCall) -> str:
    return f"{call.name} ({type(call.module).__name__})"


def _refuse_mismatches(checks: list[tuple[GenericCall, generic.Recomputed]]) -> None:
    """Every generic-rule call's recomputed outputs matched the forward's, read in ONE host sync for
    the pass (before any clipping); else the first mismatching layer is refused, naming it."""
    flags = [recomputed.matches for _, recomputed in checks if recomputed.outputs]
    if not flags or bool(torch.cat(flags).all()):
        return
    for call, recomputed in checks:
        for output, match in zip(recomputed.outputs, recomputed.matches.tolist()):
            if not match:
                reason = f"cannot be trained privately: {generic.mismatch_message(output)}"
                raise UnsupportedLayerError(f"engine: layer {_label(call)} {reason}")


def _refresh_changed_outputs(call: GenericCall) -> None:
    """Outputs changed in place after the layer returned them (``o += h``; their gradients are still
    exact, ``capture.tap``) are recomputed for the batch from the unchanged inputs, so that the
    per-example recomputation is still checked against what the layer produced."""
    changed = [
        k
        for k, v in enumerate(call.output_versions)
        if v is not None and call.outputs[k]._version != v
    ]
    if changed:
        fresh = generic.batch_outputs(call.module, call.args, call.kwargs)
        for k in changed:
            call.outputs[k] = fresh[k]
