"""The train stage's self-check: before the first step of a run, the engine proves itself
exact on the user's model and examples of the run's first scheduled batch
(:mod:`dpledger.engine.self_check`).

It runs on every run that has steps left, a resumed one included (on the model as resumed and the
batch at the resume step: the code that trains next is what is checked); a run resumed at its end
trains nothing and keeps the check its ledger already holds. A mismatch raises ``SelfCheckError``
(one line naming the layers) before anything is written. ``train.self_check: false`` skips it; the
ledger, the metrics and the report then say it did not run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dpledger.engine import BKEngine
from dpledger.models import Task
from dpledger.params.train import TrainParams
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
)
"""The ledger entries copied into metrics/train.json as ``self_check_<key>``."""


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


def check_before_training(
    settings: TrainParams,
    engine: BKEngine,
    task: Task,
    schedule: Schedule,
    step: int,
    data: tuple[torch.Tensor, torch.Tensor],
) -> dict[str, Any] | None:
    """The self-check's record (``SelfCheckResult.to_dict``) for a run starting at ``step``, or None
    when it is off or nothing is left to train; raises ``SelfCheckError`` on a mismatch."""
    if not settings.self_check:
        return None
    rows = check_rows(schedule, step, settings.self_check_examples)
    if len(rows) == 0:
        return None
    x_train, y_train = data
    index = torch.from_numpy(rows).to(x_train.device)
    only = tuple(settings.self_check_parameters)
    result = engine.self_check(task.losses, x_train[index], y_train[index], only=only)
    return result.to_dict()


def to_metrics(record: dict[str, Any]) -> dict[str, Any]:
    """Flat ``self_check_*`` scalars for metrics/train.json; ``self_check_ran: false`` without a
    record."""
    if not record:
        return {"self_check_ran": False}
    return {"self_check_ran": True, **{f"self_check_{key}": record[key] for key in METRIC_KEYS}}
