"""The train stage's model: a zoo name, ``hf`` or a plugin ``module:callable``, with the task it is
trained for, checked on one batch before training so that a mismatch is one line, not an error deep
in a step."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dpledger.data import Dataset
from dpledger.errors import ParamsError
from dpledger.models.hf import load_hf_model
from dpledger.models.plugin import load_plugin_model
from dpledger.models.tasks import Task
from dpledger.models.zoo import MODELS, build_model
from dpledger.params.lora import LoraParams

TEXT_TASKS = ("causal-lm", "sequence-classification")


def task_for(model: str, task: str, data: Dataset) -> Task:
    """The task, refused where the data cannot feed it (text tasks need text, zoo models take
    images)."""
    text = data.name == "text"
    if task in TEXT_TASKS and not text:
        raise ParamsError(
            f"params: train.task = {task!r} is invalid with data.name = {data.name!r}: "
            "it needs data.name: text"
        )
    if model in MODELS and text:
        raise ParamsError(
            f"params: train.model = {model!r} is invalid with data.name = 'text': "
            "zoo models take images; use hf or a plugin module:callable"
        )
    if task != "causal-lm" and text and not data.has_labels:
        raise ParamsError(
            f"params: data.label_field is invalid: train.task = {task!r} needs class labels, "
            f"and {data.name} file has no such field"
        )
    if task == "causal-lm" and data.x_train.shape[1] < 2:
        raise ParamsError(
            "params: train.task = 'causal-lm' is invalid for this data: "
            "its texts hold at most 1 token (data.max_length or the texts themselves), "
            "so no next token is predicted (perplexity would read 1.0); at least 2 are needed"
        )
    return Task(task, keyword_images=model == "hf" and not text)


def build_task_model(
    model: str, options: dict[str, Any], task: Task, data: Dataset, lora: LoraParams | None = None
) -> nn.Module:
    """An initialised model for ``task`` on ``data`` (seed torch beforehand for reproducible
    weights), with a LoRA adapter where ``lora`` is set (hf models only; the params schema refuses
    it elsewhere)."""
    text = data.name == "text"
    classes = data.vocab_size if task.name == "causal-lm" else data.num_classes
    if model == "hf":
        num_labels = None if task.name == "causal-lm" else classes
        built = load_hf_model(options, task.name, text=text, num_labels=num_labels, lora=lora)
    elif model in MODELS:
        built = build_model(model, data.input_shape, data.num_classes, **options)
    else:
        built = load_plugin_model(model, data.input_shape, int(classes), options)
    if not any(p.requires_grad for p in built.parameters()):
        raise ParamsError(
            f"params: train.model = {model!r} is invalid: the model has no trainable parameters"
        )
    check_outputs(built, task, data, model)
    return built


@torch.no_grad()
def check_outputs(model: nn.Module, task: Task, data: Dataset, name: str) -> None:
    """Refuse a model whose outputs cannot score the data: fewer classes than the labels, or a
    vocabulary smaller than the tokenizer's. The probe batch is zeros of the data's shape and type,
    never training examples: a model that keeps state from its inputs must not see data outside a
    private step."""
    x = torch.zeros_like(torch.from_numpy(data.x_train[:2]))
    try:
        logits = task.logits(model, x)
    except Exception as error:  # the model is the user's code: any failure is one line naming it
        layout = " (images are read as (N, C, H, W))" if x.ndim == 4 else ""
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        raise ParamsError(
            f"params: train.model = {name!r} is invalid for this data: "
            f"calling it on a batch of shape {tuple(x.shape)}{layout} failed "
            f"({type(error).__name__}: {first})"
        ) from None
    if not isinstance(logits, torch.Tensor):
        raise ParamsError(
            f"params: train.model = {name!r} is invalid: it returned {type(logits).__name__}, "
            "not logits"
        )
    if not logits.is_floating_point() or logits.ndim < 1 or logits.shape[0] != x.shape[0]:
        raise ParamsError(
            f"params: train.model = {name!r} is invalid: "
            f"on a batch of {x.shape[0]} it returned {logits.dtype} logits of shape {tuple(logits.shape)}; "  # noqa: E501
            "one row of floating-point logits per example is needed"
        )
    if task.name == "causal-lm":
        if logits.ndim != 3 or logits.shape[-1] < int(data.vocab_size or 0):
            raise ParamsError(
                f"params: train.model = {name!r} is invalid for data.tokenizer: "
                f"it scores {logits.shape[-1]} tokens (logits of shape {tuple(logits.shape)}) "
                f"but the tokenizer has {data.vocab_size}"
            )
        return
    top = int(max(data.y_train.max(), data.y_test.max()))
    if logits.ndim != 2 or logits.shape[1] <= top:
        raise ParamsError(
            "params: "
            f"data.path labels reach {top} but train.model = {name!r} has {logits.shape[-1]} classes "  # noqa: E501
            f"(logits of shape {tuple(logits.shape)}): labels must be 0..{logits.shape[-1] - 1}"
        )
