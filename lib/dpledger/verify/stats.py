"""Statistics of the battery: the paper's slope t-test, the noise tests, and Holm's step-down
correction."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

FLAT_RELATIVE_TOLERANCE = 1e-4
"""Curves from σ = 0 runs are deterministic: a spread below this fraction of their size is
floating-point noise."""


@dataclass(frozen=True)
class SlopeTest:
    """OLS fit ``y = a + b·x`` with the t-test of H0: b = 0 (000 §3.1, §3.2)."""

    slope: float
    t_statistic: float
    p_value: float
    flat: bool


def is_flat(y: np.ndarray, relative_tolerance: float = FLAT_RELATIVE_TOLERANCE) -> bool:
    """Whether ``y`` is constant up to floating-point noise (relative to its largest magnitude)."""
    y = np.asarray(y, dtype=np.float64)
    scale = float(np.max(np.abs(y))) if y.size else 0.0
    return bool(np.ptp(y) <= relative_tolerance * scale) if scale > 0 else True


def slope_test(x: np.ndarray, y: np.ndarray) -> SlopeTest:
    """Regression t-test of the slope; a curve that is flat up to rounding gets p = 1 (no evidence
    of a slope).

    With σ = 0 the curves are deterministic, so a bug shows as an exactly flat line whose residuals
    are rounding noise; testing that noise would give an arbitrary p, hence the flatness rule.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.size < 3:
        raise ValueError("a slope test needs at least 3 points")
    if is_flat(y):
        return SlopeTest(slope=0.0, t_statistic=0.0, p_value=1.0, flat=True)
    fit = stats.linregress(x, y)
    if fit.stderr == 0.0:
        return SlopeTest(slope=float(fit.slope), t_statistic=float("inf"), p_value=0.0, flat=False)
    t_statistic = float(fit.slope / fit.stderr)
    return SlopeTest(
        slope=float(fit.slope), t_statistic=t_statistic, p_value=float(fit.pvalue), flat=False
    )


def ks_standard_normal(z: np.ndarray) -> tuple[float, float]:
    """One-sample Kolmogorov–Smirnov test of ``z`` against N(0, 1) (000 App. C): (D statistic,
    p-value)."""
    result = stats.kstest(np.asarray(z, dtype=np.float64), "norm")
    return float(result.statistic), float(result.pvalue)


def variance_ratio_lower_p(z: np.ndarray) -> tuple[float, float]:
    """Test that standardized noise ``z`` has variance 1 against 'less': (ratio mean z², p = P(χ²_n
    ≤ Σz²))."""
    z = np.asarray(z, dtype=np.float64)
    sum_squares = float(np.sum(z * z))
    return sum_squares / z.size, float(stats.chi2.cdf(sum_squares, df=z.size))


def variance_ratio_upper_p(z: np.ndarray) -> float:
    """P(χ²_n ≥ Σz²): small when the noise is larger than claimed."""
    z = np.asarray(z, dtype=np.float64)
    return float(stats.chi2.sf(float(np.sum(z * z)), df=z.size))


def f_test_two_sided(numerator: np.ndarray, denominator: np.ndarray) -> tuple[float, float]:
    """Two-sided F-test that two zero-mean samples have equal variance: (ratio, p)."""
    numerator = np.asarray(numerator, dtype=np.float64)
    denominator = np.asarray(denominator, dtype=np.float64)
    ratio = float(np.mean(numerator**2) / np.mean(denominator**2))
    lower = stats.f.cdf(ratio, numerator.size, denominator.size)
    return ratio, float(min(1.0, 2.0 * min(lower, 1.0 - lower)))


def holm_thresholds(p_values: dict[str, float], significance: float) -> dict[str, bool]:
    """Holm's step-down procedure: which hypotheses are rejected with family-wise error ≤
    ``significance``."""
    ordered = sorted(p_values, key=p_values.get)
    rejected: dict[str, bool] = {name: False for name in p_values}
    for rank, name in enumerate(ordered):
        if p_values[name] > significance / (len(ordered) - rank):
            break
        rejected[name] = True
    return rejected
