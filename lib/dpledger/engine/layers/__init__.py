"""Registry of per-layer rules: how a layer type turns (activations, output gradients) into
per-example gradient information. One small module per layer type; the engine's dispatcher knows
nothing of layer internals (the Opacus ``grad_sample`` layout, STYLE.md). The registry itself is
``registry.py``; importing this package registers the rules of ``conv``, ``embedding``,
``hf_conv1d``, ``linear`` and ``normalization``.
"""

# imported for their effect: each module registers its layer rules
from dpledger.engine.layers import (  # noqa: F401
    conv,
    embedding,
    hf_conv1d,
    linear,
    normalization,
)
from dpledger.engine.layers.registry import (
    RULES,
    RULES_BY_NAME,
    LayerRule,
    add_scaled_product,
    add_weighted_sum,
    ghost_dot,
    register,
    register_by_name,
    registered_base,
    rule_for,
)

__all__ = [
    "LayerRule",
    "RULES",
    "RULES_BY_NAME",
    "add_scaled_product",
    "add_weighted_sum",
    "ghost_dot",
    "register",
    "register_by_name",
    "registered_base",
    "rule_for",
]
