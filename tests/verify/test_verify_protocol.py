"""The trainer-under-test protocol: loading callables, command templates, and the command round
trip."""

import copy
import sys

import pytest
import torch

from dpledger.errors import ParamsError
from dpledger.verify.errors import TrainerError
from dpledger.verify.functorch_trainer import train
from dpledger.verify.protocol import CommandTrainer, load_trainer, parse_command_template
from dpledger.verify.runner import BatteryConfig, Runner
from dpledger.verify.task import flat_parameters, make_task, weighted_half_mse

COMMAND = (
    f"{sys.executable} -m dpledger.verify.command_entry --trainer reference --init {{init}} --data "
    f"{{data}} "
    "--out {out} --clip-norm {clip_norm} --noise-multiplier {noise_multiplier} --batch-size "
    "{batch_size} "
    "--steps {steps} --lr {lr} --seed {seed}"
)


def missing_keywords(model, inputs, targets, *, loss_fn, clip_norm, lr):
    """A trainer that does not follow the protocol."""


def test_load_trainer_resolves_builtins_zoo_and_module_paths():
    assert load_trainer("reference").func is train.func
    assert callable(load_trainer("zoo:no_clipping"))
    assert callable(load_trainer("dpledger.verify.opacus_trainer:train"))


@pytest.mark.parametrize(
    "spec, error",
    [
        ("not-a-spec", ParamsError),
        ("no_such_module:train", TrainerError),
        ("dpledger.verify.functorch_trainer:no_such", TrainerError),
        (f"{__name__}:missing_keywords", TrainerError),
        ("zoo:no_such_bug", ParamsError),
    ],
)
def test_load_trainer_refuses_with_one_line(spec, error):
    with pytest.raises(error) as caught:
        load_trainer(spec)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "template, message",
    [
        ("", "empty"),
        ("train.py {init} {data} {out}", "lacks the placeholders"),
        (COMMAND + " {epochs}", "unknown placeholders"),
        (COMMAND + " {init", "malformed"),
    ],
)
def test_bad_command_templates_are_refused(template, message):
    with pytest.raises(ParamsError, match=message):
        parse_command_template(template)


def test_command_trainer_gives_the_same_model_as_the_callable():
    task = make_task(0)
    inputs, targets = task.ordinary_rows(0, 8)
    settings = dict(
        loss_fn=weighted_half_mse,
        clip_norm=0.5,
        noise_multiplier=1.3,
        batch_size=4,
        steps=2,
        lr=0.1,
        seed=7,
    )
    by_command, by_callable = copy.deepcopy(task.model), copy.deepcopy(task.model)
    CommandTrainer(COMMAND)(by_command, inputs, targets, **settings)
    train(by_callable, inputs, targets, **settings)
    assert torch.equal(flat_parameters(by_command), flat_parameters(by_callable))
    assert not torch.equal(flat_parameters(by_command), flat_parameters(task.model))


def test_a_failing_command_is_reported_in_one_line():
    failing = COMMAND.replace("--trainer reference", "--trainer zoo:no_such_bug")
    runner = Runner(CommandTrainer(failing), make_task(0), "sgd", BatteryConfig())
    with pytest.raises(TrainerError, match="exited with") as caught:
        runner.train(
            *make_task(0).ordinary_rows(0, 4),
            clip_norm=1.0,
            noise_multiplier=0.0,
            batch_size=4,
            lr=0.1,
            seed=0,
        )
    assert "\n" not in str(caught.value)


def test_a_trainer_that_raises_is_reported_as_a_trainer_error():
    def broken(model, inputs, targets, **settings):
        raise RuntimeError("shape mismatch\nsecond line")

    runner = Runner(broken, make_task(0), "sgd", BatteryConfig())
    with pytest.raises(TrainerError, match="RuntimeError: shape mismatch$"):
        runner.train(
            *make_task(0).ordinary_rows(0, 4),
            clip_norm=1.0,
            noise_multiplier=0.0,
            batch_size=4,
            lr=0.1,
            seed=0,
        )
