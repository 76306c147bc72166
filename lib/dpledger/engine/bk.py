"""The Book-Keeping (BK) DP engine (003 §3.1 and §3.3): exact DP-SGD gradients at about non-private cost.

One forward pass with hooks that keep each layer's input ``a``; ONE backward pass of Σ_i w_i·L_i
in which no parameter needs ``.grad`` (ghost differentiation, 003 §3.2), with tensor hooks that take
each layer's output gradient ``b`` and at once compute its per-example norms — of a weight by the ghost
norm where 2T² < p·d (keeping a and b for book-keeping), by instantiating per-example gradients elsewhere
(then a and b are freed right away); a weight shared by several layers keeps the ghost norm with cross
terms between its uses (``ghost_dot``) or is instantiated and summed; biases and normalisation parameters
are always instantiated (they are small), once, for both their norm and their clipped sum. Modules owning
parameters no specific rule covers get the generic exact rule (``layers/generic.py``: their own forward
re-run per example after the pass, from all their saved inputs and output gradients). After the
pass: clipping factors, and the clipped sum aᵀ·diag(C)·b formed directly (book-keeping), without a
second backward pass, accumulated in place into one flat buffer that already holds the step's noise σ·R·z_t.
What the engine refuses lives in ``validators.py``.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm
from torch.utils._pytree import tree_flatten, tree_unflatten

from dpledger.engine import capture, parametrized, validators
from dpledger.engine.batched import Packed, keep_rows, stacked_sum
from dpledger.engine.clipping import clip_factors, group_threshold, nonfinite_rows
from dpledger.engine.device import placement_problem
from dpledger.engine.distributed import GroupSum, group_sum
from dpledger.engine.layers import LayerRule, add_weighted_sum, generic, ghost_dot, rule_for
from dpledger.engine.noise import NoiseSource
from dpledger.engine.validators import UnsupportedLayerError
from dpledger.errors import ParamsError
from dpledger.precision import exactly, without_autocast

GhostMode = Literal["auto", "always", "never"]
CanaryHook = Callable[[int], "Sequence[Tensor] | None"]


@dataclass
class _Call:
    """One forward call of a hooked layer: its input, and later the gradient of its output."""

    name: str
    module: nn.Module
    rule: LayerRule
    params: dict[str, nn.Parameter]
    activations: Tensor | None
    backprops: Tensor | None = None
    version: int = 0


@dataclass
class _GenericCall:
    """One forward call of a layer under the generic rule: all its inputs, its outputs and their gradients."""

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


GENERIC = "generic"
"""The rule marker of layers handled by :mod:`dpledger.engine.layers.generic`."""


@dataclass
class _Pass:
    """What one backward pass collects: squared norms and instantiated gradients per parameter (by id),
    the ghost-norm calls kept for book-keeping, the first call whose batch dimension is wrong and the first
    call whose input was changed in place after the layer saw it."""

    batch: int
    use_count: Counter
    norm_sq: dict[int, Tensor]
    per_example: dict[int, Tensor]
    ghost_calls: list[_Call]
    mismatch: _Call | None = None
    modified: _Call | None = None
    generic_calls: list[_GenericCall] = field(default_factory=list)
    tied: dict[int, list[_Call]] = field(default_factory=dict)


@dataclass
class _Owner:
    """Where a trainable parameter lives: its full name and clipping group (its first owning layer)."""

    name: str
    group: int
    numel: int
    offset: int


_SEQUENCE_LAYERS = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, nn.Transformer)


def _declared_batch_first(modules: dict[str, nn.Module], name: str) -> bool | None:
    """``batch_first`` of the nearest enclosing torch transformer layer (nn.TransformerEncoderLayer with
    batch_first=False passes (T, B, ...) tensors to its Linear and LayerNorm children), or None."""
    parts = name.split(".") if name else []
    for depth in range(len(parts) - 1, -1, -1):
        parent = modules[".".join(parts[:depth])]
        if isinstance(parent, nn.Transformer):
            return parent.batch_first
        if isinstance(parent, _SEQUENCE_LAYERS):  # the layers keep it only in their attention
            return parent.self_attn.batch_first
    return None


def _norm_precision(tensor: Tensor) -> Tensor:
    """Half-precision activations and gradients are promoted so norms are computed in float32."""
    if tensor.is_floating_point() and tensor.dtype in (torch.float16, torch.bfloat16):
        return tensor.float()
    return tensor


class BKEngine:
    """Private gradients for every trainable parameter of ``model`` by Book-Keeping.

    Use: ``engine.backward(per_example_losses[, weights])`` after each forward pass of a (physical)
    batch — it adds Σ_i C_i·w_i·g_i to the step's sum, which starts as the noise σ·R·z_t — then
    ``engine.step()`` once per logical batch: it adds the canary (if any), keeps the noisy sum in
    ``last_noisy_sum``, sets each ``p.grad`` to noisy sum / ``normalizer`` (views of one reused buffer) and steps the optimizer.
    ``steps_taken`` counts logical steps (the privacy ledger); ``nonfinite_examples`` counts the real examples
    whose per-example norm was NaN or inf: they get clip factor 0 and contribute exactly zero.

    Constructing the engine sets ``requires_grad=False`` on the trainable parameters (ghost
    differentiation; :meth:`detach` restores them); build the optimizer before. A trainable parameter
    the engine cannot train exactly (a BatchNorm, a layer that mixes examples or draws random numbers in a
    generic-rule forward) raises :class:`UnsupportedLayerError` naming it — never trained without
    clipping, never silently frozen. ``layer_methods`` names each layer's method: ghost, instantiate, generic.

    Audit hooks: ``step(canary=[tensors])`` or ``canary_hook(step) -> [tensors] | None`` adds a
    caller-supplied vector (one tensor per trainable parameter, in ``parameter_names`` order) to
    the clipped sum before noise — a gradient canary; ``last_noisy_sum`` is the released noisy sum
    g̃ of the last step (same layout), so an auditor can take ⟨g̃, ĝ⟩.

    ``ghost``: "auto" uses the ghost norm where 2T² < p·d (003 §3.3, BK-MixOpt), "always"/"never"
    force one branch. ``clipping``: "flat" (default), "per-layer" or "automatic" (see clipping.py).
    ``mechanism``/``mechanism_params``/``num_steps``: correlated noise through
    ``dpledger.mechanisms.noise_stream``. ``secure_noise``: draw noise from the OS CSPRNG.
    ``process_group``: data-parallel training (see ``engine/distributed.py``): each rank's clipped sum is
    all-reduced once per ``step``; only the group's rank 0 adds the noise and the canary.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        clip_norm: float,
        noise_multiplier: float,
        normalizer: float,
        seed: int = 0,
        clipping: str = "flat",
        automatic_gamma: float = 0.01,
        ghost: GhostMode = "auto",
        mechanism: str = "identity",
        mechanism_params: dict[str, Any] | None = None,
        num_steps: int | None = None,
        secure_noise: bool = False,
        canary_hook: CanaryHook | None = None,
        process_group: torch.distributed.ProcessGroup | GroupSum | None = None,
    ) -> None:
        validators.check_options(clipping, clip_norm, automatic_gamma, noise_multiplier, normalizer, ghost)
        self.model, self.optimizer = model, optimizer
        self.clip_norm, self.noise_multiplier, self.normalizer = float(clip_norm), float(noise_multiplier), normalizer
        self.clipping, self.automatic_gamma, self.ghost = clipping, automatic_gamma, ghost
        self.canary_hook = canary_hook
        self.params: list[nn.Parameter] = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ParamsError("engine: the model has no trainable parameter")
        self._owners = self._map_owners()
        self.numel = sum(p.numel() for p in self.params)
        self._groups = 1 + max(o.group for o in self._owners.values()) if clipping == "per-layer" else 1
        reference = self.params[0]
        if problem := placement_problem(self.params, reference.device, reference.dtype):
            raise ParamsError(problem)
        self.noise = NoiseSource(
            self.numel,
            seed=seed,
            mechanism=mechanism,
            mechanism_params=mechanism_params,
            num_steps=num_steps,
            secure=secure_noise,
            device=reference.device,
            dtype=reference.dtype,
        )
        self.steps_taken = 0
        self.last_norms: Tensor | None = None
        self.layer_methods: dict[str, str] = {}
        self.last_workspace_elements = 0
        self._calls: list[_Call] = []
        self._pass: _Pass | None = None
        self._origins: dict[tuple[torch.device, torch.dtype], Tensor] = {}
        self._buffer = torch.zeros(self.numel, device=reference.device, dtype=reference.dtype)
        self._ranks = None if process_group is None else group_sum(process_group)
        if self._ranks is not None:
            self._ranks.check_layout(self.numel, self.parameter_names, reference.device)
        self._adds_noise = self._ranks is None or self._ranks.adds_noise
        self._views = self._flat_views(self._buffer)
        self._view_of = {id(p): view for p, view in zip(self.params, self._views)}
        self._slice_of = {id(p): view.view(-1) for p, view in zip(self.params, self._views)}
        self._nonfinite = torch.zeros((), dtype=torch.int64, device=reference.device)
        self._pending = False
        self._recomputing = False
        self._model_batch: int | None = None
        self._row_sources: dict[int, tuple[Any, int]] = {}  # this forward's taps of proved (B·k)-row outputs: k
        self._handles = [
            module.register_forward_hook(self._forward_hook, with_kwargs=True) for module in self._hooked_modules()
        ]
        self._handles.append(model.register_forward_pre_hook(self._note_batch, with_kwargs=True))
        self._handles += [
            module.register_forward_pre_hook(self._data_dependent_state_hook)
            for module in model.modules()
            if isinstance(module, (_BatchNorm, _InstanceNorm, nn.Embedding))
        ]
        self._check: validators.OutsideUses | None = None
        self._check_passed = False
        self._check_handles = [
            model.register_forward_pre_hook(self._begin_check),
            model.register_forward_hook(self._end_check, always_call=True),
        ]
        for module in self._hooked_modules():
            own = frozenset(id(p) for p in self._layer_params[id(module)].values()), self._rules[id(module)] == GENERIC
            self._check_handles += [
                module.register_forward_pre_hook(lambda m, i, own=own: self._enter_layer(own)),
                module.register_forward_hook(lambda m, i, o: self._leave_layer(), always_call=True),
            ]
        for param in self.params:
            param.requires_grad_(False)

    @property
    def parameter_names(self) -> list[str]:
        """Full names of the trainable parameters, in the order of canaries and ``last_noisy_sum``."""
        return [self._owners[id(p)].name for p in self.params]

    def _map_owners(self) -> dict[int, _Owner]:
        trainable = {id(p) for p in self.params}
        full_names = {id(p): name for name, p in self.model.named_parameters()}
        owners: dict[int, _Owner] = {}
        offset = 0
        for p in self.params:
            owners[id(p)] = _Owner(full_names[id(p)], group=-1, numel=p.numel(), offset=offset)
            offset += p.numel()
        self._module_names: dict[int, str] = {}
        self._rules: dict[int, LayerRule | str] = {}
        self._layer_params: dict[int, dict[str, nn.Parameter]] = {}
        self._sequence_first: set[int] = set()
        group_of_layer: dict[int, int] = {}
        claimed: set[int] = set()
        modules = dict(self.model.named_modules())
        for layer_name, module in modules.items():
            if id(module) in claimed:
                continue
            children = generic.claimed_children(module)
            claimed.update(id(m) for child in children for m in getattr(module, child).modules())
            claimed.update(id(m) for m in getattr(module, "parametrizations", nn.Module()).modules())
            own = [(attr, p) for attr, p in module.named_parameters(recurse=False) if id(p) in trainable]
            own += [(path, p) for path, p in parametrized.originals(module) if id(p) in trainable]
            own += [
                (f"{child}.{attr}", p)
                for child in children
                for attr, p in getattr(module, child).named_parameters()
                if id(p) in trainable
            ]
            if not own:
                continue
            label = f"{layer_name or '<model>'} ({type(module).__name__})"
            rule = None if children else rule_for(module)
            refusal = validators.layer_refusal(
                module,
                label,
                [f"{layer_name}.{attr}".lstrip(".") for attr, _ in own],
                rule,
                list(dict.fromkeys(parametrized.rule_name(attr) for attr, _ in own)),
            )
            if refusal:
                raise UnsupportedLayerError(refusal)
            self._module_names[id(module)] = layer_name or "<model>"
            self._rules[id(module)] = rule if rule is not None else GENERIC
            if rule is not None and _declared_batch_first(modules, layer_name) is False:
                self._sequence_first.add(id(module))
            self._layer_params[id(module)] = dict(own)
            fresh = [p for _, p in own if owners[id(p)].group < 0]
            if fresh:  # a module whose parameters are all tied to earlier ones is no clipping group of its own
                group_of_layer[id(module)] = len(group_of_layer)
                for p in fresh:
                    owners[id(p)].group = group_of_layer[id(module)]
        return owners

    def _hooked_modules(self) -> list[nn.Module]:
        return [m for m in self.model.modules() if id(m) in self._module_names]

    def _origin(self, like: Tensor) -> Tensor:
        """A zero-dimensional leaf that requires grad, an input of the tap on a layer output that would otherwise
        not need a gradient (the first layers), so the backward graph reaches every layer (003 §3.2 origin
        trick)."""
        key = (like.device, like.dtype)
        if key not in self._origins:
            self._origins[key] = torch.zeros((), device=like.device, dtype=like.dtype, requires_grad=True)
        return self._origins[key]

    def _data_dependent_state_hook(self, module: nn.Module, inputs: tuple[Any, ...]) -> None:
        """Refuse, while the model trains and even with frozen parameters, a layer whose forward pass changes
        the model from the data without noise or mixes examples (the cases: :func:`validators.data_dependent_state`)."""
        if not self.model.training:
            return
        reason = validators.data_dependent_state(module)
        if reason:
            name = next((n for n, m in self.model.named_modules() if m is module), "?") or "<model>"
            raise UnsupportedLayerError(f"engine: layer {name} ({type(module).__name__}) {reason}")

    def _begin_check(self, model: nn.Module, inputs: tuple[Any, ...]) -> None:
        """First training forward pass of the model: watch for parameters used outside their layers."""
        if self._check is None and not self._check_passed and torch.is_grad_enabled() and self.model.training:
            self._check = validators.OutsideUses({id(p): o.name for p, o in zip(self.params, self._owner_list())})
            self._check.__enter__()

    def _enter_layer(self, own: tuple[frozenset[int], bool]) -> None:
        if self._check is not None:
            self._check.running.append(own)

    def _leave_layer(self) -> None:
        if self._check is not None and self._check.running:
            self._check.running.pop()

    def _end_check(self, model: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
        check, self._check = self._check, None
        if check is None:
            return
        check.__exit__(None, None, None)
        if output is None:  # the forward pass raised (torch then calls this hook with no output): check the next one
            return
        if check.found is not None:
            self._calls = []
            raise UnsupportedLayerError(validators.outside_use_message(check.found))
        self._check_passed = True  # its hooks are removed by the next backward: not while torch iterates over them

    def _note_batch(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The batch size B of this forward pass: the leading size of the model's first tensor input."""
        first = next(
            (leaf for leaf in tree_flatten((args, kwargs))[0] if isinstance(leaf, Tensor) and leaf.dim()), None
        )
        self._model_batch = None if first is None else first.shape[0]
        self._row_sources = {}

    def _broadcast(self, tensor: Tensor, dim: int, name: str) -> Tensor:
        """A tensor of size 1 along the batch dimension ``dim`` while the batch has B > 1 examples (BERT's
        position embeddings, T5's relative position bias) as B copies, so that its gradient is each example's
        own rather than their sum; downstream it broadcasts the same."""
        batch = self._model_batch
        if batch is None or batch <= 1 or tensor.dim() <= dim or tensor.shape[dim] != 1:
            return tensor
        if self._check is not None:  # the first pass: a model that cannot take the expanded tensor is named
            self._check.broadcast.append(name)
        return tensor.expand(*tensor.shape[:dim], batch, *tensor.shape[dim + 1 :]).contiguous()

    def _forward_hook(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        # The model's mode, not the layer's: a layer put in eval mode inside a training model still trains
        # (skipping it would leave its parameters only noise); an evaluation pass of the model is skipped.
        if self._recomputing or not torch.is_grad_enabled() or not self.model.training:
            return None
        name, rule = self._module_names[id(module)], self._rules[id(module)]
        if rule == GENERIC:
            return self._record_generic(name, module, args, kwargs, output)
        inputs = args[0] if args else next(iter(kwargs.values()), None)
        if not isinstance(inputs, Tensor) or not isinstance(output, Tensor):
            raise UnsupportedLayerError(
                f"engine: layer {name} ({type(module).__name__}) was called without a tensor input or output"
            )
        if inputs.dim() and inputs.shape[0] == 1 and output.dim() and output.shape[0] == 1:
            inputs, output = self._broadcast(inputs, 0, name), self._broadcast(output, 0, name)
        version = inputs._version
        sequence_first = id(module) in self._sequence_first and inputs.dim() > 1  # (T, B, ...): rules want B first
        rows = (
            self._model_batch
            and rule.rowwise
            and (
                validators.flattened_rows(inputs, output, self._model_batch)
                or validators.rows_of_proved_rows(inputs, output, self._model_batch, self._row_sources)
            )
        )
        if sequence_first:
            inputs = inputs.transpose(0, 1)
        elif rows:  # (B·k, ...) rows of a batch-first tensor: (B, k, ...) for the rule
            inputs = inputs.unflatten(0, (-1, rows))
        call = _Call(name, module, rule, self._layer_params[id(module)], inputs.detach(), version=version)
        self._calls.append(call)

        shape = tuple(inputs.shape)

        def sink(grad: Tensor) -> None:
            grad = grad.transpose(0, 1) if sequence_first else grad.unflatten(0, (-1, rows)) if rows else grad
            try:
                self._take_backprops(call, grad)
            except torch.OutOfMemoryError:
                raise
            except (RuntimeError, IndexError) as error:  # a rule given a layout it does not know: name the layer
                label = f"{name} ({type(module).__name__})"
                raise UnsupportedLayerError(validators.rule_failure_message(label, shape, error)) from error

        tapped = capture.tap(output, sink, self._origin(output))
        if rows:  # its output rows are proved example-major too: layers after elementwise ops may use them
            self._row_sources[id(tapped.grad_fn)] = (tapped.grad_fn, rows)
        return tapped

    def _record_generic(
        self, name: str, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> Any:
        """Keep every input and output of a generic-rule call; hooks collect each output's gradient."""
        reason = generic.check_call(module, args, kwargs)
        if reason:
            raise UnsupportedLayerError(f"engine: layer {name} ({type(module).__name__}): {reason}")
        input_leaves, input_spec = tree_flatten((args, kwargs))
        input_leaves = [v.detach() if isinstance(v, Tensor) else v for v in input_leaves]
        leaves, spec = tree_flatten(output)
        layout = generic.layout_of(module, args, kwargs, output)
        call = _GenericCall(
            name,
            module,
            self._layer_params[id(module)],
            *tree_unflatten(input_leaves, input_spec),
            versions=[(t, t._version) for t in input_leaves if isinstance(t, Tensor)],
            layout=layout,
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
            # A fresh node (capture.tap): a hook on the module's own tensor would also collect the gradient of the
            # module's internal uses of it (attention weights it multiplies by the values), which the re-run
            # forward counts again, and would miss the gradient when the output is changed in place afterwards.
            leaf = self._broadcast(leaf, layout.outputs[k], name)
            sink = lambda grad, k=k: call.out_grads.__setitem__(k, grad.detach())  # noqa: E731
            leaf = leaves[k] = capture.tap(leaf, sink, self._origin(leaf))
            call.outputs[k] = leaf.detach()
            call.output_versions[k] = leaf._version
        self._calls.append(call)
        return tree_unflatten(leaves, spec)

    def _generic_grads(self, call: _GenericCall, batch: int) -> dict[str, Tensor]:
        """Per-example gradients of a generic-rule call, or a refusal naming its layer."""
        label = f"{call.name} ({type(call.module).__name__})"
        if any(t._version != version for t, version in call.versions):
            raise UnsupportedLayerError(validators.in_place_message(label))
        self._recomputing = True
        try:
            with contextlib.ExitStack() as stack:
                for device, dtype in call.autocast:
                    stack.enter_context(torch.autocast(device, dtype=dtype))
                self._refresh_changed_outputs(call)
                return generic.per_example_grads(
                    call.module, call.params, call.args, call.kwargs, call.layout, call.outputs, call.out_grads, batch
                )
        except generic.GenericRuleError as error:
            raise UnsupportedLayerError(f"engine: layer {label} cannot be trained privately: {error}") from None
        except RuntimeError as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise UnsupportedLayerError(
                f"engine: layer {label}: re-running its forward one example at a time (generic rule) failed: {first}"
                " (random operations such as dropout inside it must be off)"
            ) from error
        finally:
            self._recomputing = False

    @staticmethod
    def _refresh_changed_outputs(call: _GenericCall) -> None:
        """Outputs changed in place after the layer returned them (``o += h``; their gradients are still exact,
        ``capture.tap``) are recomputed for the batch from the unchanged inputs, so that the per-example
        recomputation is still checked against what the layer produced."""
        changed = [k for k, v in enumerate(call.output_versions) if v is not None and call.outputs[k]._version != v]
        if changed:
            fresh = generic.batch_outputs(call.module, call.args, call.kwargs)
            for k in changed:
                call.outputs[k] = fresh[k]

    @exactly  # autocast follows into backward, TF32 is global: norms in full precision (precision.py)
    def _take_backprops(self, call: _Call, grad: Tensor) -> None:
        """Backward hook: this call's per-example norms now, so instantiated layers free a and b at once."""
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
        # Half-precision a and b are promoted for the computations only; a ghost call keeps them as they came
        # (GPT-2's head keeps a B × T × vocabulary b until book-keeping: twice the memory in float32).
        kept = call.activations, call.backprops
        call.activations, call.backprops = _norm_precision(call.activations), _norm_precision(call.backprops)
        shared = any(state.use_count[id(p)] > 1 for p in call.params.values())
        tied = "weight" in call.params and id(call.params["weight"]) in state.tied
        names = frozenset(call.params)
        ghost = self._use_ghost(call, shared, tied)
        self.layer_methods[call.name] = "ghost" if ghost else "instantiate"
        if ghost:
            norm_sq = call.rule.ghost_norm(call.module, call.activations, call.backprops)
            key = id(call.params["weight"])
            state.norm_sq[key] = state.norm_sq[key] + norm_sq if key in state.norm_sq else norm_sq
            state.ghost_calls.append(call)
            names -= {"weight"}
        if names:
            instantiated = parametrized.per_example_grads(
                call.rule, call.module, call.activations, call.backprops, names
            )
            for attr, grads in instantiated.items():
                key = id(call.params[attr])
                state.per_example[key] = state.per_example[key] + grads if key in state.per_example else grads
        call.activations, call.backprops = kept if ghost else (None, None)

    @without_autocast  # the caller's autocast must not reach the engine's hooks (precision.py)
    def backward(self, losses: Tensor, weights: Tensor | None = None) -> Tensor:
        """Back-propagate Σ_i w_i·L_i once and add Σ_i C_i·w_i·g_i to this step's clipped sum.

        ``losses``: per-example losses (B,) of the last forward pass (NOT a mean). ``weights``: (B,)
        example weights, 0 for padding rows (they then contribute exactly zero). Returns the per-example
        norms ‖w_i·g_i‖ (flat over all layers) before clipping.
        """
        if losses.dim() != 1:
            raise ParamsError(f"engine: losses must be per-example, shape (B,), got {tuple(losses.shape)}")
        if problem := placement_problem(self.params, self._buffer.device, self._buffer.dtype):
            raise ParamsError(problem)
        weights = None if weights is None else weights.to(losses.device)
        if self._check_passed:
            for handle in self._check_handles:
                handle.remove()
            self._check_handles = []
        calls, self._calls = self._calls, []
        if not calls:
            raise ParamsError(
                "engine: no forward pass of the model was recorded since the last backward; run it in training "
                "mode (model.train()) with gradients enabled before engine.backward"
            )
        batch = losses.shape[0]
        use_count = Counter(id(p) for c in calls for p in c.params.values())
        state = self._pass = _Pass(batch, use_count, {}, {}, [])
        state.generic_calls = [c for c in calls if isinstance(c, _GenericCall)]
        state.tied = self._tied_ghost(calls, use_count)
        self.last_workspace_elements = 0
        total = losses.sum() if weights is None else (losses * weights.to(losses.dtype)).sum()
        try:
            total.backward()
        finally:
            self._pass = None
            for origin in self._origins.values():
                origin.grad = None
        if state.mismatch is not None:
            raise ParamsError(
                f"engine: layer {state.mismatch.name} ({type(state.mismatch.module).__name__}) saw batch dimension "
                f"{state.mismatch.activations.shape[0]} but there are {batch} losses; its input must be batch-first "
                "(or of size 1 there, shared by the batch), or its rows a contiguous view of a batch-first tensor "
                "(x.view(-1, d) of x (B, T, d)), where the engine can prove which example each row belongs to"
            )
        if state.modified is not None:
            call = state.modified
            raise UnsupportedLayerError(validators.in_place_message(f"{call.name} ({type(call.module).__name__})"))
        for key, tied_calls in state.tied.items():
            factors = [
                c.rule.tied_factors(c.module, _norm_precision(c.activations), _norm_precision(c.backprops))
                for c in tied_calls
                if c.backprops is not None
            ]  # a use whose output got no gradient adds nothing
            for first in range(len(factors)):
                for second in range(first + 1, len(factors)):
                    state.norm_sq[key] = state.norm_sq[key] + 2 * ghost_dot(factors[first], factors[second])
        for call in state.generic_calls:
            self.layer_methods[call.name] = GENERIC
            for attr, grads in self._generic_grads(call, batch).items():
                key = id(call.params[attr])
                state.per_example[key] = state.per_example[key] + grads if key in state.per_example else grads
        # Few launches and no host sync from here on (batched.py): small per-example gradients packed, one
        # stacked sum of the norms, dropped rows masked rather than tested for.
        norm_sq = state.norm_sq
        packed = Packed.of(state.per_example, batch, self._buffer.dtype) if self._groups == 1 else None
        for key, grads in state.per_example.items():
            norm_sq[key] = grads.reshape(batch, -1).square().sum(1)
        terms = list(norm_sq.values()) + ([packed.norm_sq()] if packed is not None else [])
        flat = stacked_sum(terms) if terms else losses.new_zeros(batch)
        nonfinite = nonfinite_rows(flat)
        dropped = nonfinite if weights is None else nonfinite | (weights == 0)
        self._nonfinite += (nonfinite if weights is None else nonfinite & (weights != 0)).sum()
        factors = self._factors(norm_sq, flat, dropped)
        self._add_clipped(factors, state.per_example, state.ghost_calls, packed, dropped)
        self.last_norms = flat.sqrt()
        return self.last_norms

    def _tied_ghost(self, calls: list[Any], use_count: Counter) -> dict[int, list[_Call]]:
        """Shared weights kept on the ghost norm (id -> the calls using them): every use is a layer whose rule
        writes its gradient as ``tied_factors``, and ("auto") the Grams (2T² per use, 2·T·T' per pair) are
        smaller than one instantiated gradient. Other shared weights are instantiated and summed."""
        if self.ghost == "never":
            return {}
        users: dict[int, list[_Call]] = {}
        for call in calls:
            if isinstance(call, _Call) and "weight" in call.params and use_count[id(call.params["weight"])] > 1:
                users.setdefault(id(call.params["weight"]), []).append(call)
        tied = {}
        for key, group in users.items():
            if len(group) != use_count[key] or any(c.rule.tied_factors is None for c in group):
                continue
            steps = [c.rule.ghost_cost(c.module, c.activations)[0] for c in group]
            if (
                self.ghost == "always"
                or sum(steps) * len(group) < group[0].rule.ghost_cost(group[0].module, group[0].activations)[1]
            ):
                tied[key] = group
        return tied

    def _use_ghost(self, call: _Call, shared: bool, tied: bool = False) -> bool:
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

    @property
    def nonfinite_examples(self) -> int:
        """Real examples dropped so far for a non-finite norm (kept on the device: reading it syncs)."""
        return int(self._nonfinite)

    @nonfinite_examples.setter
    def nonfinite_examples(self, value: int) -> None:
        self._nonfinite = torch.tensor(int(value), dtype=torch.int64, device=self._buffer.device)

    def _factors(self, norm_sq: dict[int, Tensor], flat: Tensor, dropped: Tensor) -> dict[int, Tensor]:
        """Clipping factor / ``normalizer`` of every parameter's group, per example (zero for weight-0 rows and
        for examples whose flat norm is not finite, in every group); flat and automatic clipping: one tensor
        for all parameters."""
        threshold = group_threshold(self.clipping, self.clip_norm, self._groups)
        if self._groups == 1:
            factor = clip_factors(flat, threshold, self.clipping, self.automatic_gamma)
            return dict.fromkeys(self._owners, factor.masked_fill(dropped, 0) / self.normalizer)
        group_sq: dict[int, list[Tensor]] = {}
        for key, value in norm_sq.items():
            group_sq.setdefault(self._owners[key].group, []).append(value)
        group_factors = {
            g: clip_factors(stacked_sum(v), threshold, self.clipping, self.automatic_gamma).masked_fill(dropped, 0)
            / self.normalizer
            for g, v in group_sq.items()
        }
        return {key: group_factors[self._owners[key].group] for key in norm_sq}

    def _flat_views(self, flat: Tensor) -> list[Tensor]:
        return [flat[o.offset : o.offset + o.numel].view_as(p) for p, o in zip(self.params, self._owner_list())]

    def _owner_list(self) -> list[_Owner]:
        return [self._owners[id(p)] for p in self.params]

    def _sum_buffer(self) -> Tensor:
        """The one flat buffer of this step's noisy sum divided by ``normalizer``; when a step begins it is
        filled with the noise σ·R·z_t/normalizer (zeros without noise), and the clipped sums and the
        canary, each scaled by 1/normalizer on the way in, are then added in place.

        It finally holds the gradients (``p.grad`` are views), so a step allocates no parameter-sized
        tensor and makes no separate pass to zero the buffer, add the noise or divide."""
        if not self._pending:
            if self.noise_multiplier > 0 and self._adds_noise:
                scale = self.noise_multiplier * self.clip_norm / self.normalizer
                self.noise.draw_into(self._buffer, self.steps_taken, scale)
            else:
                self._buffer.zero_()
            self._pending = True
        return self._buffer

    @exactly
    def _add_clipped(
        self,
        factors: dict[int, Tensor],
        per_example: dict[int, Tensor],
        ghost_calls: list[_Call],
        packed: Packed | None,
        dropped: Tensor,
    ) -> None:
        """Σ_i factors[i]·g_i of every parameter into the step's buffer; rows not kept are zeroed first."""
        self._sum_buffer()
        for key, grads in per_example.items():
            grads = keep_rows(grads, dropped)
            self._accumulate(key, grads.dtype, lambda out: add_weighted_sum(out, factors[key], grads))
        if packed is not None:
            packed.add_clipped([self._slice_of[k] for k in packed.keys], factors[packed.keys[0]], dropped)
        for call in ghost_calls:
            key = id(call.params["weight"])
            a, b = (keep_rows(_norm_precision(t), dropped) for t in (call.activations, call.backprops))
            self._accumulate(key, b.dtype, lambda out: call.rule.clipped_sum(call.module, a, b, factors[key], out))
            call.activations = call.backprops = None

    def _accumulate(self, key: int, dtype: torch.dtype, add: Callable[[Tensor], None]) -> None:
        """Run ``add`` on the buffer view of parameter ``key`` (its id); through a temporary of ``dtype``
        when the parameter is stored in another precision (e.g. half parameters, float32 norms)."""
        view = self._view_of[key]
        if view.dtype == dtype:
            add(view)
            return
        temporary = torch.zeros_like(view, dtype=dtype)
        add(temporary)
        view.add_(temporary)

    @property
    def last_noisy_sum(self) -> list[Tensor] | None:
        """The noisy sum g̃ (clipped sum + canary + noise) released by the last step, one tensor per
        parameter; None before the first step and once the next step's ``backward`` has begun."""
        if self.steps_taken == 0 or self._pending:
            return None
        return [view * self.normalizer for view in self._views]

    def step(self, canary: Sequence[Tensor] | None = None) -> None:
        """Finish one logical step: (σ·R·z_t + clipped sum (+ canary)) / ``normalizer`` to the optimizer
        (with a process group: summed over the ranks first, by one all-reduce)."""
        step = self.steps_taken
        if canary is None and self.canary_hook is not None:
            canary = self.canary_hook(step)
        self._sum_buffer()
        if canary is not None:
            if len(canary) != len(self.params):
                raise ParamsError(
                    f"engine: a canary needs {len(self.params)} tensors (one per parameter), got {len(canary)}"
                )
            for view, vector in zip(self._views, canary if self._adds_noise else ()):
                view.add_(vector.reshape(view.shape).to(view.device, view.dtype), alpha=1 / self.normalizer)
        if self._ranks is not None:
            self._ranks.all_reduce(self._buffer)
        for param, grad in zip(self.params, self._views):
            param.grad = grad
        if self.optimizer is not None:
            self.optimizer.step()
            for param in self.params:
                param.grad = None
        self._pending = False
        self.steps_taken += 1

    def private_step(
        self, losses: Tensor, weights: Tensor | None = None, canary: Sequence[Tensor] | None = None
    ) -> Tensor:
        """``backward`` then ``step``: one logical step from one physical batch; returns the norms."""
        norms = self.backward(losses, weights)
        self.step(canary)
        return norms

    def state_dict(self) -> dict[str, Any]:
        """The ledger part of a checkpoint: logical steps taken (the noise of step t depends only on t)."""
        return {"steps_taken": self.steps_taken, "nonfinite_examples": self.nonfinite_examples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the ledger; a step in progress (its noise drawn for the old position) is dropped."""
        self.steps_taken = int(state["steps_taken"])
        self.nonfinite_examples = int(state.get("nonfinite_examples", 0))
        self._pending = False

    def detach(self) -> None:
        """Remove the hooks and make the parameters require gradients again."""
        for handle in self._handles + self._check_handles:
            handle.remove()
        self._handles = self._check_handles = []
        for param in self.params:
            param.requires_grad_(True)

    def self_check(self, loss_fn: Callable, inputs: Tensor, targets: Tensor, **options: Any) -> Any:
        """Prove this engine exact on its model and a few examples against a naive per-example
        loop, on a float64 copy (model and engine unchanged); ``loss_fn(model, x, y)`` returns
        per-example losses. Returns a ``SelfCheckResult``; a mismatch raises ``SelfCheckError``
        naming the layer. ``options`` (``weights``, ``only``, ``precision``): see
        :func:`dpledger.engine.self_check.run_self_check`."""
        from dpledger.engine.self_check import run_self_check

        return run_self_check(
            self.model,
            loss_fn,
            inputs,
            targets,
            clip_norm=self.clip_norm,
            clipping=self.clipping,
            automatic_gamma=self.automatic_gamma,
            ghost=self.ghost,
            trainable=self.parameter_names,
            hidden_hooks=[*self._handles, *self._check_handles],
            engine_type=type(self),
            **options,
        )
