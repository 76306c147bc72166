"""Statistical tests that each sampler draws from the law it claims.

Every test rejects at significance ALPHA = 1e-4 (Bonferroni-split where it combines several
p-values): with a random seed a correct sampler would fail it with probability at most 1e-4; the
seeds are fixed, so the outcome is deterministic. Each test's power is shown by a wrong sampler
that the same test rejects (for example Poisson at 1.1·q).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from dpledger.sampling import build_schedule

ALPHA = 1e-4


def two_sided_chi2(statistic: float, dof: int) -> float:
    return float(min(1.0, 2 * min(stats.chi2.sf(statistic, dof), stats.chi2.cdf(statistic, dof))))


def poisson_inclusion_p_values(schedule, q: float) -> dict[str, float]:
    """p-values that each example joins each step independently with probability q.

    - total: all inclusions ~ Binomial(n·T, q) (exact binomial test);
    - per_example: Σ_i (c_i − Tq)² / (Tq(1−q)) ≈ χ²_n, two-sided (catches unequal or too-regular
      rates);
    - batch_size: Σ_t (s_t − nq)² / (nq(1−q)) ≈ χ²_T, two-sided (catches fixed sizes posing as
      Poisson).
    """
    n, steps = schedule.dataset_size, schedule.num_steps
    counts = np.bincount(schedule.indices, minlength=n)
    sizes = schedule.batch_sizes()
    per_example = float(((counts - steps * q) ** 2).sum() / (steps * q * (1 - q)))
    batch_size = float(((sizes - n * q) ** 2).sum() / (n * q * (1 - q)))
    return {
        "total": stats.binomtest(int(counts.sum()), n * steps, q).pvalue,
        "per_example": two_sided_chi2(per_example, n),
        "batch_size": two_sided_chi2(batch_size, steps),
    }


def rejects(p_values: dict[str, float]) -> bool:
    return min(p_values.values()) < ALPHA / len(p_values)


N, B, EPOCHS = 200, 20, 200  # q = 0.1, 10 steps per epoch, 2000 steps: 400 000 coin flips


def test_poisson_inclusion_frequencies_match_q():
    schedule = build_schedule("poisson", dataset_size=N, batch_size=B, epochs=EPOCHS, seed=20240601)
    assert not rejects(poisson_inclusion_p_values(schedule, B / N))


@pytest.mark.parametrize(
    "name, extra",
    [
        ("poisson", {"sample_rate": 1.1 * B / N}),
        ("fixed", {}),
        ("shuffle", {}),
        ("balls-in-bins-redrawn", {}),
    ],
)
def test_inclusion_test_rejects_samplers_that_are_not_poisson_at_q(name, extra):
    """Power: a 10% wrong q shifts the total by ~21 standard deviations; fixed and shuffled batches
    are too regular."""
    schedule = build_schedule(
        name, dataset_size=N, batch_size=B, epochs=EPOCHS, seed=20240601, **extra
    )
    assert rejects(poisson_inclusion_p_values(schedule, B / N))


def subset_frequencies(schedule, n: int) -> dict[tuple[int, ...], int]:
    counts = {subset: 0 for r in range(n + 1) for subset in itertools.combinations(range(n), r)}
    for indices, _ in schedule.batches():
        counts[tuple(sorted(indices.tolist()))] += 1
    return counts


def goodness_of_fit(observed: dict, probability) -> float:
    keys = list(observed)
    expected = np.array([probability(k) for k in keys])
    observed_counts = np.array([observed[k] for k in keys])
    keep = expected > 0
    assert observed_counts[~keep].sum() == 0, "a batch the law gives probability zero"
    total = observed_counts.sum()
    return stats.chisquare(
        observed_counts[keep], total * expected[keep] / expected[keep].sum()
    ).pvalue


def test_poisson_batches_have_the_exact_law_of_independent_coins():
    """Every subset S of 4 examples has probability q^|S| (1−q)^(4−|S|); 20 000 steps."""
    n, q = 4, 0.3
    schedule = build_schedule(
        "poisson", dataset_size=n, batch_size=1, epochs=5000, seed=7, sample_rate=q
    )
    observed = subset_frequencies(schedule, n)
    assert goodness_of_fit(observed, lambda s: q ** len(s) * (1 - q) ** (n - len(s))) > ALPHA
    wrong = build_schedule(
        "poisson", dataset_size=n, batch_size=1, epochs=5000, seed=7, sample_rate=0.33
    )
    assert (
        goodness_of_fit(
            subset_frequencies(wrong, n), lambda s: q ** len(s) * (1 - q) ** (n - len(s))
        )
        < ALPHA
    )


def test_fixed_size_batches_are_uniform_subsets_of_size_b():
    n, b = 5, 2
    schedule = build_schedule("fixed", dataset_size=n, batch_size=b, epochs=3000, seed=8)
    observed = subset_frequencies(schedule, n)
    assert goodness_of_fit(observed, lambda s: float(len(s) == b)) > ALPHA


def test_shuffle_orders_are_uniform_permutations():
    n = 3
    schedule = build_schedule("shuffle", dataset_size=n, batch_size=1, epochs=6000, seed=9)
    orders = schedule.indices.reshape(-1, n)
    observed = {perm: 0 for perm in itertools.permutations(range(n))}
    for row in orders:
        observed[tuple(row.tolist())] += 1
    assert goodness_of_fit(observed, lambda perm: 1.0) > ALPHA


@pytest.mark.parametrize("name", ["balls-in-bins", "balls-in-bins-redrawn"])
def test_balls_in_bins_puts_each_example_in_an_independent_uniform_bin(name):
    """004 Def. 3.1: the joint bin assignment of 4 examples over b = 2 bins is uniform on 2⁴ cells
    (3000 seeds)."""
    n, batch_size = 4, 2
    observed = {cells: 0 for cells in itertools.product(range(2), repeat=n)}
    for seed in range(3000):
        schedule = build_schedule(name, dataset_size=n, batch_size=batch_size, epochs=1, seed=seed)
        assignment = [0] * n
        for slot in range(schedule.num_steps):
            for index in schedule.batch(slot)[0]:
                assignment[int(index)] = slot
        observed[tuple(assignment)] += 1
    assert goodness_of_fit(observed, lambda cells: 1.0) > ALPHA
