"""The engine's configuration of a model: which layer owns each trainable parameter, by which rule
it is trained.

Built once when :class:`~dpledger.engine.bk.BKEngine` is constructed: each trainable parameter's
full name, its offset in the flat buffer of the noisy sum and its clipping group (its first owning
layer, for per-layer clipping); each hooked layer's name, rule (a :class:`LayerRule`, or
:data:`GENERIC` for the generic exact rule, ``layers/generic.py``) and parameters; and the layers
A layer the engine cannot train is refused here (``validators.layer_refusal``). Which dimension of
a layer's tensors is the batch is traced at the first forward pass (``provenance.py``), which may
hand the parameters of a layer whose tensors carry no batch to an enclosing module
(:meth:`Layout.claim`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from dpledger.engine import parametrized, validators
from dpledger.engine.layers import LayerRule, generic, rule_for
from dpledger.engine.validators import UnsupportedLayerError

GENERIC = "generic"
"""The rule marker of layers handled by :mod:`dpledger.engine.layers.generic`."""


@dataclass
class Owner:
    """Where a trainable parameter lives: its full name and clipping group (its first owning
    layer)."""

    name: str
    group: int
    numel: int
    offset: int


@dataclass
class Layout:
    """The owners of the trainable parameters (by id) and the hooked layers (by id): name, rule,
    parameters."""

    owners: dict[int, Owner]
    module_names: dict[int, str] = field(default_factory=dict)
    rules: dict[int, LayerRule | str] = field(default_factory=dict)
    layer_params: dict[int, dict[str, nn.Parameter]] = field(default_factory=dict)

    def groups(self, clipping: str) -> int:
        """Number of clipping groups: one per owning layer with per-layer clipping, else one."""
        return 1 + max(o.group for o in self.owners.values()) if clipping == "per-layer" else 1

    def hooked_modules(self, model: nn.Module) -> list[nn.Module]:
        """The model's layers that own trainable parameters, in ``model.modules()`` order."""
        return [m for m in model.modules() if id(m) in self.module_names]

    def ancestors(self, model: nn.Module) -> list[nn.Module]:
        """The modules enclosing a hooked layer that are not hooked themselves: the candidates to
        claim a layer whose tensors carry no batch (``provenance.claimant``)."""
        names = dict(model.named_modules())
        wanted: set[str] = set()
        for module in self.hooked_modules(model):
            name = self.module_names[id(module)]
            parts = name.split(".") if name != "<model>" else []
            wanted.update(".".join(parts[:depth]) for depth in range(len(parts)))
        return [names[n] for n in sorted(wanted) if id(names[n]) not in self.module_names]

    def claim(self, child: nn.Module, parent: nn.Module, names: dict[str, nn.Module]) -> None:
        """Hand ``child``'s parameters to the enclosing ``parent``, which trains them by the generic
        rule (re-running its forward per example differentiates its uses of them)."""
        child_name = self.module_names.pop(id(child))
        self.rules.pop(id(child))
        params = self.layer_params.pop(id(child))
        parent_name = next(n for n, m in names.items() if m is parent)
        prefix = child_name[len(parent_name) + 1 :] if parent_name else child_name
        self.module_names[id(parent)] = parent_name or "<model>"
        self.rules[id(parent)] = GENERIC
        owned = self.layer_params.setdefault(id(parent), {})
        owned.update({f"{prefix}.{attr}": p for attr, p in params.items()})


def _own_parameters(
    module: nn.Module, children: list[str], trainable: set[int]
) -> list[tuple[str, nn.Parameter]]:
    """The trainable parameters a layer trains (attribute path, parameter): its own, the originals
    of its parametrizations and those of the children the generic rule claims for it."""
    own = [(attr, p) for attr, p in module.named_parameters(recurse=False) if id(p) in trainable]
    own += [(path, p) for path, p in parametrized.originals(module) if id(p) in trainable]
    own += [
        (f"{child}.{attr}", p)
        for child in children
        for attr, p in getattr(module, child).named_parameters()
        if id(p) in trainable
    ]
    return own


def map_layers(model: nn.Module, params: list[nn.Parameter]) -> Layout:
    """The :class:`Layout` of ``model``'s trainable ``params``; a layer that cannot be trained
    raises :class:`UnsupportedLayerError` naming it."""
    trainable = {id(p) for p in params}
    full_names = {id(p): name for name, p in model.named_parameters()}
    layout = Layout({})
    offset = 0
    for p in params:
        layout.owners[id(p)] = Owner(full_names[id(p)], group=-1, numel=p.numel(), offset=offset)
        offset += p.numel()
    groups = 0
    claimed: set[int] = set()
    modules = dict(model.named_modules())
    for layer_name, module in modules.items():
        if id(module) in claimed:
            continue
        children = generic.claimed_children(module)
        claimed.update(id(m) for child in children for m in getattr(module, child).modules())
        claimed.update(id(m) for m in getattr(module, "parametrizations", nn.Module()).modules())
        own = _own_parameters(module, children, trainable)
        if not own:
            continue
        rule = None if children else rule_for(module)
        _add_layer(layout, layer_name, module, rule, own)
        fresh = [p for _, p in own if layout.owners[id(p)].group < 0]
        # a module whose parameters are all tied to earlier ones is no clipping group of its own
        if fresh:
            for p in fresh:
                layout.owners[id(p)].group = groups
            groups += 1
    return layout


def _add_layer(
    layout: Layout,
    layer_name: str,
    module: nn.Module,
    rule: LayerRule | None,
    own: list[tuple[str, nn.Parameter]],
) -> None:
    """Record a layer owning ``own`` in ``layout`` under ``rule`` (None: the generic rule), or
    refuse it."""
    label = f"{layer_name or '<model>'} ({type(module).__name__})"
    refusal = validators.layer_refusal(
        module,
        label,
        [f"{layer_name}.{attr}".lstrip(".") for attr, _ in own],
        rule,
        list(dict.fromkeys(parametrized.rule_name(attr) for attr, _ in own)),
    )
    if refusal:
        raise UnsupportedLayerError(refusal)
    layout.module_names[id(module)] = layer_name or "<model>"
    layout.rules[id(module)] = rule if rule is not None else GENERIC
    layout.layer_params[id(module)] = dict(own)
