"""A rank's slices of the noise vector (engine/fsdp_noise.py) against the single process's whole
draw: equal bit for bit, on the Philox path (CPU float32) and the torch-chunk path (float64), at
ranges that cross block and chunk boundaries and end at the vector's short last block."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpledger import philox_normal
from dpledger.engine import NoiseSource
from dpledger.engine.fsdp_noise import draw_ranges
from dpledger.engine.noise import NOISE_CHUNK
from dpledger.errors import ParamsError

BLOCK = 4 * philox_normal.LANES


@pytest.mark.parametrize("total", [77, 3 * BLOCK, 3 * BLOCK + 5, 10_000])
def test_a_philox_window_is_that_slice_of_the_whole_vector(total):
    key = (123, 456)
    whole = np.empty(total, np.float32)
    philox_normal.fill_standard_normal(whole, key, 7, 0.5)
    windows = [(0, total), (3, total - 1), (total - 2, total), (BLOCK - 1, BLOCK + 1)]
    for lo, hi in [(lo, hi) for lo, hi in windows if hi <= total]:
        window = np.empty(hi - lo, np.float32)
        philox_normal.fill_window(window, lo, total, key, 7, 0.5)
        assert np.array_equal(window, whole[lo:hi]), (total, lo, hi)


def test_a_window_outside_the_vector_is_refused():
    with pytest.raises(ValueError, match="outside"):
        philox_normal.fill_window(np.empty(4, np.float32), 8, 10, (1, 2), 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ranges_of_a_step_are_the_single_process_noise_at_those_entries(dtype):
    numel = 2 * NOISE_CHUNK + 1000
    noise = NoiseSource(numel, seed=5, dtype=dtype)
    whole = torch.empty(numel, dtype=dtype)
    noise.draw_into(whole, 3, 0.7)
    ranges = [(0, 10), (NOISE_CHUNK - 4, NOISE_CHUNK + 6), (NOISE_CHUNK + 100, 2 * NOISE_CHUNK + 7)]
    ranges.append((numel - 9, numel))
    out = torch.empty(sum(hi - lo for lo, hi in ranges), dtype=dtype)
    draw_ranges(noise, out, ranges, 3, 0.7)
    assert torch.equal(out, torch.cat([whole[lo:hi] for lo, hi in ranges]))


def test_correlated_noise_is_refused_under_sharding():
    from dpledger.mechanisms import banded_params

    noise = NoiseSource(
        10, seed=0, mechanism="banded", mechanism_params=banded_params(2), num_steps=4
    )
    with pytest.raises(ParamsError, match="not supported with sharded parameters"):
        draw_ranges(noise, torch.empty(3), [(0, 3)], 0, 1.0)
