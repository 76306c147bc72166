"""`dpledger epsilon` / `noise`: one line for bad input (issue 21), shared defaults, failure
probability and δ >= 1/n beside ε (issue 22)."""

import inspect
import json

import pytest
from typer.testing import CliRunner

from dpledger.cli import app
from dpledger.errors import DpledgerError
from dpledger.params.calibrate import CalibrateParams

BASE = ["--delta", "1e-5", "--sample-rate", "0.01"]
# the start of an `epsilon` call on balls-in-bins, up to --mechanism
BINS = ["epsilon", "--noise-multiplier", "1", "--delta", "1e-5", "--sampler", "balls-in-bins"]
BINS += ["--batches-per-epoch", "8", "--epochs", "1", "--mechanism"]


def _run(*args):
    return CliRunner().invoke(app, list(args))


def _one_line_error(result, *words):
    """``main`` prints a DpledgerError as one ``error:`` line (exit 2); anything else is a
    traceback."""
    assert isinstance(result.exception, DpledgerError), repr(result.exception)
    text = str(result.exception)
    assert len(text.splitlines()) == 1, text
    for word in words:
        assert word in text, text


@pytest.mark.parametrize(
    "args,words",
    [
        (["noise", "--epsilon", "1e6", *BASE, "--epochs", "1"], ["epsilon", "(0, 100]"]),
        (["noise", "--epsilon", "1", *BASE], ["--epochs", "missing"]),
        (
            ["epsilon", "--noise-multiplier", "1e-3", *BASE, "--epochs", "1"],
            ["--noise-multiplier", ">= 0.01"],
        ),
        (
            [*BINS, "banded", "--bands", "-3"],
            ["--bands", "[1, 4096]"],
        ),
        (
            [*BINS, "toeplitz", "--mechanism-params", "[1,2]"],
            ["--mechanism-params", "JSON object"],
        ),
        (
            [
                "epsilon",
                "--noise-multiplier",
                "1",
                "--delta",
                "nan",
                "--sample-rate",
                "0.01",
                "--epochs",
                "1",
            ],
            ["--delta", "finite"],
        ),
    ],
)
def test_bad_input_is_one_line(args, words):
    _one_line_error(_run(*args), *words)


def test_delta_at_least_one_over_n_warns_before_epsilon():
    args = (
        "epsilon",
        "--noise-multiplier",
        "1",
        "--delta",
        "0.05",
        "--dataset-size",
        "50",
        "--batch-size",
        "5",
    )
    result = _run(*args, "--epochs", "2")
    assert result.exit_code == 0
    assert result.output.splitlines()[0].startswith("WARNING: delta = 0.05 >= 1/n")
    payload = json.loads(_run(*args, "--epochs", "2", "--json").output)
    assert payload["warnings"]


MONTE_CARLO = [
    "epsilon",
    "--noise-multiplier",
    "1",
    "--delta",
    "0.05",
    "--sampler",
    "balls-in-bins",
    "--batches-per-epoch",
    "4",
    "--epochs",
    "1",
    "--mechanism",
    "banded",
    "--bands",
    "2",
    "--samples",
    "20000",
    "--failure-probability",
    "0.01",
]


def test_monte_carlo_text_prints_failure_probability_beside_epsilon():
    result = _run(*MONTE_CARLO)
    assert result.exit_code == 0, result.output
    headline = result.output.splitlines()[0]
    assert headline.startswith("epsilon = ") and "holds except with probability" in headline


def test_balls_in_bins_defaults_to_allocation_with_lower_bound():
    result = _run(
        "epsilon",
        "--noise-multiplier",
        "1",
        "--delta",
        "1e-5",
        "--sampler",
        "balls-in-bins-redrawn",
        "--batches-per-epoch",
        "10",
        "--epochs",
        "1",
    )
    assert result.exit_code == 0, result.output
    assert "(allocation, balls-in-bins-redrawn; lower bound 2.16" in result.output.splitlines()[0]


@pytest.mark.parametrize("command", ["epsilon", "noise"])
def test_cli_defaults_are_the_params_defaults(command):
    callback = next(c.callback for c in app.registered_commands if c.name == command)
    parameters = inspect.signature(callback).parameters
    for option, key in (
        ("samples", "mc_samples"),
        ("failure_probability", "mc_failure_probability"),
        ("evr_delta_ratio", "evr_delta_ratio"),
        ("discretization", "pld_discretization"),
        ("device", "mc_device"),
        ("accountant", "accountant"),
    ):
        assert parameters[option].default == CalibrateParams.model_fields[key].default


@pytest.mark.parametrize("verification", ["plain", "importance"])
def test_verification_option_reaches_estimate_verify_release(verification):
    result = _run(*MONTE_CARLO, "--verification", verification, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["details"]["verification"] == verification


def test_unknown_verification_is_one_line():
    _one_line_error(
        _run(*MONTE_CARLO, "--verification", "fast"), "verification", "auto, plain, importance"
    )
