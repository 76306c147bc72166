"""The Book-Keeping (BK) DP engine (003 §3.1 and §3.3): exact DP-SGD gradients at about non-private
cost.

One forward pass with hooks that keep each layer's input ``a``; ONE backward pass of Σ_i w_i·L_i
in which no parameter needs ``.grad`` (ghost differentiation, 003 §3.2), during which each layer's
output gradient ``b`` gives its per-example norms at once (ghost norm or instantiated gradients);
after the pass: clipping factors, and the clipped sum aᵀ·diag(C)·b formed directly (book-keeping),
without a second backward pass, accumulated in place into one flat buffer that already holds the
step's noise σ·R·z_t.

:class:`BKEngine` is a facade over parts with one job each:

- ``owners.py``: configuration — which layer owns each trainable parameter, its rule, its clipping
  group;
- ``recorder.py``: capture — forward hooks that keep activations, ``capture.tap`` for output
  gradients, generic-rule calls;
- ``norms.py``: per-layer norms — ghost or instantiate, tied weights, generic-rule gradients;
- ``noisy_sum.py``: the noisy sum and step — buffer, noise, clipping factors, accumulation, canary,
  all-reduce, optimizer step, the step count;
- ``validators.py``: every refusal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from dpledger.engine import noisy_sum, validators
from dpledger.engine.device import placement_problem
from dpledger.engine.distributed import GroupSum
from dpledger.engine.noise import NoiseSource
from dpledger.engine.noisy_sum import NoisySum
from dpledger.engine.norms import GhostMode, LayerNorms
from dpledger.engine.owners import map_layers
from dpledger.engine.recorder import Recorder
from dpledger.engine.settings import ClipNoise
from dpledger.engine.validators import UnsupportedLayerError
from dpledger.errors import ParamsError
from dpledger.precision import without_autocast

__all__ = ["BKEngine", "CanaryHook", "ClipNoise", "GhostMode", "UnsupportedLayerError"]

CanaryHook = Callable[[int], "Sequence[Tensor] | None"]


class BKEngine:
    """Private gradients for every trainable parameter of ``model`` by Book-Keeping.

    Use: ``engine.backward(per_example_losses[, weights])`` after each forward pass of a (physical)
    batch — it adds Σ_i C_i·w_i·g_i to the step's sum, which starts as the noise σ·R·z_t — then
    ``engine.step()`` once per logical batch: it adds the canary (if any), keeps the noisy sum in
    ``last_noisy_sum``, sets each ``p.grad`` to noisy sum / ``normalizer`` (views of one reused
    buffer) and steps the optimizer. ``steps_taken`` counts logical steps (the privacy ledger);
    ``nonfinite_examples`` counts the real examples whose per-example norm was NaN or inf: they get
    clip factor 0 and contribute exactly zero.

    Constructing the engine sets ``requires_grad=False`` on the trainable parameters (ghost
    differentiation; :meth:`detach` restores them); build the optimizer before. A trainable
    parameter the engine cannot train exactly (a BatchNorm, a layer that mixes examples or draws
    random numbers in a generic-rule forward) raises :class:`UnsupportedLayerError` naming it —
    never trained without clipping, never silently frozen. ``layer_methods`` names each layer's
    method: ghost, instantiate, generic.

    Audit hooks: ``step(canary=[tensors])`` or ``canary_hook(step) -> [tensors] | None`` adds a
    caller-supplied vector (one tensor per trainable parameter, in ``parameter_names`` order) to
    the clipped sum before noise — a gradient canary; ``last_noisy_sum`` is the released noisy sum
    g̃ of the last step (same layout), so an auditor can take ⟨g̃, ĝ⟩.

    ``ghost``: "auto" uses the ghost norm where 2T² < p·d (003 §3.3, BK-MixOpt), "always"/"never"
    force one branch. ``clipping``: "flat" (default), "per-layer" or "automatic" (see clipping.py).
    ``mechanism``/``mechanism_params``/``num_steps``: correlated noise through
    ``dpledger.mechanisms.noise_stream``. ``secure_noise``: draw noise from the OS CSPRNG.
    ``process_group``: data-parallel training (see ``engine/distributed.py``): each rank's clipped
    sum is all-reduced once per ``step``; only the group's rank 0 adds the noise and the canary.
    The clipping and noise keywords are kept whole as ``settings`` (:class:`ClipNoise`);
    :meth:`from_settings` builds an engine from such a record. ``seed``: the noise key (any
    non-negative integer; its secrecy is the privacy guarantee, see ``pipeline/noise_key.py``).
    """

    sum_type: type[NoisySum] = NoisySum
    """The noisy sum's class (``engine/fsdp_sum.py`` keeps only this rank's shards)."""
    norms_type: type[LayerNorms] = LayerNorms
    """The per-layer norms' class (``engine/fsdp.py`` gathers full weights for generic rules)."""

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
        validators.check_options(
            clipping, clip_norm, automatic_gamma, noise_multiplier, normalizer, ghost
        )
        self.model, self.optimizer = model, optimizer
        self.settings = ClipNoise(
            float(clip_norm),
            float(noise_multiplier),
            normalizer,
            clipping,
            automatic_gamma,
            mechanism,
            dict(mechanism_params or {}),
            num_steps,
            secure_noise,
        )
        self.canary_hook = canary_hook
        self.params: list[nn.Parameter] = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ParamsError("engine: the model has no trainable parameter")
        layout = map_layers(model, self.params)
        self._owners = layout.owners
        self.numel = sum(p.numel() for p in self.params)
        self._groups = layout.groups(clipping)
        reference = self.params[0]
        if problem := placement_problem(self.params, reference.device, reference.dtype):
            raise ParamsError(problem)
        noise = NoiseSource(
            self.numel,
            seed=seed,
            mechanism=mechanism,
            mechanism_params=mechanism_params,
            num_steps=num_steps,
            secure=secure_noise,
            device=reference.device,
            dtype=reference.dtype,
        )
        self._sum = self.sum_type(
            self.params,
            self._owners,
            self.parameter_names,
            noise=noise,
            noise_multiplier=float(noise_multiplier),
            clip_norm=float(clip_norm),
            normalizer=normalizer,
            process_group=process_group,
        )
        self._norms = self.norms_type(ghost)
        self.layer_methods = self._norms.layer_methods
        self.last_norms: Tensor | None = None
        self._recorder = Recorder(model, layout, self._norms.take_backprops)
        for param in self.params:
            param.requires_grad_(False)

    @classmethod
    def from_settings(
        cls,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        settings: ClipNoise,
        *,
        seed: int,
        ghost: GhostMode = "auto",
        canary_hook: CanaryHook | None = None,
        process_group: torch.distributed.ProcessGroup | GroupSum | None = None,
    ) -> BKEngine:
        """The engine of ``model`` that clips and noises as ``settings`` says, with noise key
        ``seed``."""
        return cls(
            model,
            optimizer,
            **settings.engine_options(),
            seed=seed,
            ghost=ghost,
            canary_hook=canary_hook,
            process_group=process_group,
        )

    @property
    def parameter_names(self) -> list[str]:
        """Full names of the trainable parameters, in the order of canaries and
        ``last_noisy_sum``."""
        return [self._owners[id(p)].name for p in self.params]

    @property
    def clipping(self) -> str:
        return self.settings.clipping

    @property
    def automatic_gamma(self) -> float:
        return self.settings.automatic_gamma

    @property
    def clip_norm(self) -> float:
        return self._sum.clip_norm

    @property
    def noise_multiplier(self) -> float:
        return self._sum.noise_multiplier

    @property
    def normalizer(self) -> float:
        return self._sum.normalizer

    @property
    def noise(self) -> NoiseSource:
        """The noise source z_t of the steps (``noise.py``)."""
        return self._sum.noise

    @property
    def ghost(self) -> GhostMode:
        return self._norms.ghost

    @property
    def last_workspace_elements(self) -> int:
        """Per-example workspace (elements) the last backward pass chose: Grams or gradients (003
        §3.3)."""
        return self._norms.last_workspace_elements

    @property
    def steps_taken(self) -> int:
        """Logical steps taken (the privacy ledger: the noise of step t depends only on t)."""
        return self._sum.steps_taken

    @steps_taken.setter
    def steps_taken(self, value: int) -> None:
        self._sum.steps_taken = value

    @property
    def nonfinite_examples(self) -> int:
        """Real examples dropped so far for a non-finite norm (kept on the device: reading it
        syncs)."""
        return int(self._sum.nonfinite)

    @nonfinite_examples.setter
    def nonfinite_examples(self, value: int) -> None:
        self._sum.nonfinite = torch.tensor(
            int(value), dtype=torch.int64, device=self._sum.buffer.device
        )

    @property
    def _handles(self) -> list[Any]:
        """The capture hooks (``engine/self_check.py`` hides them on its copy of the model)."""
        return self._recorder.handles

    @property
    def _check_handles(self) -> list[Any]:
        """The first-pass check's hooks, removed once it has passed."""
        return self._recorder.check_handles

    @without_autocast  # the caller's autocast must not reach the engine's hooks (precision.py)
    def backward(self, losses: Tensor, weights: Tensor | None = None) -> Tensor:
        """Back-propagate Σ_i w_i·L_i once and add Σ_i C_i·w_i·g_i to this step's clipped sum.

        ``losses``: per-example losses (B,) of the last forward pass (NOT a mean). ``weights``: (B,)
        example weights, 0 for padding rows (they then contribute exactly zero). Returns the
        per-example norms ‖w_i·g_i‖ (flat over all layers) before clipping.
        """
        validators.check_losses(losses)
        if problem := placement_problem(
            self.params, self._sum.buffer.device, self._sum.buffer.dtype
        ):
            raise ParamsError(problem)
        weights = None if weights is None else weights.to(losses.device)
        calls = self._recorder.take()
        if not calls:
            raise ParamsError(validators.NO_FORWARD)
        state = self._norms.begin(calls, losses.shape[0])
        total = losses.sum() if weights is None else (losses * weights.to(losses.dtype)).sum()
        try:
            total.backward()
        finally:
            self._norms.end()
            self._recorder.clear_origin_grads()
        self._norms.finish(state, self._recorder)
        packed, flat = self._norms.flat(state, self._sum.buffer.dtype, self._groups, losses)
        dropped = self._sum.drop(flat, weights)
        factors = self._factors(state.norm_sq, flat, dropped)
        self._sum.add_clipped(factors, state.per_example, state.ghost_calls, packed, dropped)
        self.last_norms = flat.sqrt()
        return self.last_norms

    def _factors(
        self, norm_sq: dict[int, Tensor], flat: Tensor, dropped: Tensor
    ) -> dict[int, Tensor]:
        """Clipping factor / ``normalizer`` of every parameter's group, per example
        (``noisy_sum.factors``); a subclass may override it (``verify/distributed_trainer.py``
        leaves clipping to the all-reduce)."""
        return noisy_sum.factors(
            self._owners,
            norm_sq,
            flat,
            dropped,
            clipping=self.clipping,
            clip_norm=self.clip_norm,
            automatic_gamma=self.automatic_gamma,
            groups=self._groups,
            normalizer=self.normalizer,
        )

    @property
    def last_noisy_sum(self) -> list[Tensor] | None:
        """The noisy sum g̃ (clipped sum + canary + noise) released by the last step, one tensor per
        parameter; None before the first step and once the next step's ``backward`` has begun."""
        return self._sum.last()

    def watch(self, select: Callable[[list[Tensor]], Tensor]) -> None:
        """Keep each step's released noisy sum and clipped sum (this rank's: no noise, no canary)
        at the coordinates ``select`` gathers from per-parameter tensors, as ``last_watched``
        (``NoisySum.watch``; the one-run audit's record, audit/canaries.py)."""
        self._sum.watch(select)

    @property
    def last_watched(self) -> Tensor | None:
        """(2 × coordinates): the last step's released noisy sum and clipped sum at the watched
        coordinates, in the units of ``last_noisy_sum``; None before a step or without ``watch``."""
        return self._sum.last_watched

    def step(self, canary: Sequence[Tensor] | None = None) -> None:
        """Finish one logical step: (σ·R·z_t + clipped sum (+ canary)) / ``normalizer`` to the
        optimizer (with a process group: summed over the ranks first, by one all-reduce)."""
        if canary is None and self.canary_hook is not None:
            canary = self.canary_hook(self.steps_taken)
        self._sum.release(canary, self.optimizer)

    def private_step(
        self, losses: Tensor, weights: Tensor | None = None, canary: Sequence[Tensor] | None = None
    ) -> Tensor:
        """``backward`` then ``step``: one logical step from one physical batch; returns the
        norms."""
        norms = self.backward(losses, weights)
        self.step(canary)
        return norms

    def state_dict(self) -> dict[str, Any]:
        """The ledger part of a checkpoint: logical steps taken (the noise of step t depends only on
        t)."""
        return {"steps_taken": self.steps_taken, "nonfinite_examples": self.nonfinite_examples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the ledger; a step in progress (its noise drawn for the old position) is
        dropped."""
        self.steps_taken = int(state["steps_taken"])
        self.nonfinite_examples = int(state.get("nonfinite_examples", 0))
        self._sum.pending = False

    def detach(self) -> None:
        """Remove the hooks and make the parameters require gradients again."""
        self._recorder.remove()
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
