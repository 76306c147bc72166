"""The BK engine's extra matrix FLOPs per step, by dtype, against the non-private step's, on GPT-2
small's shapes under bf16 autocast: the figure a CPU session can move that predicts the GPU time.

GPT-2 small: width 768, 12 heads, vocabulary 50 257 (tied head), T = 256, one sequence (every count
is linear in B). Each count runs the real step on the CPU under ``torch.autocast("cpu",
torch.bfloat16)`` inside a dispatch mode that adds the FLOPs of every matrix product (mm, addmm,
bmm, baddbmm, addmv, mv, dot, convolution, scaled-dot-product attention) under the dtype of its
operands: the non-private step (loss.backward()) and the BK step (``engine.private_step``, noise
off). Both are linear in the number of blocks, so they are counted with 1 and 2 blocks and
extrapolated to 12 (exact: every block has the same shapes).

    python -m benchmarks.bench_flops [--layers 12] [--steps 256]
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

VOCAB, WIDTH = 50257, 768


class FlopsByDtype(TorchDispatchMode):
    """FLOPs of the matrix products run inside, by the dtype of their first operand (torch's own
    formulas, ``torch.utils.flop_counter``)."""

    def __init__(self) -> None:
        super().__init__()
        self.flops: Counter = Counter()
        self._formulas = FlopCounterMode(display=False).flop_registry

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = self._formulas.get(func._overloadpacket)
        if formula is not None:
            first = next(t for t in args if isinstance(t, torch.Tensor))
            dtype = str(first.dtype).removeprefix("torch.")
            self.flops[dtype] += formula(*args, **kwargs, out_val=out)
        return out


def _model(layers: int, steps: int):
    import transformers

    config = transformers.GPT2Config(
        n_layer=layers,
        n_embd=WIDTH,
        n_head=12,
        n_positions=steps,
        vocab_size=VOCAB,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).train()


def count(layers: int, steps: int) -> dict[str, Counter]:
    """FLOPs by dtype of one non-private and one BK step with ``layers`` blocks."""
    from dpledger.engine import BKEngine
    from dpledger.models.tasks import Task

    ids = torch.randint(0, VOCAB, (1, steps), generator=torch.Generator().manual_seed(0))
    task = Task("causal-lm")

    def losses(model):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=ids).logits
        return task.losses_from_logits(logits, ids, ids[:, 0])

    result = {}
    model = _model(layers, steps)
    with FlopsByDtype() as counter:
        losses(model).sum().backward()
    result["nonprivate"] = counter.flops
    model = _model(layers, steps)
    engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    with FlopsByDtype() as counter:
        engine.private_step(losses(model))
    result["bk"] = counter.flops
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--steps", type=int, default=256)
    args = parser.parse_args()
    one, two = count(1, args.steps), count(2, args.steps)
    total = {}
    for method in ("nonprivate", "bk"):
        dtypes = set(one[method]) | set(two[method])
        total[method] = {
            d: one[method][d] + (args.layers - 1) * (two[method][d] - one[method][d])
            for d in dtypes
        }
    base = sum(total["nonprivate"].values())
    bk = sum(total["bk"].values())
    print(f"GPT-2 small shapes, {args.layers} blocks, T {args.steps}, B 1, bf16 autocast (CPU)")
    for method, flops in total.items():
        parts = ", ".join(f"{d} {v / 1e9:.2f}" for d, v in sorted(flops.items()))
        print(f"{method:10s} {sum(flops.values()) / 1e9:8.2f} GFLOP  ({parts})")
    extra = {d: total["bk"].get(d, 0) - total["nonprivate"].get(d, 0) for d in total["bk"]}
    print(
        f"extra      {(bk - base) / 1e9:8.2f} GFLOP = "
        f"{100 * (bk - base) / base:.1f} % of non-private"
    )
    fp32 = total["bk"].get("float32", 0)
    print(
        f"fp32 share of BK's matrix FLOPs: {100 * fp32 / bk:.1f} %; extra by dtype: "
        + ", ".join(f"{d} {v / 1e9:+.2f}" for d, v in sorted(extra.items()))
    )


if __name__ == "__main__":
    main()
