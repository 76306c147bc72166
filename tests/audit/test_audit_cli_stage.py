"""The pinned `dpledger audit` CLI, the audit stage and the DP-SGD canary audit."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from dpledger.audit.bgm import BgmAudit
from dpledger.audit.dpsgd import DpsgdAudit, Workload, audit_dpsgd, canary_outputs
from dpledger.audit.result import Claim
from dpledger.cli import app
from dpledger.errors import DpledgerError
from dpledger.params import load_params
from dpledger.pipeline import audit as audit_stage
from dpledger.sampling.registry import build_schedule
from dpledger.seals import seal_record
from helpers.train_project import genuine_record

runner = CliRunner()


def test_pinned_bgm_command_prints_the_contract_fields():
    result = runner.invoke(
        app,
        [
            "audit",
            "bgm",
            "--sampler",
            "shuffle",
            "--steps",
            "20",
            "--epochs",
            "2",
            "--noise-multiplier",
            "1.0",
            "--observations",
            "20000",
            "--seed",
            "1",
            "--threshold",
            "bonferroni",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    for key in ("epsilon_emp", "epsilon_claimed", "verdict", "observations"):
        assert key in out
    assert out["observations"] == 20000 and out["verdict"] in (
        "contradicted",
        "consistent",
        "inconclusive",
    )


def test_bgm_command_refuses_an_unknown_threshold_method():
    result = runner.invoke(
        app,
        [
            "audit",
            "bgm",
            "--sampler",
            "shuffle",
            "--steps",
            "10",
            "--noise-multiplier",
            "1",
            "--observations",
            "1000",
            "--threshold",
            "best",
            "--json",
        ],
    )
    assert result.exit_code != 0 and "threshold" in str(result.exception)


def test_selfcheck_command_reports_the_false_alarm_rate():
    result = runner.invoke(
        app, ["audit", "selfcheck", "--repeats", "10", "--observations", "2000", "--json"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["repeats"] == 10 and 0.0 <= out["false_alarm_rate"] <= 1.0 and "passed" in out


def write_inputs(root, sampler, record_sampler="poisson"):
    folder = root / "artifacts" / "calibration"
    folder.mkdir(parents=True, exist_ok=True)
    seal_record(
        folder,
        genuine_record(
            noise_multiplier=1.2,
            sampler=record_sampler,
            steps=40,
            batch_size=16,
            dataset_size=160,
            epochs=4,
        ),
    )
    build_schedule(sampler, dataset_size=160, batch_size=16, epochs=4, seed=0).save(
        root / "artifacts" / "schedule"
    )


def stage_params(repo_root, observations=20000):
    """The repo's params with ``observations`` games and no one-run audit (these projects have no
    train stage)."""
    params = load_params(repo_root / "params.yaml")
    one_run = params.audit.one_run.model_copy(update={"enabled": False})
    return params.model_copy(
        update={
            "audit": params.audit.model_copy(
                update={"observations": observations, "one_run": one_run}
            )
        }
    )


def test_stage_audits_the_sampler_actually_used_and_writes_flat_metrics(tmp_path, repo_root):
    write_inputs(tmp_path, "shuffle")
    metrics = audit_stage.run(stage_params(repo_root), tmp_path)
    assert metrics["sampler"] == "shuffle" and metrics["sampler_mismatch"] is True
    claimed = json.loads((tmp_path / "artifacts/calibration/calibration.json").read_text())[
        "epsilon"
    ]
    assert metrics["epsilon_claimed"] == claimed
    assert all(isinstance(v, (int, float, str, bool)) for v in metrics.values())
    details = json.loads((tmp_path / "artifacts" / "audit" / "audit.json").read_text())
    assert details["sampler_warning"] and details["epsilon_vs_observations"]
    for name in (
        "tradeoff.csv",
        "tradeoff.png",
        "epsilon_vs_observations.csv",
        "epsilon_vs_observations.png",
    ):
        assert (tmp_path / "plots" / "audit" / name).stat().st_size > 0
    saved = json.loads((tmp_path / "metrics" / "audit.json").read_text())
    assert saved["verdict"] == metrics["verdict"]


def test_stage_without_inputs_fails_with_one_line_and_writes_nothing(tmp_path, repo_root):
    with pytest.raises(DpledgerError, match="run the calibrate stage"):
        audit_stage.run(stage_params(repo_root), tmp_path)
    assert not (tmp_path / "metrics").exists()


def test_stage_refuses_a_schedule_built_for_other_sizes_than_the_ledger(tmp_path, repo_root):
    write_inputs(tmp_path, "poisson")
    # 10 steps, q = 0.2
    other = build_schedule("poisson", dataset_size=160, batch_size=32, epochs=2, seed=0)
    other.save(tmp_path / "artifacts" / "schedule")
    with pytest.raises(DpledgerError, match="batch_size 32 \\(accounted 16\\)"):
        audit_stage.run(stage_params(repo_root), tmp_path)
    assert not (tmp_path / "metrics").exists()


@pytest.fixture(scope="module")
def digits():
    import torch

    from dpledger.data import load_dataset

    data = load_dataset("digits", None, 0.2, 0)
    return torch.as_tensor(data.x_train[:64]), torch.as_tensor(data.y_train[:64])


def _dpsgd(threat_model: str, sampler: str = "shuffle", lr: float = 0.5, **mechanism) -> DpsgdAudit:
    """A small DP-SGD audit on the first 64 digits rows (``mechanism``: BgmAudit fields to
    change)."""
    sizes = dict(
        dataset_size=64, batch_size=16, epochs=1, noise_multiplier=1.0, observations=4, delta=1e-5
    )
    return DpsgdAudit(
        BgmAudit(sampler, **{**sizes, "progress": False, **mechanism}), threat_model, lr=lr
    )


def test_partially_informed_canaries_count_plus_one_minus_one_and_zero(digits):
    """With negligible noise the released ⟨g̃, ĝ⟩/C² is +1 in the record's step (D), 0 there (D'),
    −1 elsewhere."""
    import torch

    from dpledger.models import Task, build_model

    x, y = digits
    numel = sum(p.numel() for p in build_model("mlp", tuple(x.shape[1:]), 10).parameters())
    canary = torch.randn(numel, generator=torch.Generator().manual_seed(0))
    canary /= canary.norm()
    workload = Workload(
        "digits", x, y, Task("classification"), lambda: build_model("mlp", tuple(x.shape[1:]), 10)
    )
    config = _dpsgd("partially-informed", batch_size=4, noise_multiplier=1e-6, lr=0.1)
    present = canary_outputs(config, workload, present=True, canary=canary, seed=5)
    absent = canary_outputs(config, workload, present=False, canary=canary, seed=5)
    assert present.shape == (16,)
    assert np.sum(np.abs(present - 1) < 0.2) == 1 and np.sum(np.abs(present + 1) < 0.2) == 15
    assert np.sum(np.abs(absent) < 0.2) == 1 and np.sum(np.abs(absent + 1) < 0.2) == 15


def test_dpsgd_audit_runs_end_to_end(digits):
    result = audit_dpsgd(_dpsgd("natural", observations=8))
    assert (
        result.audit == "dpsgd-natural"
        and result.observations == 8
        and result.estimate.epsilon >= 0
    )


def test_dpsgd_audit_trains_with_the_sampler_options_and_the_claim_it_is_given():
    ledger = Claim(3.5, 1e-5, "ledger")
    dropped = audit_dpsgd(
        _dpsgd("natural", dataset_size=70, options={"last_batch": "drop"}, claim=ledger)
    )
    assert dropped.setting["steps"] == 4 and dropped.setting["sampler_options"] == {
        "last_batch": "drop"
    }
    assert dropped.claim == ledger and dropped.to_dict()["epsilon_claimed"] == 3.5
    kept = audit_dpsgd(_dpsgd("natural", dataset_size=70))
    assert kept.setting["steps"] == 5 and "'poisson'" in kept.claim.basis
    buffered = audit_dpsgd(_dpsgd("natural", sampler="partial-shuffle", options={"buffer_size": 8}))
    assert buffered.setting["steps"] == 4
    # no closed-form placement: scored by the record's memberships in pilot runs
    padded = audit_dpsgd(
        _dpsgd("partially-informed", sampler="balls-in-bins", options={"pad_truncate": True})
    )
    assert (
        padded.setting["sampler_options"] == {"pad_truncate": True} and padded.estimate.epsilon >= 0
    )


def test_stage_dpsgd_audit_uses_the_schedule_options_and_the_ledger_claim(tmp_path, repo_root):
    folder = tmp_path / "artifacts" / "calibration"
    folder.mkdir(parents=True, exist_ok=True)
    seal_record(
        folder,
        genuine_record(
            noise_multiplier=1.2,
            sampler="poisson",
            steps=10,
            batch_size=16,
            dataset_size=90,
            epochs=2,
        ),
    )
    build_schedule(
        "shuffle", dataset_size=90, batch_size=16, epochs=2, seed=0, last_batch="drop"
    ).save(tmp_path / "artifacts" / "schedule")
    params = stage_params(repo_root, observations=2000)
    params = params.model_copy(
        update={"audit": params.audit.model_copy(update={"dpsgd": True, "dpsgd_observations": 4})}
    )
    audit_stage.run(params, tmp_path)
    dpsgd = json.loads((tmp_path / "artifacts" / "audit" / "audit.json").read_text())["dpsgd"]
    assert (
        dpsgd["setting"]["sampler_options"] == {"last_batch": "drop"}
        and dpsgd["setting"]["steps"] == 10
    )
    claimed = json.loads((tmp_path / "artifacts/calibration/calibration.json").read_text())[
        "epsilon"
    ]
    assert dpsgd["epsilon_claimed"] == claimed and dpsgd["claim_basis"].startswith("ledger: pld")
