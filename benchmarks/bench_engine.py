"""BK engine speed and memory against non-private training and Opacus 1.6's fastest mode (issue 5
targets).

Workloads: MLP 784-1000×4-10 at B = 256; a 2-block transformer at B = 32, T = 128, d = 256; on CUDA
also a GPT-2-small-sized stack at B = 16, T = 256 (``--device cuda``, ``--precision bf16`` for
autocast). Methods per workload, timed interleaved (one step of each in turn, repeated), median
reported: non-private (mean loss, one backward), BK (dpledger, σ = 1 noise included), Opacus ghost
clipping (GradSampleModuleFastGradientClipping, two backward passes) and, for the sequence
workloads, Opacus's standard hooks mode (GradSampleModule + DPOptimizer, one backward pass,
per-example gradients instantiated): at T = 128, d = 256 hooks mode is the faster of the two, so BK
is compared with the faster Opacus mode measured in the same run (for the MLP hooks mode would
instantiate 3.9 GB of per-example gradients a step, and ghost is the fastest). Peak extra memory is
measured per method in a fresh subprocess: the peak RSS during 3 steps over the RSS before them
(after one warm-up step), so it counts the transient memory of a step (activations, per-example
quantities), not persistent buffers; on CUDA, the peak of ``torch.cuda.max_memory_allocated`` over 3
steps above the memory allocated before.

    python -m benchmarks.bench_engine [--repeats 15] [--workloads mlp,transformer] [--no-memory]
    [--threads N] python -m benchmarks.bench_engine --device cuda [--precision bf16]     # the GPU
    targets, when lent one python -m benchmarks.bench_engine --workloads gpt2 [--device cuda]
    [--precision bf16]

``gpt2`` is transformers' GPT2LMHeadModel (random init, tied LM head, per-sequence mean token loss):
on the CPU 4 layers, d = 256, T = 128, B = 8; on CUDA GPT-2 small (12 × 768), T = 256, B = 16.
Before timing, each private method's clipped gradient (noise off, R = the median per-example norm)
is compared with a float64 naive per-example loop on the same batch; a method off by more than the
precision's tolerance is reported WRONG, one that raises is reported with its error and not timed.

On the CPU it also times the per-example norms alone at the transformer's shapes (dpledger's against
the textbook ghost norm with both full T × T Grams) and the noise draw alone for the MLP's 3.8 M
parameters: dpledger's Philox/Box–Muller draw against torch's CPU ``normal_`` on the same fixed
chunks in the same number of threads (the path it replaced) and against one plain ``normal_`` call
(what Opacus and most trainers use).

Steps are timed after ``dpledger.engine.retain_freed_memory()`` (the train stage calls it too),
which applies to every method in the process alike; ``--default-allocator`` leaves glibc's default,
under which a BK step pays ~8 000 page faults re-growing the heap glibc trimmed after the previous
step. Memory is measured in fresh processes with the default allocator and a low mmap threshold, so
RSS follows live memory.

``--threads 1`` times single-threaded steps: on a shared machine, 2-thread OpenMP steps stall
whenever another job holds a core (every parallel region waits for a descheduled thread), 1-thread
steps do not.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from dpledger.engine import BKEngine, retain_freed_memory
from dpledger.engine.device import autocast
from dpledger.models import Transformer

METHODS = ("non-private", "bk", "opacus-ghost", "opacus-hooks")
OPACUS_METHODS = ("opacus-ghost", "opacus-hooks")


def methods_for(workload: str) -> tuple[str, ...]:
    """The methods timed on ``workload``: Opacus's hooks mode only where its per-example gradients
    fit."""
    return METHODS if workload != "mlp" else tuple(m for m in METHODS if m != "opacus-hooks")


def mlp_workload() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    layers: list[nn.Module] = [nn.Linear(784, 1000), nn.ReLU()]
    for _ in range(3):
        layers += [nn.Linear(1000, 1000), nn.ReLU()]
    layers.append(nn.Linear(1000, 10))
    return nn.Sequential(*layers), torch.randn(256, 784), torch.randint(0, 10, (256,))


def transformer_workload() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    model = Transformer((128,), 10, dim=256, depth=2, heads=4, mlp_ratio=4, vocab_size=1000)
    return model, torch.randint(0, 1000, (32, 128)), torch.randint(0, 10, (32,))


def gpt2_small_workload() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The issue's GPU workload: a GPT-2-small-sized stack (12 blocks, d = 768, 12 heads, MLP 3072,
    token embedding 50 257 × 768, learned positions) at T = 256, B = 16, under dpledger's
    mean-pooled classifier head (not GPT-2's 50 257-way language-model head)."""
    model = Transformer((256,), 10, dim=768, depth=12, heads=12, mlp_ratio=4, vocab_size=50257)
    return model, torch.randint(0, 50257, (16, 256)), torch.randint(0, 10, (16,))


class _LMLogits(nn.Module):
    """GPT2LMHeadModel returning its logits (B, T, vocab), so every method calls it the same way.
    Position ids are passed as (B, T): Opacus's hooks need every layer input batch-first (GPT-2's
    default (1, T) ids make its hooks mode stop with a stack error); BK takes either."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        return self.model(input_ids=ids, position_ids=positions).logits


def gpt2_workload(device: str = "cpu") -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """transformers' GPT-2 with its LM head tied to the token embedding, random init, dropout off: 4
    × 256, T = 128, B = 8 on the CPU; GPT-2 small (12 × 768, 12 heads), T = 256, B = 16 on CUDA.
    Targets are the inputs shifted by one token."""
    from transformers import GPT2Config, GPT2LMHeadModel

    layers, dim, heads, steps, batch = (
        (4, 256, 4, 128, 8) if device == "cpu" else (12, 768, 12, 256, 16)
    )
    config = GPT2Config(
        n_layer=layers,
        n_embd=dim,
        n_head=heads,
        n_positions=1024,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="eager",
    )
    ids = torch.randint(0, config.vocab_size, (batch, steps + 1))
    return _LMLogits(GPT2LMHeadModel(config)), ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


WORKLOADS = {
    "mlp": mlp_workload,
    "transformer": transformer_workload,
    "gpt2-small": gpt2_small_workload,
    "gpt2": gpt2_workload,
}


def build(workload: str, device: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The workload's model and batch on ``device`` (gpt2's size depends on the device)."""
    model, x, y = WORKLOADS[workload](device) if workload == "gpt2" else WORKLOADS[workload]()
    return model.to(device), x.to(device), y.to(device)


def per_example_losses(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy per example; for sequence targets (language modelling) the mean over its
    tokens."""
    if y.dim() == 1:
        return F.cross_entropy(outputs, y, reduction="none")
    return F.cross_entropy(outputs.transpose(1, 2), y, reduction="none").mean(1)


def make_step(
    method: str, workload: str, device: str = "cpu", precision: str = "fp32"
) -> Callable[[], None]:
    """A closure performing one full training step (forward, backward, clipping, noise, optimizer)
    on ``device``, the forward under ``precision`` autocast on CUDA; CUDA steps end with a
    synchronize."""
    torch.manual_seed(0)
    model, x, y = build(workload, device)
    cast = autocast(torch.device(device), precision)
    step = _method_step(method, model, x, y, cast)
    if device == "cpu":
        return step

    def synchronized() -> None:
        step()
        torch.cuda.synchronize()

    return synchronized


def _method_step(
    method: str,
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    cast,
    clip_norm: float = 1.0,
    sigma: float = 1.0,
) -> Callable[[], None]:
    batch = x.shape[0]
    if method == "non-private":
        return _plain_step(model, torch.optim.SGD(model.parameters(), lr=0.01), x, y, cast)
    if method == "bk":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        engine = BKEngine(
            model, optimizer, clip_norm=clip_norm, noise_multiplier=sigma, normalizer=batch, seed=0
        )

        def bk_step() -> None:
            with cast:
                losses = per_example_losses(model(x), y)
            engine.private_step(losses)

        # p.grad is released after a step
        bk_step.gradients = lambda: [v / batch for v in engine.last_noisy_sum]
        return bk_step
    if method == "opacus-hooks":
        return _opacus_hooks_step(model, x, y, cast, clip_norm, sigma)
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    wrapped = GradSampleModuleFastGradientClipping(
        model,
        batch_first=True,
        loss_reduction="mean",
        max_grad_norm=clip_norm,
        use_ghost_clipping=True,
    )
    optimizer = DPOptimizerFastGradientClipping(
        torch.optim.SGD(wrapped.parameters(), lr=0.01),
        noise_multiplier=sigma,
        max_grad_norm=clip_norm,
        expected_batch_size=batch,
        loss_reduction="mean",
    )
    criterion = DPLossFastGradientClipping(
        wrapped, optimizer, nn.CrossEntropyLoss(reduction="mean"), loss_reduction="mean"
    )

    def opacus_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with cast:
            outputs = wrapped(x)
        if y.dim() == 1:
            criterion(outputs, y).backward()
        else:
            # language modelling: Opacus takes the flattened tokens and the logits' shape
            # (per-sequence mean)
            criterion(
                outputs.reshape(-1, outputs.shape[-1]), y.reshape(-1), shape=outputs.shape
            ).backward()
        optimizer.step()

    return opacus_step


def _opacus_hooks_step(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    cast,
    clip_norm: float = 1.0,
    sigma: float = 1.0,
) -> Callable[[], None]:
    """Opacus's standard mode: per-example gradients from hooks in one backward pass, clipped and
    noised by DPOptimizer (what ``make_private`` builds with the default
    grad_sample_mode="hooks")."""
    from opacus.grad_sample import GradSampleModule
    from opacus.optimizers import DPOptimizer

    wrapped = GradSampleModule(model, batch_first=True, loss_reduction="mean")
    optimizer = DPOptimizer(
        torch.optim.SGD(wrapped.parameters(), lr=0.01),
        noise_multiplier=sigma,
        max_grad_norm=clip_norm,
        expected_batch_size=x.shape[0],
        loss_reduction="mean",
    )
    return _plain_step(wrapped, optimizer, x, y, cast)


def _plain_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, cast
) -> Callable[[], None]:
    """The standard loop: zero the gradients, mean loss, one backward pass, optimizer step."""

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with cast:
            loss = per_example_losses(model(x), y).mean()
        loss.backward()
        optimizer.step()

    return step


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"[:200]


def reference_gradient(workload: str, device: str) -> tuple[list[torch.Tensor], float]:
    """Σ_i C_i g_i / B by a float64 naive loop (one autograd call per example) and the R it used:
    the median per-example norm, so that about half of the examples are clipped. Two passes (norms,
    then the weighted sum), so that no B per-example gradients are held at once."""
    torch.manual_seed(0)
    model, x, y = build(workload, device)
    model = model.double()
    params = list(model.parameters())

    def example_grads(i: int) -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(
            per_example_losses(model(x[i : i + 1]), y[i : i + 1]).sum(), params
        )

    norms = [
        float(torch.sqrt(sum(g.square().sum() for g in example_grads(i))))
        for i in range(x.shape[0])
    ]
    clip_norm = statistics.median(norms)
    total = [torch.zeros_like(p) for p in params]
    for i, norm in enumerate(norms):
        factor = min(1.0, clip_norm / norm) / x.shape[0]
        for out, grad in zip(total, example_grads(i)):
            out.add_(grad, alpha=factor)
    return total, clip_norm


def check_gradients(workload: str, device: str, precision: str) -> dict[str, float | str]:
    """Each private method's gradient (noise off) against :func:`reference_gradient`: the relative
    error of the whole clipped sum, or the first line of the error the method raised."""
    reference, clip_norm = reference_gradient(workload, device)
    scale = torch.sqrt(sum(r.square().sum() for r in reference))
    errors: dict[str, float | str] = {}
    for method in (m for m in methods_for(workload) if m != "non-private"):
        torch.manual_seed(0)
        model, x, y = build(workload, device)
        params = list(model.parameters())
        try:
            step = _method_step(
                method, model, x, y, autocast(torch.device(device), precision), clip_norm, 0.0
            )
            step()
        except Exception as error:  # noqa: BLE001 (a method that fails is reported, not fatal to the benchmark)
            errors[method] = _first_line(error)
            continue
        grads = step.gradients() if hasattr(step, "gradients") else [p.grad for p in params]
        if any(g is None for g in grads):
            errors[method] = "no gradient for some parameters"
            continue
        difference = torch.sqrt(
            sum((g.double() - r).square().sum() for g, r in zip(grads, reference))
        )
        errors[method] = float(difference / scale)
        del step, model
    return errors


GRADIENT_TOLERANCE = {"fp32": 1e-3, "bf16": 5e-2, "fp16": 5e-2}
"""Relative error of a clipped sum beyond which a method is reported WRONG (float32 rounding is
~1e-6; half precision keeps 8 or 11 bits of mantissa)."""


def _interleaved_medians(
    methods: dict[str, Callable[[], object]], repeats: int
) -> dict[str, float]:
    """Median seconds of each method after one warm-up call each, methods alternating within every
    repeat."""
    for method in methods.values():
        method()
    samples: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(repeats):
        for name, method in methods.items():
            started = time.perf_counter()
            method()
            samples[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in samples.items()}


def time_interleaved(
    workload: str,
    repeats: int,
    device: str = "cpu",
    precision: str = "fp32",
    methods: tuple[str, ...] | None = None,
) -> dict[str, float]:
    """Median seconds per step of each method, methods alternating within every repeat."""
    steps = {
        m: make_step(m, workload, device, precision) for m in (methods or methods_for(workload))
    }
    for step in steps.values():  # warm-up (a second one in _interleaved_medians)
        step()
    return _interleaved_medians(steps, repeats)


def _rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize() / 2**20


def measure_memory(method: str, workload: str) -> float:
    """Peak RSS during 3 steps minus the RSS before them (MiB), sampled by a thread every ~0.5 ms.

    Run in a fresh process with glibc's mmap threshold lowered, so freed tensors leave RSS at once
    and RSS follows live memory; one warm-up step first (persistent buffers then sit in the
    baseline).
    """
    step = make_step(method, workload)
    step()
    baseline, peak, running = _rss_mb(), [0.0], [True]

    def sample() -> None:
        while running[0]:
            peak[0] = max(peak[0], _rss_mb())
            time.sleep(0.0005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    for _ in range(3):
        step()
    running[0] = False
    sampler.join()
    return peak[0] - baseline


def memory_in_subprocess(method: str, workload: str) -> float:
    code = (
        f"from benchmarks.bench_engine import measure_memory; print(measure_memory({method!r}, "
        f"{workload!r}))"
    )
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return float(result.stdout.strip().splitlines()[-1])


def cuda_peak_memory(method: str, workload: str, precision: str) -> float:
    """Peak CUDA memory allocated during 3 steps over what was allocated before them (MiB), after
    one warm-up step (persistent buffers then sit in the baseline)."""
    step = make_step(method, workload, "cuda", precision)
    step()
    baseline = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(3):
        step()
    return (torch.cuda.max_memory_allocated() - baseline) / 2**20


def time_noise(repeats: int) -> dict[str, float]:
    """Median seconds to draw σ·z for the MLP's parameters: dpledger's Philox/Box–Muller draw,
    torch's ``normal_`` on the same fixed chunks in our threads (the path it replaced) and one plain
    ``normal_``.

    Each method is timed in its own block of back-to-back draws: an OpenMP pool keeps spinning for a
    while after its work, and would slow whichever method came next if they were interleaved."""
    from dpledger.engine.noise import NoiseSource

    numel = sum(p.numel() for p in mlp_workload()[0].parameters())
    philox = NoiseSource(numel, seed=0)
    chunked = NoiseSource(numel, seed=0)
    out = torch.empty(numel)
    draws = {
        "philox": lambda s: philox.draw_into(out, s, 1.0),
        "torch-chunks": lambda s: chunked._torch_chunks_into(out, s, 1.0),
        "torch-normal": lambda s: out.normal_(),
    }
    times: dict[str, float] = {}
    for name, draw in draws.items():
        samples = []
        for step in range(repeats + 2):
            started = time.perf_counter()
            draw(step)
            samples.append(time.perf_counter() - started)
        times[name] = statistics.median(samples[2:])
    return times


def time_ghost_norms(repeats: int) -> dict[str, dict[str, float]]:
    """Median seconds of the transformer's per-example norms, ours against the textbook ghost norm
    (003 Eq. 2) measured in the same run: the four Linear shapes of a block (symmetric row-block
    Grams against both full Grams) and the token Embedding (row sums per distinct token against the
    T × T same-token Gram)."""
    from dpledger.engine.layers import embedding, linear

    def full_grams(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, a.transpose(1, 2)).mul_(torch.bmm(b, b.transpose(1, 2))).sum((1, 2))

    def same_token_gram(tokens: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        same = (tokens.unsqueeze(2) == tokens.unsqueeze(1)).to(b.dtype)
        return (same * torch.bmm(b, b.transpose(1, 2))).sum((1, 2))

    batch, steps, dim = 32, 128, 256
    results: dict[str, dict[str, float]] = {}
    for d, p in ((dim, 3 * dim), (dim, dim), (dim, 4 * dim), (4 * dim, dim)):
        a, b = torch.randn(batch, steps, d), torch.randn(batch, steps, p)
        results[f"linear {d}->{p}"] = _interleaved_medians(
            {
                "dpledger": lambda a=a, b=b: linear.sequence_ghost_norm(a, b),
                "full Grams": lambda a=a, b=b: full_grams(a, b),
            },
            repeats,
        )
    table = nn.Embedding(1000, dim)
    tokens, b = torch.randint(0, 1000, (batch, steps)), torch.randn(batch, steps, dim)
    results["embedding 1000x256"] = _interleaved_medians(
        {
            "dpledger": lambda: embedding.ghost_norm(table, tokens, b),
            "full Grams": lambda: same_token_gram(tokens, b),
        },
        repeats,
    )
    return results


def _cpu_parts(args: argparse.Namespace, results: dict, micro: bool) -> None:
    """The CPU-only parts: allocator setting, threads and (``micro``) the noise draw and per-example
    norms alone."""
    retained = False if args.default_allocator else retain_freed_memory()
    print(f"freed heap memory retained between steps: {retained}", flush=True)
    results["retain_freed_memory"] = retained
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if not micro:
        return
    noise = time_noise(args.repeats)
    print(
        f"noise for the MLP's parameters: Philox/Box-Muller {1000 * noise['philox']:.2f} ms, "
        f"torch normal_ chunks {1000 * noise['torch-chunks']:.2f} ms "
        f"({noise['torch-chunks'] / noise['philox']:.2f}x), "
        f"one torch normal_ {1000 * noise['torch-normal']:.2f} ms "
        f"({noise['torch-normal'] / noise['philox']:.2f}x)",
        flush=True,
    )
    results["noise_seconds"] = noise
    norms = time_ghost_norms(4 * args.repeats)
    results["ghost_norm_seconds"] = norms
    print(
        "per-example norms at B = 32, T = 128: "
        + ", ".join(
            f"{shape} {1000 * t['dpledger']:.2f} ms vs {1000 * t['full Grams']:.2f} ms "
            f"({t['full Grams'] / t['dpledger']:.2f}x)"
            for shape, t in norms.items()
        ),
        flush=True,
    )


def _verdict(method: str, error: float | str, wrong: list[str]) -> str:
    """Clipped-sum error as printed: FAILED (why), or the error (WRONG beyond tolerance)."""
    shown = f"FAILED ({error})" if isinstance(error, str) else f"{error:.2e}"
    return f"{method} {shown}{' WRONG' if method in wrong else ''}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--workloads",
        default=None,
        help=f"comma-separated, of {', '.join(WORKLOADS)} (default: mlp,transformer; "
        "on CUDA also gpt2-small and gpt2)",
    )
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available"
    )
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16", "fp16"),
        default="fp32",
        help="forward autocast on CUDA (norms stay float32)",
    )
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's)"
    )
    parser.add_argument(
        "--default-allocator",
        action="store_true",
        help="time steps under glibc's default trimming (no retain_freed_memory)",
    )
    args = parser.parse_args()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    results: dict = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "precision": args.precision,
    }
    workloads = args.workloads or (
        "mlp,transformer,gpt2-small,gpt2" if device == "cuda" else "mlp,transformer"
    )
    if device == "cpu":
        _cpu_parts(args, results, micro=workloads != "gpt2")
    for workload in workloads.split(","):
        row: dict = {}
        methods = methods_for(workload)
        if workload == "gpt2":
            errors = check_gradients(workload, device, args.precision)
            tolerance = GRADIENT_TOLERANCE[args.precision]
            row["clipped_sum_relative_error"] = errors
            row["wrong"] = [
                m for m, e in errors.items() if not isinstance(e, str) and e > tolerance
            ]
            row["failed"] = [m for m, e in errors.items() if isinstance(e, str)]
            print(
                f"{workload}: clipped sum vs float64 naive loop (tolerance {tolerance:g}): "
                + ", ".join(_verdict(m, e, row["wrong"]) for m, e in errors.items()),
                flush=True,
            )
            methods = tuple(m for m in methods if not isinstance(errors.get(m, 0.0), str))
        seconds = time_interleaved(workload, args.repeats, device, args.precision, methods)
        correct = [m for m in OPACUS_METHODS if m in seconds and m not in row.get("wrong", ())]
        row.update(
            seconds_per_step=seconds,
            bk_over_nonprivate=seconds["bk"] / seconds["non-private"],
            opacus_over_bk={m: seconds[m] / seconds["bk"] for m in OPACUS_METHODS if m in seconds},
        )
        if correct:
            fastest = min(correct, key=seconds.__getitem__)
            row.update(
                opacus_fastest_correct=fastest,
                opacus_fastest_correct_over_bk=seconds[fastest] / seconds["bk"],
            )
        if not args.no_memory:
            memory = {
                m: (
                    memory_in_subprocess(m, workload)
                    if device == "cpu"
                    else cuda_peak_memory(m, workload, args.precision)
                )
                for m in methods
            }
            row["peak_extra_mib"] = memory
            row["bk_extra_memory_over_nonprivate"] = memory["bk"] / memory["non-private"] - 1
        results[workload] = row
        target = 1.25 if workload == "gpt2" and device == "cpu" else 1.15
        print(
            f"{workload}: "
            + ", ".join(f"{m} {1000 * s:.1f} ms" for m, s in seconds.items())
            + f" | BK/non-private {row['bk_over_nonprivate']:.3f}x (target <= {target})"
            + "".join(f" | {m}/BK {r:.3f}x" for m, r in row["opacus_over_bk"].items())
            + (
                " | fastest correct Opacus "
                f"({row['opacus_fastest_correct']})/BK {row['opacus_fastest_correct_over_bk']:.3f}x"
                if correct
                else " | no correct Opacus mode"
            ),
            flush=True,
        )
        if "peak_extra_mib" in row:
            print(
                f"  peak transient {'RSS' if device == 'cpu' else 'CUDA memory'} MiB: "
                f"{row['peak_extra_mib']}; "
                f"BK extra over non-private {100 * row['bk_extra_memory_over_nonprivate']:.1f}% "
                "(target <= 25%)",
                flush=True,
            )
    print(json.dumps({"torch_threads": torch.get_num_threads(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
