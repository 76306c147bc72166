"""The `dpledger` console script: every stage and utility command is listed and has --help."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

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
