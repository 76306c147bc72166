"""The calibration record: what the calibrate stage proves, and what that proof assumes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dpledger import io


@dataclass(frozen=True)
class AccountantResult:
    """epsilon at delta from one accountant, with the assumptions the number rests on."""

    accountant: str
    epsilon: float
    delta: float
    assumptions: list[str]
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CalibrationRecord:
    """Noise multiplier and privacy claim handed from calibrate to train, audit and report.

    ``epsilon`` is the claim: the value proven by ``accountant`` for ``sampler`` at ``delta`` with
    ``noise_multiplier`` (noise std = noise_multiplier * clip norm on the summed clipped gradient).
    ``mechanism`` names the correlation matrix (``identity`` is DP-SGD). ``epsilon_curve`` lists
    (steps taken, epsilon proven after that many steps) so training can log the epsilon spent.
    """

    noise_multiplier: float
    epsilon: float
    delta: float
    accountant: str
    sampler: str
    assumptions: list[str]
    steps: int
    batch_size: int
    dataset_size: int
    epochs: int
    mechanism: str = "identity"
    mechanism_params: dict[str, Any] = field(default_factory=dict)
    accountants: list[AccountantResult] = field(default_factory=list)
    group: list[dict[str, Any]] = field(default_factory=list)
    epsilon_curve: list[tuple[int, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "CalibrationRecord":
        raw = dict(raw)
        raw["accountants"] = [AccountantResult(**a) for a in raw.get("accountants", [])]
        return cls(**raw)

    def save(self, path: str | Path) -> None:
        io.write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "CalibrationRecord":
        return cls.from_dict(io.read_json(path))
