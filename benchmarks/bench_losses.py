"""The causal-LM loss (``Task("causal-lm")``, flat (B·T, V) layout) against a plain flat
cross-entropy and the transposed (B, V, T) layout it replaced: forward and backward on the same
logits, median of interleaved repeats.

    python -m benchmarks.bench_losses [--batch 8] [--steps 128] [--vocab 8192] [--repeats 9]

The plain flat cross-entropy is the floor (``cross_entropy(logits[:, :-1].reshape(-1, V), ...)``,
the non-private baseline the GPU benchmark uses); the task's loss also masks padding and divides by
each sequence's count of real targets, per example.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from dpledger.models.tasks import Task


def plain_flat(logits, ids):
    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1))


def transposed(logits, ids):
    tokens = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
    return tokens.sum(1) / tokens.shape[1]


def task_loss(logits, ids):
    return Task("causal-lm").losses_from_logits(logits, ids, ids[:, 0])


METHODS = {
    "plain flat cross-entropy": plain_flat,
    "task (flat)": task_loss,
    "transposed": transposed,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    torch.manual_seed(0)
    logits = torch.randn(args.batch, args.steps, args.vocab, requires_grad=True)
    ids = torch.randint(0, args.vocab, (args.batch, args.steps))
    times: dict[str, list[float]] = {name: [] for name in METHODS}
    for _ in range(args.repeats + 1):  # the first round warms up
        for name, method in METHODS.items():
            started = time.perf_counter()
            method(logits, ids).sum().backward()
            times[name].append(time.perf_counter() - started)
            logits.grad = None
    floor = statistics.median(times["plain flat cross-entropy"][1:])
    print(f"B {args.batch}, T {args.steps}, V {args.vocab}, {torch.get_num_threads()} threads")
    for name, values in times.items():
        median = statistics.median(values[1:])
        print(f"{name:26s} {1e3 * median:8.1f} ms  {median / floor:5.2f}x")


if __name__ == "__main__":
    main()
