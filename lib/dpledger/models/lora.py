"""LoRA on an ``hf`` model (peft): a fresh adapter from ``train.lora``, or a saved adapter folder
given as ``train.model_options.path``; either way only the adapter (and, for classification, the new
head) is trained.

peft freezes every base weight; the adapter's ``lora_A`` and ``lora_B`` are ``nn.Linear`` layers,
which the BK engine trains with its Linear rule, and peft's copy of a classification head
(``modules_to_save``) is one too. An adapter folder names its base model in ``adapter_config.json``
(``base_model_name_or_path``): it must be a local ``save_pretrained`` folder, read relative to the
working directory (the project root) or to the adapter folder; nothing is downloaded.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

from torch import nn

from dpledger.errors import ParamsError
from dpledger.params.lora import ADAPTER_CONFIG, LoraParams, is_adapter_folder

__all__ = ["add_lora", "adapter_base", "is_adapter_folder", "is_peft", "load_adapter"]

SAFE_WEIGHTS = "adapter_model.safetensors"
PICKLED_WEIGHTS = "adapter_model.bin"
PEFT_TASKS = {"causal-lm": "CAUSAL_LM", "sequence-classification": "SEQ_CLS"}


def _adapter_config(folder: str) -> dict[str, Any]:
    where = f"params: train.model_options.path = {folder!r} is invalid"
    try:
        config = json.loads((Path(folder) / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as error:
        reason = type(error).__name__
        raise ParamsError(f"{where}: {ADAPTER_CONFIG} cannot be read ({reason})") from None
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        kind = config.get("peft_type") if isinstance(config, dict) else None
        raise ParamsError(f"{where}: its peft_type is {kind}; dpledger trains LoRA adapters")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ParamsError(f"{where}: its r is {rank!r}; a LoRA rank must be a positive integer")
    if config.get("lora_dropout", 0.0) != 0.0:
        raise ParamsError(
            f"{where}: its lora_dropout is {config['lora_dropout']}; LoRA dropout must be 0 "
            "(dpledger trains LoRA without dropout)"
        )
    return config


def check_adapter_weights(folder: str) -> None:
    """One line, before peft reads anything, for adapter weights dpledger will not load: a pickled
    ``adapter_model.bin`` (unpickling runs code; it is never opened) or a truncated or corrupt
    ``adapter_model.safetensors`` (its header is read, no tensor)."""
    where = f"params: train.model_options.path = {folder!r} is invalid"
    weights = Path(folder) / SAFE_WEIGHTS
    if not weights.is_file():
        if (Path(folder) / PICKLED_WEIGHTS).is_file():
            reason = f"it holds a pickled {PICKLED_WEIGHTS}, which dpledger never loads"
            advice = "unpickling runs code; save the adapter with safe_serialization=True"
            raise ParamsError(f"{where}: {reason} ({advice})")
        raise ParamsError(f"{where}: it has no {SAFE_WEIGHTS}")
    from safetensors import safe_open

    try:  # the header must cover the whole file: a truncated one fails here
        with safe_open(str(weights), framework="pt") as handle:
            list(handle.keys())
    except Exception as error:  # noqa: BLE001 (safetensors raises its own and OS errors)
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ParamsError(f"{where}: {SAFE_WEIGHTS} cannot be read ({reason})") from None


def adapter_base(folder: str) -> str:
    """The local folder of the base model an adapter folder was trained on; one line if it is not
    local."""
    base = _adapter_config(folder).get("base_model_name_or_path")
    candidates = [Path(base), Path(folder) / base] if isinstance(base, str) and base else []
    for candidate in candidates:
        if (candidate / "config.json").is_file():
            return str(candidate)
    raise ParamsError(
        "params: "
        f"train.model_options.path = {folder!r} is a peft adapter whose base model {base!r} "
        f"({ADAPTER_CONFIG}: base_model_name_or_path) is not a local save_pretrained folder "
        "(relative to the project or to the adapter); "
        "save the base model locally and point base_model_name_or_path at it"
    )


def is_peft(model: nn.Module) -> bool:
    """Whether ``model`` is a peft model; peft (an optional dependency) is not imported for this: a
    model cannot be one unless peft was imported to build it."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def _peft_task(task: str) -> str:
    if task not in PEFT_TASKS:
        raise ParamsError(
            f"params: train.lora is invalid for train.task = {task!r}: "
            f"LoRA is offered for {', '.join(PEFT_TASKS)} (text models)"
        )
    return PEFT_TASKS[task]


def add_lora(model: nn.Module, lora: LoraParams, task: str) -> nn.Module:
    """``model`` with a fresh LoRA adapter (peft): every base weight frozen, the adapter (and a
    classification head) trainable."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        target_modules=lora.target_modules,
        lora_dropout=0.0,
        bias="none",
        task_type=_peft_task(task),
    )
    try:
        # peft's notice that it sets fan_in_fan_out for GPT-2's Conv1D layers, as it should
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="fan_in_fan_out is set to False")
            return get_peft_model(model, config)
    except (ValueError, KeyError, TypeError) as error:
        lines = str(error).strip().splitlines()
        raise ParamsError(
            "params: "
            f"train.lora.target_modules = {lora.target_modules!r} is invalid for the {type(model).__name__} model: "  # noqa: E501
            f"{lines[0] if lines else type(error).__name__}"
        ) from None


def load_adapter(model: nn.Module, folder: str, base: str, task: str) -> nn.Module:
    """The base ``model`` (loaded from ``base``, see :func:`adapter_base`) with the saved adapter of
    ``folder``, trainable (training continues from it); the adapter now names ``base`` as resolved
    here."""
    from peft import PeftModel

    saved_task = _adapter_config(folder).get("task_type")
    if saved_task != _peft_task(task):
        raise ParamsError(
            f"params: train.model_options.path = {folder!r} is invalid for train.task = {task!r}: "
            f"the adapter was saved for task_type {saved_task!r} (needs {PEFT_TASKS[task]!r})"
        )
    check_adapter_weights(folder)
    try:
        adapted = PeftModel.from_pretrained(model, folder, is_trainable=True)
    except (ValueError, KeyError, RuntimeError) as error:
        lines = str(error).strip().splitlines()
        raise ParamsError(
            f"params: train.model_options.path = {folder!r} is invalid: peft cannot apply the adapter to its base ({lines[0] if lines else type(error).__name__})"  # noqa: E501
        ) from None
    adapted.peft_config["default"].base_model_name_or_path = base
    return adapted
