"""Adapter folders dpledger will not load are refused in one line, before peft reads them: a
pickled adapter_model.bin (never unpickled), a truncated adapter_model.safetensors, r: 0."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dpledger.errors import ParamsError
from dpledger.models.lora import _adapter_config, check_adapter_weights

CONFIG = {"peft_type": "LORA", "r": 4, "lora_dropout": 0.0, "task_type": "CAUSAL_LM"}


class _Payload:
    ran = False

    def __reduce__(self):
        return (_mark_ran, ())


def _mark_ran():
    _Payload.ran = True


def _folder(tmp_path: Path, **config) -> Path:
    (tmp_path / "adapter_config.json").write_text(json.dumps({**CONFIG, **config}))
    return tmp_path


def _one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message and "train.model_options.path" in message
    return message


def test_a_pickled_adapter_is_refused_and_never_unpickled(tmp_path):
    folder = _folder(tmp_path)
    (folder / "adapter_model.bin").write_bytes(pickle.dumps(_Payload()))
    with pytest.raises(ParamsError) as error:
        check_adapter_weights(str(folder))
    assert "pickled adapter_model.bin" in _one_line(error) and not _Payload.ran


def test_a_truncated_safetensors_is_one_line(tmp_path):
    folder = _folder(tmp_path)
    save_file({"lora_A": torch.zeros(64, 64)}, str(folder / "adapter_model.safetensors"))
    whole = (folder / "adapter_model.safetensors").read_bytes()
    check_adapter_weights(str(folder))  # the whole file loads
    (folder / "adapter_model.safetensors").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ParamsError) as error:
        check_adapter_weights(str(folder))
    assert "cannot be read" in _one_line(error)


@pytest.mark.parametrize("rank", [0, -2, "8", None])
def test_a_non_positive_rank_is_one_line(tmp_path, rank):
    with pytest.raises(ParamsError) as error:
        _adapter_config(str(_folder(tmp_path, r=rank)))
    assert "its r is" in _one_line(error)
