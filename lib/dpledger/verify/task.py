"""The task the battery trains on: the synthetic MLP (default) or the train stage's own model
(``verify.model: train``), a weighted per-example loss and the probe rows.

Every row of ``targets`` is ``(label_1, …, label_O, weight)``: the per-example loss is ``weight ·
ℓ(output, label)``, with ℓ = ½‖output − label‖² for the synthetic task and the train stage's task
loss (cross-entropy, or the causal LM's mean next-token loss with the token ids as labels) for the
user's model. A zero weight gives a row whose gradient is exactly zero for every parameter value
(the paper's zero-gradient points, 000 §3.1, without floating-point residue); a large weight gives
the large-gradient probe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from dpledger.engine.bk import BKEngine
from dpledger.models.tasks import Task

INPUT_DIM = 8
HIDDEN_DIM = 16
OUTPUT_DIM = 2
PROBE_ALPHA = 10.0
"""000 App. A: the probe's label is −α·M(x) with α ≫ 1."""
PROBE_NORM_FACTOR = 20.0
"""The probe's gradient norm is at least this multiple of every ordinary row's, and at least 10."""


def weighted_half_mse(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-example loss ``w·½‖outputs − y‖²`` with ``targets = [y, w]`` (the protocol's
    ``loss_fn``)."""
    labels, weights = targets[:, :-1], targets[:, -1]
    return 0.5 * weights * ((outputs - labels) ** 2).sum(dim=1)


@dataclass(frozen=True)
class WeightedTaskLoss:
    """``weight · task loss`` with ``targets = [labels, weight]``: labels are the class (one column)
    or, for a causal LM, the row's token ids (float columns, exact below 2²⁴). The battery's loss
    for the user's model."""

    task: Task

    def __call__(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        labels, weights = targets[:, :-1].long(), targets[:, -1]
        return weights * self.task.losses_from_logits(outputs, labels, labels[:, 0])


class TaskLogits(nn.Module):
    """``model(x)`` for the battery's trainers: the wrapped model's logits as its task calls it
    (token ids with their attention mask, ``pixel_values=``, or a plain call)."""

    def __init__(self, model: nn.Module, task: Task) -> None:
        super().__init__()
        self.model = model
        self.task = task

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.task.logits(self.model, x)


def build_mlp(seed: int) -> nn.Module:
    """``Sequential(Linear(8, 16), Tanh(), Linear(16, 2))`` with a seeded initialisation."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(INPUT_DIM, HIDDEN_DIM), nn.Tanh(), nn.Linear(HIDDEN_DIM, OUTPUT_DIM)
    )
    torch.random.set_rng_state(generator_state)
    return model


LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def flat_parameters(model: nn.Module, names: Sequence[str] | None = None) -> torch.Tensor:
    """The parameters ``names`` (default: all of them) as one float64 vector, each tensor once (a
    tied weight is not counted twice: the noise tests treat the vector's coordinates as independent
    draws). The battery reads only the engine's trainable set (:attr:`SyntheticTask.trainable`)."""
    named = dict(model.named_parameters())
    chosen = named.values() if names is None else (named[name] for name in names)
    return torch.cat([value.detach().reshape(-1).to(torch.float64) for value in chosen])


def engine_parameter_names(model: nn.Module) -> tuple[str, ...]:
    """The parameters dpledger's engine privatizes on ``model``, in its order:
    ``BKEngine.parameter_names`` (the trainable ones, tied weights once; LoRA: the adapter), asked
    of the engine itself so the battery counts exactly the coordinates that get noise. A trainable
    parameter the engine cannot train raises :class:`~dpledger.engine.UnsupportedLayerError` naming
    its layer. The model is left as it was."""
    engine = BKEngine(model, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    engine.detach()
    return tuple(engine.parameter_names)


def per_example_losses(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: LossFn = weighted_half_mse,
) -> torch.Tensor:
    """The loss of each row under ``model`` (float64, no gradient)."""
    with torch.no_grad():
        return loss_fn(model(inputs).double(), targets.double())


def per_example_gradient_norms(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: LossFn = weighted_half_mse,
) -> torch.Tensor:
    """‖∇_θ loss_i‖ for each row, computed by an explicit loop (the harness's own reference, not the
    trainer's)."""
    norms = []
    for row in range(inputs.shape[0]):
        model.zero_grad(set_to_none=True)
        loss_fn(model(inputs[row : row + 1]), targets[row : row + 1]).sum().backward()
        norms.append(
            torch.sqrt(
                sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None)
            )
        )
    model.zero_grad(set_to_none=True)
    return torch.stack(norms)


@dataclass(frozen=True)
class SyntheticTask:
    """Initial model plus the rows the tests assemble their batches from."""

    model: nn.Module
    inputs: torch.Tensor
    """Ordinary rows: Gaussian features."""
    targets: torch.Tensor
    """Ordinary rows' targets: labels near the model's output (small gradients), weight 1."""
    probe_input: torch.Tensor
    probe_target: torch.Tensor
    probe_norm: float
    """‖∇ loss‖ of the probe row at the initial model."""
    probe_loss: float
    ordinary_norms: torch.Tensor
    trainable: tuple[str, ...]
    """The parameters the engine privatizes (:func:`engine_parameter_names`): the only ones a
    trainer may change, and the coordinates the noise tests count as draws."""
    loss_fn: LossFn = weighted_half_mse
    """Per-example loss ``loss_fn(outputs, targets)`` the trainers are handed."""
    description: str = "synthetic MLP"

    def flat(self, model: nn.Module) -> torch.Tensor:
        """The trainable parameters of ``model`` (a trained copy of :attr:`model`), flat float64."""
        return flat_parameters(model, self.trainable)

    def changed_frozen_parameter(self, model: nn.Module) -> str | None:
        """The name of a parameter outside :attr:`trainable` that ``model`` (a trained copy)
        changed, or None: a frozen weight changed by training is released without clipping or
        noise."""
        initial = dict(self.model.named_parameters())
        trainable = set(self.trainable)
        return next(
            (
                name
                for name, value in model.named_parameters()
                if name not in trainable and not torch.equal(value, initial[name])
            ),
            None,
        )

    def losses(self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss of each row under ``model`` (float64, no gradient)."""
        return per_example_losses(model, inputs, targets, self.loss_fn)

    def zero_rows(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``count`` rows with weight 0: their gradient is zero for every parameter value."""
        inputs, targets = self.ordinary_rows(0, count)
        return inputs, torch.zeros_like(targets)

    def ordinary_rows(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``count`` ordinary rows from position ``start`` (cycling)."""
        index = torch.arange(start, start + count) % self.inputs.shape[0]
        return self.inputs[index].clone(), self.targets[index].clone()


def make_task(seed: int, rows: int = 64) -> SyntheticTask:
    """The synthetic task of ``seed``: the MLP, Gaussian rows with labels near its output, and a
    probe whose label −α·M(x) (000 App. A) and weight make its gradient dominate."""
    model = build_mlp(seed)
    generator = torch.Generator().manual_seed(seed + 1)
    inputs = torch.randn(rows, INPUT_DIM, generator=generator)
    with torch.no_grad():
        outputs = model(inputs)
    labels = outputs + 0.5 * torch.randn(rows, OUTPUT_DIM, generator=generator)
    targets = torch.cat([labels, torch.ones(rows, 1)], dim=1)
    probe_input = 2.0 * torch.randn(1, INPUT_DIM, generator=generator)
    with torch.no_grad():
        probe_label = -PROBE_ALPHA * model(probe_input)
    return with_probe(
        model, inputs, targets, probe_input, probe_label, weighted_half_mse, "synthetic MLP"
    )


def model_task(
    model: nn.Module, task: Task, x: torch.Tensor, y: torch.Tensor, description: str, rows: int = 64
) -> SyntheticTask:
    """The battery's task on the train stage's model: ``rows`` training examples (weight 1) and the
    next one as the probe (its weight scaled up as in :func:`make_task`). The model runs in float32
    with its dropout off (p = 0; the σ = 0 tests need a deterministic model); the loss is ``task``'s
    per-example loss."""
    if x.shape[0] < rows + 1:
        raise ValueError(
            f"the training set has {x.shape[0]} examples; the battery needs {rows + 1}"
        )
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
    wrapped = TaskLogits(model.float().train(), task)
    labels = x[: rows + 1].double() if task.name == "causal-lm" else y[: rows + 1, None].double()
    targets = torch.cat([labels, torch.ones(rows + 1, 1, dtype=torch.float64)], dim=1).float()
    return with_probe(
        wrapped,
        x[:rows],
        targets[:rows],
        x[rows : rows + 1],
        targets[rows : rows + 1, :-1],
        WeightedTaskLoss(task),
        description,
    )


def with_probe(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    probe_input: torch.Tensor,
    probe_label: torch.Tensor,
    loss_fn: LossFn,
    description: str,
) -> SyntheticTask:
    """The task with the probe's weight chosen so that its gradient norm is at least
    ``PROBE_NORM_FACTOR`` × every ordinary row's and at least 10 (a weight scales the gradient
    exactly).

    A trainable parameter the engine cannot train is refused first, naming its layer."""
    trainable = engine_parameter_names(model)
    ordinary_norms = per_example_gradient_norms(model, inputs, targets, loss_fn)
    unit_probe = torch.cat([probe_label, torch.ones(1, 1, dtype=probe_label.dtype)], dim=1)
    unit_norm = float(per_example_gradient_norms(model, probe_input, unit_probe, loss_fn)[0])
    weight = max(1.0, PROBE_NORM_FACTOR * float(ordinary_norms.max()) / unit_norm, 10.0 / unit_norm)
    probe_target = torch.cat(
        [probe_label, torch.full((1, 1), weight, dtype=probe_label.dtype)], dim=1
    )
    return SyntheticTask(
        model=model,
        inputs=inputs,
        targets=targets,
        probe_input=probe_input,
        probe_target=probe_target,
        probe_norm=unit_norm * weight,
        probe_loss=float(per_example_losses(model, probe_input, probe_target, loss_fn)[0]),
        ordinary_norms=ordinary_norms,
        trainable=trainable,
        loss_fn=loss_fn,
        description=description,
    )
