"""The CPU noise generator: Philox4x32-10 against Random123's known answers, the vectorized Box–Muller
against numpy's float64 log/cos/sin on the same words, layout invariance, and the N(0, 1) law."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numba import njit
from scipy import stats

from dpledger.engine import philox_normal as pn


@pytest.mark.parametrize(
    "counter, key, expected",
    [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ],
)
def test_philox_matches_random123_known_answers(counter, key, expected):
    assert tuple(int(w) for w in pn.philox4x32(*counter, *key)) == expected


def _reference(key, step, numel):
    """The documented layout recomputed with numpy's float64 log, cos and sin from scalar Philox words."""
    out = np.empty(numel)
    for start in range(0, numel, 4 * pn.LANES):
        lanes = min(pn.LANES, (numel - start + 3) // 4)
        block = start // (4 * pn.LANES)
        words = np.array([pn.philox4x32(block * pn.LANES + lane, 0, step & 0xFFFFFFFF, step >> 32, *key)
                          for lane in range(lanes)], dtype=np.float64).T
        u = (words + 0.5) / 2**32
        draws = []
        for radius, angle in ((u[0], u[1]), (u[2], u[3])):
            rho = np.sqrt(-2 * np.log(radius))
            draws += [rho * np.cos(2 * np.pi * angle), rho * np.sin(2 * np.pi * angle)]
        out[start:start + 4 * lanes] = np.concatenate(draws)[:numel - start]
    return out


@pytest.mark.parametrize("numel", [1, 7, 4 * 1024, 4 * 1024 + 4 * 300 + 3])
def test_draws_follow_the_documented_layout_to_float32_rounding(numel):
    out = np.empty(numel, np.float32)
    pn.fill_standard_normal(out, (11, 12), 2**32 + 5)
    reference = _reference((11, 12), 2**32 + 5, numel)
    np.testing.assert_allclose(out, reference, rtol=2e-7, atol=2e-7)


def test_log_and_turn_functions_are_accurate_over_their_whole_range():
    @njit
    def evaluate(u, v):
        logs, sines, cosines = np.empty_like(u), np.empty_like(v), np.empty_like(v)
        for i in range(u.shape[0]):
            logs[i] = pn._log(u[i])
            sines[i], cosines[i] = pn._sin_cos_turn(v[i])
        return logs, sines, cosines

    rng = np.random.default_rng(0)
    u = np.concatenate([rng.random(20000), [2.0**-64, 0.5 * 2.0**-32, 1 - 2.0**-33, math.sqrt(0.5), math.sqrt(2) / 2]])
    v = np.concatenate([rng.random(20000), [0.0, 0.125, 0.25, 0.5, 0.75, 1 - 2.0**-33]])[:u.size]
    logs, sines, cosines = evaluate(u, v)
    assert np.max(np.abs(logs - np.log(u)) / np.maximum(np.abs(np.log(u)), 1e-300)) < 1e-13
    assert np.max(np.abs(sines - np.sin(2 * np.pi * v))) < 1e-14
    assert np.max(np.abs(cosines - np.cos(2 * np.pi * v))) < 1e-14


def test_a_zero_radius_word_is_refined_with_the_second_counter_so_the_tail_reaches_9_sigma():
    @njit
    def transform(radius_words, refined, angle_words):
        values = np.empty(2 * radius_words.shape[0], np.float32)
        pn._box_muller(radius_words, refined, angle_words, radius_words.shape[0], 0, values, 1.0)
        return values

    radius = np.array([0, 5], np.uint32)
    refined = np.array([0, 999], np.uint32)
    angle = np.array([0, 0], np.uint32)
    values = transform(radius, refined, angle)
    assert values[0] == pytest.approx(math.sqrt(-2 * math.log(0.5 * 2.0**-64)) * math.cos(math.pi * 2.0**-32), rel=1e-6)
    assert values[0] > 9.4
    assert values[1] == pytest.approx(math.sqrt(-2 * math.log(5.5 * 2.0**-32)), rel=1e-6)  # the refinement is unused


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
    assert abs(np.corrcoef(whole, other_step)[0, 1]) < 0.01 and abs(np.corrcoef(whole, other_key)[0, 1]) < 0.01


def test_draws_are_standard_normal():
    draws = np.empty(2_000_000, np.float32)
    pn.fill_standard_normal(draws, (7, 8), 0)
    assert stats.kstest(draws, "norm").pvalue > 1e-3
    assert abs(draws.mean()) < 5 * 1 / math.sqrt(draws.size)
    assert abs(draws.var() - 1) < 5 * math.sqrt(2 / draws.size)
    beyond = int(np.sum(np.abs(draws) > 3))
    expected = draws.size * 2 * stats.norm.sf(3)
    assert abs(beyond - expected) < 5 * math.sqrt(expected)
    lag = np.corrcoef(draws[:-1], draws[1:])[0, 1]  # cos/sin pairs of one word pair are uncorrelated
    assert abs(lag) < 5 / math.sqrt(draws.size)


def test_bad_arrays_are_refused():
    with pytest.raises(ValueError, match="float32"):
        pn.fill_standard_normal(np.empty(8), (0, 0), 0)
    with pytest.raises(ValueError, match="step"):
        pn.fill_standard_normal(np.empty(8, np.float32), (0, 0), -1)
