"""The one-run canary audit (issue 28): ε_emp of a real digits run against ideal canaries, and its
cost.

python -m benchmarks.bench_one_run --acceptance   # digits, Poisson, ε = 8, 10 epochs, m = 10⁴
python -m benchmarks.bench_one_run --cost         # the default pipeline's train stage, canaries
on/off
python -m benchmarks.bench_one_run --cost --params examples/lm/params.yaml  # the LM example (after
`python -m stages.prepare --out examples/lm/data`)

Acceptance: the default MLP trained at the σ calibrated for ε = 8 with the canaries recorded; its
ε_emp for each bound beside the mean of ``--ideal-seeds`` interference-free simulations at the same
(σ, law, m, confidence). Cost: the params file's calibrate and schedule stages once, then the
train stage alternately with ``audit.one_run.enabled`` true and false (a fresh artifacts/train each
time); the recorder's own time (its ``record``, ``save`` and the engine's per-step gathers through
its ``select``) is timed inside the same stage run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import yaml
from scipy.optimize import brentq

from dpledger.accounting.pld import PldRun, pld_epsilon
from dpledger.audit import one_run
from dpledger.audit.canaries import CanaryRecorder, canary_law, recorder_for
from dpledger.data import load_data
from dpledger.engine import BKEngine
from dpledger.models import build_task_model, task_for
from dpledger.params import DataParams
from dpledger.pipeline import run_stage
from dpledger.sampling.registry import build_schedule

REPO = Path(__file__).resolve().parents[1]
DELTA = 1e-5
BOUNDS = ("fdp", "steinke")  # each call also gives both order-statistics forms


def acceptance(epsilon: float, canaries: int, ideal_seeds: int) -> dict:
    data = load_data(DataParams(), 0)
    schedule = build_schedule(
        "poisson", dataset_size=data.train_size, batch_size=64, epochs=10, seed=0
    )
    run = PldRun(1.0, "poisson", 1, 64 / data.train_size, data.train_size, 64, schedule.num_steps)
    sigma = brentq(
        lambda s: pld_epsilon(replace(run, noise_multiplier=s), DELTA) - epsilon, 0.3, 5, xtol=1e-4
    )
    torch.manual_seed(0)
    task = task_for("mlp", "classification", data)
    model = build_task_model("mlp", {}, task, data)
    engine = BKEngine(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        clip_norm=1.0,
        noise_multiplier=sigma,
        normalizer=64,
    )
    recorder = recorder_for(True, canaries, 0, engine, schedule, 1.0)
    x, y = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    recording = 0.0
    started = time.perf_counter()
    for step in range(schedule.num_steps):
        rows = torch.from_numpy(schedule.batch(step)[0].astype(np.int64))
        engine.backward(task.losses(model, x[rows], y[rows]))
        engine.step()
        mark = time.perf_counter()
        recorder.record(step)
        recording += time.perf_counter() - mark
    training = time.perf_counter() - started
    saved = {
        "raw": recorder.raw,
        "real": recorder.real,
        "included": recorder.plan.included,
        "seed": np.array(recorder.plan.seed),
    }
    law = canary_law(schedule)
    rows = {}
    for bound in BOUNDS:
        mark = time.perf_counter()
        result = one_run.audit_one_run(
            saved,
            law,
            noise_multiplier=sigma,
            epsilon_claimed=epsilon,
            delta=DELTA,
            confidence=0.95,
            bound=bound,
            threshold="bonferroni",
            split_fraction=0.5,
            correlated=False,
        )
        audit_s = time.perf_counter() - mark
        found = {bound: (result.estimate.epsilon, result.ceiling)}
        if bound == BOUNDS[0]:
            found.update({k: (v.epsilon, v.ceiling) for k, v in result.order.items() if v})
        for name, (emp, ceiling) in found.items():
            ideal = [
                one_run.ideal_epsilon(
                    law, sigma, canaries, delta=DELTA, confidence=0.95, bound=name, seed=s
                )
                for s in range(ideal_seeds)
            ]
            rows[name] = {
                "epsilon_emp": round(emp, 3),
                "fraction_of_claim": round(emp / epsilon, 3),
                "ceiling": round(ceiling, 3),
                "ideal_mean": round(statistics.mean(ideal), 3),
                "ideal_min_max": [round(min(ideal), 3), round(max(ideal), 3)],
                "ratio": round(emp / statistics.mean(ideal), 3),
                "noise_measured": round(result.noise_measured, 4),
                "audit_s (all forms)": round(audit_s, 2),
            }
    accuracy = task.evaluate(model, torch.from_numpy(data.x_test), torch.from_numpy(data.y_test))[
        "accuracy"
    ]
    return {
        "sigma": round(sigma, 4),
        "steps": schedule.num_steps,
        "canaries": canaries,
        "trainable": engine.numel,
        "train_s": round(training, 2),
        "record_s": round(recording, 3),
        "test_accuracy": round(accuracy, 4),
        "bounds": rows,
    }


def _timed(spent: list[float], method):
    """``method`` with its wall time added to ``spent[0]``, once for calls nested in timed calls."""

    def run(*args, **kwargs):
        spent[1] += 1
        mark = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            spent[1] -= 1
            if spent[1] == 0:
                spent[0] += time.perf_counter() - mark

    return run


TIMED = ("record", "save", "select")  # select: the engine's two gathers per step, and record's


def cost(repeats: int, params_file: Path) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bench-one-run-"))
    try:
        params = yaml.safe_load(params_file.read_text())
        lm_data = REPO / "examples/lm/data"
        if lm_data.exists():  # the LM example's prepared corpus and model (its params name them)
            (root / "examples/lm").mkdir(parents=True)
            (root / "examples/lm/data").symlink_to(lm_data)
        paths = {}
        for enabled in (True, False):
            params["audit"]["one_run"]["enabled"] = enabled
            paths[enabled] = root / f"params-{enabled}.yaml"
            paths[enabled].write_text(yaml.safe_dump(params))
        run_stage("calibrate", paths[True], root)
        run_stage("schedule", paths[True], root)
        times: dict[bool, list[float]] = {True: [], False: []}
        metrics: dict[bool, dict] = {}
        shares = []
        for _ in range(repeats):
            for enabled in (False, True):  # the last run keeps its canaries for the audit stage
                shutil.rmtree(root / "artifacts" / "train", ignore_errors=True)
                spent = [0.0, 0]  # the recorder's time in the stage (load cannot blur the share)
                originals = {name: getattr(CanaryRecorder, name) for name in TIMED}
                for name, method in originals.items():
                    setattr(CanaryRecorder, name, _timed(spent, method))
                try:
                    metrics[enabled] = run_stage("train", paths[enabled], root)
                finally:
                    for name, method in originals.items():
                        setattr(CanaryRecorder, name, method)
                times[enabled].append(metrics[enabled]["stage_wall_time_s"])
                if enabled:
                    shares.append(round(spent[0] / metrics[enabled]["stage_wall_time_s"], 5))
                    line = {"recorder_s": round(spent[0], 3), "share": shares[-1]}
                    print(json.dumps(line), flush=True)
        print(json.dumps({"train_stage_s": times}), flush=True)
        mark = time.perf_counter()
        audit = run_stage("audit", paths[True], root)
        audit_s = time.perf_counter() - mark
        on, off = statistics.median(times[True]), statistics.median(times[False])
        return {
            "train_stage_s_on": times[True],
            "train_stage_s_off": times[False],
            "overhead_on_off": round(on / off - 1.0, 4),
            "recorder_share_of_stage": shares,
            "quality_on_off": {
                key: [metrics[True][key], metrics[False][key]]
                for key in ("test_accuracy", "test_loss", "test_perplexity")
                if key in metrics[True]
            },
            "epsilon_on_off": [metrics[True]["epsilon_spent"], metrics[False]["epsilon_spent"]],
            "audit_stage_s": round(audit_s, 2),
            "audit_one_run": {
                k: v for k, v in audit.items() if "one_run" in k or "last_iterate" in k
            },
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--acceptance", action="store_true")
    parser.add_argument("--cost", action="store_true")
    parser.add_argument("--epsilon", type=float, default=8.0)
    parser.add_argument("--canaries", type=int, default=10_000)
    parser.add_argument("--ideal-seeds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--params",
        type=Path,
        default=REPO / "params.yaml",
        help="--cost: the params file",
    )
    args = parser.parse_args()
    if args.acceptance:
        print(json.dumps(acceptance(args.epsilon, args.canaries, args.ideal_seeds), indent=1))
    if args.cost:
        print(json.dumps(cost(args.repeats, args.params), indent=1))


if __name__ == "__main__":
    main()
