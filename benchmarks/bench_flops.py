"""The BK engine's extra matrix FLOPs per step, by dtype, against the non-private step's, on GPT-2
small's shapes under bf16 autocast: the figure a CPU session can move that predicts the GPU time.

GPT-2 small: width 768, 12 heads, vocabulary 50 257 (tied head), T = 256, one sequence (every count
is linear in B). Each count runs the step on the CPU under ``torch.autocast("cpu",
torch.bfloat16)`` inside a dispatch mode that adds the FLOPs of every matrix product (mm, addmm,
bmm, baddbmm, addmv and their in-place forms, convolution; eager attention, so its products are
bmm) under the dtype of its operands, and hands back zeros of the product's shape instead of
computing it: the non-private step (loss.backward()) and the BK step (``engine.private_step``,
noise off; its second step: the first also traces the batch's provenance, once per input shape).
Both are linear in the number of blocks, so they are counted with 1 and 2 blocks and extrapolated
to 12 (exact: every block has the same shapes). Counted twice: with the Grams and
half-precision products as CUDA forms them (whole T × T Grams; ``out_dtype`` products of the bf16
operands, ``engine/tensor_cores.py``) and as the CPU does (upper-triangle Gram blocks; operands
promoted to float32).

    python -m benchmarks.bench_flops [--layers 12] [--steps 256]
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

VOCAB, WIDTH = 50257, 768


def _addmv_flop(self_shape, mat_shape, vec_shape, *args, out_shape=None, **kwargs) -> int:
    """out = β·self + α·mat·vec: 2·m·n."""
    return 2 * mat_shape[0] * mat_shape[1]


class FlopsByDtype(TorchDispatchMode):
    """FLOPs of the matrix products run inside, by the dtype of their first operand (torch's own
    formulas, ``torch.utils.flop_counter``, plus their in-place forms and addmv, which the engine's
    book-keeping uses). The products themselves are not computed: each returns zeros of its
    result's shape (found on the meta device), so GPT-2 small's step is counted in seconds on a
    CPU. Every decision the engine makes that changes its work (ghost norm or instantiation, tied
    weights) depends on shapes only."""

    def __init__(self) -> None:
        super().__init__()
        self.flops: Counter = Counter()
        registry = FlopCounterMode(display=False).flop_registry
        aten = torch.ops.aten
        self._formulas = {
            **registry,
            aten.addmm_: registry[aten.addmm],
            aten.baddbmm_: registry[aten.baddbmm],
            aten.addmv: torch.utils.flop_counter.shape_wrapper(_addmv_flop),
            aten.addmv_: torch.utils.flop_counter.shape_wrapper(_addmv_flop),
        }

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        formula = self._formulas.get(func._overloadpacket)
        if formula is None:
            return func(*args, **kwargs)
        first = next(t for t in args if isinstance(t, torch.Tensor))
        meta = torch.utils._pytree.tree_map(
            lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, (args, kwargs)
        )
        shaped = func(*meta[0], **meta[1])
        operands = [a for a in args if not isinstance(a, torch.dtype)]  # out_dtype overloads
        self.flops[str(first.dtype).removeprefix("torch.")] += formula(
            *operands, **kwargs, out_val=shaped
        )
        if func._schema.is_mutable:  # in place: the output is the first argument, left as it is
            return args[0]
        return torch.utils._pytree.tree_map(
            lambda t: torch.zeros(t.shape, dtype=t.dtype) if isinstance(t, torch.Tensor) else t,
            shaped,
        )


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
        attn_implementation="eager",  # matmuls (CPU sdpa is uncounted)
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).train()


def count(layers: int, steps: int, gpu_path: bool) -> dict[str, Counter]:
    """FLOPs by dtype of one non-private and one BK step with ``layers`` blocks; ``gpu_path``: the
    Grams as CUDA forms them (whole T × T products; the CPU forms only the blocks on and above the
    diagonal, ``layers/linear.py``)."""
    from dpledger.engine import BKEngine, tensor_cores
    from dpledger.engine.layers import linear
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
    engine.private_step(losses(model))  # uncounted: the first step's one-time batch provenance
    block, probe = linear.GRAM_BLOCK, tensor_cores.has_out_dtype
    if gpu_path:  # one whole Gram, and half operands multiplied as CUDA's out_dtype kernels do
        linear.GRAM_BLOCK = 1 << 62
        linear.has_out_dtype = tensor_cores.has_out_dtype = lambda device_type: True
    try:
        with FlopsByDtype() as counter:
            engine.private_step(losses(model))
    finally:
        linear.GRAM_BLOCK, linear.has_out_dtype, tensor_cores.has_out_dtype = block, probe, probe
    result["bk"] = counter.flops
    return result


def report(layers: int, steps: int, gpu_path: bool) -> None:
    """Count with 1 and 2 blocks, extrapolate to ``layers``, print the totals by dtype."""
    one, two = count(1, steps, gpu_path), count(2, steps, gpu_path)
    total = {}
    for method in ("nonprivate", "bk"):
        dtypes = set(one[method]) | set(two[method])
        total[method] = {
            d: one[method][d] + (layers - 1) * (two[method][d] - one[method][d]) for d in dtypes
        }
    base, bk = sum(total["nonprivate"].values()), sum(total["bk"].values())
    path = "CUDA path (whole Grams)" if gpu_path else "CPU path (upper-triangle Gram blocks)"
    print(f"GPT-2 small shapes, {layers} blocks, T {steps}, B 1, bf16 autocast; {path}")
    for method, flops in total.items():
        parts = ", ".join(f"{d} {v / 1e9:.2f}" for d, v in sorted(flops.items()))
        print(f"  {method:10s} {sum(flops.values()) / 1e9:8.2f} GFLOP  ({parts})")
    extra = {d: total["bk"].get(d, 0) - total["nonprivate"].get(d, 0) for d in total["bk"]}
    print(
        f"  extra {(bk - base) / 1e9:.2f} GFLOP = {100 * (bk - base) / base:.1f} % of non-private;"
        f" fp32 share of BK's matrix FLOPs {100 * total['bk'].get('float32', 0) / bk:.1f} %;"
        " extra by dtype: " + ", ".join(f"{d} {v / 1e9:+.2f}" for d, v in sorted(extra.items()))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--steps", type=int, default=256)
    args = parser.parse_args()
    for gpu_path in (True, False):
        report(args.layers, args.steps, gpu_path)


if __name__ == "__main__":
    main()
