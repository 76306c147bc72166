"""The text-classification recipe of docs/recipes.md really learns. Its params block (between
the ``recipe:sentiment`` markers) on its generated sentiment set, through calibrate, schedule and
train at ε = 8, beats the majority baseline by at least 20 points."""

from __future__ import annotations

import pytest

from dpledger.data.example_sentiment import write_example
from helpers.recipe_helpers import recipe_block, run_recipe


def test_the_recipe_is_valid_params_at_epsilon_8():
    recipe = recipe_block("sentiment")
    assert recipe["calibrate"]["epsilon"] == 8
    assert recipe["data"]["path"].startswith("data/") and recipe["train"]["model"] == "hf"


@pytest.mark.slow
def test_readme_sentiment_recipe_beats_its_majority_baseline_by_20_points_at_epsilon_8(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    write_example("data/sentiment")  # the documented generation command
    metrics = run_recipe(tmp_path, recipe_block("sentiment"))
    assert metrics["epsilon_spent"] <= 8.0 + 1e-9
    assert metrics["test_accuracy"] >= metrics["baseline_accuracy"] + 0.20, metrics
    assert metrics["predicted_classes"] == 2
