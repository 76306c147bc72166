"""Privacy across runs: a model trained privately and then trained again on overlapping data
releases a function of both runs' noisy gradients, so its guarantee is the composition of both
claims, not the last run's alone.

A published model carries the claims it was built from (:data:`PRIVACY_FILE`): every run that
trained it on data that may overlap, each with the mechanism its accountant consumed, and their
composition. A run continuing from it composes those claims with its own (:func:`compose`):

- with the PLD accountant's own composition where every run was accounted by it: the runs' privacy
  loss distributions (dp-accounting, pessimistic estimates, each for the steps the run actually
  took) are composed and read at this run's δ. Two runs of the same subsampled Gaussian for T steps
  each compose exactly to one run of 2T steps;
- else by basic composition, valid for any (ε_i, δ_i)-DP runs on the same data (Dwork and Roth
  2014, Theorem 3.16): ε = Σ ε_i at δ = Σ δ_i.

Each run's own claim keeps its assumptions (sampler, adjacency, failure probability of a Monte Carlo
accountant); the composition adds none.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from dpledger.accounting.bounds import DISCRETIZATION
from dpledger.accounting.description import MechanismDescription
from dpledger.accounting.pld import PldRun, composed_pld
from dpledger.errors import ParamsError

PRIVACY_FILE = "privacy.json"
"""The claims a published model was built from, beside its weights and card."""

FORMAT = "dpledger-privacy/1"

PLD = "pld"
"""The accountant whose privacy loss distributions compose (``accountants.pld``)."""


@dataclass(frozen=True)
class RunClaim:
    """One training run's claim as a later run composes it: ε spent at δ after ``steps_done`` steps
    of ``description`` (the mechanism ``accountant`` consumed), on the training rows whose
    fingerprint is ``data``."""

    epsilon: float
    delta: float
    accountant: str
    description: dict[str, Any]
    steps_done: int
    data: str

    def mechanism(self) -> MechanismDescription:
        """The description of the steps this run took."""
        return MechanismDescription(**self.description).with_steps(self.steps_done)


@dataclass(frozen=True)
class Composition:
    """The composed claim of ``runs`` (earliest first): ε at δ by ``method``."""

    epsilon: float
    delta: float
    method: str
    runs: tuple[RunClaim, ...]


@dataclass(frozen=True)
class Provenance:
    """What :data:`PRIVACY_FILE` holds: the runs composed into the model's claim (this run last),
    their composition, and the earlier runs declared disjoint from this run's data (not composed,
    named)."""

    composition: Composition
    declared_disjoint: tuple[RunClaim, ...] = field(default_factory=tuple)

    def is_alone(self) -> bool:
        """Whether the claim is one run's, with no earlier run composed or named."""
        return len(self.composition.runs) == 1 and not self.declared_disjoint

    def metrics(self) -> dict[str, Any]:
        """The entries of metrics/train.json (none for a run alone)."""
        if self.is_alone():
            return {}
        return {
            "epsilon_composed": self.composition.epsilon,
            "delta_composed": self.composition.delta,
            "composition": self.composition.method,
            "prior_runs_composed": len(self.composition.runs) - 1,
            "prior_runs_declared_disjoint": len(self.declared_disjoint),
        }

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready body of :data:`PRIVACY_FILE`."""
        return {
            "format": FORMAT,
            "composed": {
                "epsilon": self.composition.epsilon,
                "delta": self.composition.delta,
                "method": self.composition.method,
            },
            "runs": [asdict(run) for run in self.composition.runs],
            "declared_disjoint": [asdict(run) for run in self.declared_disjoint],
        }


def load_provenance(path: Path) -> Provenance:
    """The claims of the published model at ``path`` (its :data:`PRIVACY_FILE`); one line naming
    the file when it is not one."""
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
        if body.get("format") != FORMAT:
            raise ValueError(f"format {body.get('format')!r}, expected {FORMAT!r}")
        runs = tuple(RunClaim(**run) for run in body["runs"])
        disjoint = tuple(RunClaim(**run) for run in body.get("declared_disjoint", []))
        composed = body["composed"]
        composition = Composition(
            float(composed["epsilon"]), float(composed["delta"]), str(composed["method"]), runs
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ParamsError(
            f"{path} is not a dpledger privacy record ({error}); it records the privacy of the model in its folder, and a later run composes it"  # noqa: E501
        ) from None
    if not runs:
        raise ParamsError(f"{path} records no run")
    return Provenance(composition, disjoint)


def compose(runs: tuple[RunClaim, ...], delta: float) -> Composition:
    """The composed claim of ``runs`` on overlapping data: at ``delta`` where every run was
    accounted by the PLD accountant (the PLDs composed), else at the sum of their δ (basic
    composition)."""
    if len(runs) == 1:
        (run,) = runs
        own = f"the run's own accountant ({run.accountant})"
        return Composition(run.epsilon, run.delta, own, runs)
    if any(run.epsilon == math.inf for run in runs):
        return Composition(math.inf, delta, "a run without noise composes to no guarantee", runs)
    if all(run.accountant == PLD for run in runs):
        pld = None
        for run in runs:
            this = composed_pld(PldRun.of(run.mechanism()), DISCRETIZATION)
            pld = this if pld is None else pld.compose(this)
        assert pld is not None  # two runs or more
        epsilon = float(pld.get_epsilon_for_delta(delta))
        return Composition(epsilon, delta, "PLD composition (dp-accounting)", runs)
    return Composition(
        sum(run.epsilon for run in runs),
        sum(run.delta for run in runs),
        "basic composition (ε and δ summed)",
        runs,
    )


def continued(prior: Provenance, run: RunClaim) -> Provenance:
    """The provenance of a model continued from ``prior``'s on overlapping data by ``run``: every
    run ``prior`` composed, then ``run``, composed at ``run``'s δ."""
    runs = (*prior.composition.runs, run)
    return replace(prior, composition=compose(runs, run.delta))


def alone(run: RunClaim, declared_disjoint: tuple[RunClaim, ...] = ()) -> Provenance:
    """The provenance of a model whose claim is ``run``'s alone (trained from scratch, from public
    weights, or from a private model declared disjoint, whose runs are named)."""
    return Provenance(compose((run,), run.delta), declared_disjoint)
