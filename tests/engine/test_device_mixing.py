"""The engine, the self-check and the train stage with the model on a second device
(``pretend_device.py``: a CPU tensor that says it lives elsewhere and refuses, as CUDA does, any
operation that mixes it with a CPU tensor).

What a GPU machine found on the first run (a CPU tensor minus a CUDA one in the self-check) is
caught here on the CPU: every tensor the engine or a stage makes without ``device=`` lands on the
CPU while the model is on the pretend device. The values are the CPU's own, so the results are also
compared with the same computation on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from test_engine_hf_models import MODELS as HF_MODELS
from torch import nn

from dpledger.engine import BKEngine
from helpers.pretend_device import OnPretend, host_syncs, pretend_device, reset_host_syncs


def classification_loss(model, x, y):
    return F.cross_entropy(model(x), y, reduction="none")


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.LayerNorm(16), nn.Linear(16, 4))


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 6 * 6, 4))


def _rows(n: int = 6):
    generator = torch.Generator().manual_seed(1)
    images = torch.rand(n, 1, 8, 8, generator=generator)
    return images, torch.randint(0, 4, (n,), generator=generator)


def test_the_pretend_device_refuses_what_a_gpu_refuses():
    with pretend_device() as device:
        on = torch.zeros(3, device=device)
        assert isinstance(on, OnPretend) and on.device == device and (on + 1).device == device
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            _ = on - torch.ones(3)
        with pytest.raises(TypeError, match="numpy"):
            on.numpy()
        # a 0-dim CPU scalar is allowed, as on CUDA
        assert (on + torch.tensor(2.0)).device == device
        reset_host_syncs()
        assert on.cpu().device.type == "cpu" and float(on.sum()) == 0.0
        assert host_syncs() == {"copy": 1, "read": 1}
        layer = nn.Linear(3, 2).to(device)
        layer(on.unsqueeze(0)).sum().backward()
        assert layer.weight.grad.device == device and isinstance(layer.weight, nn.Parameter)


def _step(model_fn, loss_fn, x, y, device, **options):
    """One private step without noise of a fresh model on ``device``; its gradients on the CPU."""
    model = model_fn().to(device)
    engine = BKEngine(model, None, clip_norm=0.5, noise_multiplier=0.0, normalizer=1.0, **options)
    half = len(x) // 2
    weights = torch.ones(len(x), device=device)
    weights[-1] = 0
    for rows in (slice(0, half), slice(half, None)):
        engine.backward(loss_fn(model, x[rows].to(device), y[rows].to(device)), weights[rows])
    engine.step()
    return [g.cpu() for g in engine.last_noisy_sum]


@pytest.mark.parametrize("clipping", ["flat", "per-layer", "automatic"])
@pytest.mark.parametrize("model_fn", [_mlp, _cnn], ids=["mlp", "cnn"])
def test_a_private_step_on_another_device_equals_the_cpu_one(model_fn, clipping):
    x, y = _rows()
    expected = _step(model_fn, classification_loss, x, y, torch.device("cpu"), clipping=clipping)
    with pretend_device() as device:
        got = _step(model_fn, classification_loss, x, y, device, clipping=clipping)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(got, expected))


def _hf_loss(model, x, y):
    return model.loss_fn(model(x), y)


@pytest.mark.parametrize("name", ["gpt2", "bert", "gpt2-lora"])
def test_hf_models_step_on_another_device(name):
    """GPT-2's tied head (ghost cross terms), BERT's embeddings and LoRA adapters."""
    made = HF_MODELS[name]()
    model, loss_fn, inputs, targets = made

    def build():
        built = copy.deepcopy(model).float()
        built.loss_fn = loss_fn
        return built

    expected = _step(build, _hf_loss, inputs, targets, torch.device("cpu"))
    with pretend_device() as device:
        got = _step(build, _hf_loss, inputs, targets, device)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(got, expected))


def test_a_step_with_noise_canary_and_watch_stays_on_the_device_and_never_waits_for_it():
    """The one-run audit's path (canary, watched coordinates) and the noise, with no host read or
    copy in a step once the first step's checks have run."""
    x, y = _rows(8)
    with pretend_device() as device:
        model = _mlp().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        engine = BKEngine(model, optimizer, clip_norm=1.0, noise_multiplier=1.0, normalizer=8.0)
        engine.watch(lambda views: torch.cat([v.reshape(-1)[:3] for v in views]))
        canary = [torch.full_like(p, 1e-3) for p in engine.params]
        xd, yd = x.to(device), y.to(device)
        engine.private_step(classification_loss(model, xd, yd), canary=canary)
        reset_host_syncs()
        for _ in range(2):
            engine.private_step(classification_loss(model, xd, yd), canary=canary)
        assert host_syncs() == {}
        assert engine.last_watched.device == device and engine.last_norms.device == device
        assert all(p.device == device for p in model.parameters())


def test_the_self_check_runs_on_the_models_device():
    x, y = _rows(4)
    with pretend_device() as device:
        model = _mlp().to(device)
        engine = BKEngine(model, None, clip_norm=0.5, noise_multiplier=1.0, normalizer=4.0)
        result = engine.self_check(classification_loss, x.to(device), y.to(device))
    assert result.passed and result.dtype == "float64"


def test_the_train_stage_trains_on_another_device_with_the_default_params(tmp_path, monkeypatch):
    """The default params (self-check on, one-run audit on) with the device resolved to the pretend
    one: the train stage runs and its model equals the CPU run's (no noise difference: the model
    is compared at σ as calibrated, so the same seed must give the same noise on both)."""
    from dpledger.pipeline import run_stage
    from dpledger.pipeline import train as train_stage
    from helpers.train_project import make_project

    with pretend_device() as device:
        monkeypatch.setattr(train_stage, "select_device", lambda name: device)
        params = make_project(tmp_path, epochs=1, train={"checkpoint_every": 5})
        metrics = run_stage("train", params, tmp_path)
    assert metrics["steps_done"] > 0 and metrics["self_check_ran"] and metrics["self_check_passed"]
    assert (tmp_path / "artifacts/train").is_dir()
    saved = torch.load(tmp_path / "artifacts/train/model.pt")
    assert all(type(t) is torch.Tensor and t.device.type == "cpu" for t in saved.values())


def test_the_one_run_audit_records_without_waiting_for_the_device(tmp_path):
    """The canary recorder keeps each step's watched coordinates on the device and copies them to
    the host once per checkpoint; what it saves equals the CPU run's."""
    from dpledger.audit.canaries import CanaryPlan, CanaryRecorder, load_observations

    x, y = _rows(8)
    saved = {}
    for where in ("cpu", "pretend"):
        with pretend_device() as pretend:
            device = pretend if where == "pretend" else torch.device("cpu")
            model = _mlp().to(device)
            engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=8.0)
            recorder = CanaryRecorder(CanaryPlan.draw(3, 20, engine.numel), engine, 3, 1.0)
            xd, yd = x.to(device), y.to(device)
            reset_host_syncs()
            for step in range(3):
                engine.private_step(classification_loss(model, xd, yd))
                recorder.record(step)
            if where == "pretend":
                assert host_syncs() == {}
            (tmp_path / where).mkdir()
            recorder.save(tmp_path / where, "key", 3)
        saved[where] = load_observations(tmp_path / where / "canaries.npz")
    assert all(
        torch.equal(torch.from_numpy(saved["cpu"][k]), torch.from_numpy(saved["pretend"][k]))
        for k in ("raw", "real")
    )
