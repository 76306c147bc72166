"""Numbers in the report: a claimed epsilon is never shown smaller than proven, an empirical bound
never larger."""

from __future__ import annotations

import math
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from dpledger.report.formatting import (
    flatten,
    format_change,
    format_exact,
    format_for_key,
    format_lower,
    format_percent,
    format_upper,
    format_value,
    humanize,
)

positive = st.floats(min_value=1e-12, max_value=1e12, allow_nan=False, allow_infinity=False)


def _parse(text: str) -> Fraction:
    """The exact number a reader sees (Fraction parses decimal text exactly)."""
    return Fraction(text.replace(",", ""))


@given(positive)
def test_upper_never_understates_and_lower_never_overstates(value):
    # the float's shortest decimal text, the number an accountant "returned"
    shown = Fraction(repr(value))
    up, down = _parse(format_upper(value)), _parse(format_lower(value))
    assert up >= shown >= down
    assert up - down <= Fraction(2, 1000) * shown  # within one unit of the 4th significant digit


def test_rounding_direction_against_a_naive_computation():
    for value in (3.0000049, 2.99996, 0.123449, 7.77771, 1e-5 * 1.00001):
        exponent = math.floor(math.log10(value)) - 3
        naive_up = (
            math.ceil(Fraction(repr(value)) / Fraction(10) ** exponent) * Fraction(10) ** exponent
        )
        assert _parse(format_upper(value)) == naive_up
    assert format_upper(3.0000049) == "3.001" and format_lower(3.0000049) == "3"
    assert format_upper(2.99996) == "3" and format_lower(2.99996) == "2.999"
    assert format_lower(0.83) == "0.83" and format_upper(0.83) == "0.83"


def test_format_value_is_short_and_exact_for_integers():
    assert format_value(None) == "—"
    assert format_value(True) == "yes" and format_value(False) == "no"
    assert format_value(225) == "225" and format_value(1_000_000) == "1,000,000"
    assert format_value(1e-5) == "1e-5" and format_value(0.04450625) == "0.04451"
    assert format_value(float("inf")) == "∞" and format_value(float("nan")) == "nan"
    assert format_value(list(range(100))) == "[0, 1, 2, 3, 4, 5, … (100 items)]"
    assert float(format_exact(64 / 1438)) == 64 / 1438  # every digit: the text round-trips


def test_keyed_rounding_follows_the_meaning_of_the_key():
    assert format_for_key("epsilon", 3.0000049) == "3.001"
    assert format_for_key("epsilon_emp", 0.83339) == "0.8333"
    assert format_for_key("epsilon_lower", 0.83339) == "0.8333"
    assert format_for_key("fpr", 0.83339) == "0.8334"


def test_percent_and_change():
    assert format_percent(0.8861) == "88.61 %" and format_percent(12.0) == "12"
    assert format_change(3.0, 2.0) == "−1" and format_change(2, 3) == "+1"
    assert format_change("poisson", "shuffle") == "changed" and format_change(1, 1) == ""


def test_flatten_and_humanize():
    assert flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": {}}) == [
        ("a.b", 1),
        ("a.c.d", [1, 2]),
        ("e", {}),
    ]
    assert humanize("epsilon_vs_step") == "ε vs step"  # Greek stays lower case: 'Ε' would read as E
    assert (
        humanize("rmse_vs_epsilon") == "RMSE vs ε"
        and humanize("epsilon_emp_vs_n") == "ε (empirical) vs N"
    )
    assert humanize("batch-size_histogram") == "Batch size histogram"
