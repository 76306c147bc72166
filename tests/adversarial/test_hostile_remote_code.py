"""Issue 27 defect 5: nothing runs from a model or tokenizer folder. A config.json or
tokenizer_config.json with an auto_map (code shipped in the folder) is refused with one line naming
the file: no prompt, no payload run."""

from __future__ import annotations

import builtins
import json
import shutil
from pathlib import Path

import pytest

from dpledger.data.text import load_tokenizer
from dpledger.errors import ParamsError
from dpledger.models.hf import load_hf_model
from helpers.byo_helpers import tiny_lm

PAYLOAD = """
from pathlib import Path
Path(__file__).with_name("PAYLOAD_RAN").write_text("ran")
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
class EvilConfig(GPT2Config):
    model_type = "evil"
class EvilModel(GPT2LMHeadModel):
    config_class = EvilConfig
class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> Path:
    return tiny_lm(tmp_path_factory.mktemp("remote-code")) / "model"


@pytest.fixture(autouse=True)
def no_prompt(monkeypatch):
    def refuse_input(*args, **kwargs):
        raise AssertionError("dpledger asked on the terminal")

    monkeypatch.setattr(builtins, "input", refuse_input)


def _with_auto_map(lm: Path, tmp_path: Path, file: str, auto_map: dict) -> Path:
    folder = tmp_path / "folder"
    shutil.copytree(lm, folder)
    (folder / "evil.py").write_text(PAYLOAD)
    path = folder / file
    content = json.loads(path.read_text())
    path.write_text(json.dumps({**content, "auto_map": auto_map}))
    return folder


def test_a_model_folder_whose_config_maps_to_its_own_code_is_refused(lm, tmp_path):
    auto_map = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    folder = _with_auto_map(lm, tmp_path, "config.json", auto_map)
    with pytest.raises(ParamsError) as refused:
        load_hf_model({"path": str(folder)}, "causal-lm", text=True, num_labels=None)
    message = str(refused.value)
    assert "\n" not in message and f"{folder / 'config.json'} has an auto_map" in message
    assert "train.model_options.path" in message and not (folder / "PAYLOAD_RAN").exists()


def test_a_tokenizer_folder_whose_config_maps_to_its_own_code_is_refused(lm, tmp_path):
    folder = _with_auto_map(
        lm, tmp_path, "tokenizer_config.json", {"AutoTokenizer": [None, "evil.EvilTokenizer"]}
    )
    with pytest.raises(ParamsError) as refused:
        load_tokenizer(str(folder))
    message = str(refused.value)
    assert "\n" not in message and f"{folder / 'tokenizer_config.json'} has an auto_map" in message
    assert "data.tokenizer" in message and not (folder / "PAYLOAD_RAN").exists()


def test_an_inline_config_with_an_auto_map_is_refused():
    config = {
        "model_type": "gpt2",
        "n_layer": 1,
        "auto_map": {"AutoModelForCausalLM": "evil.EvilModel"},
    }
    with pytest.raises(ParamsError, match="train.model_options.config is invalid: auto_map"):
        load_hf_model({"config": config, "init": "random"}, "causal-lm", text=True, num_labels=None)


def test_every_transformers_load_passes_trust_remote_code_false():
    import ast

    root = Path(__file__).resolve().parents[2] / "lib" / "dpledger"
    calls = [
        (path.name, node)
        for path in root.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("from_pretrained", "from_config")
        # peft's PeftModel.from_pretrained wraps a model object already built (and checked) here; it
        # reads adapter_config.json and weights, and has no auto_map through which code could run
        and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "PeftModel")
    ]
    assert len(calls) >= 4
    unguarded = [
        (name, node.lineno)
        for name, node in calls
        if not any(
            k.arg == "trust_remote_code"
            and (
                (isinstance(k.value, ast.Constant) and k.value.value is False)
                or (isinstance(k.value, ast.Name) and k.value.id == "TRUST_REMOTE_CODE")
            )
            for k in node.keywords
        )
    ]
    assert unguarded == []


def test_an_ordinary_folder_still_loads(lm):
    assert load_tokenizer(str(lm)) is not None
    assert load_hf_model({"path": str(lm)}, "causal-lm", text=True, num_labels=None).training
