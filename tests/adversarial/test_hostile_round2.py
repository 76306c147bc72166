"""Issue 27 defects 7, 8, 10 and 11: padding enters a sequence classifier as its pad_token_id, a
changed plugin model restarts training, and bad weights files, labels, text fields and lengths are
one line each."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_trust_inputs import small_project

from dpledger.data.text import PAD, _labels, _texts, read_records
from dpledger.errors import DpledgerError, ParamsError
from dpledger.models.hf import load_hf_model
from dpledger.models.tasks import Task
from dpledger.pipeline import run_stage
from helpers.byo_helpers import tiny_lm

GPT2 = {
    "model_type": "gpt2",
    "n_layer": 1,
    "n_embd": 16,
    "n_head": 2,
    "n_positions": 32,
    "vocab_size": 300,
}


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> Path:
    return tiny_lm(tmp_path_factory.mktemp("round2")) / "model"


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_a_text_padded_in_a_batch_gets_the_logits_it_gets_alone(model_type):
    config = (
        dict(GPT2)
        if model_type == "gpt2"
        else {
            "model_type": "llama",
            "num_hidden_layers": 1,
            "hidden_size": 16,
            "num_attention_heads": 2,
            "intermediate_size": 32,
            "vocab_size": 300,
        }
    )
    torch.manual_seed(0)
    model = load_hf_model(
        {"config": {**config, "pad_token_id": 299}, "init": "random"},
        "classification",
        text=True,
        num_labels=3,
    ).eval()
    task = Task("sequence-classification")
    short = torch.tensor([[5, 6, 7]])
    batch = torch.tensor([[5, 6, 7, PAD, PAD], [1, 2, 3, 4, 8]])
    with torch.no_grad():
        alone, padded = task.logits(model, short)[0], task.logits(model, batch)[0]
    assert torch.allclose(alone, padded, atol=1e-5), (alone, padded)


def test_a_sequence_classifier_without_a_pad_token_is_refused_with_one_line():
    with pytest.raises(ParamsError) as refused:
        load_hf_model({"config": GPT2, "init": "random"}, "classification", text=True, num_labels=3)
    assert "\n" not in str(refused.value) and "no pad_token_id" in str(refused.value)


@pytest.mark.parametrize("damage", ["truncated", "pickled"])
def test_a_damaged_weights_file_in_a_model_folder_is_one_line(lm, tmp_path, damage):
    folder = tmp_path / damage
    shutil.copytree(lm, folder)
    weights = folder / "model.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:200])
    else:
        weights.unlink()
        torch.save({"weight": _Payload()}, folder / "pytorch_model.bin")
    with pytest.raises(ParamsError) as refused:
        load_hf_model({"path": str(folder)}, "causal-lm", text=True, num_labels=None)
    assert "\n" not in str(refused.value) and "its weights cannot be loaded safely" in str(
        refused.value
    )
    assert not (tmp_path / "PAYLOAD_RAN").exists()


class _Payload:
    def __reduce__(self):
        return (Path.touch, (Path("PAYLOAD_RAN"),))


def test_quoted_csv_newlines_are_kept(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text('text,label\n"first line\nsecond line",1\nplain,0\n')
    assert read_records(path) == [
        {"text": "first line\nsecond line", "label": "1"},
        {"text": "plain", "label": "0"},
    ]


@pytest.mark.parametrize("label", [1.7, "1.7", True, None, [1], {"a": 1}, 1e30, 10**30, -1, "x"])
def test_a_label_that_is_no_class_index_is_refused_not_truncated(label):
    with pytest.raises(DpledgerError) as refused:
        _labels([0, label], Path("data.jsonl"), "label")
    assert "\n" not in str(refused.value) and "record 2" in str(refused.value)


def test_integral_labels_are_accepted():
    assert _labels([0, 2.0, "3", 1], Path("d.jsonl"), "label").tolist() == [0, 2, 3, 1]


@pytest.mark.parametrize("text", [None, [1, 2], 5, 2.5, True, {"a": "b"}])
def test_a_text_field_that_is_not_a_string_is_refused(text):
    with pytest.raises(DpledgerError) as refused:
        _texts(["fine", text], Path("data.jsonl"), "text")
    assert (
        "\n" not in str(refused.value)
        and "record 2" in str(refused.value)
        and "strings" in str(refused.value)
    )


def test_a_causal_lm_on_one_token_texts_is_refused(lm, tmp_path):
    from helpers.byo_helpers import text_project

    (tmp_path / "data.jsonl").write_text(
        "".join(f'{{"text": "word {i} and more"}}\n' for i in range(40))
    )
    params = text_project(
        tmp_path,
        train_size=32,
        data={
            "name": "text",
            "path": str(tmp_path / "data.jsonl"),
            "tokenizer": str(lm),
            "max_length": 1,
        },
        train={"model": "hf", "task": "causal-lm", "model_options": {"path": str(lm)}},
    )
    with pytest.raises(ParamsError, match="at most 1 token"):
        run_stage("train", params, tmp_path)
    assert not (tmp_path / "artifacts/train").exists()


def no_parameters(input_shape, num_classes):
    return torch.nn.Flatten()


def test_a_plugin_model_without_parameters_is_one_line(tmp_path):
    params, _, _ = small_project(
        tmp_path, train={"model": f"{__name__}:no_parameters", "model_options": {}}
    )
    with pytest.raises(ParamsError, match="has no trainable parameters"):
        run_stage("train", params, tmp_path)


PLUGIN = """
import torch
from torch import nn

def model(input_shape, num_classes):
    return nn.Sequential(nn.Linear(input_shape[0], 8), nn.{activation}(), nn.Linear(8, num_classes))
"""


def test_a_changed_plugin_model_source_restarts_training(tmp_path, monkeypatch):
    (tmp_path / "plugin_round2.py").write_text(PLUGIN.format(activation="Tanh"))
    monkeypatch.syspath_prepend(str(tmp_path))
    params, _, _ = small_project(
        tmp_path, train={"model": "plugin_round2:model", "model_options": {}}
    )
    assert run_stage("train", params, tmp_path)["resumed_from_step"] == 0
    assert run_stage("train", params, tmp_path)["resumed_from_step"] == 10
    (tmp_path / "plugin_round2.py").write_text(PLUGIN.format(activation="ReLU"))
    sys.modules.pop("plugin_round2", None)
    assert run_stage("train", params, tmp_path)["resumed_from_step"] == 0
    assert np.isfinite(run_stage("train", params, tmp_path)["final_train_loss"])
