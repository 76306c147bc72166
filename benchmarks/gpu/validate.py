"""The GPU validation of issue 30, one step per sub-command; ``run.sh`` runs them all in one go.

Each step writes one JSON file into the output folder (``--out``), with the device and torch version
beside every number. ``--dry-run``: the same steps on the CPU with tiny sizes (a CI test runs it, so
it cannot rot).

- ``exactness``: the BK clipped sum against the naive per-example loop in float64 on the device, for
  every architecture of tests/engine/test_engine_hf_models.py; GPT-2 in float32 with TF32 off and
  on, and under bf16 autocast, against a CPU float64 reference; the largest clipped contribution
  ‖C_i g_i‖/R under TF32 and bf16 (must be ≤ 1 + 1e-5); the device's noise (same step twice equal,
moments).
- ``bench --method M --precision P``: GPT-2 small (12 × 768, T 256, B 16) one training step,
  non-private, BK or Opacus (ghost clipping), in fp32 or bf16: time per step (synchronized, after
  warm-up) and peak memory; run.sh starts a fresh process per method so peak memory is the method's
  own.
- ``pipeline``: calibrate, schedule, train (train.device cuda) and verify run as ``python -m
  stages.NAME``; the train stage killed (SIGKILL) after two checkpoints and resumed, its model
  against an uninterrupted run.
- ``montecarlo``: δ̂ of the same pair, σ and seed on the CPU and on the device (must agree to
  float32 rounding), and the time of each.
- ``distributed``: the train stage under torchrun with as many ranks as GPUs, and the one-line
  refusal of one rank more than there are GPUs.
- ``defaults``: the default params.yaml (``train.device: auto``, self-check on, one-run audit on)
  through calibrate, schedule and train, then the LM example (its corpus and tiny GPT-2 written by
  ``stages.prepare``) through the same stages, on the device.

Every step ends with named checks (``checks`` in its JSON, ``failed`` listing those that did not
hold) and exits 1 when one fails, so run.sh counts it: a step passes only by looking. ``--inject``
plants the fault each step exists to catch (tests/e2e/test_gpu_validation.py proves every step fails
with it): a clip factor 1 % too large (exactness), a non-finite loss (bench), a train stage that
exits 1 (pipeline, distributed, defaults), a device estimate off by 1 (montecarlo).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [
    str(REPO / "lib"),
    str(REPO),
    str(REPO / "tests"),
    str(REPO / "tests" / "engine"),
    str(Path(__file__).parent),
]

from gpt2_bench import bench  # noqa: E402, F401  (a step, called by name)
from gpu_common import (  # noqa: E402  (after the path)
    FAILING_STAGE,
    about,
    device_for,
    finish,
    stage,
    stage_env,
    sync,
)

# ---- exactness
# ---------------------------------------------------------------------------------------------


def _clipped_norm_ratio(model, loss_fn, inputs, targets, clip_norm, context) -> float:
    """max_i ‖C_i g_i‖ / R, one example at a time (B = 1: the clipped sum is the example's
    contribution)."""
    from dpledger.engine import BKEngine

    worst = 0.0
    for i in range(inputs.shape[0]):
        engine = BKEngine(model, None, clip_norm=clip_norm, noise_multiplier=0.0, normalizer=1.0)
        with context():
            losses = loss_fn(model(inputs[i : i + 1]).float(), targets[i : i + 1])
        engine.backward(losses)
        engine.step()
        norm = torch.sqrt(sum(p.grad.double().square().sum() for p in engine.params))
        engine.detach()
        worst = max(worst, float(norm) / clip_norm)
    return worst


def exactness(args) -> None:
    import contextlib

    import test_engine_hf_models as hf

    from dpledger.engine import BKEngine
    from dpledger.engine.noise import NoiseSource
    from helpers.engine_checks import compare, naive_clipped_sum, relative_error

    device = device_for(args.dry_run)
    if args.inject:  # every clip factor 1 % too large: neither exact nor within R
        from dpledger.engine import noisy_sum

        factors = noisy_sum.factors
        noisy_sum.factors = lambda *a, **k: {
            key: 1.01 * value for key, value in factors(*a, **k).items()
        }
    result = {"float64_vs_naive": {}}
    names = ("gpt2",) if args.dry_run else tuple(hf.MODELS)
    examples = 2 if args.dry_run else None  # dry run: the same paths on two examples (a batch)
    for name in names:
        make = hf.MODELS[name]
        model, loss_fn, inputs, targets = make()
        inputs, targets = inputs[:examples], targets[:examples]
        started = time.perf_counter()
        error, _ = compare(model.to(device), loss_fn, inputs.to(device), targets.to(device))
        result["float64_vs_naive"][name] = {
            "relative_error": error,
            "seconds": time.perf_counter() - started,
        }
    worst = max(v["relative_error"] for v in result["float64_vs_naive"].values())
    result["float64_max_relative_error"] = worst
    result["float64_exact"] = worst < 1e-10

    model, loss_fn, inputs, targets = hf.MODELS["gpt2"]()
    inputs, targets = inputs[:examples], targets[:examples]
    reference = copy.deepcopy(model).double()
    clip_norm = 0.5
    expected = naive_clipped_sum(reference, loss_fn, inputs, targets, clip_norm)
    leaves = [torch.backends.cuda.matmul, torch.backends.cudnn.conv]
    saved = [leaf.fp32_precision for leaf in leaves]
    settings = {
        "fp32": (contextlib.nullcontext, "ieee"),
        "tf32": (contextlib.nullcontext, "tf32"),
        "bf16_autocast": (lambda: torch.autocast(device.type, dtype=torch.bfloat16), "ieee"),
    }
    x, y = inputs.to(device), targets.to(device)
    for label, (context, precision) in settings.items():
        for leaf in leaves:
            leaf.fp32_precision = precision
        try:
            on_device = copy.deepcopy(model).float().to(device)
            engine = BKEngine(
                on_device, None, clip_norm=clip_norm, noise_multiplier=0.0, normalizer=1.0
            )
            with context():
                logits = on_device(x)
            engine.private_step(loss_fn(logits.float(), y))
            got = {n: p.grad.double().cpu() for n, p in zip(engine.parameter_names, engine.params)}
            engine.detach()
            ratio = _clipped_norm_ratio(
                copy.deepcopy(model).float().to(device), loss_fn, x, y, 1e-3, context
            )
        finally:
            for leaf, value in zip(leaves, saved):
                leaf.fp32_precision = value
        result[label] = {
            "relative_error_vs_cpu_float64": relative_error(got, expected),
            "max_clipped_over_r": ratio,
        }
    result["clipped_within_r"] = all(result[k]["max_clipped_over_r"] <= 1 + 1e-5 for k in settings)

    numel = 1 << (16 if args.dry_run else 25)
    source = NoiseSource(numel, seed=3, device=device, dtype=torch.float32)
    first, again = source.independent(5).clone(), source.independent(5)
    started = time.perf_counter()
    for step in range(3):
        source.independent(step)
    sync(device)
    result["noise"] = {
        "numel": numel,
        "replayable": bool(torch.equal(first, again)),
        "mean": float(first.double().mean()),
        "std": float(first.double().std()),
        "max_abs": float(first.abs().max()),
        "seconds_per_draw": (time.perf_counter() - started) / 3,
    }
    tolerance = 6 / math.sqrt(numel)  # six standard errors of the mean and of the std
    checks = {
        "float64_exact": result["float64_exact"],
        "clipped_within_r": result["clipped_within_r"],
        "noise_replayable": result["noise"]["replayable"],
        "noise_standard_normal": abs(result["noise"]["mean"]) < tolerance
        and abs(result["noise"]["std"] - 1) < tolerance,
    }
    finish(args.out, "exactness", {**about(device), **result}, checks)


# ---- pipeline
# -----------------------------------------------------------------------------------------------


KILL_AFTER_TWO_CHECKPOINTS = """
import os, signal, sys
from pathlib import Path
from dpledger.pipeline import run_stage, train
saved = train.save_checkpoint
count = [0]
def save_then_die(*args, **kwargs):
    saved(*args, **kwargs)
    count[0] += 1
    if count[0] == 2:
        os.kill(os.getpid(), signal.SIGKILL)
train.save_checkpoint = save_then_die
root = Path(sys.argv[1])
run_stage("train", root / "params.yaml", root)
"""
"""The train stage, SIGKILLed right after its second checkpoint (deterministic, unlike a timed
kill)."""


def pipeline(args) -> None:
    import yaml

    device = device_for(args.dry_run)
    work = Path(args.work)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["batching"] = {
        "batch_size": 256 if args.dry_run else 64,
        "epochs": 1,
    }
    if args.dry_run:
        params["calibrate"].update(pld_discretization=1e-2, curve_points=3)
    params["train"].update(device=device.type, checkpoint_every=1)
    params["calibrate"].update(group_sizes=[1], table_discretization=0.01)
    env = stage_env(compared=True)
    result, seconds = {}, {}
    roots = {}
    for label in ("straight", "killed"):
        root = roots[label] = work / label
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        (root / "params.yaml").write_text(yaml.safe_dump(params))
    for name in ("calibrate", "schedule"):
        seconds[name] = stage(name, roots["straight"] / "params.yaml", roots["straight"], env)
    shutil.copytree(roots["straight"] / "artifacts", roots["killed"] / "artifacts")
    seconds["train"] = stage(
        "train", roots["straight"] / "params.yaml", roots["straight"], env, args.inject
    )
    killed = subprocess.run(
        [sys.executable, "-c", KILL_AFTER_TWO_CHECKPOINTS, str(roots["killed"])], cwd=REPO, env=env
    )
    result["killed_returncode"] = killed.returncode
    seconds["resumed_train"] = stage("train", roots["killed"] / "params.yaml", roots["killed"], env)
    metrics = {k: json.loads((roots[k] / "metrics/train.json").read_text()) for k in roots}
    models = {k: torch.load(roots[k] / "artifacts/train/model.pt") for k in roots}
    result["resumed_from_step"] = metrics["killed"].get("resumed_from_step")
    result["killed_mid_run"] = (
        killed.returncode == -signal.SIGKILL and result["resumed_from_step"] == 2
    )
    result["model_max_abs_difference"] = max(
        float((models["straight"][n].double() - models["killed"][n].double()).abs().max())
        for n in models["straight"]
    )
    result["model_pt_on_cpu"] = all(
        t.device.type == "cpu" for m in models.values() for t in m.values()
    )
    seconds["verify"] = stage("verify", roots["straight"] / "params.yaml", roots["straight"], env)
    result["train_metrics"] = {
        k: metrics["straight"].get(k)
        for k in ("steps_done", "throughput_examples_per_s", "wall_time_s")
    }
    result["seconds"] = seconds
    checks = {
        "killed_mid_run": result["killed_mid_run"],
        "resumed_model_identical": result["model_max_abs_difference"] == 0.0,
        "model_pt_on_cpu": result["model_pt_on_cpu"],
        "resumed_before_the_end": (result["resumed_from_step"] or 0)
        < (result["train_metrics"]["steps_done"] or 0),
    }
    finish(args.out, "pipeline", {**about(device), **result}, checks)


# ---- Monte Carlo
# ------------------------------------------------------------------------------------------


def montecarlo(args) -> None:
    import numpy as np

    from dpledger.accounting import montecarlo as mc
    from dpledger.mechanisms import banded_params, coefficients

    device = device_for(args.dry_run)
    bins, steps = (12, 48) if args.dry_run else (64, 1024)
    samples = (1 << 14) if args.dry_run else (1 << 21)
    pair = mc.fixed_bins_pair(coefficients("banded", banded_params(4), steps), bins, steps)
    result = {"bins": bins, "steps": steps, "samples": samples}
    # the device's own draws (a second seed: on the dry run's CPU the same seed would repeat them)
    for where, on, seed in (("cpu", torch.device("cpu"), 4), ("device", device, 5)):
        started = time.perf_counter()
        estimate = mc.estimate_delta(pair, 1.0, 1.0, samples, seed=seed, device=on)
        result[where] = {
            "delta": estimate.delta,
            "stderr": estimate.stderr,
            "seconds": time.perf_counter() - started,
        }
    if args.inject:  # a device estimate that is off
        result["device"]["delta"] += 1.0
    difference = abs(result["cpu"]["delta"] - result["device"]["delta"])
    result["agree_within_stderr"] = bool(
        difference <= 4 * math.hypot(result["cpu"]["stderr"], result["device"]["stderr"])
    )
    result["difference"] = float(np.float64(difference))
    checks = {"cpu_and_device_agree": result["agree_within_stderr"]}
    finish(args.out, "montecarlo", {**about(device), **result}, checks)


# ---- distributed
# ------------------------------------------------------------------------------------------


def distributed(args) -> None:
    device = device_for(args.dry_run)
    ranks = torch.cuda.device_count() if device.type == "cuda" else 1
    env = stage_env(compared=True)
    work = Path(args.work)
    straight, root = work / "straight", work / "torchrun"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for part in ("calibration", "schedule"):
        shutil.copytree(straight / "artifacts" / part, root / "artifacts" / part)
    shutil.copy(straight / "params.yaml", root / "params.yaml")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    stage = ["-m", "stages.train", "--params", str(root / "params.yaml"), "--root", str(root)]
    if args.inject:  # torchrun runs a train stage that fails
        (root / "failing.py").write_text(FAILING_STAGE)
        stage = [str(root / "failing.py")]
    result = {"gpus": torch.cuda.device_count()}
    runs = [("as_many_ranks_as_gpus", ranks)] + (
        [("one_rank_more", ranks + 1)] if device.type == "cuda" else []
    )
    for label, processes in runs:
        started = time.perf_counter()
        command = [*torchrun, f"--nproc-per-node={processes}", *stage]
        done = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240
        )
        result[label] = {
            "processes": processes,
            "returncode": done.returncode,
            "error_lines": [line for line in done.stderr.splitlines() if line.startswith("error:")][
                :4
            ],
            "stderr_tail": done.stderr[-400:],
            "seconds": time.perf_counter() - started,
        }
        if label == "as_many_ranks_as_gpus" and done.returncode == 0:
            models = [torch.load(r / "artifacts/train/model.pt") for r in (straight, root)]
            result[label]["model_max_abs_difference_vs_single_process"] = max(
                float((models[0][n].double() - models[1][n].double()).abs().max())
                for n in models[0]
            )
    same = result["as_many_ranks_as_gpus"]
    checks = {
        "ranks_trained": same["returncode"] == 0,
        "same_model_as_one_process": same.get("model_max_abs_difference_vs_single_process") == 0.0,
    }
    if "one_rank_more" in result:
        more = result["one_rank_more"]
        checks["one_rank_more_refused_in_one_line"] = more["returncode"] != 0 and any(
            "local rank" in line for line in more["error_lines"]
        )
    finish(args.out, "distributed", {**about(device), **result}, checks)


# ---- defaults
# ---------------------------------------------------------------------------------------------


def _run_stages(root: Path, params: dict, env: dict, inject: bool) -> dict:
    """calibrate, schedule and train at ``root`` with ``params``; the train stage's metrics."""
    import yaml

    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    for name in ("calibrate", "schedule", "train"):
        stage(name, root / "params.yaml", root, env, inject and name == "train")
    return json.loads((root / "metrics/train.json").read_text())


def defaults(args) -> None:
    """The default params (device auto, self-check and one-run audit on), then the LM example, each
    through calibrate, schedule and train on the device; the dry run makes both small."""
    import yaml

    device = device_for(args.dry_run)
    work, env = Path(args.work), stage_env()
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    if args.dry_run:
        params["batching"] = {"batch_size": 256, "epochs": 1}
        params["calibrate"].update(pld_discretization=1e-2, curve_points=3, group_sizes=[1])
    seconds, metrics = {}, {}
    started = time.perf_counter()
    metrics["default"] = _run_stages(work / "defaults", params, env, args.inject)
    seconds["default"] = time.perf_counter() - started
    data = work / "lm-data"
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "stages.prepare", "--out", str(data)], cwd=REPO, env=env, check=True
    )
    lm = yaml.safe_load((REPO / "examples/lm/params.yaml").read_text())
    lm["data"].update(path=str(data / "corpus.jsonl"), tokenizer=str(data / "model"))
    lm["train"]["model_options"]["path"] = str(data / "model")
    lm["batching"]["epochs"] = 1  # the path on the device, not the example's perplexity
    if args.dry_run:
        lm["calibrate"].update(pld_discretization=1e-2, curve_points=3, group_sizes=[1])
    metrics["lm"] = _run_stages(work / "lm", lm, env, False)
    seconds["lm"] = time.perf_counter() - started
    result = {"metrics": metrics, "seconds": seconds}
    checks = {
        f"{run}_{check}": held
        for run, m in metrics.items()
        for check, held in {
            "self_check_passed": bool(m.get("self_check_ran") and m.get("self_check_passed")),
            "all_steps_done": m.get("steps_done") == m.get("steps_total"),
            "finite": not m.get("loss_diverged", True),
        }.items()
    }
    finish(args.out, "defaults", {**about(device), **result}, checks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "step", choices=["exactness", "bench", "pipeline", "montecarlo", "distributed", "defaults"]
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", default="/tmp/dpledger-gpu-work")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument(
        "--inject", action="store_true", help="plant the fault the step must catch (it must fail)"
    )
    parser.add_argument("--method", choices=["nonprivate", "bk", "opacus"], default="bk")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="bench: also profile two steps at the largest batch (OUT/profile_M_P.txt)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    globals()[args.step](args)


if __name__ == "__main__":
    main()
