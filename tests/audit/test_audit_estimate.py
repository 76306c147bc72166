"""ε_emp estimation: Clopper–Pearson bounds, 002 Eq. 1, threshold methods and their validity."""

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from dpledger.audit.estimate import (
    clopper_pearson_upper,
    count_grid,
    epsilon_from_rates,
    estimate_epsilon,
)
from dpledger.audit.selfcheck import run_selfcheck
from dpledger.audit.verdict import judge, project_epsilon
from dpledger.errors import ParamsError


@pytest.mark.parametrize("count,trials", [(0, 10), (3, 50), (40, 1000), (999, 1000)])
def test_clopper_pearson_upper_is_the_binomial_tail_inversion(count, trials):
    upper = float(clopper_pearson_upper(count, trials, 0.025))
    assert stats.binom.cdf(count, trials, upper) == pytest.approx(0.025, rel=1e-6)
    assert upper == pytest.approx(stats.beta.ppf(0.975, count + 1, trials - count))


def test_clopper_pearson_upper_of_all_successes_is_one():
    assert clopper_pearson_upper(10, 10, 0.05) == 1.0


def test_epsilon_from_rates_matches_eq1_by_hand():
    fpr, fnr, delta = 0.01, 0.5, 1e-5
    expected = max(math.log((1 - fpr - delta) / fnr), math.log((1 - fnr - delta) / fpr), 0.0)
    assert float(epsilon_from_rates(fpr, fnr, delta)) == pytest.approx(expected)
    assert float(epsilon_from_rates(0.6, 0.6, delta)) == 0.0


def naive_max_epsilon(present, absent, delta, alpha_each):
    """002 App. B Alg. 5 written as a plain loop over every threshold."""
    best = 0.0
    games = len(present)
    for tau in np.concatenate([present, absent]):
        fp = int(np.sum(absent > tau))
        fn = int(np.sum(present <= tau))
        fpr = float(clopper_pearson_upper(fp, games, alpha_each))
        fnr = float(clopper_pearson_upper(fn, games, alpha_each))
        best = max(best, float(epsilon_from_rates(fpr, fnr, delta)))
    return best


def test_max_method_equals_the_papers_sweep():
    rng = np.random.default_rng(0)
    present, absent = rng.normal(2.0, 1.0, 300), rng.normal(0.0, 1.0, 300)
    fast = estimate_epsilon(present, absent, delta=1e-5, method="max")
    assert fast.epsilon == pytest.approx(naive_max_epsilon(present, absent, 1e-5, 0.025), rel=1e-9)
    assert not fast.valid


def test_bonferroni_is_below_max_and_split_is_valid_labelled():
    rng = np.random.default_rng(1)
    present, absent = rng.normal(3.0, 1.0, 5000), rng.normal(0.0, 1.0, 5000)
    maximum = estimate_epsilon(present, absent, delta=1e-5, method="max")
    bonferroni = estimate_epsilon(present, absent, delta=1e-5, method="bonferroni")
    split = estimate_epsilon(present, absent, delta=1e-5, method="split")
    assert 0 < bonferroni.epsilon < maximum.epsilon
    assert bonferroni.valid and split.valid
    assert bonferroni.thresholds_tried == 2 * len(count_grid(5000))


def test_count_grid_is_geometric_and_within_range():
    grid = count_grid(1000)
    assert grid[0] == 0 and grid[-1] <= 999 and np.all(np.diff(grid) > 0)
    assert list(grid[:5]) == [0, 1, 2, 4, 8]


def test_estimate_refuses_bad_input():
    with pytest.raises(ParamsError, match="threshold"):
        estimate_epsilon(np.zeros(5), np.ones(5), delta=1e-5, method="best")
    with pytest.raises(ParamsError, match="equal length"):
        estimate_epsilon(np.zeros(5), np.ones(6), delta=1e-5)
    with pytest.raises(ParamsError, match="NaN"):
        estimate_epsilon(np.array([0.0, np.nan]), np.ones(2), delta=1e-5)


def test_selfcheck_laplace_max_false_alarms_but_valid_methods_do_not():
    """On Laplace every tail threshold is tight, so the uncorrected maximum over-states ε."""
    maximum = run_selfcheck("laplace", method="max", repeats=60, observations=4000, progress=False)
    assert maximum.false_alarms >= 4
    for method in ("bonferroni", "split"):
        check = run_selfcheck(
            "laplace", method=method, repeats=60, observations=4000, progress=False
        )
        assert check.false_alarms <= 3, method
        assert check.passed


def test_verdict_contradicted_inconclusive_consistent():
    rng = np.random.default_rng(2)
    present, absent = rng.normal(4.0, 1.0, 20000), rng.normal(0.0, 1.0, 20000)
    strong = estimate_epsilon(present, absent, delta=1e-5)
    eps = strong.epsilon
    assert judge(strong, eps - 0.5, present, absent).verdict == "contradicted"
    assert judge(replace(strong, valid=False), eps - 0.5, present, absent).verdict == "inconclusive"
    # the bound is looser than the point estimate
    weak, null = (
        rng.normal(2.0, 1.0, 2000),
        rng.normal(0.0, 1.0, 2000),
    )
    loose = estimate_epsilon(weak, null, delta=1e-5)
    point = judge(loose, 50.0, weak, null).point_estimate
    assert point > loose.epsilon
    between = judge(loose, (loose.epsilon + point) / 2, weak, null)
    assert between.verdict == "inconclusive"
    assert judge(strong, 50.0, present, absent).verdict == "consistent"


def test_projection_grows_with_observations():
    rng = np.random.default_rng(3)
    present, absent = rng.normal(3.0, 1.0, 5000), rng.normal(0.0, 1.0, 5000)
    projection = project_epsilon(present, absent, delta=1e-5, confidence=0.95)
    values = [eps for _, eps in projection]
    assert projection[0][0] == 10000 and all(b >= a - 1e-12 for a, b in zip(values, values[1:]))
