"""The prepared GPU validation (benchmarks/gpu/, issue 30) runs end to end on the CPU in its dry-run
mode (the same steps, tiny sizes), so it cannot rot between the rare runs on a GPU machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STEPS = ("exactness", "bench", "pipeline", "montecarlo", "distributed")


def test_the_driver_parses_and_every_step_is_a_subcommand():
    subprocess.run(["bash", "-n", str(REPO / "benchmarks/gpu/run.sh")], check=True)
    usage = subprocess.run(
        [sys.executable, str(REPO / "benchmarks/gpu/validate.py"), "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert all(step in usage for step in STEPS)


@pytest.mark.slow
def test_the_dry_run_writes_every_result_and_they_pass(tmp_path):
    """About 2 CPU-minutes, most of it the start-up of some 16 Python processes (each bench method
    alone, the stages, torchrun); the steps themselves run on two examples, tiny models and no
    untimed warm-up."""
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        [str(REPO / "benchmarks/gpu/run.sh"), str(tmp_path), "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    log = (tmp_path / "run.log").read_text()
    assert done.returncode == 0, log[-3000:]
    results = {step: json.loads((tmp_path / f"{step}.json").read_text()) for step in STEPS}
    assert len(list(tmp_path.iterdir())) <= 8
    exactness = results["exactness"]
    assert (
        exactness["float64_exact"]
        and exactness["clipped_within_r"]
        and exactness["noise"]["replayable"]
    )
    bench = results["bench"]
    assert all(
        f"{m}_{p}" in bench for m in ("nonprivate", "bk", "opacus") for p in ("fp32", "bf16")
    )
    pipeline = results["pipeline"]
    assert pipeline["model_pt_on_cpu"] and pipeline["model_max_abs_difference"] == 0.0
    assert (
        pipeline["killed_mid_run"]
        and pipeline["resumed_from_step"] < pipeline["train_metrics"]["steps_done"]
    )
    assert results["montecarlo"]["agree_within_stderr"]
    assert (
        results["distributed"]["as_many_ranks_as_gpus"][
            "model_max_abs_difference_vs_single_process"
        ]
        == 0.0
    )
