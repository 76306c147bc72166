"""BKEngine(process_group=...) on 2 gloo ranks on the CPU against the same engine in one process.

Each rank is a spawned process (``spawn_ranks``); the single-process engine is the independent
computation. Tolerance, noise off and on: the ranks add the same clipped terms in another order (two
partial sums, then one all-reduce), so float32 results agree to rounding — |Δ| ≤ 1e-6 + 1e-5·|value|
here over ≤ 12 steps. The noise itself must be bit-for-bit the single process's: only rank 0 draws
it, from (seed, step).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from dpledger.engine import BKEngine
from dpledger.engine.distributed import GroupSum, share_bounds
from dpledger.errors import DpledgerError
from dpledger.mechanisms import banded_params
from dpledger.pipeline.distributed import spawn_ranks
from dpledger.verify import distributed_trainer
from dpledger.verify.consecutive import train_consecutive
from dpledger.verify.task import make_task, weighted_half_mse

CPU = torch.device("cpu")
TOLERANCE = dict(rtol=1e-5, atol=1e-6)
ROWS, BATCH = 11, 7  # a batch of 7 rows: shares of 3 and 4


def _data() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    return model, torch.randn(ROWS, 6), torch.randn(ROWS, 3)


def _released_sums(
    mechanism: str, canary_scale: float, steps: int, ranks=None
) -> list[torch.Tensor]:
    """Every step's released noisy sum g̃ of an engine fed this rank's share (all rows without a
    group)."""
    model, x, y = _data()
    kwargs = (
        dict(mechanism="banded", mechanism_params=banded_params(3), num_steps=steps)
        if mechanism == "banded"
        else {}
    )
    group = None if ranks is None else ranks.group
    engine = BKEngine(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        clip_norm=0.5,
        noise_multiplier=0.7,
        normalizer=BATCH,
        seed=3,
        process_group=group,
        canary_hook=lambda t: [
            torch.full_like(p, canary_scale * (t + 1)) for p in model.parameters()
        ],
        **kwargs,
    )
    lo, hi = (0, BATCH) if ranks is None else share_bounds(BATCH, ranks.rank, ranks.world_size)
    sums = []
    for step in range(steps):
        rows = (torch.arange(lo, hi) + step * BATCH) % ROWS
        # step 1: an empty logical batch (every rank joins the all-reduce with no rows)
        if step != 1:
            engine.backward(((model(x[rows]) - y[rows]) ** 2).sum(1))
        engine.step()
        sums.append(torch.cat([s.reshape(-1) for s in engine.last_noisy_sum]))
    engine.detach()
    return sums


def _watched_sums(
    share: tuple[int, int],
    ranks=None,
    noise: float = 0.7,
    canary: float = 0.25,
) -> list[torch.Tensor]:
    """Every step's ``last_watched`` (released sum, this rank's clipped sum) at all coordinates,
    and the released sum, of an engine without updates (the model stays put) fed the rows
    ``share`` of each batch."""
    model, x, y = _data()
    engine = BKEngine(
        model,
        None,
        clip_norm=0.5,
        noise_multiplier=noise,
        normalizer=BATCH,
        seed=3,
        process_group=None if ranks is None else ranks.group,
        canary_hook=lambda t: [torch.full_like(p, canary) for p in model.parameters()],
    )
    engine.watch(lambda tensors: torch.cat([t.reshape(-1) for t in tensors]))
    out = []
    for step in range(3):
        rows = (torch.arange(*share) + step * BATCH) % ROWS
        engine.backward(((model(x[rows]) - y[rows]) ** 2).sum(1))
        engine.step()
        released = torch.cat([s.reshape(-1) for s in engine.last_noisy_sum])
        out.append(torch.stack([*engine.last_watched, released]))
    engine.detach()
    return out


def _rank_checks(ranks) -> dict[str, object]:
    """Everything the 2-rank tests need from one spawn (a spawn costs seconds): the released sums
    under both mechanisms, and the refusal of ranks whose models differ."""
    outcome: dict[str, object] = {
        m: _released_sums(m, 0.25, 4, ranks) for m in ("identity", "banded")
    }
    outcome["watched"] = _watched_sums(share_bounds(BATCH, ranks.rank, ranks.world_size), ranks)
    try:
        BKEngine(
            nn.Linear(4, 2 + ranks.rank),
            None,
            clip_norm=1.0,
            noise_multiplier=1.0,
            normalizer=1.0,
            process_group=ranks.group,
        )
    except DpledgerError as error:
        outcome["different_models"] = str(error)
    return outcome


@pytest.fixture(scope="module")
def two_ranks() -> dict[str, object]:
    return spawn_ranks(_rank_checks, (), 2, CPU)


@pytest.mark.parametrize("mechanism", ["identity", "banded"])
def test_two_ranks_release_the_single_process_noisy_sum_with_noise_and_canary_once(
    two_ranks, mechanism
):
    alone, ranked = _released_sums(mechanism, 0.25, 4), two_ranks[mechanism]
    for a, b in zip(alone, ranked):
        torch.testing.assert_close(b, a, **TOLERANCE)
    # an empty step releases exactly noise + canary: rank 0's alone, bit for bit (not twice, not
    # rounded)
    assert torch.equal(alone[1], ranked[1])


def test_rank_zero_watches_the_released_sum_and_its_own_clipped_sum(two_ranks):
    """The one-run audit's record on rank 0 of 2: the released sum (all ranks, noise and canary
    once) and rank 0's clipped sum alone (no noise, no canary), against single-process engines."""
    alone = _watched_sums((0, BATCH))
    own = _watched_sums(share_bounds(BATCH, 0, 2), noise=0.0, canary=0.0)  # rank 0's rows alone
    for ranked, single, clipped in zip(two_ranks["watched"], alone, own):
        assert torch.equal(ranked[0], ranked[2])  # watched = last_noisy_sum
        torch.testing.assert_close(ranked[0], single[2], **TOLERANCE)
        torch.testing.assert_close(ranked[1], clipped[2], **TOLERANCE)


def test_ranks_with_different_models_are_refused_with_one_line(two_ranks):
    assert "every rank must build the same model" in two_ranks["different_models"]


def test_shares_are_disjoint_and_cover_every_batch_size():
    for rows in range(12):
        for world in (1, 2, 3, 5):
            bounds = [share_bounds(rows, r, world) for r in range(world)]
            assert bounds[0][0] == 0 and bounds[-1][1] == rows
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            assert max(hi - lo for lo, hi in bounds) - min(hi - lo for lo, hi in bounds) <= 1


@pytest.mark.parametrize("noise_multiplier", [0.0, 1.3])
@pytest.mark.parametrize("batch_size", [1, 5])
def test_distributed_protocol_trainer_matches_the_single_process_engine(
    noise_multiplier, batch_size
):
    # batch_size 1 leaves rank 0 empty at every step (shares [0, 0) and [0, 1)); 5 splits 2 + 3
    task = make_task(0)
    settings = dict(
        loss_fn=weighted_half_mse,
        clip_norm=0.05,
        noise_multiplier=noise_multiplier,
        batch_size=batch_size,
        steps=4,
        lr=0.5,
        seed=11,
    )
    inputs, targets = task.ordinary_rows(0, 4 * batch_size)
    alone, ranked = copy.deepcopy(task.model), copy.deepcopy(task.model)
    train_consecutive(alone, inputs, targets, **settings)
    distributed_trainer.train(ranked, inputs, targets, **settings)
    for name, value in alone.state_dict().items():
        torch.testing.assert_close(ranked.state_dict()[name], value, **TOLERANCE)
        assert not torch.equal(value, task.model.state_dict()[name])


def test_a_group_without_torch_distributed_is_refused():
    with pytest.raises(DpledgerError, match="init_process_group"):
        BKEngine(
            nn.Linear(2, 1),
            None,
            clip_norm=1.0,
            noise_multiplier=1.0,
            normalizer=1.0,
            process_group=GroupSum(),
        )
