"""The CPU noise generator: Philox4x32-10 against Random123's known answers, the float32 Box–Muller
against numpy's float64 log/cos/sin on the same words, the zero-word refinement, layout invariance,
and the N(0, 1) law."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from numba import njit
from scipy import stats

from dpledger import philox_normal as pn


@pytest.mark.parametrize(
    "counter, key, expected",
    [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ],
)
def test_philox_matches_random123_known_answers(counter, key, expected):
    assert tuple(int(w) for w in pn.philox4x32(*counter, *key)) == expected


def _words(key, step, block, lanes, second=0):
    """Philox words of a block's counters from the scalar reference, as a (4, lanes) array."""
    return np.array(
        [
            pn.philox4x32(block * pn.LANES + lane, second, step & 0xFFFFFFFF, step >> 32, *key)
            for lane in range(lanes)
        ],
        dtype=np.float64,
    ).T


def _reference(key, step, numel):
    """The documented layout recomputed with numpy's float64 log, cos and sin from scalar Philox
    words: the draws and the radius ρ each was drawn with."""
    out, radii = np.empty(numel), np.empty(numel)
    for start in range(0, numel, 4 * pn.LANES):
        lanes = min(pn.LANES, (numel - start + 3) // 4)
        words = _words(key, step, start // (4 * pn.LANES), lanes)
        u = (words + 0.5) / 2**32
        draws, rhos = [], []
        for radius, angle in ((u[0], u[1]), (u[2], u[3])):
            rho = np.sqrt(-2 * np.log(radius))
            draws += [rho * np.cos(2 * np.pi * angle), rho * np.sin(2 * np.pi * angle)]
            rhos += [rho, rho]
        out[start : start + 4 * lanes] = np.concatenate(draws)[: numel - start]
        radii[start : start + 4 * lanes] = np.concatenate(rhos)[: numel - start]
    return out, radii


@pytest.mark.parametrize("numel", [1, 7, 4 * 1024, 4 * 1024 + 4 * 300 + 3])
def test_draws_follow_the_documented_layout_to_within_four_float32_units_of_the_radius(numel):
    out = np.empty(numel, np.float32)
    pn.fill_standard_normal(out, (11, 12), 2**32 + 5, scale=3.0)
    reference, radii = _reference((11, 12), 2**32 + 5, numel)
    assert np.all(np.abs(out - 3.0 * reference) <= 4 * 2.0**-24 * 3.0 * radii)


def _edge_words():
    rng = np.random.default_rng(0)
    words = rng.integers(0, 2**32, 400_000, dtype=np.uint64)
    edges = [
        1,
        2,
        3,
        2**29 - 1,
        2**29,
        2**30 - 1,
        2**30,
        2**31,
        3 * 2**30 + 2**29,
        int(pn._NEAR_ONE) - 1,
        int(pn._NEAR_ONE),
        2**32 - 1000,
        2**32 - 2,
        2**32 - 1,
    ]
    return np.concatenate([np.array(edges, np.uint64), words]).astype(np.uint32)


def test_float32_log_and_turn_are_accurate_over_every_word():
    @njit
    def evaluate(words):
        logs, sines, cosines = (
            np.empty(words.size, np.float32),
            np.empty(words.size, np.float32),
            np.empty(words.size, np.float32),
        )
        for i in range(words.shape[0]):
            logs[i] = pn._minus_two_log(words[i], pn._ZERO)
            sines[i], cosines[i] = pn._sin_cos_turn(words[i])
        return logs, sines, cosines

    words = _edge_words()
    words = words[words != 0]
    logs, sines, cosines = evaluate(words)
    u = (words.astype(np.float64) + 0.5) / 2**32
    exact = -2 * np.log(u)
    # relative, also for U next to 1 (tiny radii)
    assert np.max(np.abs(logs - exact) / exact) < 2.0**-22
    assert np.max(np.abs(sines - np.sin(2 * np.pi * u))) < 2.0**-23
    assert np.max(np.abs(cosines - np.cos(2 * np.pi * u))) < 2.0**-23


def test_a_zero_radius_word_is_refined_with_the_second_counter_so_the_tail_reaches_9_sigma():
    @njit
    def pair(word, refined, angle):
        return pn._normal_pair(
            np.uint32(word), np.uint32(refined), np.uint32(angle), np.float32(1.0)
        )

    assert pair(0, 0, 0)[0] == pytest.approx(math.sqrt(-2 * math.log(0.5 * 2.0**-64)), rel=1e-6)
    assert pair(0, 0, 0)[0] > 9.4
    # unused
    assert pair(5, 999, 0)[0] == pytest.approx(math.sqrt(-2 * math.log(5.5 * 2.0**-32)), rel=1e-6)

    # Found by search: under key (11, 12) at this step, lane 921 of block 0 has word 2 equal to 0.
    key, step, lane = (11, 12), 8_077_275, 921
    words, second = (
        _words(key, step, 0, pn.LANES)[:, lane],
        _words(key, step, 0, pn.LANES, second=1)[:, lane],
    )
    assert words[2] == 0
    out = np.empty(4 * pn.LANES, np.float32)
    pn.fill_standard_normal(out, key, step)
    rho = math.sqrt(-2 * math.log((second[2] + 0.5) / 2**64))
    angle = 2 * math.pi * (words[3] + 0.5) / 2**32
    assert out[2 * pn.LANES + lane] == pytest.approx(rho * math.cos(angle), abs=4 * 2.0**-24 * rho)
    assert out[3 * pn.LANES + lane] == pytest.approx(rho * math.sin(angle), abs=4 * 2.0**-24 * rho)
    reference, _ = _reference(key, step, 4 * pn.LANES)
    others = np.ones(4 * pn.LANES, bool)
    others[[2 * pn.LANES + lane, 3 * pn.LANES + lane]] = False
    # only that pair was redrawn
    assert np.allclose(out[others], reference[others], rtol=0, atol=4e-6)


def test_noise_depends_only_on_key_step_and_position():
    numel = 5 * 4 * pn.LANES + 17
    whole, parts = np.empty(numel, np.float32), np.empty(numel, np.float32)
    pn.fill_standard_normal(whole, (1, 2), 3, scale=2.5)
    blocks = pn.blocks(numel)
    for first, last in ((0, 2), (2, blocks)):
        pn.fill_standard_normal(parts, (1, 2), 3, scale=2.5, block_range=(first, last))
    assert np.array_equal(whole, parts)
    other_step, other_key = np.empty(numel, np.float32), np.empty(numel, np.float32)
    pn.fill_standard_normal(other_step, (1, 2), 4, scale=2.5)
    pn.fill_standard_normal(other_key, (1, 3), 3, scale=2.5)
    assert (
        abs(np.corrcoef(whole, other_step)[0, 1]) < 0.01
        and abs(np.corrcoef(whole, other_key)[0, 1]) < 0.01
    )


@pytest.mark.parametrize("threads", [2, 3, 7])
def test_the_thread_pool_draws_the_same_values(threads):
    numel = 5 * 4 * pn.LANES + 17
    serial, pooled = np.empty(numel, np.float32), np.empty(numel, np.float32)
    pn.fill_standard_normal(serial, (1, 2), 3, scale=0.5)
    pn.fill_standard_normal(pooled, (1, 2), 3, scale=0.5, threads=threads)
    assert np.array_equal(serial, pooled)
    pooled[:] = 0
    pn.fill_standard_normal(pooled, (1, 2), 3, scale=0.5, block_range=(1, 4), threads=threads)
    inside = slice(4 * pn.LANES, 16 * pn.LANES)
    assert np.array_equal(serial[inside], pooled[inside]) and not pooled[: 4 * pn.LANES].any()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_use_the_numba_pool():
    # the parent has launched the pool (GNU OpenMP would abort a child using it)
    pn.pool_is_usable()
    child = os.fork()
    if child == 0:
        os._exit(0 if pn.pool_is_usable() is False else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_draws_are_standard_normal():
    draws = np.empty(2_000_000, np.float32)
    pn.fill_standard_normal(draws, (7, 8), 0)
    assert stats.kstest(draws, "norm").pvalue > 1e-3
    assert abs(draws.mean()) < 5 * 1 / math.sqrt(draws.size)
    assert abs(draws.var() - 1) < 5 * math.sqrt(2 / draws.size)
    beyond = int(np.sum(np.abs(draws) > 3))
    expected = draws.size * 2 * stats.norm.sf(3)
    assert abs(beyond - expected) < 5 * math.sqrt(expected)
    # cos/sin pairs of one word pair are uncorrelated
    lag = np.corrcoef(draws[:-1], draws[1:])[0, 1]
    assert abs(lag) < 5 / math.sqrt(draws.size)


def test_bad_arrays_are_refused():
    with pytest.raises(ValueError, match="float32"):
        pn.fill_standard_normal(np.empty(8), (0, 0), 0)
    with pytest.raises(ValueError, match="step"):
        pn.fill_standard_normal(np.empty(8, np.float32), (0, 0), -1)
    with pytest.raises(ValueError, match="threads"):
        pn.fill_standard_normal(np.empty(8, np.float32), (0, 0), 0, threads=0)
