"""The calibration record: what the calibrate stage proves, and what that proof assumes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dpledger import io
from dpledger.accounting.description import MechanismDescription


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

    ``epsilon`` is the claim: the value proven by ``accountant`` at ``delta`` for ``description``,
    the one description of the run (sampler, sizes, steps, σ = its noise_multiplier, mechanism) that
    the accountant consumed; the sampler, sizes and σ read below are its fields, never copies.
    ``epsilon_curve`` lists (steps taken, epsilon proven after that many steps) so training can log
    the epsilon spent.
    """

    description: MechanismDescription
    epsilon: float
    delta: float
    accountant: str
    assumptions: list[str]
    accountants: list[AccountantResult] = field(default_factory=list)
    group: list[dict[str, Any]] = field(default_factory=list)
    epsilon_curve: list[tuple[int, float]] = field(default_factory=list)

    # The description's fields, read through the record (typed properties, not copies).
    @property
    def noise_multiplier(self) -> float:
        """σ: noise std over the clipping norm."""
        return self.description.noise_multiplier

    @property
    def sampler(self) -> str:
        return self.description.sampler

    @property
    def steps(self) -> int:
        return self.description.steps

    @property
    def batch_size(self) -> int | None:
        return self.description.batch_size

    @property
    def dataset_size(self) -> int | None:
        return self.description.dataset_size

    @property
    def epochs(self) -> int:
        return self.description.epochs

    @property
    def mechanism(self) -> str:
        return self.description.mechanism

    @property
    def mechanism_params(self) -> dict[str, Any]:
        return self.description.mechanism_params

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "CalibrationRecord":
        """The record :meth:`to_dict` wrote. One written before records carried their description is
        refused (a TypeError, which :func:`dpledger.io.reading_artifact` turns into one line: re-run
        calibrate)."""
        raw = dict(raw)
        if "description" not in raw:
            raise TypeError(
                "the record carries no mechanism description (written by an older dpledger?)"
            )
        raw["description"] = MechanismDescription(**raw["description"])
        raw["accountants"] = [AccountantResult(**a) for a in raw.get("accountants", [])]
        return cls(**raw)

    def save(self, path: str | Path) -> None:
        io.write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "CalibrationRecord":
        return cls.from_dict(io.read_json(path))
