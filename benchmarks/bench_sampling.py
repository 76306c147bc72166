"""Schedules for 10⁷ examples × 1 epoch in bounded memory: time and peak memory per sampler.

Run ``python -m benchmarks.bench_sampling``. Each case runs in a fresh subprocess and reports its
wall time and its peak resident memory above the interpreter's after imports (``ru_maxrss``),
next to the size of the schedule arrays it produces. ``build`` materializes the schedule (CSR
arrays); ``stream`` only iterates the batches, as a DataLoader would. The baseline is the naive
Poisson sampler (one Bernoulli coin per example per step, O(n) per step), timed on a few steps in
the same run; the ratio is its per-step time over dpledger's.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np

N = 10_000_000
BATCH = 1024
CASES = {
    "poisson": {},
    "fixed": {},
    "shuffle": {},
    "balls-in-bins (pad/truncate)": {"pad_truncate": True},
    "partial-shuffle (K = 100 000)": {"buffer_size": 100_000},
}
NAIVE_STEPS = 10


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def run_case(label: str, mode: str) -> dict:
    """One case in this process: build or stream the schedule, measure time and peak memory."""
    from dpledger.sampling import build_sampler, materialize

    name = label.split(" ")[0]
    before = _rss_bytes()
    started = time.perf_counter()
    sampler = build_sampler(
        name, dataset_size=N, batch_size=BATCH, epochs=1, seed=0, **CASES[label]
    )
    if mode == "build":
        schedule = materialize(sampler)
        rows, steps = int(schedule.indices.shape[0]), schedule.num_steps
        output = schedule.indices.nbytes + schedule.padding.nbytes + schedule.offsets.nbytes
    else:
        rows = steps = 0
        for batch in sampler.batches():
            rows += batch.indices.shape[0]
            steps += 1
        output = 0
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    return {
        "case": label,
        "mode": mode,
        "seconds": seconds,
        "peak_mb": peak / 2**20,
        "output_mb": output / 2**20,
        "rows": rows,
        "steps": steps,
    }


def naive_poisson_seconds_per_step() -> float:
    """Baseline: n Bernoulli(q) coins per step."""
    rng = np.random.default_rng(0)
    q = BATCH / N
    started = time.perf_counter()
    for _ in range(NAIVE_STEPS):
        np.flatnonzero(rng.random(N) < q)
    return (time.perf_counter() - started) / NAIVE_STEPS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case")
    parser.add_argument("--mode", choices=("build", "stream"))
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.mode)))
        return

    results = []
    for label in CASES:
        for mode in ("build", "stream"):
            command = [
                sys.executable,
                "-m",
                "benchmarks.bench_sampling",
                "--case",
                label,
                "--mode",
                mode,
            ]
            results.append(
                json.loads(
                    subprocess.run(command, check=True, capture_output=True, text=True).stdout
                )
            )
    print(f"n = {N:,} examples, B = {BATCH}, 1 epoch")
    print(
        f"{'sampler':<30} {'mode':<7} {'steps':>6} {'rows':>11} {'time s':>7} {'peak MB':>8} {'output MB':>9}"  # noqa: E501
    )
    for r in results:
        print(
            f"{r['case']:<30} {r['mode']:<7} {r['steps']:>6} {r['rows']:>11,} {r['seconds']:>7.2f} {r['peak_mb']:>8.1f} {r['output_mb']:>9.1f}"  # noqa: E501
        )
    naive = naive_poisson_seconds_per_step()
    ours = next(r for r in results if r["case"] == "poisson" and r["mode"] == "stream")
    ours_per_step = ours["seconds"] / ours["steps"]
    print(
        f"naive Poisson (n coins per step): {naive * 1e3:.1f} ms/step, "
        f"{naive * ours['steps']:.0f} s for the epoch (extrapolated)"
    )
    print(
        f"dpledger Poisson (binomial size + uniform subset): {ours_per_step * 1e6:.1f} µs/step; "
        f"speed-up ×{naive / ours_per_step:.0f}"
    )


if __name__ == "__main__":
    main()
