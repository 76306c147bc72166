"""Stage ``verify``: the debugging battery on a trainer (default: dpledger's own engine) on
synthetic data, or (``verify.model: train``) on the train stage's model, task loss and training
examples.

Reads ``seed`` and ``verify`` (with ``verify.model: train`` also ``data`` and ``train``). Writes
``artifacts/verify/verify.json``, ``metrics/verify.json`` and one CSV + PNG per test under
``plots/verify/``; then, if a test failed and ``verify.fail_pipeline`` is set (the default), raises
:class:`BugFoundError` so ``dvc repro`` stops. With it unset the pipeline goes on and the report
puts the failure first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpledger import io
from dpledger.errors import ParamsError
from dpledger.params import Params
from dpledger.params.verify import VerifyParams
from dpledger.verify.battery import run_battery
from dpledger.verify.errors import BugFoundError
from dpledger.verify.plots import write_plots
from dpledger.verify.protocol import CommandTrainer, Trainer, load_trainer
from dpledger.verify.result import BatteryResult
from dpledger.verify.task import SyntheticTask, make_task, model_task


def trainer_from_params(settings: VerifyParams) -> tuple[Trainer, str]:
    """The trainer under test and its name: the command template if set, else ``verify.trainer``."""
    if settings.command:
        return CommandTrainer(settings.command), f"command: {settings.command}"
    return load_trainer(settings.trainer), settings.trainer


def battery_task(params: Params) -> SyntheticTask:
    """The synthetic task, or the train stage's model (seeded as train seeds it, with its LoRA
    adapter) on its first training rows; the battery reads the parameters the engine trains (a
    LoRA model: the adapter)."""
    if params.verify.model == "synthetic":
        return make_task(params.seed)
    import torch

    from dpledger.data import load_data
    from dpledger.models import build_task_model, task_for

    tp = params.train
    data = load_data(params.data, params.seed)
    task = task_for(tp.model, tp.task, data)
    torch.manual_seed(params.seed)
    model = build_task_model(tp.model, tp.model_options, task, data, lora=tp.lora)
    x, y = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    try:
        return model_task(model, task, x, y, f"train.model = {tp.model!r} ({task.name})")
    except ValueError as error:
        raise ParamsError(
            f"params: verify.model = 'train' is invalid for this data: {error}"
        ) from None


def write_outputs(result: BatteryResult, root: Path) -> dict[str, Any]:
    """Write the details, the flat metrics and the plots; return the metrics."""
    with io.atomic_dir(root / "artifacts" / "verify") as folder:
        io.write_json(folder / "verify.json", result.to_json())
    with io.atomic_dir(root / "plots" / "verify") as folder:
        write_plots(result, folder)
    metrics = {**result.metrics(), "battery_model": result.heuristics.get("model", "synthetic MLP")}
    io.write_json(root / "metrics" / "verify.json", metrics)
    return metrics


def run(params: Params, root: Path) -> dict[str, Any]:
    """Run the battery, write its outputs, and fail if it found a bug (unless told to go on)."""
    settings = params.verify
    trainer, name = trainer_from_params(settings)
    result = run_battery(
        trainer,
        trainer_name=name,
        seed=params.seed,
        optimizer=settings.optimizer,
        significance=settings.significance,
        task=battery_task(params),
    )
    metrics = write_outputs(result, root)
    if not result.passed and settings.fail_pipeline:
        raise BugFoundError(
            f"verify: the trainer {name!r} failed {', '.join(result.failed_tests)}: "
            + next(test.diagnosis for test in result.tests if not test.passed)
            + " (outputs are written; set verify.fail_pipeline: "
            "false to render the report with this finding)"
        )
    return metrics
