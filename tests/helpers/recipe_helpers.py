"""The documented recipes (no tests here): a YAML block between ``<!-- recipe:NAME -->``
markers in the README or a page of docs/, merged into the repo's params.yaml as the page says,
then run stage by stage as ``dvc repro`` would."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from dpledger.pipeline import run_stage

REPO = Path(__file__).resolve().parents[2]


def documented_pages() -> list[Path]:
    """The README and every page of docs/: where a recipe block may live."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def recipe_block(name: str) -> dict:
    """The YAML block between ``<!-- recipe:NAME -->`` and its closing marker, from the one page
    that holds it: a block found on no page, or on two (two sources of truth), fails the test."""
    pattern = rf"<!-- recipe:{name} -->\s*```yaml\n(.*?)```\s*<!-- /recipe:{name} -->"
    found = [
        (page, block.group(1))
        for page in documented_pages()
        for block in re.finditer(pattern, page.read_text(), re.S)
    ]
    pages = [str(page.relative_to(REPO)) for page, _ in found]
    assert len(found) == 1, f"recipe:{name} must appear on exactly one page, found on {pages}"
    return yaml.safe_load(found[0][1])


def merged(base: dict, override: dict) -> dict:
    """``base`` with ``override``'s keys replaced, nested mappings merged key by key."""
    both = {**base, **override}
    return {
        k: merged(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
        for k, v in both.items()
    }


# The group-level ε table for k = 2, 4, 8 (params.yaml's group_sizes) was two thirds of calibrate's
# time on these recipes (q = 0.25 at ε = 8) and is no part of what a recipe test checks: σ, the
# training and its utility do not depend on it, and the accounting tests check the table. A recipe
# that sets its own group_sizes keeps them.
RECIPE_TEST_CALIBRATE = {"calibrate": {"group_sizes": [1]}}


def run_recipe(root: Path, recipe: dict, stages=("calibrate", "schedule", "train")) -> dict:
    """Merge ``recipe`` into the repo's params.yaml at ``root`` (with ``RECIPE_TEST_CALIBRATE``
    under it), run ``stages`` there in order (the data the recipe names must exist under ``root``)
    and return the train stage's metrics."""
    base = merged(yaml.safe_load((REPO / "params.yaml").read_text()), RECIPE_TEST_CALIBRATE)
    params = merged(base, recipe)
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    for stage in stages:
        run_stage(stage, root / "params.yaml", root)
    return json.loads((root / "metrics/train.json").read_text())
