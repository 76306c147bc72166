"""Issue 20: a sampler declared in this one file (its accounted_as and description) is validated by
params, accepted by the guard, accounted, audited and named in the report, with no edit anywhere
else."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from dpledger.params import parse_params
from dpledger.pipeline import run_stage


def coin_flips(dataset_size: int, batch_size: int, epochs: int, seed: int):
    """Each example joins each step with probability B/n, ⌈n/B⌉ steps per epoch."""
    rng = np.random.default_rng(seed)
    for _ in range(epochs * -(-dataset_size // batch_size)):
        yield np.flatnonzero(rng.random(dataset_size) < batch_size / dataset_size)


coin_flips.accounted_as = "poisson"
coin_flips.description = "independent coin flips with probability B/n per example and step"


def test_a_one_file_plugin_sampler_runs_through_every_stage(tmp_path, repo_root):
    rng = np.random.default_rng(0)
    np.savez(
        tmp_path / "data.npz",
        x=rng.normal(size=(100, 6)).astype(np.float32),
        y=rng.integers(0, 2, 100),
    )
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    raw["data"] = {"name": "npz", "path": str(tmp_path / "data.npz"), "test_fraction": 0.2}
    raw["batching"] = {"batch_size": 16, "epochs": 1}
    raw["schedule"]["sampler"] = f"{__name__}:coin_flips"
    raw["calibrate"].update(
        {
            "sampler": coin_flips.accounted_as,
            "accountant": "auto",
            "mechanism": "identity",
            "group_sizes": [1],
            "curve_points": 2,
        }
    )
    raw["audit"].update({"observations": 4000, "pattern_observations": 2000})
    assert parse_params(raw).schedule.sampler == f"{__name__}:coin_flips"  # validated by params
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))

    calibrate = run_stage("calibrate", path, tmp_path)  # accounted as its declared law
    assert calibrate["sampler"] == "poisson" and calibrate["accountant"] == "pld"
    schedule = run_stage("schedule", path, tmp_path)
    header = json.loads((tmp_path / "artifacts/schedule/schedule.json").read_text())
    assert (
        schedule["num_steps"] == 5 and header["metadata"]["description"] == coin_flips.description
    )
    train = run_stage("train", path, tmp_path)  # accepted by the guard
    assert train["steps_done"] == 5 and train["sampler_mismatch"] is False
    audit = run_stage("audit", path, tmp_path)
    assert audit["sampler_mismatch"] is False and audit["epsilon_emp"] >= 0
    run_stage("report", path, tmp_path)
    text = (tmp_path / "reports/report.md").read_text()
    assert "coin_flips" in text and "declares itself equivalent to 'poisson'" in text


def test_every_sampler_describes_its_own_run_as_its_accountant_reads_it():
    from dpledger.accounting.description import describe
    from dpledger.errors import ParamsError
    from dpledger.sampling import SAMPLERS, build_sampler

    sizes = {"dataset_size": 120, "batch_size": 16, "epochs": 3}
    plugin = build_sampler(f"{__name__}:coin_flips", seed=0, **sizes)
    assert plugin.mechanism_description(noise_multiplier=1.5) == describe(
        sampler="poisson", noise_multiplier=1.5, **sizes
    )
    for name, cls in SAMPLERS.items():
        built = build_sampler(
            name, seed=0, **sizes, **({"buffer_size": 8} if "buffer_size" in cls.OPTIONS else {})
        )
        if cls.accounted_as is None:
            with pytest.raises(ParamsError, match=f"sampler = '{name}' cannot be accounted: .*"):
                built.mechanism_description()
        else:
            described = built.mechanism_description(group_size=2)
            assert described == describe(sampler=cls.accounted_as, group_size=2, **sizes)
            assert (described.steps, described.sample_rate) == (built.num_steps, 16 / 120)
