"""Issue 27 defect 4: a model that changes its own state from the data (a buffer updated in
``forward``, an example copied into a frozen parameter) is refused like BatchNorm, naming the buffer
or parameter; a model whose buffers and frozen parameters stay put trains."""

from __future__ import annotations

import pytest
import torch
from test_trust_inputs import small_project
from torch import nn

from dpledger.engine.state_guard import check_state_unchanged, state_snapshot
from dpledger.errors import DpledgerError
from dpledger.pipeline import run_stage


class RunningMean(nn.Module):
    """BatchNorm's leak in a custom module: a running mean of the inputs, updated in forward."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, classes)
        self.register_buffer("mean", torch.zeros(features))

    def forward(self, x):
        with torch.no_grad():
            self.mean.mul_(0.9).add_(0.1 * x.mean(0))
        return self.linear(x - self.mean)


class FrozenCopy(nn.Module):
    """Copies an example into a frozen parameter under no_grad: raw data in the released weights."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, classes)
        self.memo = nn.Parameter(torch.zeros(features), requires_grad=False)

    def forward(self, x):
        with torch.no_grad():
            self.memo.copy_(x[0])
        return self.linear(x)


class GrowsABuffer(nn.Module):
    """Registers a new buffer from the data on its first training call."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, classes)

    def forward(self, x):
        if torch.is_grad_enabled() and not hasattr(self, "seen"):
            self.register_buffer("seen", x[:1].detach().clone())
        return self.linear(x)


class ConstantState(nn.Module):
    """A constant buffer and a frozen parameter that forward only reads: nothing leaks, it
    trains."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, classes)
        self.register_buffer("scale", torch.full((features,), 0.5))
        self.shift = nn.Parameter(torch.ones(features), requires_grad=False)

    def forward(self, x):
        return self.linear(x * self.scale + self.shift)


class ActNorm(nn.Module):
    """ActNorm's data-dependent initialisation: its first training forward sets a trainable scale
    from the batch (under no_grad), which no noise covers."""

    def __init__(self, features: int, classes: int, any_forward: bool = False) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(features))
        self.linear = nn.Linear(features, classes)
        self.initialised, self.any_forward = False, any_forward

    def forward(self, x):
        if (self.any_forward or torch.is_grad_enabled()) and not self.initialised:
            with torch.no_grad():
                self.scale.copy_(1 / (x.std(0) + 1e-6))
            self.initialised = True
        return self.linear(x * self.scale)


def act_norm(input_shape, num_classes):
    return ActNorm(input_shape[0], num_classes)


def running_mean(input_shape, num_classes):
    return RunningMean(input_shape[0], num_classes)


def frozen_copy(input_shape, num_classes):
    return FrozenCopy(input_shape[0], num_classes)


def grows_a_buffer(input_shape, num_classes):
    return GrowsABuffer(input_shape[0], num_classes)


def constant_state(input_shape, num_classes):
    return ConstantState(input_shape[0], num_classes)


@pytest.mark.parametrize(
    "factory,named",
    [
        ("running_mean", "buffer mean changed"),
        ("frozen_copy", "frozen parameter memo changed"),
        ("grows_a_buffer", "buffer seen appeared"),
    ],
)
def test_a_model_that_changes_its_state_from_the_data_is_refused_and_nothing_is_written(
    tmp_path, factory, named
):
    params, _, _ = small_project(
        tmp_path, train={"model": f"{__name__}:{factory}", "model_options": {}}
    )
    with pytest.raises(DpledgerError) as refused:
        run_stage("train", params, tmp_path)
    message = str(refused.value)
    assert "\n" not in message and named in message and "without noise" in message
    written = (
        [p.name for p in (tmp_path / "artifacts/train").glob("*")]
        if (tmp_path / "artifacts/train").exists()
        else []
    )
    assert written == [] and not (tmp_path / "metrics/train.json").exists()


@pytest.mark.parametrize("self_check", [True, False])
def test_a_trainable_parameter_set_from_the_data_in_forward_is_refused(tmp_path, self_check):
    """Caught in the first training step, before the optimizer runs, with the self-check on (its
    copy initialises itself, not the live model) or off."""
    params, _, _ = small_project(
        tmp_path,
        train={"model": f"{__name__}:act_norm", "model_options": {}, "self_check": self_check},
    )
    with pytest.raises(DpledgerError) as refused:
        run_stage("train", params, tmp_path)
    message = str(refused.value)
    assert "\n" not in message and "trainable parameter scale changed" in message
    assert not (tmp_path / "metrics/train.json").exists()


def test_the_statelessness_forward_refuses_a_trainable_parameter_set_from_the_data():
    """A model that initialises itself in any forward does so in the self-check's forward on the
    live model (the pipeline's first call on training rows): refused there, in one line."""
    from dpledger.models.tasks import Task
    from dpledger.pipeline.self_check import check_stateless

    x, y = torch.randn(4, 3) * 5, torch.randint(0, 2, (4,))
    with pytest.raises(DpledgerError, match="trainable parameter scale changed"):
        check_stateless(ActNorm(3, 2, any_forward=True), Task("classification"), x, y)
    check_stateless(ActNorm(3, 2), Task("classification"), x, y)  # under no_grad: not set


def test_a_model_whose_buffers_and_frozen_parameters_stay_put_trains(tmp_path):
    params, _, _ = small_project(
        tmp_path, train={"model": f"{__name__}:constant_state", "model_options": {}}
    )
    assert run_stage("train", params, tmp_path)["steps_done"] == 10


def test_the_snapshot_holds_buffers_and_untrained_parameters_only():
    model = ConstantState(3, 2)
    optimizer = torch.optim.SGD(model.linear.parameters(), lr=0.1)
    assert sorted(state_snapshot(model, optimizer)) == ["buffer scale", "frozen parameter shift"]
    before = state_snapshot(model, optimizer)
    model.linear.weight.data += 1  # trained parameters may change
    check_state_unchanged(model, optimizer, before)
    model.scale[0] = float("nan")
    with pytest.raises(DpledgerError, match="buffer scale changed"):
        check_state_unchanged(model, optimizer, before)
    nan_before = state_snapshot(model, optimizer)
    check_state_unchanged(model, optimizer, nan_before)  # NaN stays NaN: unchanged


class RemembersItsFirstInput(nn.Module):
    """Keeps a copy of the first batch it is ever called with."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, classes)

    def forward(self, x):
        if not hasattr(self, "first"):
            self.register_buffer("first", x.detach().clone())
        return self.linear(x)


def remembers(input_shape, num_classes):
    return RemembersItsFirstInput(input_shape[0], num_classes)


def test_the_output_check_calls_the_model_on_zeros_never_on_training_examples(tmp_path):
    from dpledger.data import load_data
    from dpledger.models import build_task_model, task_for
    from dpledger.params import load_params

    params = load_params(small_project(tmp_path)[0])
    data = load_data(params.data, params.seed)
    task = task_for(f"{__name__}:remembers", params.train.task, data)
    model = build_task_model(f"{__name__}:remembers", {}, task, data)
    assert model.first.shape == (2, *data.input_shape) and not model.first.any()


def test_the_standalone_consecutive_trainer_refuses_a_model_that_changes_its_state():
    from dpledger.verify.consecutive import train_consecutive

    inputs, targets = torch.randn(8, 3), torch.randint(0, 2, (8,))

    def loss_fn(outputs, y):
        return torch.nn.functional.cross_entropy(outputs, y, reduction="none")

    run = {
        "loss_fn": loss_fn,
        "clip_norm": 1.0,
        "noise_multiplier": 1.0,
        "batch_size": 4,
        "steps": 2,
        "lr": 0.1,
    }
    with pytest.raises(DpledgerError, match="buffer mean changed"):
        train_consecutive(RunningMean(3, 2), inputs, targets, seed=0, **run)
    train_consecutive(ConstantState(3, 2), inputs, targets, seed=0, **run)


@pytest.mark.parametrize(
    "dtype,size", [(torch.float32, 3 * (1 << 20) + 5), (torch.bfloat16, 1001), (torch.uint8, 7)]
)
def test_the_digest_sees_one_flipped_bit_anywhere_and_keeps_no_copy(dtype, size, monkeypatch):
    """The snapshot digests on the tensor's device instead of copying it to the host (a LoRA base
    stays put); one flipped bit at the start, in the middle (across the pass boundary) or at the end
    shows."""
    from dpledger.engine import state_guard

    # several passes over the float32 tensor
    monkeypatch.setattr(state_guard, "DIGEST_CHUNK", 1 << 20)
    generator = torch.Generator().manual_seed(0)
    tensor = torch.randint(0, 255, (size,), generator=generator, dtype=torch.uint8).to(dtype)
    before = state_guard.digest(tensor)
    assert before.dtype == torch.int64 and before.shape == (2,)
    assert torch.equal(state_guard.digest(tensor.clone()), before)
    raw = tensor.view(torch.uint8) if dtype != torch.uint8 else tensor
    for index in (0, raw.numel() // 2, raw.numel() - 1):
        flipped = raw.clone()
        flipped[index] ^= 1 << (index % 8)
        assert not torch.equal(
            state_guard.digest(flipped.view(dtype) if dtype != torch.uint8 else flipped), before
        )
