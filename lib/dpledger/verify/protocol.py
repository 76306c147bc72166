"""The trainer-under-test protocol: a Python callable, or an external command built from a template.

Callable::

    train(model, inputs, targets, *, loss_fn, clip_norm, noise_multiplier, batch_size, steps, lr,
    seed,
          optimizer="sgd") -> None

trains ``model`` in place with DP-SGD on consecutive batches: ``inputs`` has ``steps·batch_size``
rows and step t uses rows ``t·B … (t+1)·B − 1`` (no sampling in test mode; built-in trainers take
them from :func:`dpledger.verify.consecutive.consecutive_batches`). ``loss_fn(outputs, targets)``
returns per-example losses. The update is 000 Alg. 1: ``θ ← θ − lr·(1/B)(Σ clip_C(g_b) + N(0, (σC)²
I))`` (SGD) or the same private gradient handed to Adam; ``seed`` seeds the noise.

Command: a template with the placeholders of :data:`PLACEHOLDERS`; ``{init}`` is a ``torch.save``'d
``state_dict``, ``{data}`` a ``torch.save``'d dict (see :func:`data_file_payload`), and the command
must write the final ``state_dict`` to ``{out}``.
"""

from __future__ import annotations

import importlib
import inspect
import shlex
import string
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpledger.errors import ParamsError
from dpledger.verify.consecutive import ConsecutiveRun, LossFn, Trainer
from dpledger.verify.errors import TrainerError
from dpledger.verify.task import weighted_half_mse

PLACEHOLDERS = (
    "init",
    "data",
    "out",
    "clip_norm",
    "noise_multiplier",
    "batch_size",
    "steps",
    "lr",
    "seed",
)
OPTIONAL_PLACEHOLDERS = ("optimizer",)
KEYWORDS = (
    "loss_fn",
    "clip_norm",
    "noise_multiplier",
    "batch_size",
    "steps",
    "lr",
    "seed",
    "optimizer",
)
BUILTIN_TRAINERS = {
    "dpledger": "dpledger.verify.consecutive:train_consecutive",
    "reference": "dpledger.verify.functorch_trainer:train",
    "opacus": "dpledger.verify.opacus_trainer:train",
    "distributed": "dpledger.verify.distributed_trainer:train",
}
MODEL_DESCRIPTION = "torch.nn.Sequential(Linear(8, 16), Tanh(), Linear(16, 2))"
LOSS_DESCRIPTION = (
    "per-example loss w·½‖outputs − y‖² with targets[:, :-1] = y and targets[:, -1] = w"
)


def load_trainer(spec: str) -> Trainer:
    """Import a trainer from 'dpledger', 'reference', 'opacus', 'distributed', 'zoo:NAME' or
    'module:callable'."""
    if spec.startswith("zoo:"):
        from dpledger.verify.flawed_trainers import zoo_trainer

        return zoo_trainer(spec.removeprefix("zoo:"))
    target = BUILTIN_TRAINERS.get(spec, spec)
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ParamsError(
            f"params: verify.trainer = {spec!r} is invalid: use 'dpledger', 'reference', 'opacus', "
            "'distributed', "
            "'zoo:NAME' or 'module:callable'"
        )
    try:
        trainer = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise TrainerError(f"verify.trainer = {spec!r}: cannot import {target} ({error})") from None
    check_signature(trainer, spec)
    return trainer


def check_signature(trainer: Any, spec: str) -> None:
    """Refuse a callable that does not accept the protocol's keyword arguments."""
    if not callable(trainer):
        raise TrainerError(f"verify.trainer = {spec!r} is not callable")
    try:
        parameters = inspect.signature(trainer).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    missing = [keyword for keyword in KEYWORDS if keyword not in parameters]
    if missing:
        raise TrainerError(
            f"verify.trainer = {spec!r} does not accept the protocol keywords {missing}"
        )


def parse_command_template(template: str) -> list[str]:
    """Split a command template into arguments and check its placeholders; one line on a bad
    template."""
    try:
        arguments = shlex.split(template)
    except ValueError as error:
        raise ParamsError(
            f"params: verify.command = {template!r} cannot be split into arguments ({error})"
        ) from None
    if not arguments:
        raise ParamsError(
            "params: verify.command is empty: "
            "give a command with the placeholders {init} {data} {out} …"
        )
    found: set[str] = set()
    for argument in arguments:
        try:
            fields = [
                name for _, name, _, _ in string.Formatter().parse(argument) if name is not None
            ]
        except ValueError as error:
            raise ParamsError(
                f"params: verify.command has a malformed placeholder in {argument!r}: {error}"
            ) from None
        found.update(fields)
    unknown = sorted(found - set(PLACEHOLDERS) - set(OPTIONAL_PLACEHOLDERS))
    missing = [name for name in PLACEHOLDERS if name not in found]
    if unknown:
        raise ParamsError(
            f"params: verify.command uses unknown placeholders {unknown}; allowed: "
            f"{list(PLACEHOLDERS)}"
        )
    if missing:
        raise ParamsError(
            f"params: verify.command lacks the placeholders {missing}; "
            f"all of {list(PLACEHOLDERS)} are needed"
        )
    return arguments


def data_file_payload(
    inputs: torch.Tensor, targets: torch.Tensor, optimizer: str
) -> dict[str, Any]:
    """What ``{data}`` holds: tensors plus a plain description of the model and the loss to use."""
    return {
        "inputs": inputs,
        "targets": targets,
        "loss": "weighted_half_mse",
        "loss_description": LOSS_DESCRIPTION,
        "model": MODEL_DESCRIPTION,
        "optimizer": optimizer,
    }


class CommandTrainer:
    """Runs an external training script through the command template, one process per call."""

    def __init__(self, template: str, timeout_s: float = 600.0) -> None:
        self.template = template
        self.arguments = parse_command_template(template)
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"command: {self.template}"

    def __call__(
        self,
        model: nn.Module,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        *,
        loss_fn: LossFn,
        **settings: Any,
    ) -> None:
        """Train ``model`` through the command; ``settings`` are the fields of a
        :class:`ConsecutiveRun`."""
        run = ConsecutiveRun(**settings)
        if loss_fn is not weighted_half_mse:
            raise TrainerError(
                "a command trainer only knows the weighted_half_mse loss of the data file"
            )
        with tempfile.TemporaryDirectory(prefix="dpledger-verify-") as folder:
            paths = {name: str(Path(folder) / f"{name}.pt") for name in ("init", "data", "out")}
            torch.save(model.state_dict(), paths["init"])
            torch.save(data_file_payload(inputs, targets, run.optimizer), paths["data"])
            values = dict(
                paths,
                clip_norm=repr(float(run.clip_norm)),
                noise_multiplier=repr(float(run.noise_multiplier)),
                batch_size=str(int(run.batch_size)),
                steps=str(int(run.steps)),
                lr=repr(float(run.lr)),
                seed=str(int(run.seed)),
                optimizer=run.optimizer,
            )
            command = [argument.format(**values) for argument in self.arguments]
            try:
                completed = subprocess.run(
                    command, capture_output=True, text=True, timeout=self.timeout_s
                )
            except (OSError, subprocess.TimeoutExpired) as error:
                raise TrainerError(f"verify.command failed to run: {error}") from None
            if completed.returncode != 0:
                last_line = (completed.stderr.strip().splitlines() or ["(no stderr)"])[-1]
                raise TrainerError(
                    f"verify.command exited with {completed.returncode}: {last_line}"
                )
            if not Path(paths["out"]).exists():
                raise TrainerError("verify.command exited without writing {out}")
            model.load_state_dict(torch.load(paths["out"], weights_only=True))
