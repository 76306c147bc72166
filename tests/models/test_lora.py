"""LoRA (train.lora or a saved peft adapter folder) on hf models: only the adapter is trained, the
engine's clipped sum over it equals a naive per-example loop, and every bad setting is one line."""

from __future__ import annotations

import copy
import json
import os
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

from dpledger.errors import ParamsError
from dpledger.models.hf import load_hf_model
from dpledger.params import load_params
from dpledger.params.lora import LoraParams
from helpers.engine_checks import bk_clipped_sum, naive_clipped_sum, relative_error
from helpers.train_project import make_project

VOCAB = 40


def _config(**extra) -> GPT2Config:
    sizes = {"n_layer": 2, "n_embd": 16, "n_head": 2, "n_positions": 16, "vocab_size": VOCAB}
    sizes.update((key, extra.pop(key)) for key in list(extra) if key in sizes)
    no_dropout = {
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "summary_first_dropout": 0.0,
    }
    tokens = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
    return GPT2Config(**sizes, **no_dropout, **tokens, **extra)


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> Path:
    """Two tiny GPT-2 checkpoints saved with save_pretrained: ``lm`` and ``classifier`` (3
    labels)."""
    root = tmp_path_factory.mktemp("lora")
    torch.manual_seed(0)
    GPT2LMHeadModel(_config()).save_pretrained(root / "lm")
    GPT2ForSequenceClassification(_config(num_labels=3)).save_pretrained(root / "classifier")
    return root


def _lora(**options) -> LoraParams:
    return LoraParams(**{"rank": 2, "alpha": 4.0, **options})


def _trained_names(model: torch.nn.Module) -> list[str]:
    return [name for name, p in model.named_parameters() if p.requires_grad]


def _lm(bases: Path, **options):
    """The lm base through load_hf_model, with ``options`` (e.g. lora)."""
    path = {"path": str(bases / "lm")}
    return load_hf_model(path, "causal-lm", text=True, num_labels=None, **options)


def test_lora_trains_the_adapter_only_and_freezes_every_base_weight(bases):
    model = _lm(bases, lora=_lora())
    trained = _trained_names(model)
    assert trained and all(".lora_A." in name or ".lora_B." in name for name in trained)
    base = GPT2LMHeadModel.from_pretrained(bases / "lm")
    frozen = {n: p for n, p in model.get_base_model().named_parameters() if "lora_" not in n}
    assert len(frozen) == len(list(base.parameters()))  # the tied head counted once
    assert not any(p.requires_grad for p in frozen.values())


def test_lora_on_a_classifier_trains_the_new_head_too(bases):
    model = load_hf_model(
        {"path": str(bases / "classifier")},
        "sequence-classification",
        text=True,
        num_labels=3,
        lora=_lora(),
    )
    trained = _trained_names(model)
    heads = [name for name in trained if "lora_" not in name]
    assert heads and all("modules_to_save" in name and ".score." in name for name in heads)


def _randomise_lora_b(model: torch.nn.Module) -> None:
    """peft starts lora_B at zero (a zero update): give it values, so every gradient term is
    exercised."""
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator))


def _lm_loss(output, tokens):
    logits = output.logits[:, :-1]
    losses = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1), reduction="none")
    return losses.view(tokens.shape[0], -1).mean(1)


def _class_loss(output, labels):
    return F.cross_entropy(output.logits, labels, reduction="none")


@pytest.mark.parametrize("head", ["causal-lm", "sequence-classification"])
def test_engine_clipped_sum_over_lora_equals_the_naive_per_example_loop(bases, head):
    folder, labels = ("lm", None) if head == "causal-lm" else ("classifier", 3)
    options = {"path": str(bases / folder)}
    model = load_hf_model(options, head, text=True, num_labels=labels, lora=_lora())
    _randomise_lora_b(model)
    model = model.double()
    tokens = torch.randint(1, VOCAB, (6, 8), generator=torch.Generator().manual_seed(1))
    targets = tokens if head == "causal-lm" else torch.tensor([0, 1, 2, 0, 1, 2])
    loss = _lm_loss if head == "causal-lm" else _class_loss
    expected = naive_clipped_sum(copy.deepcopy(model), loss, tokens, targets, 0.05)
    got, engine = bk_clipped_sum(model, loss, tokens, targets, 0.05)
    adapter = ("lora_A.default", "lora_B.default")
    assert all(name.endswith(adapter) or ".score." in name for name in engine.layer_methods)
    assert relative_error(got, expected) < 1e-10


def _save_adapter(bases: Path, folder: Path, **config) -> Path:
    """A peft adapter of the lm base saved into ``folder``, with ``config`` written into its
    adapter_config.json (base_model_name_or_path: the base folder, unless given)."""
    model = _lm(bases, lora=_lora())
    model.save_pretrained(folder)
    adapter_config = json.loads((folder / "adapter_config.json").read_text())
    adapter_config.update({"base_model_name_or_path": str(bases / "lm"), **config})
    (folder / "adapter_config.json").write_text(json.dumps(adapter_config))
    return folder


def test_an_adapter_folder_as_path_loads_its_base_relative_to_the_adapter(bases, tmp_path):
    relative = os.path.relpath(bases / "lm", tmp_path / "adapter")
    adapter = _save_adapter(bases, tmp_path / "adapter", base_model_name_or_path=relative)
    model = load_hf_model({"path": str(adapter)}, "causal-lm", text=True, num_labels=None)
    trained = _trained_names(model)
    assert trained and all("lora_" in name for name in trained)
    base = model.peft_config["default"].base_model_name_or_path
    assert Path(base).resolve() == (bases / "lm").resolve()


def _one_line_refusal(match: str, call) -> None:
    with pytest.raises(ParamsError, match=match) as error:
        call()
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "config,match",
    [
        (
            {"base_model_name_or_path": "gpt2"},
            r"is a peft adapter whose base model 'gpt2' .* is not a local",
        ),
        ({"lora_dropout": 0.1}, r"its lora_dropout is 0.1; LoRA dropout must be 0"),
        ({"peft_type": "IA3"}, r"its peft_type is IA3; dpledger trains LoRA adapters"),
        (
            {"target_modules": ["no_such_layer"]},
            r"is invalid: peft cannot apply the adapter to its base \(Target modules",
        ),
        (
            {"task_type": "SEQ_CLS"},
            r"the adapter was saved for task_type 'SEQ_CLS' \(needs 'CAUSAL_LM'\)",
        ),
    ],
)
def test_an_unusable_adapter_folder_is_one_line(bases, tmp_path, config, match):
    adapter = _save_adapter(bases, tmp_path / "adapter", **config)
    options = {"path": str(adapter)}
    call = partial(load_hf_model, options, "causal-lm", text=True, num_labels=None)
    _one_line_refusal(match, call)


@pytest.mark.parametrize(
    "options,lora,match",
    [
        (
            {"config": {"model_type": "gpt2", "n_layer": 1}, "init": "random"},
            _lora(),
            r"init = 'random' is invalid",
        ),
        ({"init": "random"}, _lora(), r"init = 'random' is invalid with LoRA"),
        (
            {},
            _lora(target_modules=["no_such_layer"]),
            r"train.lora.target_modules = \['no_such_layer'\] is inv",
        ),
    ],
)
def test_lora_on_random_weights_or_missing_layers_is_one_line(bases, options, lora, match):
    options = {"path": str(bases / "lm"), **options} if "config" not in options else options
    call = partial(load_hf_model, options, "causal-lm", text=True, num_labels=None, lora=lora)
    _one_line_refusal(match, call)


def test_lora_and_an_adapter_folder_together_are_one_line(bases, tmp_path):
    adapter = _save_adapter(bases, tmp_path / "adapter")
    options = {"path": str(adapter)}
    call = partial(load_hf_model, options, "causal-lm", text=True, num_labels=None, lora=_lora())
    _one_line_refusal(
        r"train.lora is invalid with train.model_options.path = .*: that folder is a peft adapter",
        call,
    )


@pytest.mark.parametrize(
    "train,match",
    [
        (
            {"model": "hf", "lora": {"dropout": 0.1}},
            r"train.lora.dropout = 0.1 is invalid: LoRA dropout must be 0",
        ),
        (
            {"model": "mlp", "lora": {"rank": 4}},
            r"train.lora = .* is invalid: LoRA adapts an hf model",
        ),
        (
            {"export_merged": True},
            r"train.export_merged = True is invalid: merged weights are a LoRA export",
        ),
        ({"model": "hf", "lora": {"rank": 0}}, r"train.lora.rank = 0 is invalid"),
    ],
)
def test_bad_lora_params_are_refused_by_the_schema(tmp_path, train, match):
    params = make_project(tmp_path, epochs=1, train=train)
    _one_line_refusal(match, lambda: load_params(params))


def test_the_resume_fingerprint_covers_an_adapters_base_model(bases, tmp_path):
    """A new base under the same adapter restarts training: its files are hashed inputs."""
    from dpledger.pipeline.train_prepare import user_files

    adapter = _save_adapter(bases, tmp_path / "adapter")
    model = {"model": "hf", "task": "causal-lm", "model_options": {"path": str(adapter)}}
    params = load_params(make_project(tmp_path, epochs=1, train=model))
    hashed = {path.resolve() for path in user_files(params)}
    assert (bases / "lm" / "config.json").resolve() in hashed
    assert (adapter / "adapter_config.json").resolve() in hashed
