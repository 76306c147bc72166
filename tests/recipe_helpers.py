"""The README's recipes (no tests here): a YAML block between ``<!-- recipe:NAME -->`` markers,
merged into the repo's params.yaml as the README says, then run stage by stage as ``dvc repro``
would."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from dpledger.pipeline import run_stage

REPO = Path(__file__).resolve().parents[1]


def readme_recipe(name: str) -> dict:
    """The YAML block of the README between ``<!-- recipe:NAME -->`` and its closing marker."""
    text = (REPO / "README.md").read_text()
    pattern = rf"<!-- recipe:{name} -->\s*```yaml\n(.*?)```\s*<!-- /recipe:{name} -->"
    block = re.search(pattern, text, re.S)
    assert block, f"README.md lost its recipe:{name} block"
    return yaml.safe_load(block.group(1))


def merged(base: dict, override: dict) -> dict:
    """``base`` with ``override``'s keys replaced, nested mappings merged key by key."""
    both = {**base, **override}
    return {
        k: merged(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
        for k, v in both.items()
    }


def run_recipe(root: Path, recipe: dict, stages=("calibrate", "schedule", "train")) -> dict:
    """Merge ``recipe`` into the repo's params.yaml at ``root``, run ``stages`` there in order (the
    data the recipe names must exist under ``root``) and return the train stage's metrics."""
    params = merged(yaml.safe_load((REPO / "params.yaml").read_text()), recipe)
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    for stage in stages:
        run_stage(stage, root / "params.yaml", root)
    return json.loads((root / "metrics/train.json").read_text())
