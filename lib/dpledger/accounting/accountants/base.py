"""The interface every accountant implements, and the sentences and checks they share.

An accountant says what it covers (:meth:`Accountant.unsupported`: None, or why not, naming what to
use instead), its ε at δ and δ at ε for a :class:`MechanismDescription` with the assumptions the
number rests on (an :class:`AccountantResult`), the σ that meets a target (ε, δ) and a cheap ε for
the ε-vs-step curve. Callers (calibration, the pipeline, the seals, the CLI) use only this
interface, never an accountant's type.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from dpledger.accounting.description import MechanismDescription
from dpledger.accounting.record import AccountantResult
from dpledger.accounting.search import Calibration
from dpledger.errors import UnsupportedMechanismError

ADJACENCY = "add or remove one example (both directions accounted, the worse one reported)"
RELEASE = "every intermediate model is released (no last-iterate amplification is claimed)"


class Accountant(Protocol):
    """ε(δ), δ(ε) and σ calibration of the descriptions an accountant covers.

    ``deterministic``: its ε can be recomputed exactly from the description (a Monte Carlo claim
    cannot: it is sealed, and it is not run as a cross-check). ``auto_rank``: its place in the
    order ``auto`` tries (tightest first), or None where ``auto`` never picks it.
    ``printed_bounds``: where the CLI's ``epsilon`` or ``noise`` command prints a different one of
    the accountant's valid bounds than the claim calibrate records, the sentence that says so.
    """

    name: str
    deterministic: ClassVar[bool]
    auto_rank: ClassVar[int | None]
    printed_bounds: ClassVar[dict[str, str]]

    def unsupported(self, description: MechanismDescription) -> str | None:
        """None where the accountant covers the description soundly, else why not (one line)."""
        ...

    def epsilon(self, description: MechanismDescription, delta: float) -> AccountantResult:
        """The proven ε at δ with its assumptions."""
        ...

    def delta(self, description: MechanismDescription, epsilon: float) -> float:
        """δ at ε."""
        ...

    def calibrate(
        self, description: MechanismDescription, epsilon: float, delta: float, tolerance: float
    ) -> Calibration:
        """The smallest σ whose proven ε at δ is at most ``epsilon`` (within ``tolerance``)."""
        ...

    def curve_epsilon(
        self, description: MechanismDescription, delta: float, table_discretization: float
    ) -> float:
        """A cheap ε at δ for one point of the ε-vs-step curve (a valid bound, or for Monte Carlo
        an estimate; ``table_discretization`` is the PLD interval of such tables)."""
        ...


def outside(
    description: MechanismDescription, name: str, covered: tuple[str, ...], what: str, use: str
) -> str | None:
    """The refusal of accountant ``name`` for a sampler outside ``covered`` (``what`` in words),
    naming the accountant to ``use`` instead; None for a covered sampler."""
    if description.sampler in covered:
        return None
    return f"the {name} accountant covers {what}, not {description.sampler}; use --accountant {use}"


def base_assumptions(description: MechanismDescription) -> list[str]:
    """The sentences every accountant's claim rests on: sampling, adjacency, noise and release."""
    adjacency = (
        ADJACENCY
        if description.group_size == 1
        else (
            f"add or remove up to k = {description.group_size} examples (group privacy; "
            "both directions accounted)"
        )
    )
    return [
        description.sampling_sentence(),
        f"adjacency: {adjacency}",
        "noise N(0, (σ·clip norm)²) "
        f"with σ = {description.noise_multiplier:.6g} added once per step to the sum of per-example clipped gradients, "  # noqa: E501
        f"{description.steps} steps",
        RELEASE,
    ]


def require_support(accountant: Accountant, description: MechanismDescription) -> None:
    """Raise :class:`UnsupportedMechanismError` with the accountant's reason if it cannot account
    soundly."""
    reason = accountant.unsupported(description)
    if reason is not None:
        raise UnsupportedMechanismError(f"accountant {accountant.name}: {reason}")
