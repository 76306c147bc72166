"""Issue 27 defect 12: a fresh clone pulls from a DVC remote although the bundled LM example's stage
was never run (its output is regenerated, not cached, so it has nothing to check out)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(*command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_fresh_clone_pulls_with_the_lm_example_never_run(tmp_path):
    dvc = str(Path(sys.executable).with_name("dvc"))
    origin = tmp_path / "origin"
    (origin / "examples/lm").mkdir(parents=True)
    shutil.copy(REPO / "examples/lm/dvc.yaml", origin / "examples/lm/dvc.yaml")
    (origin / "dvc.yaml").write_text(
        "stages:\n  main:\n    cmd: echo hi > out.txt\n    outs:\n      - out.txt\n"
    )
    for command in (
        ["git", "init", "-q"],
        ["git", "config", "user.email", "t@t"],
        ["git", "config", "user.name", "t"],
        [dvc, "init", "-q"],
        [dvc, "repro", "-q", "dvc.yaml"],
        [dvc, "remote", "add", "-q", "-d", "local", str(tmp_path / "remote")],
        ["git", "add", "-A"],
        ["git", "commit", "-qm", "init"],
        [dvc, "push", "-q"],
    ):
        assert _run(*command, cwd=origin).returncode == 0, command
    assert (
        _run("git", "clone", "-q", str(origin), str(tmp_path / "clone"), cwd=tmp_path).returncode
        == 0
    )
    pulled = _run(dvc, "pull", cwd=tmp_path / "clone")
    assert pulled.returncode == 0, pulled.stderr
    assert (tmp_path / "clone/out.txt").read_text() == "hi\n"
