"""The GPU validation's ``bench`` step: GPT-2 small (12 × 768, T 256, vocabulary 50 257, tied
head) one SGD step, non-private, BK or Opacus ghost clipping, fp32 or bf16 autocast, at B = 16, 32
and 64, every method scoring the flat (B·T, V) cross-entropy; run.sh starts a fresh process per
method and precision."""

from __future__ import annotations

import math
import time

import torch
from gpu_common import about, device_for, finish, sync


def _bench_model(args, device, steps):
    """GPT-2 small (tiny in the dry run), seeded; Opacus gets an untied head (it refuses tied
    parameters) and eager attention."""
    import transformers

    layers, width = (2, 32) if args.dry_run else (12, 768)
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
        tie_word_embeddings=args.method != "opacus",
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).to(device).train(), (layers, width)


def _bench_step(args, model, batch, optimizer, losses):
    """One training step of ``args.method`` on ``model`` (per-example ``losses(model)``)."""
    if args.method == "nonprivate":

        def step() -> torch.Tensor:
            loss = losses(model).sum()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss.detach()

        return step, model
    if args.method == "bk":
        from dpledger.engine import BKEngine

        engine = BKEngine(
            model, optimizer, clip_norm=1.0, noise_multiplier=1.0, normalizer=float(batch)
        )

        def step() -> torch.Tensor:
            per_example = losses(model)
            engine.private_step(per_example)
            return per_example.detach().sum()

        return step, engine
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

    def step() -> torch.Tensor:
        per_example = losses(wrapped)
        loss = criterion(per_example, per_example)
        loss.backward()
        dp_optimizer.step()
        dp_optimizer.zero_grad(set_to_none=True)
        return per_example.detach().sum()

    return step, wrapped


def bench(args) -> None:
    """Each batch size in turn (ascending, peak memory reset between): s/step over synchronized
    steps after warm-up, and peak memory. Every method scores the flat (B·T, V) cross-entropy."""
    import torch.nn.functional as F

    device = device_for(args.dry_run)
    steps = 16 if args.dry_run else 256
    batches = (2, 4) if args.dry_run else (16, 32, 64)
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if args.precision == "bf16"
        else torch.autocast(device.type, enabled=False)
    )
    key = f"{args.method}_{args.precision}"
    result, checks = {}, {}
    for batch in batches:
        model, (layers, width) = _bench_model(args, device, steps)
        ids = torch.randint(0, model.config.vocab_size, (batch, steps), device=device)
        # per example: Opacus needs batch rows
        positions = torch.arange(steps, device=device).repeat(batch, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, foreach=True)

        def losses(
            m, ids=ids, positions=positions, batch=batch, vocab=model.config.vocab_size
        ) -> torch.Tensor:
            with autocast:
                logits = m(input_ids=ids, position_ids=positions).logits
            tokens = F.cross_entropy(
                logits[:, :-1].float().reshape(-1, vocab), ids[:, 1:].reshape(-1), reduction="none"
            )
            per_example = tokens.view(batch, -1).sum(1)
            return per_example * math.nan if args.inject else per_example

        step, _ = _bench_step(args, model, batch, optimizer, losses)
        # dry run: that a step runs; fp32 fewer steps (slower, and the 8-minute budget)
        warmup, timed = (0, 1) if args.dry_run else (3, 10) if args.precision == "bf16" else (2, 6)
        for _ in range(warmup):
            step()
        sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        started = time.perf_counter()
        for _ in range(timed):
            loss = step()
        sync(device)
        seconds = (time.perf_counter() - started) / timed
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
        if args.profile and batch == batches[-1]:
            _profile(step, device, args.out / f"profile_{key}.txt")
        finite = bool(torch.isfinite(loss)) and all(
            bool(torch.isfinite(p).all()) for p in model.parameters()
        )
        result[f"B{batch}"] = {"s_per_step": seconds, "peak_gib": peak, "finite": finite}
        checks[f"{key}_B{batch}_finite"] = finite
        del model, optimizer, step
        if device.type == "cuda":
            torch.cuda.empty_cache()
    shape = {"layers": layers, "width": width, "T": steps, "B": list(batches), "loss": "flat"}
    finish(args.out, "bench", {**about(device), "shape": shape, key: result}, checks)


def _profile(step, device, path) -> None:
    """The 30 operators that took the most device time (CPU time on the CPU) over two steps."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiled:
        for _ in range(2):
            step()
        sync(device)
    order = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    path.write_text(
        profiled.key_averages().table(sort_by=order, row_limit=30, max_name_column_width=60)
    )
