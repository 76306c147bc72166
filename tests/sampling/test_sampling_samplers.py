"""Structural properties of every built-in sampler, checked on random sizes and seeds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpledger.sampling import SAMPLERS, build_sampler, build_schedule

PER_EPOCH_PARTITIONS = (
    "shuffle",
    "sequential",
    "partial-shuffle",
    "batch-then-shuffle",
    "balls-in-bins",
    "balls-in-bins-redrawn",
)


def sizes_and_seed():
    return st.integers(1, 60).flatmap(
        lambda n: st.tuples(
            st.just(n), st.integers(1, n), st.integers(1, 3), st.integers(0, 2**32 - 1)
        )
    )


def options(name: str, batch_size: int) -> dict:
    return {"buffer_size": 2 * batch_size + 1} if name == "partial-shuffle" else {}


def epochs_of(schedule):
    """Each epoch's concatenated real indices."""
    spe = schedule.steps_per_epoch
    for epoch in range(schedule.num_steps // spe):
        lo, hi = schedule.offsets[epoch * spe], schedule.offsets[(epoch + 1) * spe]
        yield schedule.indices[lo:hi][~schedule.padding[lo:hi]]


@settings(max_examples=40, deadline=None)
@given(sizes_and_seed(), st.sampled_from(PER_EPOCH_PARTITIONS))
def test_every_example_exactly_once_per_epoch(sizes, name):
    n, batch_size, epochs, seed = sizes
    schedule = build_schedule(
        name,
        dataset_size=n,
        batch_size=batch_size,
        epochs=epochs,
        seed=seed,
        **options(name, batch_size),
    )
    assert schedule.num_steps == epochs * schedule.steps_per_epoch
    for used in epochs_of(schedule):
        assert np.array_equal(np.sort(used), np.arange(n))


@settings(max_examples=30, deadline=None)
@given(
    sizes_and_seed(),
    st.sampled_from(("shuffle", "sequential", "partial-shuffle", "batch-then-shuffle")),
)
def test_drop_last_keeps_full_batches_and_each_example_at_most_once(sizes, name):
    n, batch_size, epochs, seed = sizes
    schedule = build_schedule(
        name,
        dataset_size=n,
        batch_size=batch_size,
        epochs=epochs,
        seed=seed,
        last_batch="drop",
        **options(name, batch_size),
    )
    assert schedule.steps_per_epoch == n // batch_size
    assert np.all(schedule.batch_sizes() == batch_size)
    for used in epochs_of(schedule):
        assert used.size == np.unique(used).size == (n // batch_size) * batch_size


@settings(max_examples=30, deadline=None)
@given(sizes_and_seed())
def test_fixed_bins_keep_each_example_in_its_bin_across_epochs(sizes):
    n, batch_size, _, seed = sizes
    schedule = build_schedule(
        "balls-in-bins", dataset_size=n, batch_size=batch_size, epochs=3, seed=seed
    )
    spe = schedule.steps_per_epoch
    first_epoch = [np.sort(schedule.batch(t)[0]) for t in range(spe)]
    for t in range(schedule.num_steps):
        assert np.array_equal(np.sort(schedule.batch(t)[0]), first_epoch[t % spe])


def test_redrawn_bins_change_between_epochs():
    schedule = build_schedule(
        "balls-in-bins-redrawn", dataset_size=200, batch_size=10, epochs=2, seed=3
    )
    spe = schedule.steps_per_epoch
    assert any(
        not np.array_equal(schedule.batch(t)[0], schedule.batch(t + spe)[0]) for t in range(spe)
    )


@settings(max_examples=30, deadline=None)
@given(sizes_and_seed(), st.sampled_from(("balls-in-bins", "balls-in-bins-redrawn")))
def test_pad_truncate_batches_have_exactly_b_rows_and_marked_padding(sizes, name):
    n, batch_size, epochs, seed = sizes
    plain = build_schedule(name, dataset_size=n, batch_size=batch_size, epochs=epochs, seed=seed)
    padded = build_schedule(
        name, dataset_size=n, batch_size=batch_size, epochs=epochs, seed=seed, pad_truncate=True
    )
    assert padded.normalizer == batch_size and plain.normalizer is None
    assert np.all(np.diff(padded.offsets) == batch_size)
    assert np.all((padded.indices >= 0) & (padded.indices < n))
    for t in range(plain.num_steps):
        members, _ = plain.batch(t)
        rows, padding = padded.batch(t)
        kept = min(members.size, batch_size)
        # same bins; truncation keeps the first B
        assert np.array_equal(rows[:kept], members[:kept])
        # padding rows last, all marked
        assert np.array_equal(padding, np.arange(batch_size) >= kept)


def test_padding_rows_contribute_zero_gradient_in_a_per_example_training_step():
    """A plain per-example DP-SGD step weighting each row by ~padding equals the step on the real
    rows alone."""
    schedule = build_schedule(
        "balls-in-bins", dataset_size=40, batch_size=8, epochs=1, seed=5, pad_truncate=True
    )
    padded_step = next(t for t in range(schedule.num_steps) if schedule.batch(t)[1].any())
    rows, padding = schedule.batch(padded_step)
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 3, generator=generator), torch.randn(40, generator=generator)
    weight = torch.randn(3, generator=generator, requires_grad=True)

    def clipped_gradient(i: int, row_weight: float) -> torch.Tensor:
        loss = row_weight * (x[i] @ weight - y[i]) ** 2
        (grad,) = torch.autograd.grad(loss, weight)
        return grad / max(1.0, float(grad.norm()) / 1.0)

    per_row = torch.stack(
        [clipped_gradient(int(i), float(not pad)) for i, pad in zip(rows, padding)]
    )
    assert torch.all(per_row[torch.from_numpy(padding)] == 0)
    real_only = torch.stack([clipped_gradient(int(i), 1.0) for i in rows[~padding]])
    torch.testing.assert_close(
        per_row.sum(0) / schedule.normalizer,
        real_only.sum(0) / schedule.normalizer,
        rtol=0,
        atol=1e-6,
    )


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_same_seed_gives_identical_schedule_and_another_seed_a_different_one(name):
    def make(seed):
        return build_schedule(
            name, dataset_size=97, batch_size=10, epochs=2, seed=seed, **options(name, 10)
        )

    first, again, other = make(11), make(11), make(12)
    assert np.array_equal(first.indices, again.indices) and np.array_equal(
        first.offsets, again.offsets
    )
    if name != "sequential":
        assert not np.array_equal(first.indices, other.indices)


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_resuming_at_step_t_regenerates_the_remaining_batches(name):
    sampler = build_sampler(
        name, dataset_size=53, batch_size=7, epochs=3, seed=2, **options(name, 7)
    )
    full = list(sampler.batches())
    for start in (0, 1, sampler.steps_per_epoch, sampler.steps_per_epoch + 3, sampler.num_steps):
        resumed = list(sampler.batches(start))
        assert len(resumed) == len(full) - start
        assert all(np.array_equal(a.indices, b.indices) for a, b in zip(resumed, full[start:]))


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_batches_are_distinct_valid_indices(name):
    schedule = build_schedule(
        name, dataset_size=64, batch_size=9, epochs=2, seed=4, **options(name, 9)
    )
    for indices, padding in schedule.batches():
        assert (
            indices.dtype == np.int64 and padding.dtype == bool and indices.shape == padding.shape
        )
        real = indices[~padding]
        assert real.size == np.unique(real).size
        assert np.all((real >= 0) & (real < 64))


def test_sampler_is_a_dataloader_batch_sampler():
    sampler = build_sampler(
        "balls-in-bins", dataset_size=30, batch_size=4, epochs=2, seed=0, pad_truncate=True
    )
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.arange(30)), batch_sampler=sampler
    )
    assert len(loader) == sampler.num_steps
    loaded = [batch[0].tolist() for batch in loader]
    expected = [b.indices[~b.padding].tolist() for b in sampler.batches()]
    assert loaded == expected


def test_partial_shuffle_keeps_each_window_in_its_own_stretch_of_batches():
    """002 §7.1: with buffer K a multiple of B, window w's examples fill exactly batches w·K/B ..
    (w+1)·K/B − 1."""
    n, batch_size, buffer_size = 100, 5, 20
    schedule = build_schedule(
        "partial-shuffle",
        dataset_size=n,
        batch_size=batch_size,
        epochs=2,
        seed=1,
        buffer_size=buffer_size,
    )
    per_window = buffer_size // batch_size
    for t in range(schedule.num_steps):
        window = (t % schedule.steps_per_epoch) // per_window
        indices, _ = schedule.batch(t)
        assert np.all(indices // buffer_size == window)
    full = build_schedule(
        "partial-shuffle", dataset_size=n, batch_size=batch_size, epochs=1, seed=1, buffer_size=n
    )
    # K = n is a full shuffle, not dataset order
    assert not np.all(np.diff(full.indices[:buffer_size]) > 0)


def test_batch_then_shuffle_batches_are_consecutive_ranges_in_shuffled_order():
    schedule = build_schedule("batch-then-shuffle", dataset_size=23, batch_size=5, epochs=2, seed=0)
    firsts = []
    for t in range(schedule.num_steps):
        indices, _ = schedule.batch(t)
        assert indices[0] % 5 == 0 and np.array_equal(
            indices, np.arange(indices[0], min(indices[0] + 5, 23))
        )
        firsts.append(int(indices[0]))
    assert sorted(firsts[:5]) == [0, 5, 10, 15, 20] and firsts[:5] != [0, 5, 10, 15, 20]


def test_sequential_is_dataset_order():
    schedule = build_schedule("sequential", dataset_size=12, batch_size=5, epochs=2, seed=0)
    assert schedule.indices.tolist() == list(range(12)) * 2
    assert schedule.batch_sizes().tolist() == [5, 5, 2] * 2
