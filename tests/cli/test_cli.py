"""The `dpledger` console script: every stage and utility command is listed and has --help."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SMALL_BGM_AUDIT = (
    "audit",
    "bgm",
    "--sampler",
    "poisson",
    "--steps",
    "10",
    "--noise-multiplier",
    "1",
    "--observations",
    "100",
)
COMMANDS = ["stage", "epsilon", "noise", "samplers", "schedule-stats", "verify", "audit", "report"]


def _dpledger(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="200")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return subprocess.run(["dpledger", *args], capture_output=True, text=True, env=env)


def test_help_lists_every_stage_and_utility_command():
    result = _dpledger("--help")
    assert result.returncode == 0
    for command in COMMANDS:
        assert f" {command} " in result.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command):
    result = _dpledger(command, "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage" in result.stdout


def test_unknown_stage_is_one_line_and_exit_code_2():
    result = _dpledger("stage", "bogus")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: unknown stage 'bogus'; stages are calibrate, schedule, train, verify, audit, report"
    ]


def _invoke(*args: str):
    """Run the app in-process (the console script's `main` turns a DpledgerError into one line and
    exit 2)."""
    from typer.testing import CliRunner

    from dpledger.cli import app

    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("command", ["bgm", "dpsgd"])
def test_audit_partial_shuffle_without_buffer_size_is_a_params_error(command):
    from dpledger.errors import ParamsError

    args = (
        ["--steps", "10", "--noise-multiplier", "1", "--observations", "100"]
        if command == "bgm"
        else []
    )
    result = _invoke("audit", command, "--sampler", "partial-shuffle", *args)
    # was a TypeError from the sampler's __init__
    assert isinstance(result.exception, ParamsError), result.exception
    assert str(result.exception) == (
        "--buffer-size is missing: --sampler partial-shuffle needs the shuffle buffer K (an "
        "integer >= 1)"
    )


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_audit_bgm_refuses_a_non_finite_or_negative_claim(value):
    from dpledger.errors import ParamsError

    # nan gave verdict "consistent" and printed NaN (not JSON) with --json
    result = _invoke(*SMALL_BGM_AUDIT, "--epsilon-claimed", value, "--json")
    assert isinstance(result.exception, ParamsError) and result.stdout == ""
    assert str(result.exception).startswith("--epsilon-claimed = ") and "finite number > 0" in str(
        result.exception
    )


@pytest.mark.parametrize(
    "args",
    [
        ["audit", "selfcheck", "--seed", "-1"],
        ["audit", "dpsgd", "--seed", str(2**64)],
        [*SMALL_BGM_AUDIT, "--seed", str(2**64)],
        ["verify", "--seed", str(2**64 - 1)],
    ],
)
def test_out_of_range_seeds_are_usage_errors_not_tracebacks(args):
    result = _invoke(*args)  # were ValueError tracebacks from numpy / torch.manual_seed
    assert result.exit_code == 2, result.exception
    assert "--seed" in result.output


def test_audit_json_is_strict_json():
    from dpledger.cli.strict_json import jsonable

    strict = jsonable({"a": float("inf"), "b": [float("nan"), 1.0], "c": None})
    assert strict == {"a": "inf", "b": ["nan", 1.0], "c": None}
