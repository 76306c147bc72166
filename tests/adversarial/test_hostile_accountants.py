"""Issue 27 defect 9 and the two bounds: the allocation accountant refuses a composition it cannot
finish and a grid that does not fit memory with one line, the CLI applies params' Monte Carlo
bounds, and `dpledger noise` / `dpledger epsilon` say which of their two valid upper bounds is the
claim."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dpledger.accounting import allocation
from dpledger.accounting.description import describe
from dpledger.cli import app
from dpledger.errors import ParamsError


def _redrawn(epochs: int):
    return describe(
        sampler="balls-in-bins-redrawn",
        noise_multiplier=1.0,
        sample_rate=None,
        steps=None,
        dataset_size=1000,
        batch_size=100,
        batches_per_epoch=None,
        epochs=epochs,
        group_size=1,
        mechanism="identity",
        mechanism_params={},
    )


def test_ten_thousand_redrawn_epochs_are_refused_at_once_not_hung():
    with pytest.raises(ParamsError) as refused:
        allocation.allocation_epsilon(_redrawn(10_000), 1e-5)
    assert "\n" not in str(refused.value) and "epochs = 10000" in str(refused.value)
    assert (
        allocation.allocation_shape(_redrawn(allocation.MAX_COMPOSED_EPOCHS))[2]
        == allocation.MAX_COMPOSED_EPOCHS
    )


def test_a_grid_that_does_not_fit_memory_is_one_line(monkeypatch):
    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(allocation, "_bounds", exhausted)
    with pytest.raises(ParamsError) as refused:
        allocation.allocation_epsilon(_redrawn(2), 0.3)
    assert "\n" not in str(refused.value) and "δ = 0.3" in str(refused.value)


RUN = [
    "--delta",
    "1e-5",
    "--sampler",
    "balls-in-bins",
    "--dataset-size",
    "100",
    "--batch-size",
    "50",
    "--epochs",
    "1",
]


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--samples", "1000000000"),
        ("--samples", "10"),
        ("--failure-probability", "2"),
        ("--evr-delta-ratio", "1.5"),
    ],
)
def test_the_cli_applies_the_params_bounds_of_monte_carlo(flag, value):
    result = CliRunner().invoke(
        app, ["epsilon", "--accountant", "montecarlo", "--noise-multiplier", "1", *RUN, flag, value]
    )
    assert result.exit_code != 0 and isinstance(result.exception, (ParamsError, SystemExit))
    if isinstance(result.exception, ParamsError):
        assert "\n" not in str(result.exception) and flag in str(result.exception)


def test_epsilon_says_its_allocation_bound_is_not_the_recorded_claim():
    result = CliRunner().invoke(
        app, ["epsilon", "--accountant", "allocation", "--noise-multiplier", "2", *RUN]
    )
    assert result.exit_code == 0, result.output
    assert "the claim calibrate records (and dpledger noise prints)" in result.output
