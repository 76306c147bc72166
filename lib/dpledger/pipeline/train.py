"""train stage: DP-SGD with the BK engine on the schedule's batches, with a resumable privacy ledger.

Reads ``artifacts/calibration/calibration.json`` (σ, mechanism, ε curve) and ``artifacts/schedule/``
(the batches), refuses a schedule whose sampler differs from the accounted one (unless
``train.allow_sampler_mismatch``) or that is longer than the accounted number of steps, and trains.
A checkpoint with the ledger is written every ``train.checkpoint_every`` steps and at each epoch's end
into ``artifacts/train/`` (``persist: true`` in dvc.yaml), so a killed run resumes at the step it reached.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from dpledger import io
from dpledger.accounting.record import CalibrationRecord
from dpledger.data import Dataset, load_dataset
from dpledger.engine import BKEngine, make_optimizer, retain_freed_memory
from dpledger.engine.checkpoint import Ledger, fingerprint, load_checkpoint, save_checkpoint
from dpledger.engine.device import autocast, select_device
from dpledger.errors import DpledgerError
from dpledger.models import build_model
from dpledger.params import Params
from dpledger.sampling.guard import check_schedule, check_schedule_sizes
from dpledger.sampling.schedule import Schedule

CALIBRATION = Path("artifacts/calibration/calibration.json")
SCHEDULE = Path("artifacts/schedule")
OUT = Path("artifacts/train")


def epsilon_spent(record: CalibrationRecord, steps_done: int) -> float:
    """ε after ``steps_done`` steps, read pessimistically: the first curve point at or past the step.

    Without such a point the full claim ``record.epsilon`` (proven for ``record.steps``) is reported.
    """
    if steps_done <= 0:
        return 0.0
    at_or_after = [(steps, eps) for steps, eps in record.epsilon_curve if steps >= steps_done]
    return float(min(at_or_after)[1]) if at_or_after else float(record.epsilon)


def _load_inputs(params: Params, root: Path) -> tuple[CalibrationRecord, Schedule, Dataset]:
    for needed, stage in ((root / CALIBRATION, "calibrate"), (root / SCHEDULE / "schedule.json", "schedule")):
        if not needed.exists():
            raise DpledgerError(f"train: {needed} is missing; run the {stage} stage first")
    with io.reading_artifact(root / CALIBRATION, "calibrate"):
        record = CalibrationRecord.load(root / CALIBRATION)
    with io.reading_artifact(root / SCHEDULE, "schedule"):
        schedule = Schedule.load(root / SCHEDULE)
    data = load_dataset(params.data.name, params.data.path, params.data.test_fraction, params.seed)
    if schedule.dataset_size != data.train_size:
        raise DpledgerError(
            f"train: the schedule indexes {schedule.dataset_size} examples but the training set has {data.train_size}; "
            "re-run the schedule stage"
        )
    check_schedule_sizes(schedule, dataset_size=record.dataset_size, batch_size=record.batch_size, epochs=record.epochs)
    if schedule.num_steps > record.steps:
        raise DpledgerError(
            f"train: the schedule has {schedule.num_steps} steps but calibration accounted for {record.steps}; "
            "training past the accounted steps would spend unproven privacy — re-run calibrate"
        )
    return record, schedule, data


def _training_code() -> list[Path]:
    """The source files that decide what a training step computes: a change to any of them starts over."""
    package = Path(__file__).resolve().parents[1]
    folders = ("engine", "models", "mechanisms", "sampling", "data")
    return [Path(__file__).resolve(), *sorted(f for name in folders for f in (package / name).rglob("*.py"))]


def _input_fingerprint(params: Params, root: Path) -> str:
    train = params.train.model_dump(exclude={"checkpoint_every"})
    return fingerprint(params.seed, params.data.model_dump(), train, root / CALIBRATION,
                       root / SCHEDULE / "schedule.json", root / SCHEDULE / "schedule.npz", *_training_code())


def _noise_seed(seed: int) -> int:
    return int(np.random.SeedSequence([seed, 1]).generate_state(1)[0])


@torch.no_grad()
def _evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(accuracy, mean loss) in eval mode."""
    model.eval()
    outputs = torch.cat([model(chunk) for chunk in x.split(1024)])
    model.train()
    return float((outputs.argmax(1) == y).float().mean()), float(F.cross_entropy(outputs, y))


def run(params: Params, root: Path) -> dict[str, Any]:
    """Train (or resume), then write artifacts/train, metrics/train.json and plots/train."""
    record, schedule, data = _load_inputs(params, root)
    check = check_schedule(record.sampler, schedule, allow_mismatch=params.train.allow_sampler_mismatch)
    device = select_device(params.train.device)
    if device.type == "cpu":
        retain_freed_memory()
    tp = params.train
    torch.manual_seed(params.seed)
    model = build_model(tp.model, data.input_shape, data.num_classes, **tp.model_options).to(device)
    optimizer = make_optimizer(tp.optimizer, model.parameters(), tp.lr, tp.momentum)
    normalizer = schedule.normalizer or record.batch_size
    engine = BKEngine(
        model, optimizer, clip_norm=tp.clip_norm, noise_multiplier=record.noise_multiplier, normalizer=normalizer,
        seed=_noise_seed(params.seed), clipping=tp.clipping, automatic_gamma=tp.automatic_gamma, ghost=tp.ghost,
        mechanism=record.mechanism, mechanism_params=record.mechanism_params, num_steps=schedule.num_steps,
        secure_noise=tp.secure_noise,
    )
    key = _input_fingerprint(params, root)
    checkpoint_path = root / OUT / "checkpoint.pt"
    ledger = Ledger(0, schedule.num_steps, 0.0, record.delta, record.noise_multiplier, key,
                    history={"loss": [], "epsilon": [], "eval_step": [], "train_accuracy": [], "test_accuracy": [],
                             "elapsed_s": [0.0], "examples": [0.0]})
    saved = load_checkpoint(checkpoint_path, key)
    if saved is not None:
        ledger = saved["ledger"]
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        engine.load_state_dict({"steps_taken": ledger.steps_done})
    resumed_from = ledger.steps_done

    x_train = torch.from_numpy(data.x_train).to(device)
    y_train = torch.from_numpy(data.y_train).to(device)
    x_test, y_test = torch.from_numpy(data.x_test).to(device), torch.from_numpy(data.y_test).to(device)
    history = {k: list(v) for k, v in ledger.history.items()}
    started = time.perf_counter()
    examples = 0
    physical = tp.physical_batch_size
    bar = tqdm(total=schedule.num_steps, initial=ledger.steps_done, desc="train", unit="step",
               disable=not sys.stderr.isatty())
    for step in range(ledger.steps_done, schedule.num_steps):
        indices, padding = schedule.batch(step)
        rows = torch.from_numpy(indices.astype(np.int64)).to(device)
        weights = torch.from_numpy(~padding).to(device=device, dtype=x_train.dtype)
        loss_sum, real = 0.0, float(weights.sum())
        chunk = physical or max(len(indices), 1)
        for lo in range(0, len(indices), chunk):
            part, part_weights = rows[lo:lo + chunk], weights[lo:lo + chunk]
            with autocast(device, tp.precision):
                outputs = model(x_train[part])
            losses = F.cross_entropy(outputs.float(), y_train[part], reduction="none")
            engine.backward(losses, part_weights)
            loss_sum += float((losses.detach() * part_weights).sum())
        engine.step()
        examples += int(real)
        history["loss"].append(loss_sum / real if real else float("nan"))
        history["epsilon"].append(epsilon_spent(record, step + 1))
        done = step + 1
        epoch_end = done % schedule.steps_per_epoch == 0 or done == schedule.num_steps
        if epoch_end:
            train_acc, _ = _evaluate(model, x_train, y_train)
            test_acc, _ = _evaluate(model, x_test, y_test)
            history["eval_step"].append(done)
            history["train_accuracy"].append(train_acc)
            history["test_accuracy"].append(test_acc)
        if epoch_end or done % tp.checkpoint_every == 0:
            history["elapsed_s"] = [history["elapsed_s"][0] + time.perf_counter() - started]
            history["examples"] = [history["examples"][0] + examples]
            started, examples = time.perf_counter(), 0
            ledger = replace(ledger, steps_done=done, epsilon_spent=epsilon_spent(record, done), history=history)
            save_checkpoint(checkpoint_path, ledger, model, optimizer)
        bar.update(1)
    bar.close()
    return _write_outputs(root, ledger, record, check, model, x_train, y_train, x_test, y_test, engine, resumed_from)


def _write_outputs(root, ledger, record, check, model, x_train, y_train, x_test, y_test, engine, resumed_from) -> dict[str, Any]:
    history = ledger.history
    test_acc, test_loss = _evaluate(model, x_test, y_test)
    train_acc, train_loss = _evaluate(model, x_train, y_train)
    elapsed, examples = history["elapsed_s"][0], history["examples"][0]
    metrics = {
        "test_accuracy": test_acc,
        "train_accuracy": train_acc,
        "final_train_loss": train_loss,
        "test_loss": test_loss,
        "epsilon_spent": ledger.epsilon_spent,
        "epsilon_claimed": float(record.epsilon),
        "delta": float(record.delta),
        "noise_multiplier": float(record.noise_multiplier),
        "steps_done": ledger.steps_done,
        "steps_total": ledger.total_steps,
        "resumed_from_step": resumed_from,
        "throughput_examples_per_s": examples / elapsed if elapsed > 0 else 0.0,
        "wall_time_s": elapsed,
        "mechanism": record.mechanism,
        **check.to_metrics(),
    }
    out = root / OUT
    with io.atomic_path(out / "model.pt") as tmp:
        torch.save(model.state_dict(), tmp)
    summary = {k: v for k, v in asdict(ledger).items() if k != "history"}
    assumptions = [s for s in (check.warning(), check.assumption()) if s]
    io.write_json(out / "ledger.json", {**summary, "schedule_position": ledger.schedule_position,
                                         "layer_methods": engine.layer_methods, "assumptions": assumptions})
    _write_plots(root / "plots/train", history)
    io.write_json(root / "metrics/train.json", metrics)
    return metrics


def _write_plots(folder: Path, history: dict[str, list[float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = list(range(1, len(history["loss"]) + 1))
    io.write_csv(folder / "loss.csv", ["step", "loss", "epsilon_spent"],
                 [[s, l, e] for s, l, e in zip(steps, history["loss"], history["epsilon"])])
    io.write_csv(folder / "accuracy.csv", ["step", "train_accuracy", "test_accuracy"],
                 [list(r) for r in zip(history["eval_step"], history["train_accuracy"], history["test_accuracy"])])
    for name, series, label in (("loss", [("loss", history["loss"], steps)], "training loss (mean per batch)"),
                                ("accuracy", [("train", history["train_accuracy"], history["eval_step"]),
                                              ("test", history["test_accuracy"], history["eval_step"])], "accuracy")):
        figure, axis = plt.subplots(figsize=(5, 3.2))
        for legend, values, xs in series:
            axis.plot(xs, values, label=legend)
        axis.set_xlabel("step")
        axis.set_ylabel(label)
        if len(series) > 1:
            axis.legend()
        figure.tight_layout()
        with io.atomic_path(folder / f"{name}.png") as tmp:
            figure.savefig(tmp, format="png", dpi=110)
        plt.close(figure)
