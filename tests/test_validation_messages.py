"""The shared validators raise the house refusal: one line, ``[where: ]name = value is invalid:
requirement``, the value quoted when it is a string, NaN refused like any value outside."""

from __future__ import annotations

import math

import pytest

from dpledger import validation
from dpledger.errors import ParamsError


def _message(check, *args, **kwargs) -> str:
    with pytest.raises(ParamsError) as refusal:
        check(*args, **kwargs)
    message = str(refusal.value)
    assert "\n" not in message
    return message


def test_invalid_names_the_place_the_parameter_and_the_requirement():
    error = validation.invalid("train.model", "resnet", "allowed values are mlp", where="params")
    assert str(error) == "params: train.model = 'resnet' is invalid: allowed values are mlp"
    assert str(validation.invalid("steps", 0, "it must be >= 1")) == (
        "steps = 0 is invalid: it must be >= 1"
    )


def test_one_of_lists_the_allowed_values_and_the_note():
    validation.one_of("verification", "plain", ("auto", "plain"))
    assert _message(validation.one_of, "verification", "fast", ("auto", "plain"), note=" (x)") == (
        "verification = 'fast' is invalid: allowed values are auto, plain (x)"
    )


@pytest.mark.parametrize(
    "interval,inside,outside,shown",
    [
        ("open", [0.5], [0.0, 1.0, math.nan, math.inf], "(0, 1)"),
        ("closed", [0.0, 1.0], [-1e-9, 1.0 + 1e-9, math.nan], "[0, 1]"),
        ("left-open", [1.0], [0.0, math.nan], "(0, 1]"),
        ("right-open", [0.0], [1.0], "[0, 1)"),
    ],
)
def test_within_keeps_each_end_open_or_closed_as_asked(interval, inside, outside, shown):
    for value in inside:
        validation.within("q", value, 0, 1, interval=interval)
    for value in outside:
        message = _message(validation.within, "q", value, 0, 1, interval=interval)
        assert message == f"q = {value} is invalid: it must lie in {shown}"


def test_at_least_and_positive_refuse_below_their_bound():
    validation.at_least("bins", 3, 1, integer=True)
    assert _message(validation.at_least, "bins", 0, 1, integer=True) == (
        "bins = 0 is invalid: it must be an integer >= 1"
    )
    assert "an integer" in _message(validation.at_least, "bins", 1.5, 1, integer=True)
    assert _message(validation.at_least, "games per side", 1, 2, where="audit") == (
        "audit: games per side = 1 is invalid: it must be at least 2"
    )
    validation.positive("sigma", 0.0, allow_zero=True)
    for value in (0.0, -1.0, math.inf, math.nan):
        assert "it must be a finite number > 0" in _message(validation.positive, "sigma", value)
