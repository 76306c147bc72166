"""The LM example's model (issue 29): at the example's width its initial weights have standard
deviation 1/√width, not transformers' 0.02 (sized for width 768), with which the example learned
nothing under DP."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM

from dpledger.data.example_lm import EXAMPLE, WIDTH_KEYS, write_example


@pytest.mark.parametrize("architecture", sorted(WIDTH_KEYS))
def test_a_chosen_width_initialises_weights_at_one_over_its_square_root(tmp_path, architecture):
    width = EXAMPLE["width"]
    write_example(
        tmp_path / "lm", architecture=architecture, max_chars=3000, vocab_size=280, width=width
    )
    config = json.loads((tmp_path / "lm/model/config.json").read_text())
    assert config[WIDTH_KEYS[architecture]] == width
    assert config["initializer_range"] == pytest.approx(width**-0.5)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "lm/model", local_files_only=True)
    embedding = model.get_input_embeddings().weight
    assert embedding.shape[1] == width
    # measured, not the config's word
    assert float(embedding.std()) == pytest.approx(width**-0.5, rel=0.1)


def test_without_a_width_the_architecture_is_unchanged(tmp_path):
    write_example(tmp_path / "lm", max_chars=3000, vocab_size=280)
    config = json.loads((tmp_path / "lm/model/config.json").read_text())
    assert config["n_embd"] == 64 and config["initializer_range"] == 0.02
