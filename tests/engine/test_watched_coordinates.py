"""The watched coordinates of the one-run audit (``engine/watched.py``): gathered from whole
tensors, and from row shards as FSDP holds them, whose per-rank shares sum to the whole gather."""

from __future__ import annotations

import torch

from dpledger.engine.watched import Coordinates


def _coordinates() -> tuple[Coordinates, list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randn(5, 3, generator=generator), torch.randn(7, generator=generator)]
    parts = ((0, torch.tensor([0, 4, 8, 14])), (1, torch.tensor([1, 6])))
    return Coordinates(parts), tensors


def test_the_shares_of_row_shards_sum_to_the_whole_gather():
    coordinates, tensors = _coordinates()
    whole = coordinates(tensors)
    assert torch.equal(whole[:4], tensors[0].reshape(-1)[[0, 4, 8, 14]])
    shares = []
    for rows in ((0, 2), (2, 4), (4, 5)):  # three ranks; parameter 1 left whole, held by rank 0
        shard = tensors[0][rows[0] : rows[1]]
        rank_zero = rows[0] == 0
        shares.append(
            coordinates.held([shard, tensors[1]], [rows[0] * 3, 0 if rank_zero else None])
        )
    torch.testing.assert_close(sum(shares), whole, rtol=0, atol=0)


def test_an_empty_shard_contributes_zeros():
    coordinates, tensors = _coordinates()
    share = coordinates.held([tensors[0][:0], tensors[1]], [15, None])
    assert torch.equal(share, torch.zeros(6))
