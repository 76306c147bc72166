"""train stage: DP-SGD with the BK engine on the schedule's batches, with a resumable privacy
ledger.

Reads ``artifacts/calibration/calibration.json`` (σ, mechanism, ε curve) and ``artifacts/schedule/``
(the batches), builds the model and its task (:mod:`dpledger.models`: zoo, ``hf`` or plugin;
per-example loss and metric), refuses a schedule whose sampler differs from the accounted one
(unless ``train.allow_sampler_mismatch``) or that is longer than the accounted number of steps, and
trains. A checkpoint with the ledger is written every ``train.checkpoint_every`` steps and at each
epoch's end into ``artifacts/train/`` (``persist: true`` in dvc.yaml), so a killed run resumes at
the step it reached.

Nothing read is trusted (``dpledger.seals``): the record's ε is recomputed at its σ (deterministic
accountants) or checked against calibrate's seal (Monte Carlo), and the schedule's arrays against
their digest. The training data's content is part of the checkpoint fingerprint. The ledger and
metrics record the σ the engine used, the examples dropped for a non-finite gradient norm and
whether the loss diverged.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.optim.lr_scheduler import LRScheduler

from dpledger import io, paths, plotting
from dpledger.accounting.record import CalibrationRecord
from dpledger.audit.canaries import CanaryRecorder, recorder_for
from dpledger.data import Dataset, load_data
from dpledger.engine import BKEngine, make_optimizer, make_scheduler, retain_freed_memory
from dpledger.engine.checkpoint import (
    Ledger,
    fingerprint,
    load_checkpoint,
    remove_stale_temporaries,
    save_checkpoint,
)
from dpledger.engine.device import autocast, select_device
from dpledger.engine.validators import check_state_unchanged, state_snapshot
from dpledger.errors import DpledgerError
from dpledger.models import Task, build_task_model, task_for, utility
from dpledger.models.lora import adapter_base, is_adapter_folder
from dpledger.models.publish import publish_run
from dpledger.params import Params
from dpledger.pipeline.batches import DeviceBatches
from dpledger.pipeline.distributed import SINGLE, Ranks, run_ranks
from dpledger.pipeline.progress import Progress
from dpledger.pipeline.self_check import check_before_training, to_metrics
from dpledger.pipeline.step_losses import StepLosses
from dpledger.plugins import plugin_source
from dpledger.sampling.guard import SamplerCheck, check_schedule
from dpledger.sampling.schedule import Schedule
from dpledger.seals import verified_record, verified_schedule

CALIBRATION = paths.CALIBRATION
SCHEDULE = paths.SCHEDULE_DIR
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


def _load_inputs(params: Params, root: Path) -> tuple[CalibrationRecord, Schedule, Dataset]:
    record = verified_record(root / CALIBRATION, "train")
    schedule = verified_schedule(root / SCHEDULE, "train")
    data = load_data(params.data, params.seed)
    if schedule.dataset_size != data.train_size:
        raise DpledgerError(
            f"train: the schedule indexes {schedule.dataset_size} examples but the training set "
            f"has {data.train_size}; "
            "re-run the schedule stage"
        )
    if schedule.num_steps > record.steps:
        raise DpledgerError(
            f"train: the schedule has {schedule.num_steps} steps but calibration accounted for "
            f"{record.steps}; "
            "training past the accounted steps would spend unproven privacy — re-run calibrate"
        )
    return record, schedule, data


def _training_code() -> list[Path]:
    """The source files that decide what a training step computes, a change to any of which starts
    over: every library file this runner can import, found by the function that checks the deps of
    dvc.yaml."""
    from dpledger.imports import import_closure

    return sorted(import_closure([Path(__file__).resolve()]))


def _user_files(params: Params) -> list[Path]:
    """The user's tokenizer, model checkpoint (an adapter's base model too) and plugin model's
    source: new weights or code start over, too."""
    model = params.train.model_options.get("path") if params.train.model == "hf" else None
    base = adapter_base(model) if is_adapter_folder(model) else None
    folders = [params.data.tokenizer, model, base]
    files: list[Path] = []
    for folder in (Path(f) for f in folders if isinstance(f, str) and Path(f).is_dir()):
        files += sorted(f for f in folder.rglob("*") if f.is_file())
    return files + [f for f in [plugin_source(params.train.model)] if f is not None]


def _input_fingerprint(params: Params, root: Path, data: Dataset, device: torch.device) -> str:
    """Everything a step depends on, the training data's content included (a changed file restarts
    at 0), and the resolved device type and torch version (not ``auto``): the noise draws depend on
    both, and correlated noise replays its history on resume (issue 30)."""
    checks = {"self_check", "self_check_examples", "self_check_parameters"}  # they change no step
    train = params.train.model_dump(exclude={"checkpoint_every", "processes", *checks})
    train |= {"device": device.type, "torch": torch.__version__}
    # their record must be whole
    canaries = params.audit.one_run.model_dump(include={"enabled", "canaries"})
    return fingerprint(
        params.seed,
        params.data.model_dump(),
        train,
        canaries,
        root / CALIBRATION,
        root / SCHEDULE / "schedule.json",
        root / SCHEDULE / "schedule.npz",
        data.x_train,
        data.y_train,
        data.x_test,
        data.y_test,
        *_training_code(),
        *_user_files(params),
    )


def _noise_seed(seed: int) -> int:
    return int(np.random.SeedSequence([seed, 1]).generate_state(1)[0])


def _build(
    params: Params,
    record: CalibrationRecord,
    schedule: Schedule,
    data: Dataset,
    device: torch.device,
    ranks: Ranks,
) -> tuple[torch.nn.Module, Task, torch.optim.Optimizer, LRScheduler, BKEngine]:
    """Model (seeded), its task, optimizer, learning-rate schedule (in logical steps) and engine."""
    tp = params.train
    task = task_for(tp.model, tp.task, data)
    torch.manual_seed(params.seed)
    model = build_task_model(tp.model, tp.model_options, task, data, lora=tp.lora).to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(tp.optimizer, trainable, tp.lr, tp.momentum, tp.weight_decay)
    scheduler = make_scheduler(optimizer, tp.lr_schedule, tp.warmup_steps, schedule.num_steps)
    engine = BKEngine(
        model,
        optimizer,
        clip_norm=tp.clip_norm,
        noise_multiplier=record.noise_multiplier,
        normalizer=schedule.normalizer or record.batch_size,
        seed=_noise_seed(params.seed),
        clipping=tp.clipping,
        automatic_gamma=tp.automatic_gamma,
        ghost=tp.ghost,
        mechanism=record.mechanism,
        mechanism_params=record.mechanism_params,
        num_steps=schedule.num_steps,
        secure_noise=tp.secure_noise,
        process_group=ranks.group,
    )
    return model, task, optimizer, scheduler, engine


def _resume(
    key: str,
    path: Path,
    record: CalibrationRecord,
    schedule: Schedule,
    task: Task,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    engine: BKEngine,
) -> Ledger:
    """The saved ledger (model, optimizer, schedule and engine restored) when a checkpoint of the
    same inputs exists, else a fresh one."""
    history: dict[str, list[float]] = {
        "loss": [],
        "epsilon": [],
        "eval_step": [],
        f"train_{task.metric}": [],
        f"test_{task.metric}": [],
        "elapsed_s": [0.0],
        "examples": [0.0],
    }
    saved = load_checkpoint(path, key)
    if saved is None:
        return Ledger(
            0, schedule.num_steps, 0.0, record.delta, record.noise_multiplier, key, history=history
        )
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    engine.load_state_dict(
        {
            "steps_taken": saved["ledger"].steps_done,
            "nonfinite_examples": saved["ledger"].nonfinite_examples,
        }
    )
    return saved["ledger"]


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
) -> torch.Tensor:
    """One DP-SGD step over the batch ``rows`` (in physical chunks); returns the batch's summed
    loss, a float64 scalar left on the device (read back by ``StepLosses``: no host sync per
    physical batch)."""
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    chunk = physical or max(len(rows), 1)
    for lo in range(0, len(rows), chunk):
        part, part_weights = rows[lo : lo + chunk], weights[lo : lo + chunk]
        with autocast(device, precision):
            losses = task.losses(model, x[part], y[part])
        engine.backward(losses, part_weights)
        loss_sum += (losses.detach() * part_weights).sum().double()
    engine.step()
    return loss_sum


def run(params: Params, root: Path) -> dict[str, Any]:
    """Train (or resume) in ``train.processes`` ranks (see pipeline/distributed.py), then write the
    outputs."""
    remove_stale_temporaries(root / OUT)
    return run_ranks(
        train, params, root, params.train.processes, select_device(params.train.device)
    )


def train(params: Params, root: Path, ranks: Ranks = SINGLE) -> dict[str, Any]:
    """Train (or resume) as rank ``ranks.rank``; rank 0 writes artifacts/train, metrics/train.json
    and plots/train."""
    record, schedule, data = _load_inputs(params, root)
    check = check_schedule(
        record.description, schedule, allow_mismatch=params.train.allow_sampler_mismatch
    )
    device = ranks.device(select_device(params.train.device))
    if device.type == "cpu":
        retain_freed_memory()
    tp = params.train
    built = _build(params, record, schedule, data, device, ranks)
    model, task, optimizer, scheduler, engine = built
    checkpoint_path = root / OUT / "checkpoint.json"
    key = _input_fingerprint(params, root, data, device)
    ledger = _resume(
        key,
        checkpoint_path,
        record,
        schedule,
        task,
        model,
        optimizer,
        scheduler,
        engine,
    )
    resumed_from = ledger.steps_done
    ranks.check_same_start(resumed_from, model, device)
    canaries = _canaries(params, ranks, engine, schedule, (root / OUT, key, resumed_from))
    if ranks.writes:
        print(f"train: {_tuning_line(model, engine)}", file=sys.stderr)

    x_train, y_train = (
        torch.from_numpy(data.x_train).to(device),
        torch.from_numpy(data.y_train).to(device),
    )
    x_test, y_test = (
        torch.from_numpy(data.x_test).to(device),
        torch.from_numpy(data.y_test).to(device),
    )
    start, rows = ledger.steps_done, (x_train, y_train)
    checked = check_before_training(tp, engine, task, schedule, start, rows)
    ledger = ledger if checked is None else replace(ledger, self_check=checked)
    history = {k: list(v) for k, v in ledger.history.items()}
    started = time.perf_counter()
    examples = 0
    bar = Progress(schedule.num_steps, ledger.steps_done, enabled=ranks.writes)
    # buffers and frozen parameters: checked after a step, before saving
    state = state_snapshot(model, optimizer)
    batches = DeviceBatches.upload(schedule, ranks, device)
    step_losses = StepLosses(ranks)
    for step in range(ledger.steps_done, schedule.num_steps):
        rows, weights, _ = batches.batch(step)
        loss_sum = _private_step(
            engine,
            task,
            model,
            x_train,
            y_train,
            rows,
            weights,
            tp.physical_batch_size,
            device,
            tp.precision,
        )
        scheduler.step()  # one learning-rate step per logical (engine) step
        done = step + 1
        epoch_end = done % schedule.steps_per_epoch == 0 or done == schedule.num_steps
        saves = epoch_end or done % tp.checkpoint_every == 0
        if step == resumed_from or saves:  # after the first step, and before anything is saved
            check_state_unchanged(model, optimizer, state)
        if canaries:
            canaries.record(step)
        real = batches.real_rows(step)
        examples += int(real)
        step_losses.add(loss_sum, real)
        # one device-to-host copy of the losses of the steps since the last read
        reads = saves or bar.shows_loss(done)
        history["loss"] += step_losses.read() if reads else []
        history["epsilon"].append(epsilon_spent(record, step + 1))
        if epoch_end:
            _evaluate(history, done, task, model, (x_train, y_train, x_test, y_test))
        if saves and ranks.writes:
            history["elapsed_s"] = [history["elapsed_s"][0] + time.perf_counter() - started]
            history["examples"] = [history["examples"][0] + examples]
            started, examples = time.perf_counter(), 0
            ledger = replace(
                ledger,
                steps_done=done,
                epsilon_spent=epsilon_spent(record, done),
                history=history,
                nonfinite_examples=engine.nonfinite_examples,
            )
            save_checkpoint(checkpoint_path, ledger, model, optimizer, scheduler)
            if canaries:
                canaries.save(root / OUT, key, done)
        bar.update(history["loss"][-1] if reads else None, history["epsilon"][-1])
    bar.close()
    if not ranks.writes:
        return {}
    tensors = (x_train, y_train, x_test, y_test)
    evidence = utility.measure(
        task,
        model,
        tensors,
        noise_multiplier=engine.noise_multiplier,
        clip_norm=engine.clip_norm,
        batch_size=engine.normalizer,
        vocab_size=data.vocab_size,
        trainable=engine.params,
    )
    finished = Finished(ledger, record, check, model, task, engine, resumed_from)
    metrics = _write_outputs(root, finished, tensors, evidence)
    publish_run(
        root / paths.PUBLISHED_DIR, model, params, record, ledger, check, metrics, engine.numel
    )
    return metrics


def _canaries(
    params: Params,
    ranks: Ranks,
    engine: BKEngine,
    schedule: Schedule,
    resume: tuple[Path, str, int],
) -> CanaryRecorder | None:
    """The one-run audit's recorder (audit/one_run.py): canaries in a side copy of the released
    sums, on rank 0 like the noise; resumed from its own checkpoint (folder, fingerprint, step) with
    the run."""
    one_run = params.audit.one_run
    recorder = recorder_for(
        one_run.enabled and ranks.writes,
        one_run.canaries,
        params.seed,
        engine,
        schedule,
        params.train.clip_norm,
    )
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
    snr = utility.signal_to_noise(
        engine.noise_multiplier, engine.clip_norm, trainable, engine.normalizer
    )
    return utility.tuning_hint(snr, trainable, engine.normalizer, engine.noise_multiplier)


@dataclass(frozen=True)
class Finished:
    """A finished (or resumed-to-the-end) run: what its outputs are written from."""

    ledger: Ledger
    record: CalibrationRecord
    check: SamplerCheck
    model: torch.nn.Module
    task: Task
    engine: BKEngine
    resumed_from: int


def _write_outputs(
    root: Path, run: Finished, tensors: tuple[torch.Tensor, ...], evidence: utility.Evidence
) -> dict[str, Any]:
    """artifacts/train (model.pt, ledger.json, utility.json), plots/train and metrics/train.json;
    returns the metrics."""
    ledger, record, check, model, task, engine = (
        run.ledger,
        run.record,
        run.check,
        run.model,
        run.task,
        run.engine,
    )
    x_train, y_train, x_test, y_test = tensors
    history = ledger.history
    test, train = task.evaluate(model, x_test, y_test), task.evaluate(model, x_train, y_train)
    elapsed, examples = history["elapsed_s"][0], history["examples"][0]
    metrics = {
        f"test_{task.metric}": test[task.metric],
        f"train_{task.metric}": train[task.metric],
        "final_train_loss": train["loss"],
        "test_loss": test["loss"],
        "epsilon_spent": ledger.epsilon_spent,
        "epsilon_claimed": float(record.epsilon),
        "delta": float(record.delta),
        "noise_multiplier": float(engine.noise_multiplier),
        "nonfinite_examples": ledger.nonfinite_examples,
        "loss_diverged": not all(
            math.isfinite(v) for v in (train["loss"], test["loss"], *history["loss"])
        ),
        "steps_done": ledger.steps_done,
        "steps_total": ledger.total_steps,
        "resumed_from_step": run.resumed_from,
        "throughput_examples_per_s": examples / elapsed if elapsed > 0 else 0.0,
        "wall_time_s": elapsed,
        "mechanism": record.mechanism,
        **check.to_metrics(),
        **to_metrics(ledger.self_check),
        **evidence.metrics,
    }
    out = root / OUT
    with io.atomic_path(out / "model.pt") as tmp:
        torch.save({k: v.cpu() for k, v in model.state_dict().items()}, tmp)  # loads without a GPU
    summary = {k: v for k, v in asdict(ledger).items() if k != "history"}
    assumptions = [s for s in (check.warning(), check.assumption()) if s]
    io.write_json(
        out / "ledger.json",
        {
            **summary,
            "schedule_position": ledger.schedule_position,
            "task": task.name,
            "layer_methods": engine.layer_methods,
            "assumptions": assumptions,
        },
    )
    io.write_json(out / "utility.json", evidence.details)
    with io.atomic_dir(
        root / paths.plots("train")
    ) as folder:  # replaced whole: no other task's stale curves
        _write_plots(folder, history, task.metric)
        evidence.write_plots(folder)
    io.write_json(root / paths.metrics("train"), metrics)
    return metrics


def _write_plots(folder: Path, history: dict[str, list[float]], metric: str) -> None:
    steps = list(range(1, len(history["loss"]) + 1))
    io.write_csv(
        folder / "loss.csv",
        ["step", "loss", "epsilon_spent"],
        [[s, loss, e] for s, loss, e in zip(steps, history["loss"], history["epsilon"])],
    )
    train, test = history[f"train_{metric}"], history[f"test_{metric}"]
    io.write_csv(
        folder / f"{metric}.csv",
        ["step", f"train_{metric}", f"test_{metric}"],
        [list(r) for r in zip(history["eval_step"], train, test)],
    )
    for name, series, label in (
        ("loss", [("loss", history["loss"], steps)], "training loss (mean per batch)"),
        (
            metric,
            [("train", train, history["eval_step"]), ("test", test, history["eval_step"])],
            metric,
        ),
    ):
        with plotting.png(folder / f"{name}.png") as axes:
            for legend, values, xs in series:
                axes.plot(xs, values, label=legend)
            axes.set_xlabel("step")
            axes.set_ylabel(label)
            if len(series) > 1:
                axes.legend()
