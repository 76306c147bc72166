"""PLD/RDP accountants, σ calibration and group-level ε, checked against dp-accounting and known
values."""

import json
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from typer.testing import CliRunner

from dpledger.accounting import calibrate_noise, describe, get_accountant, group_table
from dpledger.accounting.pld import PldRun, gaussian_delta, gaussian_noise_for, pld_epsilon
from dpledger.cli import app
from dpledger.errors import ParamsError, UnsupportedMechanismError

runner = CliRunner()


def _dp_accounting_epsilon(event, count, delta, interval=1e-4):
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=interval)
    accountant.compose(event, count)
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize("sigma,q,steps,interval", [(1.0, 0.01, 100, 1e-3), (0.8, 0.05, 60, None)])
def test_cli_epsilon_equals_dp_accounting_pld(sigma, q, steps, interval):
    """At the default interval (None: dp-accounting's 1e-4) and at one given by --discretization."""
    given = [] if interval is None else ["--discretization", str(interval)]
    out = runner.invoke(
        app,
        [
            "epsilon",
            "--noise-multiplier",
            str(sigma),
            "--sample-rate",
            str(q),
            "--steps",
            str(steps),
            "--delta",
            "1e-5",
            "--json",
            *given,
        ],
    )
    assert out.exit_code == 0, out.output
    payload = json.loads(out.output)
    expected = _dp_accounting_epsilon(
        dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)),
        steps,
        1e-5,
        interval or 1e-4,
    )
    assert payload["epsilon"] == pytest.approx(expected, rel=1e-6)
    assert payload["accountant"] == "pld" and payload["delta"] == 1e-5 and payload["assumptions"]


@pytest.mark.parametrize("sigma,published", [(0.5, 6.49), (1.0, 0.73), (1.5, 0.30)])
def test_poisson_epsilon_of_shuffle_paper_settings(sigma, published):
    """002 Table (T = 100, B = 1, q = 1/100): Poisson-accounted ε 6.49 / 0.73 / 0.30 at δ = 1e-5."""
    description = describe(sampler="poisson", noise_multiplier=sigma, sample_rate=0.01, steps=100)
    assert get_accountant("pld").epsilon(description, 1e-5).epsilon == pytest.approx(
        published, abs=0.02
    )


@pytest.mark.parametrize("accountant,target", [("pld", 1.0), ("pld", 3.0), ("rdp", 2.0)])
def test_calibrated_noise_reaches_target_epsilon(accountant, target):
    """The search is the same at any PLD interval; 1e-3 builds each PLD ~10× faster than 1e-4."""
    chosen = get_accountant(accountant, discretization=1e-3)
    description = describe(sampler="poisson", sample_rate=0.02, steps=100)
    calibration = calibrate_noise(chosen, description, target, 1e-5)
    assert target - 1e-3 <= calibration.result.epsilon <= target
    slightly_less = chosen.epsilon(
        description.with_noise(calibration.noise_multiplier * 0.995), 1e-5
    )
    assert slightly_less.epsilon > target


def test_cli_noise_json_matches_calibration():
    out = runner.invoke(
        app,
        [
            "noise",
            "--epsilon",
            "2",
            "--delta",
            "1e-5",
            "--sample-rate",
            "0.02",
            "--steps",
            "100",
            "--discretization",
            "1e-3",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    payload = json.loads(out.output)
    assert {"noise_multiplier", "epsilon", "delta", "accountant", "assumptions"} <= payload.keys()
    assert payload["details"]["discretization"] == 1e-3
    check = get_accountant("pld", discretization=1e-3).epsilon(
        describe(
            sampler="poisson",
            noise_multiplier=payload["noise_multiplier"],
            sample_rate=0.02,
            steps=100,
        ),
        1e-5,
    )
    assert 2 - 1e-3 <= check.epsilon <= 2


def test_mog_with_one_example_equals_example_level_pld():
    mog = dp_event.MixtureOfGaussiansDpEvent(1.1, [0.0, 1.0], [0.97, 0.03])
    by_mog = _dp_accounting_epsilon(mog, 80, 1e-5, interval=1e-3)
    example = pld_epsilon(PldRun(1.1, "poisson", 1, 0.03, None, None, 80), 1e-5, 1e-3)
    assert example == pytest.approx(by_mog, rel=1e-3)
    by_accountant = get_accountant("pld", discretization=1e-3).epsilon(
        describe(sampler="poisson", noise_multiplier=1.1, sample_rate=0.03, steps=80), 1e-5
    )
    assert example == pytest.approx(by_accountant.epsilon)


def test_group_of_one_under_mog_equals_example_level_for_fixed_batches():
    """Fixed batch, k = 1: sensitivities {0, 2} with P(2) = B/N (001 Thm 3.3), computed as the
    subsampled Gaussian at σ/2, equals the dp-accounting MoG event and the k = 2-capable MoG
    path."""
    eps = pld_epsilon(PldRun(2.0, "fixed", 1, 50 / 1000, 1000, 50, 60), 1e-5, 1e-3)
    by_hand = _dp_accounting_epsilon(
        dp_event.MixtureOfGaussiansDpEvent(2.0, [0.0, 2.0], [0.95, 0.05]), 60, 1e-5, 1e-3
    )
    assert eps == pytest.approx(by_hand, rel=2e-3)


def test_fixed_batch_with_doubled_noise_is_close_to_poisson():
    """001 §4: fixed-batch accounting at 2σ ≈ Poisson at σ (hypergeometric ≈ binomial)."""
    poisson = pld_epsilon(PldRun(1.0, "poisson", 1, 0.01, None, None, 300), 1e-5, 1e-3)
    fixed = pld_epsilon(PldRun(2.0, "fixed", 1, 0.01, 10_000, 100, 300), 1e-5, 1e-3)
    assert fixed == pytest.approx(poisson, rel=0.02)


def test_rdp_is_looser_than_pld():
    description = describe(sampler="poisson", noise_multiplier=1.0, sample_rate=0.01, steps=300)
    assert (
        get_accountant("rdp").epsilon(description, 1e-5).epsilon
        > get_accountant("pld").epsilon(description, 1e-5).epsilon
    )


@pytest.mark.parametrize(
    "field,values", [("sigma", [0.7, 1.0, 1.5, 3.0]), ("steps", [10, 50, 200]), ("k", [1, 2, 3])]
)
def test_epsilon_is_monotone(field, values):
    base = {"sigma": 1.0, "steps": 50, "k": 1}
    epsilons = []
    for value in values:
        setting = dict(base, **{field: value})
        epsilons.append(
            pld_epsilon(
                PldRun(
                    setting["sigma"], "poisson", setting["k"], 0.02, None, None, setting["steps"]
                ),
                1e-5,
                1e-2,
            )
        )
    ordered = epsilons[::-1] if field == "sigma" else epsilons
    assert all(a < b for a, b in zip(ordered, ordered[1:]))


def test_group_table_mog_is_finite_and_below_conversion():
    description = describe(sampler="poisson", noise_multiplier=1.0, sample_rate=0.01, steps=30)
    rows = group_table(description, 1e-5, [1, 2, 4], discretization=3e-3)
    assert rows[0].mog == pytest.approx(rows[0].linear, rel=1e-9)
    for row in rows:
        assert math.isfinite(row.mog)
        assert row.mog <= row.conversion + 1e-9
        assert row.mog >= row.linear * 0.999 or row.group_size == 1


def test_group_conversion_reports_infinity_where_it_fails():
    description = describe(sampler="poisson", noise_multiplier=0.5, sample_rate=0.01, steps=200)
    row = group_table(description, 1e-5, [8], discretization=1e-2)[0]
    assert math.isfinite(row.mog) and math.isinf(row.conversion) and "∞" in row.note


def test_exact_gaussian_delta_matches_dp_accounting():
    for mu in (0.5, 1.0, 2.0):
        accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
        accountant.compose(dp_event.GaussianDpEvent(1.0 / mu))
        assert gaussian_delta(mu, 1.0) == pytest.approx(accountant.get_delta(1.0), rel=1e-3)
    sigma = gaussian_noise_for(2.0, 1.0, 1e-5)
    assert gaussian_delta(2.0 / sigma, 1.0) == pytest.approx(1e-5, rel=1e-6)


@pytest.mark.parametrize(
    "accountant,settings",
    [
        ("pld", {"sampler": "balls-in-bins", "batches_per_epoch": 10}),
        ("rdp", {"sampler": "fixed", "dataset_size": 100, "batch_size": 10}),
        ("rdp", {"sampler": "poisson", "sample_rate": 0.1, "group_size": 2}),
        ("montecarlo", {"sampler": "poisson", "sample_rate": 0.1}),
        (
            "montecarlo",
            {
                "sampler": "balls-in-bins-redrawn",
                "batches_per_epoch": 4,
                "mechanism": "banded",
                "mechanism_params": {"coefficients": [1, 0.5]},
            },
        ),
    ],
)
def test_unsupported_combinations_say_what_to_use(accountant, settings):
    description = describe(noise_multiplier=1.0, steps=None, **settings)
    with pytest.raises(UnsupportedMechanismError, match="use"):
        get_accountant(accountant).epsilon(description, 1e-5)


def test_shuffle_sampler_is_refused_with_reason():
    out = runner.invoke(
        app,
        [
            "epsilon",
            "--noise-multiplier",
            "1",
            "--sampler",
            "shuffle",
            "--sample-rate",
            "0.1",
            "--steps",
            "10",
            "--delta",
            "1e-5",
        ],
    )
    assert isinstance(out.exception, ParamsError)
    assert "no tight accountant" in str(out.exception) and "balls-in-bins" in str(out.exception)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"sample_rate": 1.5},
        {"dataset_size": 10, "batch_size": 20},
        {"group_size": 0},
        {"noise_multiplier": -1.0, "sample_rate": 0.1},
    ],
)
def test_bad_sizes_raise_params_error(kwargs):
    with pytest.raises(ParamsError):
        describe(sampler="poisson", steps=10, **kwargs)


def test_noise_zero_gives_infinite_epsilon():
    description = describe(sampler="poisson", noise_multiplier=0.0, sample_rate=0.1, steps=10)
    assert np.isinf(get_accountant("pld").epsilon(description, 1e-5).epsilon)


def test_cli_group_size_uses_the_binomial_mixture():
    """--group-size k with Poisson: sensitivities 0..k with Binomial(k, q) weights (001 Thm 3.1)."""
    from scipy import stats

    out = runner.invoke(
        app,
        [
            "epsilon",
            "--noise-multiplier",
            "1.5",
            "--sample-rate",
            "0.05",
            "--steps",
            "20",
            "--delta",
            "1e-5",
            "--group-size",
            "2",
            "--discretization",
            "3e-3",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    probs = stats.binom.pmf([0, 1, 2], 2, 0.05).tolist()
    mog = dp_event.MixtureOfGaussiansDpEvent(1.5, [0.0, 1.0, 2.0], probs)
    expected = _dp_accounting_epsilon(mog, 20, 1e-5, interval=3e-3)
    assert json.loads(out.output)["epsilon"] == pytest.approx(expected, rel=1e-6)


def test_group_conversion_for_fixed_batches_covers_the_smaller_datasets():
    """Fixed batch, remove up to k: the chain D ⊃ D − x₁ ⊃ … hops out of datasets of N, N − 1, …,
    N − k + 1 examples, so each hop needs the example-level ε at q = B/(N − k + 1), not B/N (that
    gave 15.25 < 15.59)."""
    n, b, sigma, steps, k, delta = 200, 50, 4.0, 12, 4, 1e-5
    description = describe(
        sampler="fixed", noise_multiplier=sigma, dataset_size=n, batch_size=b, steps=steps
    )
    # Sensitivity 2 with probability B/m at std σ is the subsampled Gaussian at std σ/2; the hop
    # chain needs δ₁(ε₁)·(e^{kε₁} − 1)/(e^{ε₁} − 1) <= δ, scanned over a fine ε₁ grid at once.
    pld = pld_lib.from_gaussian_mechanism(
        standard_deviation=sigma / 2,
        sampling_prob=b / (n - k + 1),
        value_discretization_interval=1e-4,
        pessimistic_estimate=True,
        use_connect_dots=True,
    ).self_compose(steps)
    eps_1 = np.linspace(1e-3, 8.0, 20_001)
    delta_1 = np.asarray(pld.get_delta_for_epsilon(eps_1))
    feasible = delta_1 * np.expm1(k * eps_1) / np.expm1(eps_1) <= delta
    by_hand = float(np.min(k * eps_1[feasible])) if feasible.any() else math.inf
    row = group_table(description, delta, [k], discretization=1e-3)[0]
    assert math.isfinite(by_hand)
    assert row.conversion >= by_hand * (1 - 2e-3)
    assert row.mog <= row.conversion


@pytest.mark.parametrize("delta", ["0", "1", "1.5", "-1e-5"])
def test_cli_epsilon_refuses_delta_outside_zero_one(delta):
    """δ >= 1 printed ε = 0 and δ <= 0 printed ε = ∞, with exit code 0."""
    out = runner.invoke(
        app,
        [
            "epsilon",
            "--noise-multiplier",
            "1",
            "--sample-rate",
            "0.01",
            "--steps",
            "100",
            "--delta",
            delta,
        ],
    )
    assert isinstance(out.exception, ParamsError) and "--delta" in str(out.exception)


def test_steps_contradicting_epochs_are_refused():
    """--epochs 10 --steps 100 with 100 batches per epoch accounted 100 steps and silently dropped
    the epochs."""
    with pytest.raises(ParamsError, match="contradicts epochs"):
        describe(sampler="poisson", dataset_size=1000, batch_size=10, epochs=10, steps=100)
    out = runner.invoke(
        app,
        [
            "epsilon",
            "--noise-multiplier",
            "1",
            "--dataset-size",
            "1000",
            "--batch-size",
            "10",
            "--epochs",
            "10",
            "--steps",
            "100",
            "--delta",
            "1e-5",
        ],
    )
    assert isinstance(out.exception, ParamsError)
    stopped_mid_epoch = describe(
        sampler="poisson", dataset_size=1000, batch_size=10, epochs=10, steps=950
    )
    assert stopped_mid_epoch.steps == 950 and stopped_mid_epoch.epochs == 10


def test_batches_per_epoch_contradicting_dataset_and_batch_size_is_refused():
    """--dataset-size 1000 --batch-size 10 --epochs 2 --batches-per-epoch 7 accounted 14 steps (ε =
    0.41) where 2 epochs of 100 batches take 200 (ε = 0.91)."""
    with pytest.raises(ParamsError, match="batches_per_epoch = 7 contradicts"):
        describe(sampler="poisson", dataset_size=1000, batch_size=10, epochs=2, batches_per_epoch=7)
    consistent = describe(
        sampler="poisson", dataset_size=1000, batch_size=10, epochs=2, batches_per_epoch=100
    )
    assert consistent.steps == 200


def test_fixed_batch_group_larger_than_the_slack_says_why_the_conversion_is_infinite():
    description = describe(
        sampler="fixed", noise_multiplier=4.0, dataset_size=20, batch_size=18, steps=3
    )
    row = group_table(description, 1e-5, [4], discretization=1e-2)[0]
    assert row.conversion == math.inf and "leaves fewer than B = 18" in row.note
