"""AdamW, weight decay and learning-rate schedules counted in logical steps: the schedules against
transformers' own, the optimizers against torch's on the same gradients, and a resumed run
bit-identical."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import optimization

from dpledger.engine import BKEngine, LrSchedule, make_optimizer, make_scheduler
from dpledger.errors import ParamsError
from dpledger.ledger import load_checkpoint
from dpledger.params import load_params
from dpledger.pipeline import run_stage
from helpers.train_project import make_project

TRANSFORMERS_SCHEDULES = {
    "constant": lambda opt, w, t: optimization.get_constant_schedule_with_warmup(opt, w),
    "linear": optimization.get_linear_schedule_with_warmup,
    "cosine": optimization.get_cosine_schedule_with_warmup,
}


def _lrs(scheduler: torch.optim.lr_scheduler.LRScheduler, steps: int) -> list[float]:
    lrs = []
    for _ in range(steps):
        lrs.append(scheduler.optimizer.param_groups[0]["lr"])
        scheduler.optimizer.step()
        scheduler.step()
    return lrs


def _sgd() -> torch.optim.SGD:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.3)


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("warmup", [0, 1, 7])
def test_lr_schedules_equal_the_transformers_schedules_to_the_bit(kind, warmup):
    total = 23
    ours = make_scheduler(_sgd(), kind, warmup, total)
    theirs = TRANSFORMERS_SCHEDULES[kind](_sgd(), warmup, total)
    assert _lrs(ours, total + 2) == _lrs(theirs, total + 2)


def test_linear_schedule_is_the_closed_form():
    schedule = LrSchedule("linear", warmup_steps=4, total_steps=10)
    assert [schedule(s) for s in range(11)] == [
        0,
        0.25,
        0.5,
        0.75,
        1,
        5 / 6,
        4 / 6,
        3 / 6,
        2 / 6,
        1 / 6,
        0,
    ]


def test_constant_schedule_without_warmup_leaves_sgd_bit_for_bit_unchanged():
    """The defaults (sgd, constant, no warm-up): the scheduler changes no number of the default
    pipeline."""
    torch.manual_seed(0)
    plain, scheduled = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    scheduled.load_state_dict(plain.state_dict())
    optimizers = [make_optimizer("sgd", m.parameters(), 0.5) for m in (plain, scheduled)]
    scheduler = make_scheduler(optimizers[1], "constant", 0, 10)
    for step in range(10):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
        for model, optimizer in zip((plain, scheduled), optimizers):
            optimizer.zero_grad()
            model(x).square().sum().backward()
            optimizer.step()
        scheduler.step()
    for a, b in zip(plain.parameters(), scheduled.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["adamw", "adam", "momentum"])
def test_optimizers_with_weight_decay_step_like_torch_on_the_engine_gradient(name):
    """With σ = 0 and a clip norm no gradient reaches, the engine's p.grad is the batch mean
    gradient: our optimizer and schedule then move the weights exactly as torch's own optimizer and
    LambdaLR."""
    torch.manual_seed(1)
    model, twin = torch.nn.Linear(5, 3).double(), torch.nn.Linear(5, 3).double()
    twin.load_state_dict(model.state_dict())
    optimizer = make_optimizer(name, model.parameters(), 0.05, weight_decay=0.1)
    scheduler = make_scheduler(optimizer, "cosine", 2, 6)
    engine = BKEngine(model, optimizer, clip_norm=1e9, noise_multiplier=0.0, normalizer=8, seed=0)
    torch_class = {
        "adamw": torch.optim.AdamW,
        "adam": torch.optim.Adam,
        "momentum": torch.optim.SGD,
    }[name]
    extra = {"momentum": 0.9} if name == "momentum" else {}
    reference = torch_class(twin.parameters(), lr=0.05, weight_decay=0.1, **extra)
    reference_schedule = optimization.get_cosine_schedule_with_warmup(reference, 2, 6)
    for step in range(6):
        x = torch.randn(8, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(step))
        engine.private_step(model(x).square().sum(1))
        scheduler.step()
        reference.zero_grad()
        (twin(x).square().sum(1).sum() / 8).backward()
        reference.step()
        reference_schedule.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_a_warmup_that_does_not_end_before_the_last_step_is_refused(tmp_path):
    params = make_project(tmp_path, epochs=1, train={"lr_schedule": "linear", "warmup_steps": 22})
    with pytest.raises(
        ParamsError,
        match=r"^params: train.warmup_steps = 22 is invalid: the schedule has 22 logical",
    ):
        run_stage("train", params, tmp_path)


def test_adamw_is_a_known_optimizer_of_the_schema(tmp_path):
    params = make_project(tmp_path, epochs=1, train={"optimizer": "adamw", "lr_schedule": "cosine"})
    assert load_params(params).train.optimizer == "adamw"
    bad = make_project(tmp_path, epochs=1, train={"lr_schedule": "step"})
    with pytest.raises(ParamsError, match=r"train.lr_schedule = 'step' is invalid"):
        load_params(bad)


class _Killed(BaseException):
    """Stands for SIGKILL after a checkpoint: nothing after the raising call runs."""


def _final_state(root):
    return torch.load(root / "artifacts/train/model.pt", weights_only=True)


def test_a_killed_run_with_warmup_and_decay_resumes_bit_identically(tmp_path, monkeypatch):
    """The schedule's position is restored from the checkpoint: a fresh LambdaLR would restart the
    warm-up."""
    from dpledger.pipeline import train as train_stage

    settings = {
        "optimizer": "adamw",
        "lr": 0.01,
        "weight_decay": 0.05,
        "lr_schedule": "linear",
        "warmup_steps": 4,
        "checkpoint_every": 1,
    }
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    for root in (killed, clean):
        root.mkdir()
        make_project(root, epochs=1, train=settings)
    real_save = train_stage.save_checkpoint

    def save_then_die(path, ledger, *args, **kwargs):
        real_save(path, ledger, *args, **kwargs)
        if ledger.steps_done == 9:
            raise _Killed

    with monkeypatch.context() as patch:
        patch.setattr(train_stage, "save_checkpoint", save_then_die)
        with pytest.raises(_Killed):
            run_stage("train", killed / "params.yaml", killed)
    assert run_stage("train", killed / "params.yaml", killed)["resumed_from_step"] == 9
    run_stage("train", clean / "params.yaml", clean)
    resumed, uninterrupted = _final_state(killed), _final_state(clean)
    for name, value in uninterrupted.items():
        assert torch.equal(resumed[name], value), name
    key = json.loads((killed / "artifacts/train/checkpoint.json").read_text())["fingerprint"]
    saved = load_checkpoint(killed / "artifacts/train/checkpoint.json", key)
    assert saved["scheduler"]["last_epoch"] == 22  # one scheduler step per logical step
    final_lr = saved["optimizer"]["param_groups"][0]["lr"]
    assert final_lr == 0.01 * LrSchedule("linear", 4, 22)(22) == 0.0
