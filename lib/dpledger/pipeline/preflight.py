"""Fail fast: the first stage that reads the data (calibrate) also builds the train stage's model
for it and calls it on one batch, before any accounting work, so that a model name, option, data
layout or input-shape mistake is one line in seconds instead of an error in train after calibrate
and schedule ran.

It writes nothing and changes no output, so ``train.model``, ``train.model_options`` and
``train.task`` are not calibrate's DVC params: a later change to them alone reruns train (which
checks them again), not the accounting.
"""

from __future__ import annotations

import torch

from dpledger.data import Dataset
from dpledger.models import build_task_model, task_for
from dpledger.params import Params


def check_training_inputs(params: Params, data: Dataset) -> None:
    """Build the model train would build for ``data`` (seeded, on the CPU) and score one batch with
    it (:func:`dpledger.models.select.check_outputs`); any mismatch raises a one-line
    ParamsError."""
    train = params.train
    task = task_for(train.model, train.task, data)
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(params.seed)
        build_task_model(train.model, train.model_options, task, data)
    finally:
        torch.random.set_rng_state(state)
