"""``train.model: hf``: a transformers model from a local folder (``from_pretrained``, local files
only: no hub access) or built from a config for random initialisation.

``train.model_options``: ``path`` (a folder saved with ``save_pretrained``), ``init``
(``pretrained``: its weights, the default; ``random``: its config.json with fresh weights), or
``config`` (a dict for ``AutoConfig.for_model``, e.g. ``{model_type: gpt2, n_layer: 2}``, random
weights) instead of ``path``. The head comes from ``train.task``; a model type transformers has no
such head for is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpledger import validation
from dpledger.errors import ParamsError
from dpledger.local_folders import TRUST_REMOTE_CODE, refuse_remote_code, refuse_remote_code_spec
from dpledger.models.lora import adapter_base, add_lora, is_adapter_folder, load_adapter
from dpledger.params.lora import LoraParams

OPTIONS = ("path", "init", "config")
HEADS = {  # task -> (transformers auto class, mapping that lists the configs it supports)
    "causal-lm": ("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING"),
    "sequence-classification": (
        "AutoModelForSequenceClassification",
        "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING",
    ),
    "image-classification": (
        "AutoModelForImageClassification",
        "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING",
    ),
}


def head_for(task: str, text: bool) -> str:
    """The transformers head of ``task``: ``classification`` is sequence or image classification by
    the data."""
    if task == "classification":
        return "sequence-classification" if text else "image-classification"
    return task


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _config(options: dict[str, Any], num_labels: int | None) -> Any:
    from transformers import AutoConfig

    if "config" in options:
        spec = dict(options["config"]) if isinstance(options["config"], dict) else None
        if not spec or "model_type" not in spec:
            raise ParamsError(
                "params: train.model_options.config is invalid: a mapping with model_type (e.g. "
                "gpt2)"
            )
        refuse_remote_code_spec(spec, "train.model_options.config")
        if num_labels is not None:
            spec.setdefault("num_labels", num_labels)
        try:
            return AutoConfig.for_model(**spec)
        except (
            Exception
        ) as error:  # any value of any key: transformers' own checks fail in many ways
            raise ParamsError(
                f"params: train.model_options.config is invalid: {_first_line(error)}"
            ) from None
    path = options["path"]
    if not Path(path).is_dir():
        raise ParamsError(
            f"params: train.model_options.path = {path!r} is invalid: no such folder "
            "(a transformers checkpoint saved with save_pretrained)"
        )
    if not (Path(path) / "config.json").is_file():
        raise ParamsError(
            f"params: train.model_options.path = {path!r} is invalid: "
            "not a transformers checkpoint (no config.json; save the model with save_pretrained)"
        )
    refuse_remote_code(path, "train.model_options.path")
    try:
        return AutoConfig.from_pretrained(
            path, local_files_only=True, trust_remote_code=TRUST_REMOTE_CODE
        )
    except Exception as error:  # a foreign or damaged config.json fails in many ways
        raise ParamsError(
            f"params: train.model_options.path = {path!r} is invalid: "
            f"not a transformers checkpoint ({_first_line(error)})"
        ) from None


def _supported_tasks(config: Any) -> list[str]:
    import transformers.models.auto.modeling_auto as auto

    return [task for task, (_, mapping) in HEADS.items() if type(config) in getattr(auto, mapping)]


def _checked_init(options: dict[str, Any]) -> str:
    """``model_options.init`` after the keys are checked: each bad option is one line naming it."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ParamsError(
            f"params: train.model_options {unknown} are invalid for model 'hf': "
            f"allowed keys are {', '.join(OPTIONS)}"
        )
    if ("path" in options) == ("config" in options):
        raise ParamsError(
            "params: train.model_options is invalid for model 'hf': give path (a local folder) "
            "or config"
        )
    init = options.get("init", "pretrained")
    if init not in ("pretrained", "random") or (init == "pretrained" and "config" in options):
        raise validation.invalid(
            "train.model_options.init",
            init,
            "allowed values are pretrained (with path), random",
            where="params",
        )
    return init


def load_hf_model(
    options: dict[str, Any],
    task: str,
    *,
    text: bool,
    num_labels: int | None,
    lora: LoraParams | None = None,
) -> nn.Module:
    """The model for ``task`` in float32 and train mode, with a LoRA adapter (models/lora.py) when
    ``lora`` is set or ``path`` is a peft adapter folder; every bad option is one line naming its
    key."""
    init = _checked_init(options)
    adapter = options["path"] if is_adapter_folder(options.get("path")) else None
    _check_lora(options, init, adapter, lora)
    if adapter is not None:
        options = {**options, "path": adapter_base(adapter)}
    config = _config(options, num_labels)
    head = head_for(task, text)
    supported = _supported_tasks(config)
    if head not in supported:
        where = options.get("path") or f"config model_type {config.model_type!r}"
        raise ParamsError(
            "params: "
            f"train.task = {task!r} is invalid for the {type(config).__name__} model in {where}: "
            f"transformers has no {head} head for it (it has: "
            f"{', '.join(supported) or 'none of ' + ', '.join(HEADS)})"
        )
    if head == "sequence-classification" and getattr(config, "pad_token_id", None) is None:
        where = options.get("path") or "train.model_options.config"
        raise ParamsError(
            "params: "
            f"train.task = {task!r} is invalid for the {type(config).__name__} model in {where}: "
            "it has no pad_token_id, "
            "and its classifier pools at the last token that is not padding; set pad_token_id "
            "(e.g. to the eos token id) in its config"
        )
    import transformers

    auto_class = getattr(transformers, HEADS[head][0])
    try:
        if init == "random":
            model = auto_class.from_config(
                config, dtype=torch.float32, trust_remote_code=TRUST_REMOTE_CODE
            )
        else:
            model = auto_class.from_pretrained(
                options["path"],
                local_files_only=True,
                dtype=torch.float32,
                trust_remote_code=TRUST_REMOTE_CODE,
            )
    except (
        Exception
    ) as error:  # foreign files: a truncated safetensors, a pickle refused by weights_only, ...
        raise ParamsError(
            f"params: train.model_options.path = {options.get('path')!r} is invalid: "
            f"its weights cannot be loaded safely ({type(error).__name__}: "
            f"{_first_line(error)[:160]})"
        ) from None
    if adapter is not None:
        model = load_adapter(model, adapter, options["path"], head)
    elif lora is not None:
        model = add_lora(model, lora, head)
    return model.train()


def _check_lora(
    options: dict[str, Any],
    init: str,
    adapter: str | None,
    lora: LoraParams | None,
) -> None:
    """LoRA fine-tunes pretrained weights, from ``train.lora`` or from an adapter folder, not
    both."""
    if lora is not None and adapter is not None:
        raise ParamsError(
            f"params: train.lora is invalid with train.model_options.path = {adapter!r}: "
            "that folder is a peft adapter already (its own rank and targets apply); "
            "remove train.lora"
        )
    if (lora is not None or adapter is not None) and init != "pretrained":
        raise ParamsError(
            f"params: train.model_options.init = {init!r} is invalid with LoRA: "
            "an adapter fine-tunes pretrained weights "
            "(set model_options.path to a local save_pretrained folder, init: pretrained)"
        )
