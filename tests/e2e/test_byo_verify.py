"""verify.model: train — the debugging battery on the train stage's own model and task loss (a tiny
GPT-2 LM from a text file): the correct engine passes; the engine run with the clipping switched
off, or with noise std σ instead of σ·C, fails the tests meant to catch that; and the loss the
battery hands the trainers is the task's per-example loss times the row's weight."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from dpledger.data import load_data
from dpledger.errors import ParamsError
from dpledger.models import build_task_model, task_for
from dpledger.params import load_params
from dpledger.pipeline import run_stage
from dpledger.verify.consecutive import train_consecutive
from dpledger.verify.task import (
    WeightedTaskLoss,
    model_task,
    per_example_gradient_norms,
)
from helpers.byo_helpers import text_project, tiny_lm


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> Path:
    return tiny_lm(tmp_path_factory.mktemp("byo-verify"))


def never_clips(model, inputs, targets, **settings):
    """The engine with clipping off (C huge, noise kept at the claimed σ·C): the no-clipping bug."""
    clip_norm = settings.pop("clip_norm")
    noise = settings.pop("noise_multiplier")
    train_consecutive(
        model,
        inputs,
        targets,
        clip_norm=1e12,
        noise_multiplier=noise * clip_norm / 1e12,
        **settings,
    )


def uncalibrated_noise(model, inputs, targets, **settings):
    """The engine with noise std σ whatever C (σ/C as multiplier): the uncalibrated-noise bug."""
    clip_norm = settings.pop("clip_norm")
    noise = settings.pop("noise_multiplier")
    train_consecutive(
        model, inputs, targets, clip_norm=clip_norm, noise_multiplier=noise / clip_norm, **settings
    )


TINY_GPT2 = {
    "model_type": "gpt2",
    "n_layer": 1,
    "n_embd": 16,
    "n_head": 2,
    "n_positions": 32,
    "vocab_size": 300,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
}


def _project(root: Path, lm: Path, **verify) -> Path:
    """A tiny random GPT-2 (1 layer, width 16) on the corpus, texts cut at 12 tokens."""
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
    params = text_project(root, train_size=size - max(1, round(0.2 * size)), data=data, train=train)
    raw = yaml.safe_load(params.read_text())
    raw["verify"].update(verify)
    params.write_text(yaml.safe_dump(raw))
    return params


def _task(params: Path):
    p = load_params(params)
    data = load_data(p.data, p.seed)
    task = task_for(p.train.model, p.train.task, data)
    torch.manual_seed(p.seed)
    model = build_task_model(p.train.model, p.train.model_options, task, data)
    return model, task, torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)


def test_the_battery_passes_the_engine_on_the_train_stages_lm(tmp_path, lm):
    params = _project(tmp_path, lm, model="train")
    metrics = run_stage("verify", params, tmp_path)
    details = json.loads((tmp_path / "artifacts/verify/verify.json").read_text())
    assert metrics["passed"], details["verdict"]
    assert (
        details["heuristics"]["model"]
        == metrics["battery_model"]
        == "train.model = 'hf' (causal-lm)"
    )
    assert details["heuristics"]["probe_gradient_norm"] >= 10
    engine_check = next(test for test in details["tests"] if test["name"] == "engine_self_check")
    assert engine_check["passed"] and engine_check["details"]["flat"]["dtype"] == "float64"
    parameters = sum(1 for _ in _task(params)[0].parameters())
    assert engine_check["details"]["flat"]["parameters_checked"] == parameters


@pytest.mark.parametrize(
    "trainer, caught",
    [
        ("never_clips", {"t1_no_clipping", "sensitivity"}),
        ("uncalibrated_noise", {"t3_noise_calibration", "noise_scale"}),
    ],
)
def test_a_broken_engine_fails_the_tests_meant_for_its_bug_on_the_lm(tmp_path, lm, trainer, caught):
    params = _project(
        tmp_path, lm, model="train", trainer=f"test_byo_verify:{trainer}", fail_pipeline=False
    )
    metrics = run_stage("verify", params, tmp_path)
    assert not metrics["passed"]
    failed = set(
        json.loads((tmp_path / "artifacts/verify/verify.json").read_text())["verdict"][
            "failed_tests"
        ]
    )
    assert caught <= failed


def test_weighted_token_loss_is_weight_times_the_naive_loss_and_zero_weight_gives_zero_gradient(
    tmp_path, lm
):
    model, task, x, y = _task(_project(tmp_path, lm, model="train"))
    battery = model_task(model, task, x, y, "lm", rows=4)
    ids = battery.inputs[:2]
    logits = battery.model(ids)
    weights = torch.tensor([0.5, 3.0])
    targets = torch.cat([ids.double(), weights[:, None].double()], 1).float()
    naive = torch.stack(
        [
            torch.nn.functional.cross_entropy(
                logits[i, :-1][ids[i, 1:] >= 0], ids[i, 1:][ids[i, 1:] >= 0]
            )
            for i in range(2)
        ]
    )
    torch.testing.assert_close(WeightedTaskLoss(task)(logits, targets), weights * naive)
    zero_inputs, zero_targets = battery.zero_rows(3)
    assert torch.all(
        per_example_gradient_norms(battery.model, zero_inputs, zero_targets, battery.loss_fn) == 0
    )
    # the weight is chosen as 20 × the largest norm over the unit norm: equal up to rounding
    assert battery.probe_norm >= 20 * float(battery.ordinary_norms.max()) * (1 - 1e-12)


def test_model_train_with_an_external_command_is_refused(tmp_path, lm):
    params = _project(
        tmp_path,
        lm,
        model="train",
        command="python train.py {init} {data} {out} {clip_norm} {noise_multiplier} {batch_size} "
        "{steps} {lr} {seed}",
    )
    with pytest.raises(
        ParamsError, match=r"verify.model = 'train' is invalid: an external verify.command"
    ):
        load_params(params)
