"""The synthetic task the battery trains on: a small MLP, a weighted per-example loss and the probe rows.

Every row of ``targets`` is ``(label_1, …, label_O, weight)``: the per-example loss is
``weight · ½‖output − label‖²``. A zero weight gives a row whose gradient is exactly zero for every
parameter value (the paper's zero-gradient points, 000 §3.1, without floating-point residue); a large
weight gives the large-gradient probe.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

INPUT_DIM = 8
HIDDEN_DIM = 16
OUTPUT_DIM = 2
PROBE_ALPHA = 10.0
"""000 App. A: the probe's label is −α·M(x) with α ≫ 1."""
PROBE_NORM_FACTOR = 20.0
"""The probe's gradient norm is at least this multiple of every ordinary row's, and at least 10."""


def weighted_half_mse(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-example loss ``w·½‖outputs − y‖²`` with ``targets = [y, w]`` (the protocol's ``loss_fn``)."""
    labels, weights = targets[:, :-1], targets[:, -1]
    return 0.5 * weights * ((outputs - labels) ** 2).sum(dim=1)


def build_mlp(seed: int) -> nn.Module:
    """``Sequential(Linear(8, 16), Tanh(), Linear(16, 2))`` with a seeded initialisation."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(INPUT_DIM, HIDDEN_DIM), nn.Tanh(), nn.Linear(HIDDEN_DIM, OUTPUT_DIM))
    torch.random.set_rng_state(generator_state)
    return model


def flat_parameters(model: nn.Module) -> torch.Tensor:
    """All parameters as one float64 vector (state_dict order)."""
    return torch.cat([value.detach().reshape(-1).to(torch.float64) for value in model.state_dict().values()])


def per_example_losses(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The loss of each row under ``model`` (float64, no gradient)."""
    with torch.no_grad():
        return weighted_half_mse(model(inputs).double(), targets.double())


def per_example_gradient_norms(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """‖∇_θ loss_i‖ for each row, computed by an explicit loop (the harness's own reference, not the trainer's)."""
    norms = []
    for row in range(inputs.shape[0]):
        model.zero_grad(set_to_none=True)
        weighted_half_mse(model(inputs[row : row + 1]), targets[row : row + 1]).sum().backward()
        norms.append(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters())))
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

    def zero_rows(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``count`` rows with weight 0: their gradient is zero for every parameter value."""
        inputs, _ = self.ordinary_rows(0, count)
        return inputs, torch.zeros(count, OUTPUT_DIM + 1)

    def ordinary_rows(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``count`` ordinary rows from position ``start`` (cycling)."""
        index = torch.arange(start, start + count) % self.inputs.shape[0]
        return self.inputs[index].clone(), self.targets[index].clone()


def make_task(seed: int, rows: int = 64) -> SyntheticTask:
    """Build the model and rows from ``seed``; the probe's weight makes its gradient dominate (000 App. A)."""
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
    unit_probe = torch.cat([probe_label, torch.ones(1, 1)], dim=1)
    ordinary_norms = per_example_gradient_norms(model, inputs, targets)
    unit_norm = float(per_example_gradient_norms(model, probe_input, unit_probe)[0])
    weight = max(1.0, PROBE_NORM_FACTOR * float(ordinary_norms.max()) / unit_norm, 10.0 / unit_norm)
    probe_target = torch.cat([probe_label, torch.full((1, 1), weight)], dim=1)
    return SyntheticTask(
        model=model,
        inputs=inputs,
        targets=targets,
        probe_input=probe_input,
        probe_target=probe_target,
        probe_norm=unit_norm * weight,
        probe_loss=float(per_example_losses(model, probe_input, probe_target)[0]),
        ordinary_norms=ordinary_norms,
    )
