"""train stage: DP-SGD with the BK engine on the schedule's batches, with a resumable privacy
ledger.

Reads ``artifacts/calibration/calibration.json`` (σ, mechanism, ε curve) and ``artifacts/schedule/``
(the batches), builds the model and its task (:mod:`dpledger.models`: zoo, ``hf`` or plugin;
per-example loss and metric), refuses a schedule whose sampler differs from the accounted one
(unless ``train.allow_sampler_mismatch``) or that is longer than the accounted number of steps, and
trains. A checkpoint with the ledger is written every ``train.checkpoint_every`` steps and at each
epoch's end into ``artifacts/train/`` (``persist: true`` in dvc.yaml), so a killed run resumes at
the step it reached.

A run is four phases, each a function here: :func:`prepare` (inputs, fingerprint, noise key, model
and engine, checkpoint restored: ``train_prepare.py``), :func:`step_loop` (the DP-SGD steps),
:func:`checkpoint` (the ledger and weights, with the secret noise key sealed in the weights file)
and :func:`finish` (evaluation, outputs: ``train_outputs.py``, publication). The noise key is
secret by default (``pipeline/noise_key.py``). The ledger and metrics record the σ the engine used,
where the noise key came from, the examples dropped for a non-finite gradient norm and whether the
loss diverged.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from dpledger import paths
from dpledger.accounting.record import CalibrationRecord
from dpledger.audit.canaries import CanaryRecorder, recorder_for
from dpledger.data import Dataset
from dpledger.engine import BKEngine, retain_freed_memory
from dpledger.engine.device import autocast, select_device
from dpledger.engine.state_guard import (
    check_state_unchanged,
    check_trained_unchanged,
    state_snapshot,
    trained_snapshot,
)
from dpledger.ledger import (
    PUBLIC_KEY_WARNING,
    Ledger,
    fingerprint,
    remove_stale_temporaries,
    save_checkpoint,
)
from dpledger.models import Task, utility
from dpledger.models.publish import publish_run
from dpledger.params import Params
from dpledger.pipeline import prior_runs, sharding, train_prepare
from dpledger.pipeline.batches import DeviceBatches
from dpledger.pipeline.distributed import SINGLE, Ranks, run_ranks
from dpledger.pipeline.noise_key import NoiseKey
from dpledger.pipeline.progress import Progress
from dpledger.pipeline.self_check import (
    check_before_training,
    spot_check,
    spot_entries,
    spot_step,
)
from dpledger.pipeline.step_losses import StepLosses
from dpledger.pipeline.train_outputs import Finished, write_outputs
from dpledger.sampling.guard import SamplerCheck, check_schedule
from dpledger.sampling.schedule import Schedule

OUT = paths.TRAIN_DIR


def epsilon_spent(record: CalibrationRecord, steps_done: int) -> float:
    """ε after ``steps_done`` steps, read pessimistically: the first curve point at or past the
    step.

    Without such a point the full claim ``record.epsilon`` (proven for ``record.steps``) is
    reported.
    """
    if steps_done <= 0:
        return 0.0
    at_or_after = [(steps, eps) for steps, eps in record.epsilon_curve if steps >= steps_done]
    return float(min(at_or_after)[1]) if at_or_after else float(record.epsilon)


@dataclass
class Run:
    """A run in progress: its inputs, its trainable parts, the noise key and the ledger so far."""

    params: Params
    root: Path
    ranks: Ranks
    record: CalibrationRecord
    schedule: Schedule
    data: Dataset
    check: SamplerCheck
    device: torch.device
    model: torch.nn.Module
    task: Task
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler
    engine: BKEngine
    fingerprint: str
    noise: NoiseKey
    ledger: Ledger
    resumed_from: int
    canaries: CanaryRecorder | None
    batches: DeviceBatches
    """The schedule's batches on the device, this rank's shares (:func:`sharding.upload`)."""
    tensors: tuple[torch.Tensor, ...] = ()
    """x_train, y_train, x_test, y_test on the device."""
    prior: prior_runs.Prior | None = None
    """The privately trained starting point, if any (:mod:`dpledger.pipeline.prior_runs`)."""
    rows: str = ""
    """The fingerprint of the training rows (a later run compares its own with it)."""
    fresh: Callable[[], torch.nn.Module] | None = None
    """A new model of the run (``train_prepare.Built.fresh``): the spot check's fresh copy."""

    @property
    def checkpoint_path(self) -> Path:
        return self.root / OUT / "checkpoint.json"


@dataclass
class Progression:
    """The step loop's running state: history, the examples and time since the last checkpoint."""

    history: dict[str, list[float]]
    started: float = field(default_factory=time.perf_counter)
    examples: int = 0


def prepare(params: Params, root: Path, ranks: Ranks) -> Run:
    """Inputs checked, noise key found, model and engine built, a checkpoint of the same inputs
    (and noise key) restored, canaries resumed, data on the device."""
    record, schedule, data = train_prepare.load_inputs(params, root)
    rows = fingerprint(data.x_train, data.y_train)  # which examples: compared with a prior's
    prior = prior_runs.find_prior(params, root, rows)
    check = check_schedule(
        record.description, schedule, allow_mismatch=params.train.allow_sampler_mismatch
    )
    device = ranks.device(select_device(params.train.device))
    if device.type == "cpu":
        retain_freed_memory()
    noise = train_prepare.noise_key(params, root)
    code = train_prepare.training_code()
    key = train_prepare.input_fingerprint(params, root, data, device, noise, code)
    saved, noise = train_prepare.saved_state(root / OUT / "checkpoint.json", key, noise)
    settings = train_prepare.clip_noise(params, record, schedule)
    built = train_prepare.build(params, settings, data, device, ranks, noise)
    if saved is None:
        ledger = train_prepare.new_ledger(
            record, schedule, built.task, key, noise, params.train.threads
        )
    else:
        ledger = train_prepare.restore(saved, built)
    resumed_from = ledger.steps_done
    train_prepare.pin_threads(ledger, params.train.threads)
    ranks.check_same_start(resumed_from, built.model, device)
    resume = (root / OUT, key, resumed_from)
    canaries = _canaries(params, ranks, built.engine, schedule, resume)
    if ranks.writes:
        print(f"train: {_tuning_line(built.model, built.engine)}", file=sys.stderr)
        if noise.public:
            print(
                f"train: warning: the noise key is {noise.source}: {PUBLIC_KEY_WARNING}",
                file=sys.stderr,
            )
    arrays = (data.x_train, data.y_train, data.x_test, data.y_test)
    tensors = tuple(torch.from_numpy(a).to(device) for a in arrays)
    run = Run(
        params,
        root,
        ranks,
        record,
        schedule,
        data,
        check,
        device,
        built.model,
        built.task,
        built.optimizer,
        built.scheduler,
        built.engine,
        key,
        noise,
        ledger,
        resumed_from,
        canaries,
        sharding.upload(built.engine, schedule, ranks, device),
        tensors,
        prior,
        rows,
        None if sharding.is_sharded(built.model) else built.fresh,
    )
    checked = check_before_training(
        params.train, run.engine, run.task, run.batches, resumed_from, tensors[:2]
    )
    if checked is not None:
        # a spot check the earlier run made covers steps of this ledger: kept beside the new check
        checked = {**spot_entries(ledger.self_check, resumed_from), **checked}
    if checked is not None or resumed_from < schedule.num_steps:
        # steps left to train without a check: an earlier run's record covers none of them
        run.ledger = replace(ledger, self_check=checked or {})
    return run


def _private_step(
    engine: BKEngine,
    task: Task,
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    rows: torch.Tensor,
    weights: torch.Tensor,
    physical: int | None,
    device: torch.device,
    precision: str,
    guarded: bool = False,
) -> torch.Tensor:
    """One DP-SGD step over the batch ``rows`` (in physical chunks); returns the batch's summed
    loss, a float64 scalar left on the device (read back by ``StepLosses``: no host sync per
    physical batch). ``guarded``: the trained parameters must come out of the forward and backward
    passes unchanged (``state_guard.trained_snapshot``), checked before the optimizer runs."""
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    chunk = physical or max(len(rows), 1)
    trained = trained_snapshot(model, engine.params) if guarded else None
    for lo in range(0, len(rows), chunk):
        part, part_weights = rows[lo : lo + chunk], weights[lo : lo + chunk]
        with autocast(device, precision):
            losses = task.losses(model, x[part], y[part])
        engine.backward(losses, part_weights)
        loss_sum += (losses.detach() * part_weights).sum().double()
    if trained is not None:
        check_trained_unchanged(model, engine.params, trained)
    engine.step()
    return loss_sum


def step_loop(run: Run) -> None:
    """The DP-SGD steps from the ledger's position to the schedule's end: one private step and one
    learning-rate step each, the state check after the first step and before each save, the spot
    self-check before the step the seed draws, canaries, losses, ε, an evaluation at each epoch's
    end and a checkpoint where one is due."""
    tp, schedule, ranks = run.params.train, run.schedule, run.ranks
    x_train, y_train = run.tensors[:2]
    loop = Progression({k: list(v) for k, v in run.ledger.history.items()})
    history = loop.history
    bar = Progress(schedule.num_steps, run.ledger.steps_done, enabled=ranks.writes)
    # buffers and frozen parameters: checked after a step, before saving
    state = state_snapshot(run.model, run.optimizer)
    batches = run.batches
    step_losses = StepLosses(ranks)
    spot = spot_step(run.params.seed, schedule.num_steps) if tp.self_check else None
    for step in range(run.ledger.steps_done, schedule.num_steps):
        if step == spot:  # the self-check on the live model, before this step changes it
            data = (x_train, y_train)
            found = spot_check(tp, run.engine, run.task, batches, step, data, run.fresh)
            run.ledger = replace(run.ledger, self_check={**run.ledger.self_check, **found})
        rows, weights, _ = batches.batch(step)
        done = step + 1
        epoch_end = done % schedule.steps_per_epoch == 0 or done == schedule.num_steps
        saves = epoch_end or done % tp.checkpoint_every == 0
        loss_sum = _private_step(
            run.engine,
            run.task,
            run.model,
            x_train,
            y_train,
            rows,
            weights,
            tp.physical_batch_size,
            run.device,
            tp.precision,
            guarded=step == run.resumed_from or saves,
        )
        run.scheduler.step()  # one learning-rate step per logical (engine) step
        if step == run.resumed_from or saves:  # after the first step, and before anything is saved
            check_state_unchanged(run.model, run.optimizer, state)
        if run.canaries:
            run.canaries.record(step)
        real = batches.real_rows(step)
        loop.examples += int(real)
        step_losses.add(loss_sum, real)
        # one device-to-host copy of the losses of the steps since the last read
        reads = saves or bar.shows_loss(done)
        history["loss"] += step_losses.read() if reads else []
        history["epsilon"].append(epsilon_spent(run.record, step + 1))
        if epoch_end:
            _evaluate(history, done, run.task, run.model, run.tensors)
        if saves:
            checkpoint(run, loop, done)
        bar.update(history["loss"][-1] if reads else None, history["epsilon"][-1])
    bar.close()


def checkpoint(run: Run, loop: Progression, done: int) -> None:
    """The ledger after ``done`` steps (time and examples since the last save added) and the
    weights file with the sealed noise key; the canaries' own checkpoint beside it. Every rank
    calls it (a sharded model is gathered whole); rank 0 writes."""
    model, optimizer = sharding.whole_state(run.model, run.optimizer)
    if not run.ranks.writes:
        return
    history = loop.history
    history["elapsed_s"] = [history["elapsed_s"][0] + time.perf_counter() - loop.started]
    history["examples"] = [history["examples"][0] + loop.examples]
    loop.started, loop.examples = time.perf_counter(), 0
    run.ledger = replace(
        run.ledger,
        steps_done=done,
        epsilon_spent=epsilon_spent(run.record, done),
        history=history,
        nonfinite_examples=run.engine.nonfinite_examples,
    )
    save_checkpoint(
        run.checkpoint_path,
        run.ledger,
        model,
        optimizer,
        run.scheduler,
        noise_key=run.noise.to_hex(),
    )
    if run.canaries:
        run.canaries.save(run.root / OUT, run.fingerprint, done)


def finish(run: Run, placement: dict[str, Any]) -> dict[str, Any]:
    """Utility evidence, the outputs of artifacts/train, plots and metrics (with the run's
    ``placement``: sharding, ranks, memory), and the published model; returns the metrics."""
    evidence = utility.measure(
        run.task,
        run.model,
        run.tensors,
        settings=run.engine.settings,
        vocab_size=run.data.vocab_size,
        trainable=run.engine.params,
    )
    own = prior_runs.this_run(run.record, run.ledger, run.rows)
    claims = prior_runs.provenance(run.prior, run.params.train.prior_data, own)
    finished = Finished(
        run.ledger,
        run.record,
        run.check,
        run.model,
        run.task,
        run.engine,
        run.resumed_from,
        placement,
        claims,
    )
    metrics = write_outputs(run.root, finished, run.tensors, evidence)
    publish_run(
        run.root / paths.PUBLISHED_DIR,
        run.model,
        run.params,
        (run.record, run.ledger, claims),
        run.check,
        metrics,
        run.engine.numel,
    )
    return metrics


def run(params: Params, root: Path) -> dict[str, Any]:
    """Train (or resume) in ``train.processes`` ranks (see pipeline/distributed.py), then write the
    outputs."""
    sharding.check_before_ranks(params)
    remove_stale_temporaries(root / OUT)
    return run_ranks(
        train, params, root, params.train.processes, select_device(params.train.device)
    )


def train(params: Params, root: Path, ranks: Ranks = SINGLE) -> dict[str, Any]:
    """Train (or resume) as rank ``ranks.rank``; rank 0 writes artifacts/train, metrics/train.json
    and plots/train."""
    threads = torch.get_num_threads()
    try:
        started = prepare(params, root, ranks)
        step_loop(started)
        outputs, placement = sharding.for_outputs(started)  # every rank: a sharded model gathered
        return finish(outputs, placement) if ranks.writes else {}
    finally:
        torch.set_num_threads(threads)


def _canaries(
    params: Params,
    ranks: Ranks,
    engine: BKEngine,
    schedule: Schedule,
    resume: tuple[Path, str, int],
) -> CanaryRecorder | None:
    """The one-run audit's recorder (audit/one_run.py): canaries in a side copy of the released
    sums, recorded on rank 0 (the data-parallel sum is whole there); resumed from its own checkpoint
    (folder, fingerprint, step) with the run. Under sharding every rank watches the coordinates (a
    collective: each gathers those its shards hold) and rank 0 alone records them."""
    one_run = params.audit.one_run
    sharded = params.train.sharding == "fsdp"
    recorder = recorder_for(
        one_run.enabled and (ranks.writes or sharded),
        one_run.canaries,
        params.seed,
        engine,
        schedule,
        params.train.clip_norm,
    )
    if recorder and not ranks.writes:
        return None  # watching, for the collective; rank 0 records
    if recorder:
        recorder.resume(*resume)
    return recorder


def _evaluate(
    history: dict[str, list[float]],
    done: int,
    task: Task,
    model: torch.nn.Module,
    tensors: tuple[torch.Tensor, ...],
) -> None:
    """Append the train and test metric after ``done`` steps (an epoch's end) to ``history``."""
    x_train, y_train, x_test, y_test = tensors
    history["eval_step"].append(done)
    for split, xs, ys in (("train", x_train, y_train), ("test", x_test, y_test)):
        history[f"{split}_{task.metric}"].append(task.evaluate(model, xs, ys)[task.metric])


def _tuning_line(model: torch.nn.Module, engine: BKEngine) -> str:
    """The step's signal-to-noise and what moves it (utility.tuning_hint), for stderr."""
    trainable = utility.model_summary(model, engine.params)["parameters_trainable"]
    settings = engine.settings
    snr = utility.signal_to_noise(
        settings.noise_multiplier, settings.clip_norm, trainable, settings.normalizer
    )
    return utility.tuning_hint(snr, trainable, engine.normalizer, engine.noise_multiplier)
