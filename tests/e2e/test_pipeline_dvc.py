"""The DVC pipeline end to end in a temporary copy: a change reruns exactly the stages it
affects."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
STAGES = {"calibrate", "schedule", "train", "verify", "audit", "report"}

pytestmark = pytest.mark.slow


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result


def _stages_run(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))


def _set_params(project: Path, changes: dict[str, object]) -> None:
    path = project / "params.yaml"
    params = yaml.safe_load(path.read_text())
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = params
        for part in parents:
            node = node[part]
        node[leaf] = value
    path.write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A git+DVC copy of the working tree with small settings, after one full `dvc repro`."""
    if (
        shutil.which("dvc", path=os.path.dirname(sys.executable)) is None
        and shutil.which("dvc") is None
    ):
        pytest.skip("dvc is not installed")
    root = tmp_path_factory.mktemp("pipeline") / "project"
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, files):
        source = REPO / name
        if source.is_file() and not name.startswith(
            ("artifacts/", "metrics/", "plots/", "reports/")
        ):
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(root / "lib")
    env["DVC_NO_ANALYTICS"] = "1"
    _set_params(project=root, changes=SMALL_RUN)
    for command in (["git", "init", "-q"], ["git", "add", "-A"]):
        _run(command, root, env)
    _run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"], root, env)
    first = _run(["dvc", "repro"], root, env)
    assert _stages_run(first.stdout) == STAGES
    return root, env


# Keep the end-to-end run short; the defaults are exercised by `make repro`. The tests here check
# which stages DVC reruns, not what a stage computes. Calibrate runs three times and was most of the
# time: the group-level table (no test here reads it; k = 2 alone took a third of a run) and the
# PLD at 1e-4 (1e-3 halves the rest). The other stages run at the sizes of
# tests/pipeline/test_pipeline_declared.py's small run (2 % of the audit's games, 200 canaries).
SMALL_RUN: dict[str, object] = {
    "batching.epochs": 1,
    "batching.batch_size": 128,
    "calibrate.group_sizes": [1],
    "calibrate.pld_discretization": 1e-3,
    "calibrate.curve_points": 4,
    "audit.observations": 20_000,
    "audit.pattern_observations": 2_000,
    "audit.one_run.canaries": 200,
}


def test_full_run_writes_the_report(project):
    root, _ = project
    assert (root / "reports" / "report.md").stat().st_size > 0
    for stage in STAGES - {"report"}:
        assert (root / "metrics" / f"{stage}.json").exists()


def test_second_repro_runs_nothing(project):
    root, env = project
    started = time.perf_counter()
    again = _run(["dvc", "repro"], root, env)
    elapsed = time.perf_counter() - started
    assert _stages_run(again.stdout) == set()
    print(f"no-change dvc repro took {elapsed:.1f} s")


def test_new_epsilon_reruns_only_what_depends_on_it(project):
    root, env = project
    _set_params(root, {"calibrate.epsilon": 2.0})
    rerun = _run(["dvc", "repro"], root, env)
    assert _stages_run(rerun.stdout) == {"calibrate", "train", "audit", "report"}


def test_new_sampler_reruns_calibrate_schedule_and_downstream(project):
    root, env = project
    _set_params(root, {"calibrate.sampler": "fixed", "schedule.sampler": "fixed"})
    rerun = _run(["dvc", "repro"], root, env)
    assert _stages_run(rerun.stdout) == {"calibrate", "schedule", "train", "audit", "report"}
