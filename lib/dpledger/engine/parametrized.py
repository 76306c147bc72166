"""Parametrized weights (``torch.nn.utils.parametrize``: ``parametrizations.weight_norm``,
``spectral_norm``, ``orthogonal`` or a user's own): per-example gradients of the parametrization's
originals.

A parametrized layer computes its tensor ``weight = f(original0, original1, ...)`` on each access,
and the trainable parameters are the originals. The layer's own rule gives example i's gradient of
the computed weight, G_i (instantiated: the ghost norm does not survive the chain rule); example i's
gradient of the originals is then the vector-Jacobian product of f at the current originals with
G_i, one vjp under ``vmap`` over the examples. f is evaluated in eval mode, so that spectral_norm
uses the power-iteration vectors its training forward pass just updated, without iterating again
(the weight it gives is the one the forward pass used). A generic-rule layer needs nothing of this:
re-running its forward from the originals differentiates f.
"""

from __future__ import annotations

from torch import Tensor, nn
from torch.func import functional_call, vjp, vmap
from torch.nn.utils import parametrize

from dpledger.engine.layers import LayerRule

PREFIX = "parametrizations."


def originals(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(path relative to ``module``, parameter) of the originals of its parametrized tensors."""
    if not parametrize.is_parametrized(module):
        return []
    return [(PREFIX + path, p) for path, p in module.parametrizations.named_parameters()]


def rule_name(path: str) -> str:
    """The attribute a rule knows for a parameter path: ``parametrizations.weight.original0`` ->
    ``weight``."""
    return path[len(PREFIX) :].split(".")[0] if path.startswith(PREFIX) else path


def per_example_grads(
    rule: LayerRule, layer: nn.Module, a: Tensor, b: Tensor, names: frozenset
) -> dict[str, Tensor]:
    """``rule.per_example_grads`` for the parameter paths ``names``, parametrized tensors pulled
    back to their originals (paths as in :func:`originals`)."""
    grads = rule.per_example_grads(layer, a, b, frozenset(rule_name(n) for n in names))
    result = {n: grads[n] for n in names if not n.startswith(PREFIX)}
    for tensor in {rule_name(n) for n in names if n.startswith(PREFIX)}:
        pulled = _pull_back(layer.parametrizations[tensor], grads[tensor])
        result.update(
            {
                f"{PREFIX}{tensor}.{k}": v
                for k, v in pulled.items()
                if f"{PREFIX}{tensor}.{k}" in names
            }
        )
    return result


def _pull_back(chain: nn.Module, weight_grads: Tensor) -> dict[str, Tensor]:
    """{original name: (B, *shape)}: the vjp of the parametrization chain with each example's weight
    gradient."""
    primals = {name: p.detach() for name, p in chain.named_parameters()}
    training = chain.training
    chain.eval()
    try:
        weight, pullback = vjp(lambda values: functional_call(chain, values, ()), primals)
        return vmap(lambda grad: pullback(grad.to(weight.dtype))[0])(weight_grads)
    finally:
        chain.train(training)
