"""Small CNN with GroupNorm (BatchNorm mixes examples, so DP-SGD cannot use it)."""

from __future__ import annotations

from torch import Tensor, nn


class CNN(nn.Module):
    """[Conv3×3 → GroupNorm → tanh] per entry of ``channels`` (stride 2 after the first), global
    average pool, Linear."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        channels: tuple[int, ...] | list[int] = (16, 32),
        groups: int = 4,
    ) -> None:
        super().__init__()
        in_channels = input_shape[0]
        layers: list[nn.Module] = []
        for index, width in enumerate(channels):
            layers += [
                nn.Conv2d(in_channels, width, 3, stride=1 if index == 0 else 2, padding=1),
                nn.GroupNorm(min(groups, width), width),
                nn.Tanh(),
            ]
            in_channels = width
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_channels, num_classes)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)
