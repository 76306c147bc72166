"""Issue 29 item 2: the README's text-classification recipe really learns. Its params block (between the
``recipe:sentiment`` markers) on its generated sentiment set, through calibrate, schedule and train at
ε = 8, beats the majority baseline by at least 20 points."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from dpledger.data.example_sentiment import write_example
from dpledger.pipeline import run_stage

REPO = Path(__file__).resolve().parents[1]


def readme_recipe() -> dict:
    """The YAML block of the README between ``<!-- recipe:sentiment -->`` and its closing marker."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"<!-- recipe:sentiment -->\s*```yaml\n(.*?)```\s*<!-- /recipe:sentiment -->", text, re.S)
    assert block, "README.md lost its recipe:sentiment block"
    return yaml.safe_load(block.group(1))


def merged(base: dict, override: dict) -> dict:
    """``base`` with ``override``'s keys replaced, nested mappings merged key by key."""
    both = {**base, **override}
    return {
        k: merged(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v for k, v in both.items()
    }


def test_the_recipe_is_valid_params_at_epsilon_8():
    recipe = readme_recipe()
    assert recipe["calibrate"]["epsilon"] == 8
    assert recipe["data"]["path"].startswith("data/") and recipe["train"]["model"] == "hf"


@pytest.mark.slow
def test_readme_sentiment_recipe_beats_its_majority_baseline_by_20_points_at_epsilon_8(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_example("data/sentiment")  # the README's generation command
    params = merged(yaml.safe_load((REPO / "params.yaml").read_text()), readme_recipe())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    for stage in ("calibrate", "schedule", "train"):
        run_stage(stage, tmp_path / "params.yaml", tmp_path)
    metrics = json.loads((tmp_path / "metrics/train.json").read_text())
    assert metrics["epsilon_spent"] <= 8.0 + 1e-9
    assert metrics["test_accuracy"] >= metrics["baseline_accuracy"] + 0.20, metrics
    assert metrics["predicted_classes"] == 2
