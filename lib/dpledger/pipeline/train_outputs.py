"""The train stage's last writes: artifacts/train (model.pt, ledger.json, utility.json),
plots/train and metrics/train.json, from a finished (or resumed-to-the-end) run."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from dpledger import io, paths, plotting
from dpledger.accounting.across_runs import Provenance
from dpledger.accounting.record import CalibrationRecord
from dpledger.engine import BKEngine
from dpledger.ledger import Ledger
from dpledger.models import Task, utility
from dpledger.pipeline.self_check import to_metrics
from dpledger.sampling.guard import SamplerCheck

OUT = paths.TRAIN_DIR


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
    placement: dict[str, Any] = field(default_factory=dict)
    """How the run was placed: sharding, ranks, peak memory per rank (``pipeline/sharding.py``)."""
    provenance: Provenance | None = None
    """The claims the published model is built from (``pipeline/prior_runs.py``)."""


def write_outputs(
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
        "noise_key_source": ledger.noise_key_source,
        "noise_key_public": ledger.noise_key_public,
        **run.placement,
        **check.to_metrics(),
        **to_metrics(ledger.self_check),
        **evidence.metrics,
        **(run.provenance.metrics() if run.provenance is not None else {}),
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
            **({"across_runs": run.provenance.to_dict()} if _composed(run.provenance) else {}),
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


def _composed(provenance: Provenance | None) -> bool:
    """Whether the claim involves an earlier run (composed or declared disjoint)."""
    return provenance is not None and not provenance.is_alone()


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
