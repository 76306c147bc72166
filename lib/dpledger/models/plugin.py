"""``train.model: module:callable``: a user's model factory, loaded like plugin samplers
(dpledger.plugins).

Protocol: ``callable(input_shape, num_classes, **train.model_options) -> torch.nn.Module``, where
``num_classes`` is the number of classes (classification) or the tokenizer's vocabulary size (causal
LM). See :mod:`dpledger.models.tasks` for how the module is called.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from dpledger.errors import ParamsError
from dpledger.plugins import load_callable


def load_plugin_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, options: dict[str, Any]
) -> nn.Module:
    """Call the factory ``name``; refuse options it does not take and a result that is no
    ``nn.Module``."""
    factory = load_callable(name, "params: train.model", "a plugin model")
    try:
        inspect.signature(factory).bind(input_shape, num_classes, **options)
    except TypeError as error:
        raise ParamsError(
            f"params: train.model_options {sorted(options)} are invalid for model {name!r}: {error}"
        ) from None
    except ValueError:
        pass  # no introspectable signature (a builtin): let the call decide
    try:
        model = factory(input_shape, num_classes, **options)
    except (
        Exception
    ) as error:  # the user's code: its failure is one line naming it, not a traceback
        first = (str(error).strip().splitlines() or [""])[0][:160]
        raise ParamsError(
            f"params: train.model = {name!r} is invalid: "
            f"the factory raised {type(error).__name__}: {first}"
        ) from None
    if not isinstance(model, nn.Module):
        raise ParamsError(
            f"params: train.model = {name!r} is invalid: it returned {type(model).__name__}, "
            "not a torch.nn.Module"
        )
    return model
