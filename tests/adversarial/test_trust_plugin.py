"""Issue 21 defect 6: a module:callable sampler goes through schedule, train, audit and report."""

from __future__ import annotations

import json

import numpy as np
import yaml

from dpledger.pipeline import run_stage
from dpledger.seals import seal_record
from helpers.train_project import genuine_record


def poisson_like(dataset_size: int, batch_size: int, epochs: int, seed: int):
    """Poisson sampling written as a plugin: each example joins each step with probability B/n."""
    rng = np.random.default_rng(seed)
    for _ in range(epochs * -(-dataset_size // batch_size)):
        yield np.flatnonzero(rng.random(dataset_size) < batch_size / dataset_size)


poisson_like.accounted_as = "poisson"


def test_a_plugin_sampler_goes_through_schedule_train_audit_and_report(tmp_path, repo_root):
    rng = np.random.default_rng(0)
    np.savez(
        tmp_path / "data.npz",
        x=rng.normal(size=(100, 6)).astype(np.float32),
        y=rng.integers(0, 2, 100),
    )
    params = yaml.safe_load((repo_root / "params.yaml").read_text())
    params["data"] = {"name": "npz", "path": str(tmp_path / "data.npz"), "test_fraction": 0.2}
    params["batching"] = {"batch_size": 16, "epochs": 1}
    params["schedule"]["sampler"] = f"{__name__}:poisson_like"
    params["audit"].update({"observations": 4000, "pattern_observations": 2000})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    path = tmp_path / "params.yaml"

    schedule = run_stage("schedule", path, tmp_path)
    assert schedule["num_steps"] == 5
    folder = tmp_path / "artifacts/calibration"
    folder.mkdir(parents=True)
    seal_record(
        folder,
        genuine_record(
            noise_multiplier=1.0,
            sampler="poisson",
            steps=5,
            batch_size=16,
            dataset_size=80,
            epochs=1,
        ),
    )
    train = run_stage("train", path, tmp_path)
    assert train["steps_done"] == 5 and train["sampler_mismatch"] is False
    audit = run_stage("audit", path, tmp_path)
    assert audit["sampler_mismatch"] is False and audit["epsilon_emp"] >= 0
    report = run_stage("report", path, tmp_path)
    text = (tmp_path / "reports/report.md").read_text()
    assert "poisson_like" in text and "declared" in text
    assert (
        json.loads((tmp_path / "metrics/report.json").read_text())["warnings"] == report["warnings"]
    )
