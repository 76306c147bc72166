"""Data-parallel BK steps: what the distributed path costs and gains, as ratios measured in one run.

``--device cpu`` (default): the same logical steps (MLP 784-512-512-10, B = 256) in 1 process with
all cores against 2 spawned gloo ranks with half the cores each (each rank clips half of every
batch; one all-reduce per step), and 1 process through the distributed path (world size 1, gloo)
against without it. ``--device cuda``: one GPU through the distributed path (world size 1, nccl)
against without it; the target is ≤ 1.03×. Each variant runs the train stage's step: forward,
``engine.backward`` on the rank's share, ``engine.step`` (the all-reduce), and the summed loss (one
small all-reduce on the device, read back once at the end: ``pipeline/step_losses.py``).

Run: ``python -m benchmarks.bench_distributed [--device cpu|cuda] [--steps N]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dpledger.engine import BKEngine
from dpledger.engine.distributed import share_bounds
from dpledger.pipeline.distributed import SINGLE, Ranks, spawn_ranks
from dpledger.pipeline.step_losses import StepLosses

BATCH, FEATURES, CLASSES, WARMUP = 256, 784, 10, 3


def _steps(steps: int, device_name: str, ranks: Ranks = SINGLE) -> list[float]:
    """Seconds per logical step (after warm-up) of this rank's share of every batch."""
    device = ranks.device(torch.device(device_name))
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(FEATURES, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, CLASSES)
    ).to(device)
    engine = BKEngine(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        clip_norm=1.0,
        noise_multiplier=1.0,
        normalizer=BATCH,
        seed=0,
        process_group=ranks.group,
    )
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH * 4, FEATURES, generator=generator).to(device)
    y = torch.randint(0, CLASSES, (BATCH * 4,), generator=generator).to(device)
    lo, hi = share_bounds(BATCH, ranks.rank, ranks.world_size)
    times, step_losses = [], StepLosses(ranks)
    for step in range(WARMUP + steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        rows = slice((step % 4) * BATCH + lo, (step % 4) * BATCH + hi)
        losses = F.cross_entropy(model(x[rows]), y[rows], reduction="none")
        engine.backward(losses)
        engine.step()
        step_losses.add(losses.detach().sum().double(), float(BATCH))
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    step_losses.read()  # as the train stage does at a progress line: one copy for the pending steps
    return times[WARMUP:]


def _median_ms(times: list[float]) -> float:
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    device = torch.device(args.device)
    threads = torch.get_num_threads()
    plain = _median_ms(_steps(args.steps, args.device))
    world1 = _median_ms(spawn_ranks(_steps, (args.steps, args.device), 1, device))
    backend = "nccl" if device.type == "cuda" else "gloo"
    print(
        f"device {args.device}, {threads} threads, B = {BATCH}, {args.steps} steps "
        "(median per step)"
    )
    print(f"1 process, no process group:        {plain:8.2f} ms")
    print(
        f"1 process, world size 1 ({backend}):     {world1:8.2f} ms   ratio {world1 / plain:.3f}× "
        "(target ≤ 1.03 on CUDA)"
    )
    if device.type == "cpu":
        two = _median_ms(spawn_ranks(_steps, (args.steps, args.device), 2, device))
        torch.set_num_threads(max(1, threads // 2))
        one_thread = _median_ms(_steps(args.steps, args.device))
        print(
            f"2 processes ({backend}, {max(1, threads // 2)} thread each): "
            f"{two:8.2f} ms   speed-up {plain / two:.2f}× over 1 process"
        )
        print(
            f"1 process, {max(1, threads // 2)} thread: "
            f"               {one_thread:8.2f} ms   2 processes' speed-up over it {one_thread / two:.2f}×"  # noqa: E501
        )
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
