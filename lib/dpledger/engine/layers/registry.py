"""The registry of per-layer rules: :class:`LayerRule`, the maps from layer classes (or their
qualified names) to rules, :func:`rule_for`, and the few tensor helpers the rules share. Kept apart
from the package's ``__init__.py``, which imports the rule modules to register them, so that the
rule modules import this module and nothing imports back in a circle.

Every rule works on the activations ``a`` a forward hook saw and the gradient ``b = ∂L/∂s`` of the
summed loss with respect to the layer output (so ``b[i]`` is example i's output gradient).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from dpledger.engine.tensor_cores import mm_float32, promoted, scaled_parts
from dpledger.precision import exactly

PerExampleGrads = Callable[[nn.Module, Tensor, Tensor, frozenset], dict[str, Tensor]]
GhostNorm = Callable[[nn.Module, Tensor, Tensor], Tensor]
ClippedSum = Callable[[nn.Module, Tensor, Tensor, Tensor, Tensor], None]
GhostCost = Callable[[nn.Module, Tensor], tuple[int, int]]
TiedFactors = Callable[[nn.Module, Tensor, Tensor], tuple[str, Tensor, Tensor]]
Validate = Callable[[nn.Module], "str | None"]


@dataclass(frozen=True)
class LayerRule:
    """Per-example gradient rules of one layer type.

    ``per_example_grads(layer, a, b, names)`` -> {name: (B, *param.shape)} for the parameters in
    ``names`` (the trainable ones), always available.
    The ghost branch covers the weight only (003 §2: biases and the like are cheap to instantiate,
    and the engine does so): ``ghost_norm(layer, a, b)`` -> (B,) squared norms of the per-example
    weight gradients without instantiating them, ``clipped_sum(layer, a, b, factors, out)`` adds Σ_i
    factors[i]·g_i of the weight into ``out`` in place (book-keeping, 003 §3.1 step 5; no
    parameter-sized temporary) and ``ghost_cost(layer, a)`` -> (ghost elements, instantiation
    elements) per example for the layer-wise decision 2T² < p·d (003 §3.3); all three are None for
    layers that always instantiate (normalisation layers: tiny per-example gradients).
    ``validate(layer)`` returns why this particular layer cannot be handled, or None; ``parameters``
    names the direct parameters the rule produces gradients for (any other one is an error).
    ``tied_factors(layer, a, b)`` -> (kind, A, M) writes the weight gradient as g_i = M_iᵀ A_i, with
    M dense (B, T, rows) ("dense") or one-hot given by (B, T) row indices ("onehot"), so that a
    weight shared by several layers (GPT-2's head tied to its token embedding) keeps the ghost norm:
    see :func:`ghost_dot`. ``rowwise``: the layer acts on each position of its leading dimensions
    alone (Linear, LayerNorm), so an input of (B·k, ...) rows proved to be example-major
    (:func:`validators.flattened_rows`) is given to the rule as (B, k, ...). ``half_operands``: the
    layer's product ran on half-precision operands when its output gradient is half (autocast casts
    its input), so the engine rounds a float32 input the same way and hands ``ghost_norm`` and
    ``clipped_sum`` the half operands, for tensor cores (``tensor_cores.py``); other rules get them
    promoted to float32.
    """

    per_example_grads: PerExampleGrads
    ghost_norm: GhostNorm | None = None
    clipped_sum: ClippedSum | None = None
    ghost_cost: GhostCost | None = None
    validate: Validate | None = None
    parameters: tuple[str, ...] = ("weight", "bias")
    tied_factors: TiedFactors | None = None
    rowwise: bool = False
    half_operands: bool = False

    @property
    def has_ghost(self) -> bool:
        return self.ghost_norm is not None


RULES: dict[type[nn.Module], LayerRule] = {}
RULES_BY_NAME: dict[str, LayerRule] = {}
"""Rules of layer classes from optional libraries, keyed by ``module.qualname`` (e.g.
``transformers.pytorch_utils.Conv1D``), so that the engine never imports those libraries itself."""


def register(*layer_types: type[nn.Module], rule: LayerRule) -> LayerRule:
    """Map each of ``layer_types`` (and its subclasses, unless they have their own rule) to
    ``rule``."""
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
"""The methods that compute a layer's output: a subclass that overrides one (e.g. ``F.linear(2 * x,
...)``, torch's QAT layers) no longer computes what its registered base class's rule assumes."""


def registered_base(layer: nn.Module) -> type[nn.Module] | None:
    """The nearest registered class in ``layer``'s MRO, or None."""
    return next((cls for cls in type(layer).__mro__ if _registered(cls) is not None), None)


def rule_for(layer: nn.Module) -> LayerRule | None:
    """The rule of the nearest registered class in ``layer``'s MRO, or None — also None when
    ``layer``'s class overrides how that class computes its output (the rule would then be silently
    wrong)."""
    base = registered_base(layer)
    if base is None or any(
        getattr(type(layer), m, None) is not getattr(base, m, None) for m in FORWARD_METHODS
    ):
        return None
    return _registered(base)


@exactly
def ghost_dot(first: tuple[str, Tensor, Tensor], second: tuple[str, Tensor, Tensor]) -> Tensor:
    """⟨g_i, g'_i⟩ per example for two calls' gradients of ONE shared weight, g = Mᵀ A
    (``tied_factors``), without forming them: Σ_{s,t} (A_s·A'_t)(M_s·M'_t), where M_s·M'_t is a dot
    product of dense rows, the entry M_s[row'_t] of a dense row at a one-hot row index, or 1{row_s =
    row'_t} for two one-hot rows. Then ‖Σ_c g_c‖² = Σ_c ‖g_c‖² + 2 Σ_{c<c'} ⟨g_c, g_c'⟩ (norms of
    tied weights combine before squaring, 003 §5)."""
    (kind, a, m), (other_kind, a2, m2) = first, second
    gram_a = torch.bmm(a, a2.transpose(1, 2))
    if kind == other_kind == "dense":
        gram_m = torch.bmm(m, m2.transpose(1, 2))
    elif kind == "dense":
        gram_m = m.gather(2, m2.unsqueeze(1).expand(-1, m.shape[1], -1))
    elif other_kind == "dense":
        gram_m = m2.gather(2, m.unsqueeze(1).expand(-1, m2.shape[1], -1)).transpose(1, 2)
    else:
        gram_m = (m.unsqueeze(2) == m2.unsqueeze(1)).to(gram_a.dtype)
    return (gram_a * gram_m.to(gram_a.dtype)).sum((1, 2))


def add_weighted_sum(out: Tensor, factors: Tensor, per_example: Tensor) -> None:
    """out += Σ_i factors[i] · per_example[i] (module 5 of 003 §3.4), as one matrix-vector product
    in place."""
    out.view(-1).addmv_(
        per_example.reshape(per_example.shape[0], -1).T, factors.to(per_example.dtype)
    )


def add_scaled_product(out: Tensor, factors: Tensor, b: Tensor, a: Tensor) -> None:
    """out += Σ_i factors[i] · b_iᵀ a_i for b (B, T, p) and a (B, T, d), in place.

    The factors scale whichever of a and b is smaller, so the temporary is B·T·min(p, d). bfloat16
    operands take the exact split of ``tensor_cores.scaled_parts`` (two products on tensor cores,
    the factors lowered by less than 2⁻⁷); float16 ones are promoted to float32."""
    if a.dtype == b.dtype == torch.bfloat16:
        _add_split_product(out, factors, b, a)
        return
    b, a = promoted(b), promoted(a)
    factors = factors.to(b.dtype)[:, None, None]
    if b.shape[-1] <= a.shape[-1]:
        b = b * factors
    else:
        a = a * factors
    out.addmm_(b.reshape(-1, b.shape[-1]).T, a.reshape(-1, a.shape[-1]))


def _add_split_product(out: Tensor, factors: Tensor, b: Tensor, a: Tensor) -> None:
    """:func:`add_scaled_product` of bfloat16 b and a: hi + lo = C̃·(the smaller one) exactly, and
    out += hiᵀ·other + loᵀ·other with float32 results."""
    scale_b = b.shape[-1] <= a.shape[-1]
    scaled, other = (b, a) if scale_b else (a, b)
    other = other.reshape(-1, other.shape[-1])
    for part in scaled_parts(scaled, factors):
        part = part.reshape(-1, part.shape[-1])
        out.add_(mm_float32(part.T, other) if scale_b else mm_float32(other.T, part))
