"""The verify battery: wall time and training steps per trainer, and the 20-seed classification
check.

Run ``python -m benchmarks.bench_verify [--seeds 20]``. For every correct trainer (dpledger's
engine, the reference, Opacus) and every zoo member it runs the whole SGD battery on seeds 0..N−1
and counts correct classifications (correct trainer: passes; zoo member: fails, with its designated
tests). The baseline, timed in the same run, is plain non-private SGD for as many steps as the
battery takes on the same MLP; the ratio is the battery's wall time over it (the cost of the tests'
many short runs).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import time

import torch

from dpledger.verify.battery import run_battery
from dpledger.verify.flawed_trainers import ZOO
from dpledger.verify.protocol import load_trainer
from dpledger.verify.self_check import CORRECT_TRAINERS, classified_correctly
from dpledger.verify.task import make_task, weighted_half_mse

PAPER_STEPS = 8 + 100 + 500
"""000 App. D: T1 8 steps, T2 100 steps, T3 5 models × 10 steps × 10 C values."""


def plain_sgd_seconds(steps: int, batch_size: int = 16) -> float:
    """Non-private SGD on the battery's MLP, ``steps`` steps: the baseline."""
    task = make_task(0)
    model = copy.deepcopy(task.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, targets = task.ordinary_rows(0, batch_size)
    torch.set_num_threads(1)
    started = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad()
        weighted_half_mse(model(inputs), targets).mean().backward()
        optimizer.step()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    trainers = CORRECT_TRAINERS + tuple(f"zoo:{name}" for name in ZOO)
    rows = []
    for trainer in trainers:
        function = load_trainer(trainer)
        results = [
            run_battery(function, trainer_name=trainer, seed=seed, progress=False)
            for seed in range(args.seeds)
        ]
        wall = [result.wall_time_s for result in results]
        steps = [result.training_steps for result in results]
        baseline = plain_sgd_seconds(max(steps))
        rows.append(
            {
                "trainer": trainer,
                "classified_correctly": sum(
                    classified_correctly(trainer, result) for result in results
                ),
                "seeds": args.seeds,
                "false_alarm_seeds": [
                    r.seed for r in results if not trainer.startswith("zoo:") and not r.passed
                ],
                "median_wall_s": sorted(wall)[len(wall) // 2],
                "max_wall_s": max(wall),
                "max_steps": max(steps),
                "replicates_run": sum(
                    any("replicate_p_value" in t.details for t in r.tests) for r in results
                ),
                "ratio_to_plain_sgd": sorted(wall)[len(wall) // 2] / baseline,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    print("| trainer | classified correctly | median s | max s | max steps | ratio vs plain SGD |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['trainer']} | {row['classified_correctly']}/{row['seeds']} | "
            f"{row['median_wall_s']:.2f} | "
            f"{row['max_wall_s']:.2f} | {row['max_steps']} | {row['ratio_to_plain_sgd']:.1f} |"
        )
    print(
        f"paper's cost (000 App. D): {PAPER_STEPS} steps; machine: "
        f"{platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')}"
    )


if __name__ == "__main__":
    main()
