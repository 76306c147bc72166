"""The train stage's first phase: read and check the inputs, fingerprint them, find the noise key,
build the model, optimizer and engine, and restore a checkpoint of the same inputs.

Nothing read is trusted (``dpledger.seals``): the record's ε is recomputed at its σ (deterministic
accountants) or checked against calibrate's seal (Monte Carlo), and the schedule's arrays against
their digest. The training data's content is part of the checkpoint fingerprint.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from dpledger import paths
from dpledger.accounting.record import CalibrationRecord
from dpledger.data import Dataset, load_data
from dpledger.engine import BKEngine, ClipNoise, make_optimizer, make_scheduler
from dpledger.errors import DpledgerError
from dpledger.ledger import Ledger, fingerprint, load_checkpoint
from dpledger.models import Task, build_task_model, task_for
from dpledger.models.lora import adapter_base, is_adapter_folder
from dpledger.params import Params
from dpledger.pipeline import sharding
from dpledger.pipeline.distributed import Ranks
from dpledger.pipeline.noise_key import NoiseKey, key_from_checkpoint, resolve_noise_key
from dpledger.plugins import plugin_source
from dpledger.sampling.schedule import Schedule
from dpledger.seals import verified_record, verified_schedule

CALIBRATION = paths.CALIBRATION
SCHEDULE = paths.SCHEDULE_DIR
STAGE_FILE = Path(__file__).resolve().with_name("train.py")
SECURE_NOISE_SOURCE = "fresh draws from the operating system's CSPRNG (train.secure_noise)"


def load_inputs(params: Params, root: Path) -> tuple[CalibrationRecord, Schedule, Dataset]:
    """The sealed calibration record, the schedule and the data, refused when they disagree."""
    record = verified_record(root / CALIBRATION, "train")
    schedule = verified_schedule(root / SCHEDULE, "train")
    data = load_data(params.data, params.seed)
    if schedule.dataset_size != data.train_size:
        raise DpledgerError(
            "train: "
            f"the schedule indexes {schedule.dataset_size} examples but the training set has {data.train_size}; "  # noqa: E501
            "re-run the schedule stage"
        )
    if schedule.num_steps > record.steps:
        raise DpledgerError(
            "train: "
            f"the schedule has {schedule.num_steps} steps but calibration accounted for {record.steps}; "  # noqa: E501
            "training past the accounted steps would spend unproven privacy — re-run calibrate"
        )
    return record, schedule, data


def training_code() -> list[Path]:
    """The source files that decide what a training step computes, a change to any of which starts
    over: every library file the train stage can import, found by the function that checks the deps
    of dvc.yaml."""
    from dpledger.imports import import_closure

    return sorted(import_closure([STAGE_FILE]))


def user_files(params: Params) -> list[Path]:
    """The user's tokenizer, model checkpoint (an adapter's base model too) and plugin model's
    source: new weights or code start over, too."""
    model = params.train.model_options.get("path") if params.train.model == "hf" else None
    base = adapter_base(model) if is_adapter_folder(model) else None
    folders = [params.data.tokenizer, model, base]
    files: list[Path] = []
    for folder in (Path(f) for f in folders if isinstance(f, str) and Path(f).is_dir()):
        files += sorted(f for f in folder.rglob("*") if f.is_file())
    return files + [f for f in [plugin_source(params.train.model)] if f is not None]


def input_fingerprint(
    params: Params,
    root: Path,
    data: Dataset,
    device: torch.device,
    noise: NoiseKey,
    code: list[Path],
) -> str:
    """Everything a step depends on, the training data's content included (a changed file restarts
    at 0), the resolved device type and torch version (not ``auto``: the noise draws depend on
    both, and correlated noise replays its history on resume) and the noise key's identity (a hash
    of a provided key; never the key)."""
    checks = {"self_check", "self_check_examples", "self_check_parameters"}  # they change no step
    # threads: a resume takes the ledger's count back (``pin_threads``); the checkpoint holds one
    # process's full state whatever the processes and sharding
    placed = {"processes", "sharding"}
    train = params.train.model_dump(exclude={"checkpoint_every", "threads", *placed, *checks})
    train |= {"device": device.type, "torch": torch.__version__, "noise_key": noise.identity()}
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
        *code,
        *user_files(params),
    )


def noise_key(params: Params, root: Path) -> NoiseKey:
    """The run's noise key (``pipeline/noise_key.py``); with ``train.secure_noise`` every draw is
    fresh from the CSPRNG and the key plays no part."""
    tp = params.train
    key = resolve_noise_key(params.seed, tp.noise_key_file, tp.insecure_public_seed, root)
    return NoiseKey(key.value, SECURE_NOISE_SOURCE) if tp.secure_noise else key


def clip_noise(params: Params, record: CalibrationRecord, schedule: Schedule) -> ClipNoise:
    """The run's clipping and noise: σ and the mechanism from calibrate, the rest from params."""
    tp = params.train
    return ClipNoise(
        clip_norm=tp.clip_norm,
        noise_multiplier=record.noise_multiplier,
        normalizer=schedule.normalizer or record.batch_size,
        clipping=tp.clipping,
        automatic_gamma=tp.automatic_gamma,
        mechanism=record.mechanism,
        mechanism_params=dict(record.mechanism_params or {}),
        num_steps=schedule.num_steps,
        secure_noise=tp.secure_noise,
    )


@dataclass
class Built:
    """The trainable parts of a run."""

    model: torch.nn.Module
    task: Task
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler
    engine: BKEngine
    fresh: Callable[[], torch.nn.Module]
    """A new model of the run, seeded as at the start (it reseeds the global RNG: call it inside
    ``torch.random.fork_rng``); its weights are then loaded."""


def build(
    params: Params,
    settings: ClipNoise,
    data: Dataset,
    device: torch.device,
    ranks: Ranks,
    noise: NoiseKey,
) -> Built:
    """Model (seeded; sharded with ``train.sharding: fsdp``), its task, optimizer, learning-rate
    schedule (in logical steps) and engine."""
    tp = params.train
    task = task_for(tp.model, tp.task, data)

    def fresh() -> torch.nn.Module:
        torch.manual_seed(params.seed)
        return build_task_model(tp.model, tp.model_options, task, data, lora=tp.lora).to(device)

    model = fresh()
    sharding.shard(params, settings, model, ranks)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(tp.optimizer, trainable, tp.lr, tp.momentum, tp.weight_decay)
    scheduler = make_scheduler(optimizer, tp.lr_schedule, tp.warmup_steps, settings.num_steps)
    engine = sharding.make_engine(params, settings, model, optimizer, ranks, noise.value, fresh)
    return Built(model, task, optimizer, scheduler, engine, fresh)


def new_ledger(
    record: CalibrationRecord,
    schedule: Schedule,
    task: Task,
    key: str,
    noise: NoiseKey,
    threads: int | None,
) -> Ledger:
    """The ledger of a run starting at step 0, with an empty history, at ``threads`` intra-op
    threads (None: torch's current count)."""
    history: dict[str, list[float]] = {
        "loss": [],
        "epsilon": [],
        "eval_step": [],
        f"train_{task.metric}": [],
        f"test_{task.metric}": [],
        "elapsed_s": [0.0],
        "examples": [0.0],
    }
    return Ledger(
        0,
        schedule.num_steps,
        0.0,
        record.delta,
        record.noise_multiplier,
        key,
        history=history,
        noise_key_source=noise.source,
        noise_key_public=noise.public,
        threads=threads or torch.get_num_threads(),
    )


def pin_threads(ledger: Ledger, asked: int | None) -> None:
    """Set torch's intra-op thread count (and with it MKL's, without its dynamic adjustment) to the
    ledger's: a step's floating-point sums depend on the count, so a run resumed in another
    environment (``taskset``, ``OMP_NUM_THREADS``, a host with other cores) would otherwise drift
    from the uninterrupted run."""
    threads = ledger.threads or asked or torch.get_num_threads()
    if asked is not None and asked != threads:
        print(
            f"train: resuming at the {threads} threads the run started with (train.threads = {asked} applies to a run from step 0)",  # noqa: E501
            file=sys.stderr,
        )
    torch.set_num_threads(threads)


def saved_state(path: Path, key: str, noise: NoiseKey) -> tuple[dict[str, Any] | None, NoiseKey]:
    """The checkpoint of the same inputs (or None) and the noise key to continue with: the one
    sealed in that checkpoint."""
    saved = load_checkpoint(path, key)
    return saved, noise if saved is None else key_from_checkpoint(noise, saved.get("noise_key"))


def restore(saved: dict[str, Any], built: Built) -> Ledger:
    """Put the saved model, optimizer, schedule and engine ledger back; returns the saved ledger."""
    sharding.load_state(built.model, built.optimizer, saved)
    built.scheduler.load_state_dict(saved["scheduler"])
    built.engine.load_state_dict(
        {
            "steps_taken": saved["ledger"].steps_done,
            "nonfinite_examples": saved["ledger"].nonfinite_examples,
        }
    )
    return saved["ledger"]
