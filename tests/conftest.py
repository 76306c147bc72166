"""Shared test set-up: a non-interactive matplotlib backend and the repository root."""

from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


TEST_NOISE_KEY = "5eed" * 16
"""The explicit noise key of every test run (64 hex digits): runs replay exactly, as the tests of
resume and of reproducibility need, without a key derived from a tracked params value. A test of the
default (a fresh CSPRNG key) removes it."""


@pytest.fixture(autouse=True)
def test_noise_key(monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test trains with :data:`TEST_NOISE_KEY` in DPLEDGER_NOISE_KEY (subprocesses inherit
    it)."""
    monkeypatch.setenv("DPLEDGER_NOISE_KEY", TEST_NOISE_KEY)
    return TEST_NOISE_KEY
