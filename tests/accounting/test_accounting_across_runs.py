"""Privacy across runs (issue 40, item 3): the claims of runs on overlapping data compose by the PLD
accountant's own composition where every run was accounted by it (checked against dp-accounting's
PLDAccountant composing the same DP events, and against one run of the summed steps), else by
basic composition; the privacy record round-trips and a damaged one is one line."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

from dpledger.accounting.across_runs import (
    RunClaim,
    alone,
    compose,
    continued,
    load_provenance,
)
from dpledger.accounting.description import describe
from dpledger.accounting.pld import PldRun, pld_epsilon
from dpledger.errors import ParamsError

DELTA = 1e-5


def _claim(sigma: float, steps: int, accountant: str = "pld", data: str = "rows") -> RunClaim:
    description = describe(
        sampler="poisson",
        noise_multiplier=sigma,
        dataset_size=1000,
        batch_size=50,
        epochs=steps // 20,
    )
    epsilon = pld_epsilon(PldRun.of(description), DELTA)
    return RunClaim(epsilon, DELTA, accountant, asdict(description), description.steps, data)


def _accountant_epsilon(*runs: tuple[float, int]) -> float:
    """dp-accounting's PLD accountant on the same Poisson-subsampled Gaussian events."""
    accountant = pld_privacy_accountant.PLDAccountant()
    for sigma, steps in runs:
        event = dp_event.PoissonSampledDpEvent(0.05, dp_event.GaussianDpEvent(sigma))
        accountant.compose(event, steps)
    return accountant.get_epsilon(DELTA)


def test_two_identical_runs_compose_to_one_run_of_twice_the_steps():
    once = _claim(1.1, 200)
    composed = compose((once, once), DELTA)
    twice = _claim(1.1, 400).epsilon
    assert composed.method == "PLD composition (dp-accounting)" and composed.delta == DELTA
    assert composed.epsilon == pytest.approx(twice, rel=1e-3)
    assert once.epsilon < composed.epsilon < 2 * once.epsilon  # tighter than basic composition


def test_different_runs_compose_as_dp_accountings_accountant_composes_them():
    runs = (_claim(0.9, 100), _claim(1.4, 300))
    composed = compose(runs, DELTA)
    independent = _accountant_epsilon((0.9, 100), (1.4, 300))
    assert composed.epsilon >= max(run.epsilon for run in runs)
    assert composed.epsilon == pytest.approx(independent, rel=2e-3)


def test_a_run_stopped_early_composes_the_steps_it_took():
    stopped = _claim(1.1, 400)
    stopped = RunClaim(_claim(1.1, 200).epsilon, DELTA, "pld", stopped.description, 200, "rows")
    composed = compose((stopped, _claim(1.1, 200)), DELTA)
    assert composed.epsilon == pytest.approx(_claim(1.1, 400).epsilon, rel=1e-3)


def test_a_run_of_another_accountant_composes_by_summing_epsilon_and_delta():
    runs = (_claim(1.1, 200, accountant="montecarlo"), _claim(1.1, 200))
    composed = compose(runs, DELTA)
    assert composed.method == "basic composition (ε and δ summed)"
    assert composed.epsilon == runs[0].epsilon + runs[1].epsilon
    assert composed.delta == 2 * DELTA


def test_a_run_without_noise_composes_to_no_guarantee():
    noiseless = RunClaim(math.inf, DELTA, "pld", _claim(1.0, 100).description, 100, "rows")
    assert compose((noiseless, _claim(1.0, 100)), DELTA).epsilon == math.inf


def test_a_continued_model_carries_every_earlier_run(tmp_path):
    first, second, third = _claim(1.0, 100), _claim(1.2, 100), _claim(1.5, 100)
    chain = continued(continued(alone(first), second), third)
    assert chain.composition.runs == (first, second, third)
    assert chain.composition.epsilon == pytest.approx(
        _accountant_epsilon((1.0, 100), (1.2, 100), (1.5, 100)), rel=2e-3
    )
    path = tmp_path / "privacy.json"
    path.write_text(json.dumps(chain.to_dict()))
    assert load_provenance(path) == chain
    assert chain.metrics()["prior_runs_composed"] == 2 and alone(first).metrics() == {}


@pytest.mark.parametrize(
    "content",
    ["not json", json.dumps({"format": "other"}), json.dumps({"format": "dpledger-privacy/1"})],
)
def test_a_damaged_privacy_record_is_one_line_naming_it(tmp_path, content):
    path = tmp_path / "privacy.json"
    path.write_text(content)
    with pytest.raises(
        ParamsError, match=r"privacy.json is not a dpledger privacy record"
    ) as caught:
        load_provenance(path)
    assert "\n" not in str(caught.value)
