"""The committed outputs are the code's: in a clean copy of the tracked files, `dvc status` shows no
stage whose code, data or params differ from dvc.lock, and no git-tracked output (metrics, plots,
the report) that differs from what dvc.lock recorded. `make refresh` reruns and commits them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNCACHED = ("metrics/", "plots/", "reports/")
"""Outputs kept in git (cache: false): they are in the copy, so they must match dvc.lock."""


def _dvc() -> str:
    found = shutil.which("dvc", path=os.path.dirname(sys.executable)) or shutil.which("dvc")
    if found is None:
        pytest.skip("dvc is not installed")
    return found


def stale_entries(status: dict) -> list[str]:
    """`dvc status --json` entries that say HEAD's outputs are not HEAD's: a changed dep or param,
    or a modified git-tracked output. Cached outputs absent from a fresh clone (no remote here) are
    not staleness."""
    stale = []
    for stage, entries in status.items():
        for entry in entries if isinstance(entries, list) else [entries]:
            if not isinstance(entry, dict):
                stale.append(f"{stage}: {entry}")
                continue
            for kind, changes in entry.items():
                for path, state in (changes or {}).items():
                    if kind == "changed outs" and not path.startswith(UNCACHED):
                        continue
                    if kind == "changed deps" and path.startswith("artifacts/"):
                        continue  # an upstream stage's cached output: not in a fresh clone
                    stale.append(f"{stage}: {kind} {path} ({state})")
    return stale


def test_stale_entries_ignore_missing_cache_only():
    status = {
        "train": [
            {"changed deps": {"artifacts/schedule": "deleted", "lib/dpledger/engine": "modified"}},
            {"changed outs": {"artifacts/model": "not in cache", "metrics/train.json": "modified"}},
        ],
        "report": ["always changed"],
    }
    assert stale_entries(status) == [
        "train: changed deps lib/dpledger/engine (modified)",
        "train: changed outs metrics/train.json (modified)",
        "report: always changed",
    ]


def test_a_clean_copy_has_the_outputs_of_its_code(tmp_path):
    """A fresh clone listed changed code deps for every stage: its metrics and report were made
    before the last code changes. Run `make refresh` after the last code change."""
    dvc = _dvc()
    files = subprocess.run(
        ["git", "ls-files", "--cached", "-z"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    for name in filter(None, files):
        source = REPO / name
        if source.is_file():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tmp_path / name)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    result = subprocess.run(
        [dvc, "status", "--json"], cwd=tmp_path, capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr
    stale = stale_entries(json.loads(result.stdout or "{}"))
    assert stale == [], "the committed outputs are not HEAD's (run `make refresh`): " + "; ".join(
        stale[:8]
    )
