"""The GPU validation of issue 30, one step per sub-command; ``run.sh`` runs them all in one go.

Each step writes one JSON file into the output folder (``--out``), with the device and torch version
beside every number. ``--dry-run``: the same steps on the CPU with tiny sizes (a CI test runs it, so
it cannot rot).

- ``exactness``: the BK clipped sum against the naive per-example loop in float64 on the device, for
  every architecture of tests/test_engine_hf_models.py; GPT-2 in float32 with TF32 off and on, and
  under bf16 autocast, against a CPU float64 reference; the largest clipped contribution ‖C_i g_i‖/R
  under TF32 and bf16 (must be ≤ 1 + 1e-5); the device's noise (same step twice equal, moments).
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
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "lib"), str(REPO), str(REPO / "tests")]


def _device(dry_run: bool) -> torch.device:
    if dry_run:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        sys.exit("validate: no CUDA device (use --dry-run on a CPU)")
    return torch.device("cuda")


def _about(device: torch.device) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda}


def _write(out: Path, name: str, result: dict) -> None:
    """Merge ``result`` into out/name.json (bench runs once per method and precision)."""
    path = out / f"{name}.json"
    merged = json.loads(path.read_text()) if path.exists() else {}
    merged.update(result)
    path.write_text(json.dumps(merged, indent=1, default=str))
    print(json.dumps(result, default=str)[:2000])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    from test_engine_helpers import compare, naive_clipped_sum, relative_error

    device = _device(args.dry_run)
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
    _sync(device)
    result["noise"] = {
        "numel": numel,
        "replayable": bool(torch.equal(first, again)),
        "mean": float(first.double().mean()),
        "std": float(first.double().std()),
        "max_abs": float(first.abs().max()),
        "seconds_per_draw": (time.perf_counter() - started) / 3,
    }
    _write(args.out, "exactness", {**_about(device), **result})


# ---- benchmark
# ----------------------------------------------------------------------------------------------


def bench(args) -> None:  # noqa: C901  (one linear benchmark script: set-up, then each method in turn)
    import torch.nn.functional as F
    import transformers

    device = _device(args.dry_run)
    layers, width, steps, batch = (2, 32, 16, 4) if args.dry_run else (12, 768, 256, 16)
    config = transformers.GPT2Config(
        n_layer=layers,
        n_embd=width,
        n_head=max(1, width // 64),
        n_positions=max(steps, 64),
        vocab_size=1000 if args.dry_run else 50257,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="eager" if args.method == "opacus" else "sdpa",
        tie_word_embeddings=args.method
        != "opacus",  # Opacus's ghost clipping refuses tied parameters
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).to(device).train()
    ids = torch.randint(0, config.vocab_size, (batch, steps), device=device)
    # per example: Opacus needs batch rows
    positions = torch.arange(steps, device=device).repeat(batch, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, foreach=True)
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if args.precision == "bf16"
        else torch.autocast(device.type, enabled=False)
    )

    def losses(m) -> torch.Tensor:
        with autocast:
            logits = m(input_ids=ids, position_ids=positions).logits
        return F.cross_entropy(
            logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none"
        ).sum(1)

    if args.method == "nonprivate":

        def step() -> None:
            losses(model).sum().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    elif args.method == "bk":
        from dpledger.engine import BKEngine

        engine = BKEngine(
            model, optimizer, clip_norm=1.0, noise_multiplier=1.0, normalizer=float(batch)
        )

        def step() -> None:
            engine.private_step(losses(model))

    else:
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
        from opacus.optimizers import DPOptimizerFastGradientClipping
        from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

        class PerExample:
            """The "criterion" Opacus wraps: hands back the per-example losses it is given."""

            reduction = "mean"

            def __call__(self, per_example, _target):
                return per_example

        wrapped = GradSampleModuleFastGradientClipping(
            model, max_grad_norm=1.0, use_ghost_clipping=True
        )
        dp_optimizer = DPOptimizerFastGradientClipping(
            optimizer, noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=batch
        )
        criterion = DPLossFastGradientClipping(
            wrapped, dp_optimizer, PerExample(), loss_reduction="mean"
        )

        def step() -> None:
            per_example = losses(wrapped)
            loss = criterion(per_example, per_example)
            loss.backward()
            dp_optimizer.step()
            dp_optimizer.zero_grad(set_to_none=True)

    warmup, timed = (0, 1) if args.dry_run else (3, 10)  # dry run: that a step runs, not its time
    for _ in range(warmup):
        step()
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    for _ in range(timed):
        step()
    _sync(device)
    seconds = (time.perf_counter() - started) / timed
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    key = f"{args.method}_{args.precision}"
    shape = {"layers": layers, "width": width, "T": steps, "B": batch}
    _write(
        args.out,
        "bench",
        {**_about(device), "shape": shape, key: {"s_per_step": seconds, "peak_gib": peak}},
    )


# ---- pipeline
# -----------------------------------------------------------------------------------------------


def _stage(name: str, params: Path, root: Path, env: dict) -> float:
    """Run ``python -m stages.NAME`` as run.sh documents it; its wall time."""
    command = [sys.executable, "-m", f"stages.{name}", "--params", str(params), "--root", str(root)]
    started = time.perf_counter()
    subprocess.run(command, cwd=REPO, env=env, check=True)
    return time.perf_counter() - started


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

    device = _device(args.dry_run)
    work = Path(args.work)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["batching"] = {
        "batch_size": 256 if args.dry_run else 64,
        "epochs": 1 if args.dry_run else 3,
    }
    if args.dry_run:
        params["calibrate"].update(pld_discretization=1e-2, curve_points=3)
    params["train"].update(device=device.type, checkpoint_every=1)
    params["calibrate"].update(group_sizes=[1], table_discretization=0.01)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "lib"), str(REPO), os.environ.get("PYTHONPATH", "")]
        ),
    }
    result, seconds = {}, {}
    roots = {}
    for label in ("straight", "killed"):
        root = roots[label] = work / label
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        (root / "params.yaml").write_text(yaml.safe_dump(params))
    for name in ("calibrate", "schedule"):
        seconds[name] = _stage(name, roots["straight"] / "params.yaml", roots["straight"], env)
    shutil.copytree(roots["straight"] / "artifacts", roots["killed"] / "artifacts")
    seconds["train"] = _stage("train", roots["straight"] / "params.yaml", roots["straight"], env)
    killed = subprocess.run(
        [sys.executable, "-c", KILL_AFTER_TWO_CHECKPOINTS, str(roots["killed"])], cwd=REPO, env=env
    )
    result["killed_returncode"] = killed.returncode
    seconds["resumed_train"] = _stage(
        "train", roots["killed"] / "params.yaml", roots["killed"], env
    )
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
    seconds["verify"] = _stage("verify", roots["straight"] / "params.yaml", roots["straight"], env)
    result["train_metrics"] = {
        k: metrics["straight"].get(k)
        for k in ("steps_done", "throughput_examples_per_s", "wall_time_s")
    }
    result["seconds"] = seconds
    _write(args.out, "pipeline", {**_about(device), **result})


# ---- Monte Carlo
# ------------------------------------------------------------------------------------------


def montecarlo(args) -> None:
    import numpy as np

    from dpledger.accounting import montecarlo as mc
    from dpledger.mechanisms import banded_params, coefficients

    device = _device(args.dry_run)
    bins, steps = (12, 48) if args.dry_run else (64, 1024)
    samples = (1 << 14) if args.dry_run else (1 << 21)
    pair = mc.fixed_bins_pair(coefficients("banded", banded_params(4), steps), bins, steps)
    result = {"bins": bins, "steps": steps, "samples": samples}
    for where in ("cpu", device.type):
        started = time.perf_counter()
        estimate = mc.estimate_delta(pair, 1.0, 1.0, samples, seed=4, device=torch.device(where))
        result[where] = {
            "delta": estimate.delta,
            "stderr": estimate.stderr,
            "seconds": time.perf_counter() - started,
        }
    difference = abs(result["cpu"]["delta"] - result[device.type]["delta"])
    result["agree_within_stderr"] = bool(
        difference <= 4 * math.hypot(result["cpu"]["stderr"], result[device.type]["stderr"])
    )
    result["difference"] = float(np.float64(difference))
    _write(args.out, "montecarlo", {**_about(device), **result})


# ---- distributed
# ------------------------------------------------------------------------------------------


def distributed(args) -> None:
    device = _device(args.dry_run)
    ranks = torch.cuda.device_count() if device.type == "cuda" else 1
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "lib"), str(REPO), os.environ.get("PYTHONPATH", "")]
        ),
    }
    work = Path(args.work)
    straight, root = work / "straight", work / "torchrun"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for part in ("calibration", "schedule"):
        shutil.copytree(straight / "artifacts" / part, root / "artifacts" / part)
    shutil.copy(straight / "params.yaml", root / "params.yaml")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    stage = ["-m", "stages.train", "--params", str(root / "params.yaml"), "--root", str(root)]
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
    _write(args.out, "distributed", {**_about(device), **result})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "step", choices=["exactness", "bench", "pipeline", "montecarlo", "distributed"]
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", default="/tmp/dpledger-gpu-work")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--method", choices=["nonprivate", "bk", "opacus"], default="bk")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    globals()[args.step](args)


if __name__ == "__main__":
    main()
