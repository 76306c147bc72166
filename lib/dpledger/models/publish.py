"""The published model: ``artifacts/model/``, a folder to share, written by the train stage after
training.

- ``hf`` model: ``save_pretrained`` (config.json, model.safetensors) with the data's tokenizer when
  there is one (``data.tokenizer``), loadable by ``AutoModelFor...from_pretrained``.
- LoRA (``train.lora`` or an adapter folder as input): the adapter only (adapter_config.json,
  adapter_model.safetensors, loadable by ``PeftModel.from_pretrained`` on the base model it names),
  and with ``train.export_merged`` also ``merged/``: the base model reloaded from its folder with
  the saved adapter merged in (``merge_and_unload``), a plain transformers checkpoint.
- zoo and plugin models: ``model.pt`` (the state dict, as ``artifacts/train/model.pt``).

Every folder gets the model card ``README.md`` (:mod:`dpledger.models.model_card`) and the privacy
record ``privacy.json`` (``merged/`` too): the claims the model is built from, which a run
continuing from the folder composes (:mod:`dpledger.accounting.across_runs`). Weights are copied to
the CPU before saving, so the files load on a machine without the training device. The
folder is replaced as a whole (``io.atomic_dir``): no file of an earlier run survives in it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpledger import io
from dpledger.accounting.across_runs import PRIVACY_FILE, Provenance
from dpledger.accounting.record import CalibrationRecord
from dpledger.ledger import Ledger
from dpledger.models.lora import is_peft
from dpledger.models.model_card import CardFacts, model_card
from dpledger.params import Params
from dpledger.sampling.guard import SamplerCheck

MERGED = "merged"


def _cpu_state(model: nn.Module) -> dict[str, torch.Tensor]:
    state = model.state_dict()
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in state.items()}


def _save_tokenizer(tokenizer: str | None, folder: Path) -> None:
    if tokenizer is not None:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(
            tokenizer, local_files_only=True, trust_remote_code=False
        ).save_pretrained(folder)


def _merged(adapter_folder: Path, model: nn.Module) -> nn.Module:
    """The base model, reloaded from its local folder on the CPU, with the saved adapter merged
    in."""
    from peft import PeftModel

    base = model.get_base_model()
    source = model.peft_config["default"].base_model_name_or_path
    reloaded = type(base).from_pretrained(
        source, local_files_only=True, dtype=torch.float32, trust_remote_code=False
    )
    return PeftModel.from_pretrained(reloaded, str(adapter_folder)).merge_and_unload()


PRIVACY_LINE = f"`{PRIVACY_FILE}`: the privacy claims this model is built from; a run that continues from this folder composes them into its own (`train.prior_data`)"  # noqa: E501


def _files(model: nn.Module, tokenizer: str | None, merged: bool) -> tuple[str, ...]:
    """What the folder holds, in the card's words."""
    if is_peft(model):
        source = model.peft_config["default"].base_model_name_or_path
        files = [
            "`adapter_config.json`, `adapter_model.safetensors`: the LoRA adapter only; "
            "load it with `PeftModel.from_pretrained(base, "
            f"folder)` on the base model in `{source}`"
        ]
        if merged:
            files.append(f"`{MERGED}/`: the base with the adapter merged in (`from_pretrained`)")
    elif hasattr(model, "save_pretrained"):
        files = ["`config.json`, `model.safetensors`: `AutoModelFor...from_pretrained(folder)`"]
    else:
        files = [f"`model.pt`: the state dict of a `{type(model).__name__}` (`torch.load`)"]
    if tokenizer is not None:
        files.append("the tokenizer files (`AutoTokenizer.from_pretrained(folder)`)")
    return (*files, "`README.md`: this card")


def _library(model: nn.Module) -> str:
    if is_peft(model):
        return "peft"
    return "transformers" if hasattr(model, "save_pretrained") else "pytorch"


def publish(
    folder: Path,
    model: nn.Module,
    facts: CardFacts,
    tokenizer: str | None,
    merged: bool,
) -> None:
    """Write the published folder (see the module docstring); the card's file list and library are
    filled in here."""
    with io.atomic_dir(folder) as tmp:
        if is_peft(model):
            model.save_pretrained(tmp, state_dict=_cpu_state(model))
            if merged:
                _merged(tmp, model).save_pretrained(tmp / MERGED)
                _save_tokenizer(tokenizer, tmp / MERGED)
        elif hasattr(model, "save_pretrained"):
            model.save_pretrained(tmp, state_dict=_cpu_state(model))
        else:
            torch.save(_cpu_state(model), tmp / "model.pt")
        _save_tokenizer(tokenizer, tmp)
        files = _files(model, tokenizer, merged)
        if facts.provenance is not None:
            files = (*files[:-1], PRIVACY_LINE, files[-1])
            for where in (tmp, tmp / MERGED) if merged and is_peft(model) else (tmp,):
                io.write_json(where / PRIVACY_FILE, facts.provenance.to_dict())
        card = model_card(replace(facts, files=files, library=_library(model)))
        (tmp / "README.md").write_text(card, encoding="utf-8")


def _base_model(model: nn.Module, params: Params) -> str | None:
    """The pretrained folder this run fine-tuned, if any."""
    if is_peft(model):
        return model.peft_config["default"].base_model_name_or_path
    options = params.train.model_options
    pretrained = params.train.model == "hf" and options.get("init", "pretrained") == "pretrained"
    return options.get("path") if pretrained else None


def publish_run(
    folder: Path,
    model: nn.Module,
    params: Params,
    claims: tuple[CalibrationRecord, Ledger, Provenance],
    check: SamplerCheck,
    metrics: dict[str, Any],
    trainable: int,
) -> None:
    """The train stage's call: the published folder of a finished run, with its card and its
    privacy record (``claims``: the calibration record, the ledger and the claims the model is built
    from; ``trainable``: the number of parameters the engine trained; it froze them all for ghost
    differentiation)."""
    record, ledger, provenance = claims
    facts = CardFacts(
        train=params.train,
        data_name=params.data.name,
        record=record,
        ledger=ledger,
        check=check,
        metrics=metrics,
        parameters=(trainable, sum(p.numel() for p in model.parameters())),
        base_model=_base_model(model, params),
        provenance=provenance,
    )
    publish(folder, model, facts, params.data.tokenizer, params.train.export_merged)
