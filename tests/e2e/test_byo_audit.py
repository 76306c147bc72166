"""audit.dpsgd on the train stage's own model (audit.dpsgd_model: train): the canary games train a
tiny GPT-2 on the text file with its causal-LM loss, the canary counts come out as the threat model
says, and the stage writes the DP-SGD audit next to the BGM one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from dpledger.audit.bgm import BgmAudit
from dpledger.audit.dpsgd import DpsgdAudit, canary_outputs, train_workload
from dpledger.params import load_params
from dpledger.pipeline import run_stage
from helpers.byo_helpers import text_project, tiny_lm

TINY_GPT2 = {
    "model_type": "gpt2",
    "n_layer": 1,
    "n_embd": 16,
    "n_head": 2,
    "n_positions": 32,
    "vocab_size": 300,
}


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> Path:
    return tiny_lm(tmp_path_factory.mktemp("byo-audit"))


def _project(root: Path, lm: Path) -> Path:
    data = {
        "name": "text",
        "path": str(lm / "corpus.jsonl"),
        "tokenizer": str(lm / "model"),
        "max_length": 12,
    }
    train = {
        "model": "hf",
        "task": "causal-lm",
        "model_options": {"config": TINY_GPT2, "init": "random"},
    }
    size = len((lm / "corpus.jsonl").read_text().splitlines())
    params = text_project(
        root, train_size=size - max(1, round(0.2 * size)), data=data, train=train, batch_size=16
    )
    raw = yaml.safe_load(params.read_text())
    raw["audit"].update(
        {
            "dpsgd": True,
            "dpsgd_model": "train",
            "dpsgd_observations": 4,
            "observations": 1000,
            "dpsgd_threat_model": "natural",
            # no train stage in this project
            "one_run": {
                **raw["audit"]["one_run"],
                "enabled": False,
            },
        }
    )
    params.write_text(yaml.safe_dump(raw))
    return params


def test_partially_informed_canaries_on_the_lm_count_plus_one_minus_one_and_zero(tmp_path, lm):
    """With negligible noise ⟨g̃, ĝ⟩/C² is +1 in the record's step (D), 0 there (D'), −1 elsewhere:
    the games really train the LM (its clipped gradients project to ~0 on a random direction of its
    ~10⁴ parameters)."""
    p = load_params(_project(tmp_path, lm))
    workload = train_workload(p.data, p.train, p.seed)
    assert workload.task.name == "causal-lm" and workload.x.dtype == torch.int64
    numel = sum(param.numel() for param in workload.build().parameters())
    canary = torch.randn(numel, generator=torch.Generator().manual_seed(0))
    canary /= canary.norm()
    mechanism = BgmAudit(
        "shuffle",
        dataset_size=64,
        batch_size=4,
        epochs=1,
        noise_multiplier=1e-6,
        observations=4,
        delta=1e-5,
    )
    config = DpsgdAudit(mechanism, threat_model="partially-informed", clip_norm=1.0, lr=0.1)
    present = canary_outputs(config, workload, present=True, canary=canary, seed=5)
    absent = canary_outputs(config, workload, present=False, canary=canary, seed=5)
    assert present.shape == (16,)
    assert np.sum(np.abs(present - 1) < 0.2) == 1 and np.sum(np.abs(present + 1) < 0.2) == 15
    assert np.sum(np.abs(absent) < 0.2) == 1 and np.sum(np.abs(absent + 1) < 0.2) == 15


def test_audit_stage_audits_dpsgd_on_the_train_model(tmp_path, lm):
    metrics = run_stage("audit", _project(tmp_path, lm), tmp_path)
    dpsgd = json.loads((tmp_path / "artifacts/audit/audit.json").read_text())["dpsgd"]
    assert dpsgd["setting"]["dataset"] == "text (hf, causal-lm)" and dpsgd["observations"] == 4
    assert metrics["dpsgd_epsilon_emp"] >= 0 and dpsgd["audit"] == "dpsgd-natural"
