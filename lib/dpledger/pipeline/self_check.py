"""The train stage's self-check: before the first step of a run, the engine proves itself
exact on the user's model and examples of the run's first scheduled batch
(:mod:`dpledger.engine.self_check`), in float64 and in the precision training uses (the model's own
dtype, under ``train.precision``'s autocast); and once more at one later step, drawn from the run's
seed, on the live model as trained so far (:func:`spot_check`): a model whose behaviour changes with
training (a layer that switches method, state that builds up) is checked as it trains, not only as
it starts. Each also forwards the physical batch training forwards at that step, at its full size,
and compares some of its rows' losses with theirs alone
(:func:`dpledger.engine.self_check.batch_losses`): a model that mixes examples only in batches as
large as training's is caught at that size. The spot step also compares the live model with a copy
built anew holding its parameters and buffers (:func:`check_fresh_copy`): state kept elsewhere,
which fills as training runs, makes them differ.

It runs on every run that has steps left, a resumed one included (on the model as resumed and the
batch at the resume step: the code that trains next is what is checked); a run resumed at its end
trains nothing and keeps the check its ledger already holds. A mismatch raises ``SelfCheckError``
(one line naming the layers) before anything is written. ``train.self_check: false`` skips it; the
ledger, the metrics and the report then say it did not run, a resumed run's too: the record of the
check an earlier run made covers none of the steps trained now, so it is dropped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from dpledger.engine import BKEngine, SelfCheckError
from dpledger.engine.device import autocast_dtype
from dpledger.engine.self_check_forward import CheckedForward
from dpledger.engine.state_guard import check_trained_unchanged, trained_snapshot
from dpledger.models import Task
from dpledger.params.train import TrainParams
from dpledger.pipeline.batches import DeviceBatches
from dpledger.sampling.schedule import Schedule

METRIC_KEYS = (
    "passed",
    "max_relative_error",
    "sum_relative_error",
    "examples",
    "parameters_checked",
    "parameters_trainable",
    "dtype",
    "seconds",
    "batch_rows",
    "training_passed",
    "training_dtype",
    "training_max_relative_error",
    "spot_step",
    "spot_passed",
    "spot_dtype",
    "spot_batch_rows",
    "spot_fresh_copy",
    "spot_max_relative_error",
)
"""The ledger entries copied into metrics/train.json as ``self_check_<key>`` (those a record holds:
one from an older version has no ``training_*``, one of a run that has not reached its spot step no
``spot_*``)."""

SPOT_STREAM = 0x5B07
"""Mixed with the run's seed to draw the spot check's step: its own stream, so that drawing it moves
no other random number of the run."""


def check_rows(schedule: Schedule, step: int, count: int) -> np.ndarray:
    """The first ``count`` real (not padding) rows of the batches from ``step`` on (a Poisson batch
    may be smaller than ``count``, or empty); fewer only if the rest of the schedule has fewer."""
    rows: list[int] = []
    for position in range(step, schedule.num_steps):
        indices, padding = schedule.batch(position)
        rows += [int(i) for i in indices[~padding][: count - len(rows)]]
        if len(rows) == count:
            break
    return np.asarray(rows, dtype=np.int64)


def training_batch(
    batches: DeviceBatches, step: int, physical: int | None, data: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Inputs and targets of the first physical batch this rank forwards from ``step`` on, as
    training cuts it (``train.physical_batch_size`` rows at most, padding rows included); None when
    no step from ``step`` on has a row here."""
    x_train, y_train = data
    for position in range(step, batches.schedule.num_steps):
        rows = batches.batch(position)[0]
        if len(rows):
            rows = rows[: physical or len(rows)]
            return x_train[rows], y_train[rows]
    return None


def check_before_training(
    settings: TrainParams,
    engine: BKEngine,
    task: Task,
    batches: DeviceBatches,
    step: int,
    data: tuple[torch.Tensor, torch.Tensor],
) -> dict[str, Any] | None:
    """The self-check's record (``SelfCheckResult.to_dict``) for a run starting at ``step``, or None
    when it is off or nothing is left to train; raises ``SelfCheckError`` on a mismatch."""
    if not settings.self_check:
        return None
    rows = check_rows(batches.schedule, step, settings.self_check_examples)
    if len(rows) == 0:
        return None
    x_train, y_train = data
    index = torch.from_numpy(rows).to(x_train.device)
    check_stateless(engine.model, task, x_train[index], y_train[index])
    only = tuple(settings.self_check_parameters)
    autocast = autocast_dtype(x_train.device, settings.precision)
    result = engine.self_check(
        task.losses,
        x_train[index],
        y_train[index],
        only=only,
        autocast=autocast,
        batch=training_batch(batches, step, settings.physical_batch_size, data),
    )
    return result.to_dict()


def spot_step(seed: int, num_steps: int) -> int | None:
    """The step (never the first) at which :func:`spot_check` runs, drawn from the run's ``seed``
    so that a rerun or a resume checks the same one; None when the run has a single step."""
    if num_steps < 2:
        return None
    return int(np.random.default_rng([seed, SPOT_STREAM]).integers(1, num_steps))


def spot_check(
    settings: TrainParams,
    engine: BKEngine,
    task: Task,
    batches: DeviceBatches,
    step: int,
    data: tuple[torch.Tensor, torch.Tensor],
    fresh: Callable[[], torch.nn.Module] | None = None,
) -> dict[str, Any]:
    """The self-check's comparison on the live model before ``step`` is trained, in training's
    precision only, on the first ``train.self_check_examples`` real rows of the step's batch and at
    its physical batch's size: the ``spot_*`` entries of the ledger's record. With ``fresh`` (the
    run's model factory; None under sharding, whose check already runs on a copy built anew) the
    live model is also compared with a fresh copy of itself (:func:`check_fresh_copy`). It runs on
    copies in their own fork of the random streams, so the model, the optimizer and the RNG are left
    as they were and the run trains bit for bit as without it; a mismatch raises
    ``SelfCheckError`` (one line naming the step)."""
    rows = check_rows(batches.schedule, step, settings.self_check_examples)
    x_train, y_train = data
    index = torch.from_numpy(rows).to(x_train.device)
    result = engine.self_check(
        task.losses,
        x_train[index],
        y_train[index],
        only=tuple(settings.self_check_parameters),
        precision="training",
        autocast=autocast_dtype(x_train.device, settings.precision),
        raise_on_mismatch=False,
        batch=training_batch(batches, step, settings.physical_batch_size, data),
    )
    if not result.passed:
        raise SelfCheckError(result.failure(f" at step {step} on the live model (spot check)"))
    if fresh is not None:
        check_fresh_copy(engine.model, fresh, task, x_train[index], y_train[index], step)
    return {
        "spot_step": step,
        "spot_passed": True,
        "spot_batch_rows": result.batch_rows,
        "spot_dtype": result.dtype,
        "spot_max_relative_error": result.max_relative_error,
        "spot_fresh_copy": fresh is not None,
    }


def spot_entries(record: dict[str, Any], before: int) -> dict[str, Any]:
    """The ``spot_*`` entries of an earlier run's ``record`` whose spot check ran before step
    ``before`` (a resumed run keeps them beside its own check: the steps they covered are in its
    ledger)."""
    step = record.get("spot_step")
    if not isinstance(step, int) or step >= before:
        return {}
    return {key: value for key, value in record.items() if key.startswith("spot_")}


@contextlib.contextmanager
def _buffers_restored(model: torch.nn.Module) -> Iterator[list[str]]:
    """``model``'s buffers put back as they were on exit, whatever happens inside; the list it
    yields then names those the block changed (added ones included)."""
    saved = {name: b.detach().clone() for name, b in model.named_buffers()}
    changed: list[str] = []
    try:
        yield changed
    finally:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                if name not in saved or not torch.equal(buffer, saved[name]):
                    changed.append(name)
                if name in saved and buffer.shape == saved[name].shape:
                    buffer.copy_(saved[name])


def check_stateless(model: torch.nn.Module, task: Task, x: torch.Tensor, y: torch.Tensor) -> None:
    """The same batch forwarded twice from the same RNG state must give the same per-example losses.

    A model that carries state across forwards outside its parameters and buffers (a cross-batch
    feature memory in a plain attribute, as MoCo queues keep) lets one example reach later steps
    through a channel no accountant sees, and the self-check on a fresh copy cannot see it. The
    model's buffers and the RNG are restored afterwards, so the check changes nothing; raises
    ``SelfCheckError`` (one line) when the two forwards differ with the buffers unchanged (state in
    a buffer is the state guard's, which names it)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    trained = trained_snapshot(model, trainable)
    cpu = torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    outputs = []
    try:
        with _buffers_restored(model) as changed, torch.no_grad():
            for _ in range(2):
                torch.random.set_rng_state(cpu)
                if cuda is not None:
                    torch.cuda.set_rng_state_all(cuda)
                outputs.append(task.losses(model, x, y).detach().clone())
    finally:
        torch.random.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
    check_trained_unchanged(model, trainable, trained)  # set from the data in a forward pass
    if changed:
        return  # state kept in buffers: the state guard names the buffer after the first step
    first, second = outputs
    # a tolerance for nondeterministic GPU kernels; a memory that mixes in earlier examples moves
    # the losses by far more
    if not torch.allclose(first, second, rtol=1e-5, atol=1e-6, equal_nan=True):
        worst = float((first - second).abs().max())
        raise SelfCheckError(
            f"the model is not stateless: the same batch forwarded twice from the same random state gave losses differing by {worst:.3g}; it keeps state across forwards outside its parameters and buffers (e.g. a feature memory), through which one example reaches later steps unaccounted. Remove that state."  # noqa: E501
        )


FRESH_TOLERANCE = {
    torch.float64: 1e-9,
    torch.float32: 1e-5,
    torch.bfloat16: 1e-2,
    torch.float16: 1e-2,
}
"""Largest relative difference between the live model's losses and a fresh copy's, per parameter
dtype: the same operations on the same numbers, so round-off of nondeterministic GPU kernels only
(as :func:`check_stateless`'s); a memory mixed into the logits moves them by far more."""


def check_fresh_copy(
    model: torch.nn.Module,
    fresh: Callable[[], torch.nn.Module],
    task: Task,
    x: torch.Tensor,
    y: torch.Tensor,
    step: int,
) -> None:
    """The live model, after the ``step`` steps trained so far, must give the per-example losses of
    a model built anew (``fresh``) holding its parameters, buffers and modes: state kept in plain
    attributes (a feature memory that fills as training runs) is what makes them differ, and
    :func:`check_stateless` before the first step sees it only once it acts. Both are forwarded
    once, from the same random state, with dropout off and without gradients; the live model's
    buffers and the RNG are restored, so training goes on as without the check. Raises
    ``SelfCheckError`` (one line) on a difference."""
    devices = [x.device] if x.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        copy = fresh()
    copy.load_state_dict(model.state_dict())
    live_modules = dict(model.named_modules())
    live_buffers = dict(model.named_buffers())
    with torch.no_grad():
        for name, buffer in copy.named_buffers():  # non-persistent ones too
            if name in live_buffers and buffer.shape == live_buffers[name].shape:
                buffer.copy_(live_buffers[name])
    for name, module in copy.named_modules():
        module.training = live_modules[name].training if name in live_modules else model.training
    losses = []
    with torch.random.fork_rng(devices=devices), _buffers_restored(model), torch.no_grad():
        state = torch.random.get_rng_state()
        with CheckedForward():
            for each in (model, copy):
                torch.random.set_rng_state(state)
                losses.append(task.losses(each, x, y).detach().double())
    live, anew = losses
    dtype = next(model.parameters()).dtype
    tolerance = FRESH_TOLERANCE.get(dtype, 1e-5)
    scale = max(float(anew.abs().max()), 1.0)
    worst = float((live - anew).abs().max())
    if not worst <= tolerance * scale:
        raise SelfCheckError(
            f"the model is not stateless: after {step} steps its per-example losses differ from those of a model built anew with its parameters, buffers and modes (by {worst:.3g}); it keeps state outside them (a memory in a plain attribute), through which examples reach later steps unaccounted. Remove that state."  # noqa: E501
        )


def to_metrics(record: dict[str, Any]) -> dict[str, Any]:
    """Flat ``self_check_*`` scalars for metrics/train.json; ``self_check_ran: false`` without a
    record."""
    if not record:
        return {"self_check_ran": False}
    copied = {f"self_check_{key}": record[key] for key in METRIC_KEYS if key in record}
    return {"self_check_ran": True, **copied}
