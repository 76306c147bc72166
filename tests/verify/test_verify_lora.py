"""verify.model: train on a LoRA model (train.lora on a tiny GPT-2): the battery reads exactly the
parameters the engine privatizes (the adapter), so the correct engine passes; a trainer without
noise, with noise std σ instead of σ·C, or one that also changes the frozen base weights is still
caught."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from transformers import GPT2Config, GPT2LMHeadModel

from dpledger.engine import BKEngine, UnsupportedLayerError
from dpledger.params import load_params
from dpledger.pipeline import run_stage
from dpledger.pipeline.verify import battery_task
from dpledger.verify.clipping_checks import probe_first_order_error
from dpledger.verify.consecutive import train_consecutive
from dpledger.verify.errors import TrainerError
from dpledger.verify.task import weighted_half_mse, with_probe
from helpers.byo_helpers import text_project, tiny_lm

TINY_GPT2 = {"n_layer": 1, "n_embd": 16, "n_head": 2, "n_positions": 32, "vocab_size": 300}
NO_DROPOUT = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
TOKENS = {"bos_token_id": 0, "eos_token_id": 0}


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> Path:
    """The LM example's corpus and tokenizer, and a 1-layer width-16 GPT-2 (save_pretrained)."""
    folder = tiny_lm(tmp_path_factory.mktemp("verify-lora"))
    torch.manual_seed(0)
    config = GPT2Config(**TINY_GPT2, **NO_DROPOUT, **TOKENS)
    GPT2LMHeadModel(config).save_pretrained(folder / "tiny")
    return folder


def _project(root: Path, lm: Path, **verify) -> Path:
    """The tiny GPT-2 with a rank-2 LoRA adapter (train.lora), texts cut at 12 tokens."""
    data = {
        "name": "text",
        "path": str(lm / "corpus.jsonl"),
        "tokenizer": str(lm / "model"),
        "max_length": 12,
    }
    train = {
        "model": "hf",
        "task": "causal-lm",
        "model_options": {"path": str(lm / "tiny")},
        "lora": {"rank": 2, "alpha": 4.0},
    }
    size = len((lm / "corpus.jsonl").read_text().splitlines())
    params = text_project(root, train_size=size - max(1, round(0.2 * size)), data=data, train=train)
    raw = yaml.safe_load(params.read_text())
    raw["verify"].update({"model": "train", "fail_pipeline": False, **verify})
    params.write_text(yaml.safe_dump(raw))
    return params


def _adapter(params: Path) -> list[torch.Tensor]:
    """The LoRA adapter's tensors, found by their names (not asked of the engine)."""
    model = battery_task(load_params(params)).model
    return [p for name, p in model.named_parameters() if ".lora_A." in name or ".lora_B." in name]


def no_noise(model, inputs, targets, **settings):
    """The engine with the noise switched off whatever σ: the missing-noise bug."""
    train_consecutive(model, inputs, targets, **{**settings, "noise_multiplier": 0.0})


def uncalibrated_noise(model, inputs, targets, **settings):
    """The engine with noise std σ whatever C (σ/C as multiplier): the uncalibrated-noise bug."""
    clip_norm, noise = settings["clip_norm"], settings["noise_multiplier"]
    train_consecutive(model, inputs, targets, **{**settings, "noise_multiplier": noise / clip_norm})


def trains_the_base_too(model, inputs, targets, **settings):
    """The engine on the adapter, plus a plain (unclipped, noiseless) change of a base weight."""
    train_consecutive(model, inputs, targets, **settings)
    named = dict(model.named_parameters())
    frozen = next(p for name, p in named.items() if name.endswith("wte.weight"))
    assert not frozen.requires_grad
    with torch.no_grad():
        frozen.add_(1e-3)


def _verdict(root: Path) -> dict:
    return json.loads((root / "artifacts/verify/verify.json").read_text())


def test_the_battery_passes_the_engine_on_a_lora_model_and_counts_only_the_adapter(tmp_path, lm):
    params = _project(tmp_path, lm)
    metrics = run_stage("verify", params, tmp_path)
    details = _verdict(tmp_path)
    assert metrics["passed"], details["verdict"]
    tests = {test["name"]: test for test in details["tests"]}
    adapter = _adapter(params)
    size = sum(p.numel() for p in adapter)
    # The base has ~10⁴ weights: counting them as noise draws failed KS and noise_scale.
    assert 0 < size < 1000
    # KS standardizes 4 seeds × the adapter's coordinates:
    assert tests["ks_update_distribution"]["details"]["samples"] == 4 * size
    assert tests["engine_self_check"]["details"]["flat"]["parameters_checked"] == len(adapter)


@pytest.mark.parametrize(
    "trainer, caught",
    [
        ("no_noise", {"t3_noise_calibration", "ks_update_distribution", "noise_scale"}),
        ("uncalibrated_noise", {"t3_noise_calibration", "noise_scale"}),
    ],
)
def test_a_flawed_engine_is_still_caught_on_a_lora_model(tmp_path, lm, trainer, caught):
    params = _project(tmp_path, lm, trainer=f"test_verify_lora:{trainer}")
    metrics = run_stage("verify", params, tmp_path)
    assert not metrics["passed"]
    assert caught <= set(_verdict(tmp_path)["verdict"]["failed_tests"])


def test_a_trainer_that_changes_a_frozen_base_weight_is_named(tmp_path, lm):
    params = _project(tmp_path, lm, trainer="test_verify_lora:trains_the_base_too")
    match = r"^the trainer under test changed '.*wte\.weight', a parameter the engine does not"
    with pytest.raises(TrainerError, match=match):
        run_stage("verify", params, tmp_path)


def test_the_task_reads_exactly_the_engines_trainable_set(tmp_path, lm):
    task = battery_task(load_params(_project(tmp_path, lm)))
    model = task.model
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    engine = BKEngine(model, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    assert list(task.trainable) == engine.parameter_names == trainable
    engine.detach()
    assert all(".lora_" in name for name in task.trainable)
    assert task.flat(model).numel() == sum(p.numel() for p in model.parameters() if p.requires_grad)


class WithBatchNorm(torch.nn.Module):
    """A trainable BatchNorm: its per-example gradients do not exist, so the engine refuses it."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(features)
        self.linear = torch.nn.Linear(features, classes)

    def forward(self, x):
        return self.linear(self.norm(x.flatten(1)))


def with_batchnorm(input_shape, num_classes):
    return WithBatchNorm(int(torch.tensor(input_shape).prod()), num_classes)


def test_a_trainable_parameter_the_engine_cannot_privatize_is_refused_by_name(tmp_path, repo_root):
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())  # digits
    raw["train"].update({"model": "test_verify_lora:with_batchnorm", "model_options": {}})
    raw["verify"]["model"] = "train"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    match = r"^engine: trainable parameter .*norm\.weight.*BatchNorm"
    with pytest.raises(UnsupportedLayerError, match=match):
        run_stage("verify", tmp_path / "params.yaml", tmp_path)
    assert not (tmp_path / "artifacts/verify").exists()


def test_the_probe_steps_departure_from_first_order_is_the_closed_form_on_a_quadratic():
    """T1/T2 shrink their step while this exceeds 10 % (a fresh LoRA adapter failed T1 at 10 %
    of the probe's loss). For w·½(θ·x − y)², along the gradient: L(s) − L + s‖g‖ = ½·s²·w·‖x‖²,
    so the departure is s·‖x‖ / (2·|θ·x − y|)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1, bias=False).double()
    x = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64)
    rows = torch.randn(4, 3, dtype=torch.float64)
    with torch.no_grad():
        labels = model(rows)
    targets = torch.cat([labels + 0.1, torch.ones(4, 1, dtype=torch.float64)], dim=1)
    label = torch.tensor([[3.0]], dtype=torch.float64)
    task = with_probe(model, rows, targets, x, label, weighted_half_mse, "quadratic")
    residual = abs(float(model(x)) - 3.0)
    for length in (1e-3, 0.1, 0.5):
        expected = length * float(x.norm()) / (2 * residual)
        assert probe_first_order_error(task, length) == pytest.approx(expected, rel=1e-6)
