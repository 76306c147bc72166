"""GPT-2 + LoRA: the offline LoRA recipe of docs/recipes.md (``recipe:lora``) fine-tunes a base
pretrained without privacy on PUBLIC text (pydoc's topics) with DP on a PRIVATE corpus
(standard-library docstrings) and beats the unigram baseline and the base it started from at ε =
8."""

from __future__ import annotations

import pytest

from helpers.recipe_helpers import recipe_block, run_recipe


def test_the_lora_recipe_is_valid_params_at_epsilon_8():
    recipe = recipe_block("lora")
    assert recipe["calibrate"]["epsilon"] == 8
    assert recipe["train"]["lora"]["rank"] > 0 and recipe["train"]["task"] == "causal-lm"
    assert recipe["data"]["path"].startswith("data/") and recipe["train"]["model_options"][
        "path"
    ].startswith("data/")


@pytest.mark.slow
def test_readme_lora_recipe_beats_the_unigram_baseline_and_its_public_base_at_epsilon_8(
    tmp_path, monkeypatch
):
    import torch
    from transformers import AutoModelForCausalLM

    from dpledger.data import load_data
    from dpledger.data.public_base import write_private_corpus, write_public_base
    from dpledger.models.select import task_for
    from dpledger.params import load_params

    monkeypatch.chdir(tmp_path)
    write_public_base("data/public-base")  # the documented generation commands
    write_private_corpus("data/private.jsonl")
    metrics = run_recipe(tmp_path, recipe_block("lora"))
    assert metrics["epsilon_spent"] <= 8.0 + 1e-9
    assert metrics["parameters_trainable"] < metrics["parameters_total"] / 4
    assert metrics["test_perplexity"] < 0.6 * metrics["baseline_perplexity_unigram"], metrics
    # the base, not fine-tuned, on the same test split
    params = load_params(tmp_path / "params.yaml")
    data = load_data(params.data, params.seed)
    base = AutoModelForCausalLM.from_pretrained("data/public-base/model")
    before = task_for("hf", "causal-lm", data).evaluate(
        base, torch.as_tensor(data.x_test), torch.as_tensor(data.y_test)
    )
    assert metrics["test_perplexity"] < 0.95 * before["perplexity"], (
        metrics["test_perplexity"],
        before,
    )
