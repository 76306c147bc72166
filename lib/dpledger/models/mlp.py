"""Multi-layer perceptron on flattened inputs."""

from __future__ import annotations

import math

from torch import Tensor, nn


class MLP(nn.Module):
    """Flatten → [Linear → activation] × len(hidden) → Linear."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        hidden: tuple[int, ...] | list[int] = (256,),
        activation: str = "tanh",
    ) -> None:
        super().__init__()
        acts = {"relu": nn.ReLU, "tanh": nn.Tanh}
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(input_shape)
        for size in hidden:
            layers += [nn.Linear(width, size), acts[activation]()]
            width = size
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)
