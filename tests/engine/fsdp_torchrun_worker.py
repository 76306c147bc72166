"""One torchrun worker of ``test_fsdp_multinode.py``: the tiny GPT-2 of ``test_fsdp_engine.py``
sharded over torchrun's group (gloo), trained two private steps; rank 0 saves the gathered model.

Run as ``torchrun ... tests/engine/fsdp_torchrun_worker.py OUT.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from test_fsdp_engine import _sharded_run  # noqa: E402

from dpledger.pipeline.distributed import Ranks  # noqa: E402


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    try:
        ranks = Ranks(dist.get_rank(), dist.get_world_size(), 0, dist.group.WORLD)
        result = _sharded_run("gpt2", ranks)
        if ranks.rank == 0:
            torch.save({"state": result["state"], "world": ranks.world_size}, out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
