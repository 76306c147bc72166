"""The model zoo: MLP, CNN with GroupNorm, small transformer (all BK-engine compatible).

``build_model(name, input_shape, num_classes, **opts)`` builds one; unknown names or options raise
:class:`dpledger.errors.ParamsError`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dpledger import validation
from dpledger.errors import ParamsError
from dpledger.models.cnn import CNN
from dpledger.models.mlp import MLP
from dpledger.models.transformer import Transformer
from dpledger.params.bounds import (
    BYTES_PER_MODEL_PARAMETER,
    MAX_LIST_LENGTH,
    MAX_MODEL_PARAMETERS,
    MAX_WIDTH,
    refuse_beyond,
    refuse_beyond_memory,
)

MODELS: dict[str, type[nn.Module]] = {"mlp": MLP, "cnn": CNN, "transformer": Transformer}


def _check_option(key: str, value: Any) -> None:
    """Integers in model options are sizes (widths, depths, heads): each in [1, MAX_WIDTH], lists
    bounded."""
    if isinstance(value, list):
        if len(value) > MAX_LIST_LENGTH:
            raise ParamsError(
                f"params: train.model_options.{key} has {len(value)} entries; "
                f"at most {MAX_LIST_LENGTH}"
            )
        for item in value:
            _check_option(key, item)
    elif isinstance(value, bool) or (isinstance(value, int) and not 1 <= value <= MAX_WIDTH):
        raise ParamsError(
            f"params: train.model_options.{key} = {value!r} is invalid: sizes are integers in [1, "
            f"{MAX_WIDTH:,}]"
        )


def check_model(name: str, input_shape: tuple[int, ...], num_classes: int, **opts: Any) -> int:
    """The parameter count of the model ``build_model`` would build, or one line on bad or too large
    options.

    The model is built and run on the ``meta`` device (shapes only: no memory, no random draws), so
    nothing is allocated before the bounds are checked."""
    validation.one_of("train.model", name, MODELS, where="params")
    for key, value in opts.items():
        _check_option(key, value)
    try:
        with torch.device("meta"):
            shape_only = MODELS[name](tuple(input_shape), num_classes, **opts)
            shape_only(
                torch.zeros(
                    (2, *input_shape), dtype=torch.long if "vocab_size" in opts else torch.float32
                )
            )
    except (TypeError, ValueError, KeyError, RuntimeError, ZeroDivisionError, IndexError) as error:
        message = f"{type(error).__name__}: {error}".splitlines()[0]
        raise ParamsError(
            f"params: train.model_options {opts} are invalid for model {name!r}: {message}"
        ) from None
    parameters = sum(p.numel() for p in shape_only.parameters())
    refuse_beyond(
        f"train.model_options {opts} (model {name!r})",
        parameters,
        MAX_MODEL_PARAMETERS,
        "parameters",
        "use smaller widths",
    )
    refuse_beyond_memory(
        f"train.model_options {opts} (model {name!r}, {parameters:,} parameters)",
        parameters * BYTES_PER_MODEL_PARAMETER,
        "use smaller widths",
    )
    return parameters


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, **opts: Any
) -> nn.Module:
    """An initialised model (seed torch beforehand for reproducible weights), after
    :func:`check_model`."""
    check_model(name, input_shape, num_classes, **opts)
    return MODELS[name](tuple(input_shape), num_classes, **opts)
