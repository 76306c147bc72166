"""The battery's statistics against independent computations (statsmodels, closed forms,
simulation)."""

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats
from statsmodels.stats.multitest import multipletests

from dpledger.verify.heuristics import noise_onset, plateau_start
from dpledger.verify.stats import (
    f_test_two_sided,
    holm_thresholds,
    is_flat,
    slope_test,
    variance_ratio_lower_p,
)


def test_slope_test_matches_statsmodels_ols():
    rng = np.random.default_rng(0)
    x = np.linspace(1, 10, 12)
    y = 0.3 * x + rng.normal(size=12)
    fit = sm.OLS(y, sm.add_constant(x)).fit()
    result = slope_test(x, y)
    assert result.slope == pytest.approx(fit.params[1])
    assert result.t_statistic == pytest.approx(fit.tvalues[1])
    assert result.p_value == pytest.approx(fit.pvalues[1])


def test_flat_curve_up_to_rounding_has_no_evidence_of_a_slope():
    y = 0.5 + 1e-9 * np.random.default_rng(1).normal(size=8)
    assert is_flat(y)
    assert slope_test(np.arange(8.0), y).p_value == 1.0
    assert not is_flat(np.array([1.0, 1.01]))


def _holm_by_adjusted_p_values(p, alpha):
    """Holm via adjusted p-values: p̃_(i) = max_{j ≤ i} min(1, (m − j + 1)·p_(j)); reject where p̃ ≤
    α."""
    order = np.argsort(p)
    adjusted = np.maximum.accumulate(
        np.minimum(1.0, (len(p) - np.arange(len(p))) * np.asarray(p)[order])
    )
    rejected = np.empty(len(p), dtype=bool)
    rejected[order] = adjusted <= alpha
    return rejected


def test_holm_matches_adjusted_p_values_and_statsmodels():
    rng = np.random.default_rng(2)
    for case in range(300):
        p = rng.uniform(0, 0.05, size=4) ** rng.uniform(0.5, 2)
        names = [f"t{i}" for i in range(4)]
        ours = holm_thresholds(dict(zip(names, p)), 0.02)
        assert [ours[n] for n in names] == list(_holm_by_adjusted_p_values(p, 0.02))
        if case < 3:
            assert [ours[n] for n in names] == list(multipletests(p, alpha=0.02, method="holm")[0])


def test_variance_ratio_p_is_uniform_under_the_null_and_small_for_too_little_noise():
    rng = np.random.default_rng(3)
    p_values = [variance_ratio_lower_p(rng.normal(size=500))[1] for _ in range(400)]
    assert stats.kstest(p_values, "uniform").pvalue > 0.001
    ratio, p = variance_ratio_lower_p(0.8 * rng.normal(size=500))
    assert ratio == pytest.approx(0.64, rel=0.15) and p < 1e-6


def test_f_test_detects_a_variance_ratio_of_four():
    rng = np.random.default_rng(4)
    ratio, p = f_test_two_sided(2.0 * rng.normal(size=700), rng.normal(size=700))
    assert ratio == pytest.approx(4.0, rel=0.2) and p < 1e-10
    p_values = [f_test_two_sided(rng.normal(size=300), rng.normal(size=300))[1] for _ in range(300)]
    assert np.mean(np.array(p_values) < 0.05) < 0.1


def test_plateau_start_finds_the_first_constant_tail_value():
    assert plateau_start(np.array([1.0, 2.0, 3.0, 4.0, 4.0, 4.0])) == 3
    assert plateau_start(np.array([5.0, 5.0, 5.0])) == 0
    assert plateau_start(np.array([1.0, 2.0, 3.0])) == 2


def test_noise_onset_is_where_the_change_becomes_visible_for_good():
    sigmas = (1e-3, 1e-2, 1e-1, 1.0)
    assert noise_onset(sigmas, np.array([0.0, 0.5, 0.0, 0.7]), 0.0, scale=1.0) == 1.0
    assert noise_onset(sigmas, np.array([0.0, 0.5, 0.6, 0.7]), 0.0, scale=1.0) == 1e-2
    assert noise_onset(sigmas, np.zeros(4), 0.0, scale=1.0) is None
