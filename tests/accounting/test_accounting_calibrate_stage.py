"""The calibrate stage: outputs, the record training reads, the Monte Carlo path, and bad params."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import yaml

from dpledger.accounting import CalibrationRecord, describe, get_accountant
from dpledger.errors import ParamsError
from dpledger.params import parse_params
from dpledger.pipeline import calibrate as stage

REPO = Path(__file__).resolve().parents[2]


def _params(**calibrate):
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["batching"] = {"batch_size": 256, "epochs": 2}
    raw["calibrate"].update({"group_sizes": [1, 2], "curve_points": 5, **calibrate})
    return parse_params(raw)


def _outputs(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_poisson_stage_writes_record_metrics_and_plots(tmp_path):
    params = _params(epsilon=2.0)
    metrics = stage.run(params, tmp_path)
    record = CalibrationRecord.load(tmp_path / "artifacts" / "calibration" / "calibration.json")
    assert record.steps == 2 * math.ceil(1438 / 256) == metrics["steps"]
    assert (
        2.0 - 1e-3 <= record.epsilon <= 2.0
        and record.sampler == "poisson"
        and record.mechanism == "identity"
    )
    check = get_accountant("pld").epsilon(
        describe(
            sampler="poisson",
            noise_multiplier=record.noise_multiplier,
            dataset_size=1438,
            batch_size=256,
            epochs=2,
        ),
        params.calibrate.delta,
    )
    assert check.epsilon == pytest.approx(record.epsilon, rel=1e-9)
    assert {a.accountant for a in record.accountants} == {"pld", "rdp"}
    assert all(isinstance(v, (int, float, str, bool)) for v in metrics.values())
    for key in (
        "noise_multiplier",
        "epsilon",
        "delta",
        "accountant",
        "sampler",
        "mechanism",
        "steps",
        "sample_rate",
    ):
        assert key in metrics
    steps, epsilons = zip(*record.epsilon_curve)
    assert steps[-1] == record.steps and epsilons[-1] <= record.epsilon
    assert all(a <= b for a, b in zip(epsilons, epsilons[1:]))
    assert [g["group_size"] for g in record.group] == [1, 2] and record.group[1][
        "mog"
    ] <= record.group[1]["conversion"]
    for name in ("epsilon_vs_step", "epsilon_vs_group", "rmse_vs_epsilon"):
        assert (tmp_path / "plots" / "calibrate" / f"{name}.csv").exists()
        assert (tmp_path / "plots" / "calibrate" / f"{name}.png").stat().st_size > 1000
    json.loads((tmp_path / "metrics" / "calibrate.json").read_text())


def test_montecarlo_stage_with_blt_streams_the_calibrated_matrix(tmp_path):
    params = _params(
        epsilon=4.0,
        delta=1e-3,
        accountant="montecarlo",
        sampler="balls-in-bins",
        mechanism="blt",
        blt_buffers=2,
        optimize_steps=4,
        optimize_samples=1024,
        mc_samples=20_000,
        mc_failure_probability=0.05,
        rmse_epsilons=[2.0, 8.0],
        rmse_samples=2000,
    )
    metrics = stage.run(params, tmp_path)
    record = CalibrationRecord.load(tmp_path / "artifacts" / "calibration" / "calibration.json")
    assert record.epsilon == 4.0 and record.accountant == "montecarlo" and record.mechanism == "blt"
    assert set(record.mechanism_params) == {"buffer_decays", "output_scales"}
    # ε = 4 over 4 bins: the importance-sampled verification applies and needs far fewer than the
    # plain ~1e5
    assert 0 <= metrics["mc_failure_probability"] <= 0.05 and metrics["mc_verify_samples"] > 1000
    assert any("Estimate-Verify-Release" in s for s in record.assumptions)
    rows = (tmp_path / "plots" / "calibrate" / "rmse_vs_epsilon.csv").read_text().splitlines()[1:]
    for row in rows:
        _, _, amplified, unamplified, _ = row.split(",")
        assert float(amplified) < float(unamplified)

    import torch

    from dpledger.mechanisms import noise_stream

    rows = list(
        noise_stream(
            record.mechanism,
            record.mechanism_params,
            record.steps,
            3,
            generator=torch.Generator().manual_seed(0),
        )
    )
    assert len(rows) == record.steps


def test_fixed_bins_with_identity_warn_in_the_record(tmp_path):
    params = _params(
        epsilon=4.0,
        delta=1e-3,
        accountant="montecarlo",
        sampler="balls-in-bins",
        mc_samples=20_000,
        mc_failure_probability=0.05,
        rmse_epsilons=[4.0],
        rmse_samples=2000,
    )
    metrics = stage.run(params, tmp_path)
    record = CalibrationRecord.load(tmp_path / "artifacts" / "calibration" / "calibration.json")
    assert (
        record.assumptions[0].startswith("WARNING") and metrics["epsilon_poisson_same_noise"] < 4.0
    )


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("evr_delta_ratio", 1.0, "less than 1"),
        ("mc_samples", 10, "greater than or equal"),
        ("sampler", "shuffle", "no tight accountant"),
        ("accountant", "allocation", "supports samplers"),
        ("epsilon", 1e9, "less than or equal"),
        ("delta", float("nan"), "finite"),
        ("mechanism", "blt", "balls-in-bins"),
        ("group_sizes", [0, 2], "[1, 1024]"),
        ("rmse_epsilons", [-1.0], "(0, 100]"),
        ("curve_points", 1, "greater than or equal"),
        ("pld_discretization", 0.5, "less than or equal"),
        ("blt_buffers", 0, "greater than or equal"),
    ],
)
def test_bad_calibrate_values_are_refused_in_one_line(key, value, message):
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw = copy.deepcopy(raw)
    raw["calibrate"][key] = value
    with pytest.raises(ParamsError) as error:
        parse_params(raw)
    text = str(error.value)
    assert f"calibrate.{key}" in text and message in text and "\n" not in text


def test_batch_larger_than_dataset_writes_nothing(tmp_path):
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["batching"]["batch_size"] = 5000
    with pytest.raises(ParamsError, match="batch_size"):
        stage.run(parse_params(raw), tmp_path)
    assert _outputs(tmp_path) == []


@pytest.mark.parametrize(
    "update,message",
    [({"accountant": "montecarlo"}, "supports samplers"), ({"epsilon": float("inf")}, "finite")],
)
def test_calibrate_params_refused_when_sampler_is_left_at_its_default(update, message):
    """An omitted calibrate.sampler defaulted to poisson without validation, so accountant
    montecarlo was accepted by parse_params (and refused only at stage time); an infinite target ε
    was accepted too."""
    raw = copy.deepcopy(yaml.safe_load((REPO / "params.yaml").read_text()))
    raw["calibrate"].pop("sampler")
    raw["calibrate"].update(update)
    with pytest.raises(ParamsError, match=message):
        parse_params(raw)


def test_auto_accountant_is_allocation_for_balls_in_bins_and_shows_both_bounds(tmp_path):
    params = _params(epsilon=2.0, delta=1e-5, sampler="balls-in-bins-redrawn", rmse_epsilons=[2.0])
    metrics = stage.run(params, tmp_path)
    record = CalibrationRecord.load(tmp_path / "artifacts" / "calibration" / "calibration.json")
    assert record.accountant == "allocation" and metrics["accountant"] == "allocation"
    assert metrics["epsilon_lower"] <= metrics["epsilon"] <= 2.0
    assert metrics["delta_at_least_one_over_n"] is False
    assert all(eps <= 2.0 + 1e-12 for _, eps in record.epsilon_curve)


def test_delta_at_least_one_over_n_is_recorded_first(tmp_path):
    metrics = stage.run(_params(epsilon=2.0, delta=0.01), tmp_path)
    record = CalibrationRecord.load(tmp_path / "artifacts" / "calibration" / "calibration.json")
    assert metrics["delta_at_least_one_over_n"] is True and record.assumptions[0].startswith(
        "WARNING: delta"
    )
