"""Memory per rank of the BK engine under FSDP2: parameters, gradients and optimizer state at 1, 2
and 4 ranks (CPU, gloo), which must fall as 1/N.

A GPT-2-shaped transformer (width 256, 8 blocks, vocabulary 8192, 128 positions; 8.5 M parameters),
float32, sharded by ``shard_model`` (one ``fully_shard`` per block, then the root), trained two
private AdamW steps by :class:`~dpledger.engine.fsdp.FSDPEngine` on each rank's share of a batch of
8 sequences of 64 tokens. Counted on each rank, in bytes of the tensors themselves (what FSDP
shards): the parameters' local shards, the engine's gradient buffer (its shards of the noisy sum,
which the optimizer reads as the gradients) and AdamW's state (exp_avg, exp_avg_sq). Also the
process's peak resident memory (``ru_maxrss``), which includes torch itself, the activations and
the full-sized temporaries of one layer at a time, so it falls more slowly.

Run: ``python -m benchmarks.bench_fsdp_memory [--ranks 1 2 4]``.
"""

from __future__ import annotations

import argparse
import resource

import torch
import torch.nn.functional as F
from torch import nn

from dpledger.engine.distributed import share_bounds
from dpledger.pipeline.distributed import Ranks, spawn_ranks

WIDTH, BLOCKS, VOCAB, POSITIONS, BATCH, TOKENS = 256, 8, 8192, 128, 8, 64
MIB = 1 << 20


class _LM(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=ids).logits
        return F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none").sum(1)


def _model() -> nn.Module:
    import transformers

    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=POSITIONS,
        n_embd=WIDTH,
        n_layer=BLOCKS,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    return _LM(transformers.GPT2LMHeadModel(config))


def _local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def measure(ranks: Ranks) -> dict[str, float]:
    """This rank's memory after two private AdamW steps (rank 0's is returned by spawn_ranks)."""
    from dpledger.engine.fsdp import FSDPEngine, shard_model

    model = _model()
    shard_model(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3)
    engine = FSDPEngine(model, optimizer, clip_norm=1.0, noise_multiplier=1.0, normalizer=BATCH)
    generator = torch.Generator().manual_seed(1)
    lo, hi = share_bounds(BATCH, ranks.rank, ranks.world_size)
    for _ in range(2):
        ids = torch.randint(0, VOCAB, (BATCH, TOKENS), generator=generator)[lo:hi]
        engine.backward(model(ids))
        engine.step()
    state = [t for s in optimizer.state.values() for t in s.values() if t.dim()]
    return {
        "ranks": ranks.world_size,
        "parameters": engine.numel,
        "parameter_mib": sum(_local_bytes(p) for p in trainable) / MIB,
        "gradient_mib": _local_bytes(engine._sum.buffer) / MIB,
        "optimizer_mib": sum(_local_bytes(t) for t in state) / MIB,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    rows = [spawn_ranks(measure, (), n, torch.device("cpu")) for n in args.ranks]
    base = rows[0]
    print(
        "| ranks | parameters (MiB) | gradients (MiB) | AdamW state (MiB) | sum | × 1 rank's "
        "| peak RSS (MiB) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        total = row["parameter_mib"] + row["gradient_mib"] + row["optimizer_mib"]
        first = base["parameter_mib"] + base["gradient_mib"] + base["optimizer_mib"]
        print(
            f"| {row['ranks']} | {row['parameter_mib']:.2f} | {row['gradient_mib']:.2f} | "
            f"{row['optimizer_mib']:.2f} | {total:.2f} | {total / first:.3f} | "
            f"{row['peak_rss_mib']:.0f} |"
        )
    print(f"model: {base['parameters']:,} parameters, float32")


if __name__ == "__main__":
    main()
