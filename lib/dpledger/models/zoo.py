"""The model zoo: MLP, CNN with GroupNorm, small transformer (all BK-engine compatible).

``build_model(name, input_shape, num_classes, **opts)`` builds one; unknown names or options raise
:class:`dpledger.errors.ParamsError`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from dpledger.errors import ParamsError
from dpledger.models.cnn import CNN
from dpledger.models.mlp import MLP
from dpledger.models.transformer import Transformer

MODELS: dict[str, type[nn.Module]] = {"mlp": MLP, "cnn": CNN, "transformer": Transformer}


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, **opts: Any) -> nn.Module:
    """An initialised model (seed torch beforehand for reproducible weights)."""
    if name not in MODELS:
        raise ParamsError(f"params: train.model = {name!r} is invalid: allowed values are {', '.join(MODELS)}")
    try:
        return MODELS[name](tuple(input_shape), num_classes, **opts)
    except TypeError as error:
        raise ParamsError(f"params: train.model_options {sorted(opts)} are invalid for model {name!r}: {error}") from None
