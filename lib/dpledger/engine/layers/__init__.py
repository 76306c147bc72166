"""Registry of per-layer rules: how a layer type turns (activations, output gradients) into per-example
gradient information. One small module per layer type; the engine's dispatcher knows nothing of
layer internals (the Opacus ``grad_sample`` layout, STYLE.md).

Every rule works on the activations ``a`` a forward hook saw and the gradient ``b = ∂L/∂s`` of the
summed loss with respect to the layer output (so ``b[i]`` is example i's output gradient).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

PerExampleGrads = Callable[[nn.Module, Tensor, Tensor, frozenset], dict[str, Tensor]]
GhostNorm = Callable[[nn.Module, Tensor, Tensor], Tensor]
ClippedSum = Callable[[nn.Module, Tensor, Tensor, Tensor, Tensor], None]
GhostCost = Callable[[nn.Module, Tensor], tuple[int, int]]
Validate = Callable[[nn.Module], "str | None"]


@dataclass(frozen=True)
class LayerRule:
    """Per-example gradient rules of one layer type.

    ``per_example_grads(layer, a, b, names)`` -> {name: (B, *param.shape)} for the parameters in
    ``names`` (the trainable ones), always available.
    The ghost branch covers the weight only (003 §2: biases and the like are cheap to instantiate, and the
    engine does so): ``ghost_norm(layer, a, b)`` -> (B,) squared norms of the per-example weight gradients
    without instantiating them, ``clipped_sum(layer, a, b, factors, out)`` adds Σ_i factors[i]·g_i of the
    weight into ``out`` in place (book-keeping, 003 §3.1 step 5; no parameter-sized temporary) and
    ``ghost_cost(layer, a)`` -> (ghost elements, instantiation elements) per example for the layer-wise
    decision 2T² < p·d (003 §3.3); all three are None for layers that always instantiate
    (normalisation layers: tiny per-example gradients).
    ``validate(layer)`` returns why this particular layer cannot be handled, or None; ``parameters``
    names the direct parameters the rule produces gradients for (any other one is an error).
    """

    per_example_grads: PerExampleGrads
    ghost_norm: GhostNorm | None = None
    clipped_sum: ClippedSum | None = None
    ghost_cost: GhostCost | None = None
    validate: Validate | None = None
    parameters: tuple[str, ...] = ("weight", "bias")

    @property
    def has_ghost(self) -> bool:
        return self.ghost_norm is not None


RULES: dict[type[nn.Module], LayerRule] = {}
RULES_BY_NAME: dict[str, LayerRule] = {}
"""Rules of layer classes from optional libraries, keyed by ``module.qualname`` (e.g.
``transformers.pytorch_utils.Conv1D``), so that the engine never imports those libraries itself."""


def register(*layer_types: type[nn.Module], rule: LayerRule) -> LayerRule:
    """Map each of ``layer_types`` (and its subclasses, unless they have their own rule) to ``rule``."""
    for layer_type in layer_types:
        RULES[layer_type] = rule
    return rule


def register_by_name(*qualified_names: str, rule: LayerRule) -> LayerRule:
    """As :func:`register`, for classes named ``module.qualname`` that are not imported here."""
    for name in qualified_names:
        RULES_BY_NAME[name] = rule
    return rule


def _registered(cls: type) -> LayerRule | None:
    return RULES.get(cls) or RULES_BY_NAME.get(f"{cls.__module__}.{cls.__qualname__}")


FORWARD_METHODS = ("forward", "_conv_forward")
"""The methods that compute a layer's output: a subclass that overrides one (e.g. ``F.linear(2 * x, ...)``,
torch's QAT layers) no longer computes what its registered base class's rule assumes."""


def registered_base(layer: nn.Module) -> type[nn.Module] | None:
    """The nearest registered class in ``layer``'s MRO, or None."""
    return next((cls for cls in type(layer).__mro__ if _registered(cls) is not None), None)


def rule_for(layer: nn.Module) -> LayerRule | None:
    """The rule of the nearest registered class in ``layer``'s MRO, or None — also None when ``layer``'s class
    overrides how that class computes its output (the rule would then be silently wrong)."""
    base = registered_base(layer)
    if base is None or any(getattr(type(layer), m, None) is not getattr(base, m, None) for m in FORWARD_METHODS):
        return None
    return _registered(base)


def add_weighted_sum(out: Tensor, factors: Tensor, per_example: Tensor) -> None:
    """out += Σ_i factors[i] · per_example[i] (module 5 of 003 §3.4), as one matrix-vector product in place."""
    out.view(-1).addmv_(per_example.reshape(per_example.shape[0], -1).T, factors.to(per_example.dtype))


def add_scaled_product(out: Tensor, factors: Tensor, b: Tensor, a: Tensor) -> None:
    """out += Σ_i factors[i] · b_iᵀ a_i for b (B, T, p) and a (B, T, d), in place.

    The factors scale whichever of a and b is smaller, so the temporary is B·T·min(p, d)."""
    factors = factors.to(b.dtype)[:, None, None]
    if b.shape[-1] <= a.shape[-1]:
        b = b * factors
    else:
        a = a * factors
    out.addmm_(b.reshape(-1, b.shape[-1]).T, a.reshape(-1, a.shape[-1]))


from dpledger.engine.layers import conv, embedding, hf_conv1d, linear, normalization  # noqa: E402,F401  (registers rules)

__all__ = ["LayerRule", "RULES", "RULES_BY_NAME", "add_scaled_product", "add_weighted_sum", "register",
           "register_by_name", "registered_base", "rule_for"]
