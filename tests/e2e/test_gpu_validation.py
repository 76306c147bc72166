"""The prepared GPU validation (benchmarks/gpu/, issue 30) runs end to end on the CPU in its dry-run
mode (the same steps, tiny sizes), so it cannot rot between the rare runs on a GPU machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STEPS = ("exactness", "bench", "pipeline", "montecarlo", "distributed", "defaults")


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
    # as on the GPU machine: no noise key in the environment, so every run draws a fresh one
    env = {k: v for k, v in os.environ.items() if k != "DPLEDGER_NOISE_KEY"}
    env["PYTHON"] = sys.executable
    done = subprocess.run(
        [str(REPO / "benchmarks/gpu/run.sh"), str(tmp_path), "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,  # a loaded 2-core CI machine: about 30 minutes with the defaults step
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
        set(bench[f"{m}_{p}"]) == {"B2", "B4"}
        for m in ("nonprivate", "bk", "opacus")
        for p in ("fp32", "bf16")
    )
    assert all(not results[step]["failed"] and results[step]["checks"] for step in STEPS)
    defaults = results["defaults"]["metrics"]
    assert defaults["default"]["self_check_passed"] and defaults["lm"]["self_check_passed"]
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


def _validate(step: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO / "benchmarks/gpu/validate.py"), step, "--dry-run"]
    command += ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), *extra]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1200)


INJECTED = {
    "exactness": ("float64_exact", "clipped_within_r"),
    "bench": ("bk_fp32_B2_finite",),
    "montecarlo": ("cpu_and_device_agree",),
    "distributed": ("ranks_trained",),
}


@pytest.mark.slow
@pytest.mark.parametrize("step", [*INJECTED, "pipeline", "defaults"])
def test_every_step_fails_when_what_it_checks_fails(step, tmp_path):
    """``--inject`` plants the fault the step exists to catch; the step must exit non-zero, and
    (where it gets that far) its JSON must name the check that caught it. The distributed step
    runs on a project the train helpers write (calibration and schedule; its injected train stage
    fails under torchrun, the case that once exited 0)."""
    extra = ["--method", "bk"] if step == "bench" else []
    if step == "distributed":
        from helpers.train_project import make_project

        make_project(tmp_path / "work/straight", epochs=1)
    done = _validate(step, tmp_path, *extra, "--inject")
    assert done.returncode != 0, done.stdout[-2000:] + done.stderr[-2000:]
    if step in INJECTED:
        result = json.loads((tmp_path / "out" / f"{step}.json").read_text())
        assert set(INJECTED[step]) <= set(result["failed"]), result["failed"]
    else:  # the injected train stage's own line
        assert "injected: this stage fails" in done.stderr


@pytest.mark.slow
def test_run_sh_counts_a_failing_step(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "STEPS": "montecarlo"}
    run = [str(REPO / "benchmarks/gpu/run.sh"), str(tmp_path / "good"), "--dry-run"]
    assert subprocess.run(run, env=env, capture_output=True, timeout=900).returncode == 0
    run[1] = str(tmp_path / "bad")
    env["INJECT"] = "montecarlo"
    assert subprocess.run(run, env=env, capture_output=True, timeout=900).returncode == 1
    assert "=== status 1" in (tmp_path / "bad/run.log").read_text()
