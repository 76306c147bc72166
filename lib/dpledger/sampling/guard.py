"""The one check, shared by calibrate, train and audit, that the sampler accounted is the sampler used.

Accounted samplers (what ``calibrate.sampler`` may name) are ``poisson``, ``fixed``, ``balls-in-bins``
and ``balls-in-bins-redrawn``. A schedule's sampler is compared by the accounted sampler it *is*:
its own name for a built-in one (``shuffle``, ``sequential``, ``partial-shuffle`` and
``batch-then-shuffle`` are none of the four: no sound accountant exists for them), the declared
``accounted_as`` for a plugin. Pad/truncate is a variant of balls-in-bins and keeps that name: the
accounting concerns the summed gradient, where a padding or truncated row is a zero gradient (004 §5.2.1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dpledger.errors import SamplerMismatchError

if TYPE_CHECKING:
    from dpledger.sampling.schedule import Schedule

ACCOUNTED_SAMPLERS = ("poisson", "fixed", "balls-in-bins", "balls-in-bins-redrawn")


@dataclass(frozen=True)
class SamplerCheck:
    """Outcome of comparing the accountant's sampling assumption with the schedule's sampler.

    ``used`` is the sampler that built the batches (a built-in name or ``module:callable``);
    ``used_as`` is the accounted sampler a plugin declares itself equivalent to (None otherwise).
    """

    accounted: str
    used: str
    allowed_mismatch: bool
    used_as: str | None = None

    @property
    def effective(self) -> str:
        """The name compared with the accountant's: the plugin's declaration, else the sampler itself."""
        return self.used_as or self.used

    @property
    def matches(self) -> bool:
        return self.accounted == self.effective

    def warning(self) -> str | None:
        """The sentence the report puts at the top when the two differ, else None."""
        if self.matches:
            return None
        reason = "" if self.effective in ACCOUNTED_SAMPLERS else f" No sound accountant exists for '{self.effective}'."
        return (
            f"The accountant assumed the '{self.accounted}' sampler but training used {self.describe_used()}: "
            f"the claimed epsilon does not describe this run.{reason}"
        )

    def describe_used(self) -> str:
        """The used sampler, quoted, with a plugin's declaration."""
        if self.used_as is None:
            return f"'{self.used}'"
        return f"'{self.used}' (declared equivalent to '{self.used_as}')"

    def assumption(self) -> str | None:
        """For a plugin matched through its declaration: the sentence saying the match rests on it."""
        if self.used_as is None:
            return None
        return (
            f"The batches came from the plugin sampler '{self.used}', which declares itself equivalent to "
            f"'{self.used_as}'; dpledger does not prove this declaration (the audit tests it empirically)."
        )

    def to_metrics(self) -> dict[str, Any]:
        """Flat keys for metrics/train.json: sampler_accounted, sampler_used, sampler_mismatch."""
        return {"sampler_accounted": self.accounted, "sampler_used": self.used, "sampler_mismatch": not self.matches}


def check_sampler(accounted: str, used: str, *, allow_mismatch: bool, used_as: str | None = None) -> SamplerCheck:
    """Compare the two samplers; raise unless they match or the mismatch is explicitly allowed."""
    check = SamplerCheck(accounted=accounted, used=used, allowed_mismatch=allow_mismatch, used_as=used_as)
    if not check.matches and not allow_mismatch:
        raise SamplerMismatchError(
            f"the accountant (calibrate.sampler) assumed '{accounted}' but the schedule was built with "
            f"{check.describe_used()} (schedule.sampler); make them equal, or set train.allow_sampler_mismatch: true "
            f"to train anyway and have the report flag the mismatch"
        )
    return check


def declared_equivalent(sampler: str, sampler_params: dict[str, Any]) -> str | None:
    """The accounted sampler a plugin schedule declared (``accounted_as``), or None."""
    if ":" not in sampler:
        return None
    return sampler_params.get("accounted_as")


def check_schedule(accounted: str, schedule: "Schedule", *, allow_mismatch: bool) -> SamplerCheck:
    """:func:`check_sampler` for a built schedule: plugins compare by their declared ``accounted_as``."""
    return check_sampler(
        accounted,
        schedule.sampler,
        allow_mismatch=allow_mismatch,
        used_as=declared_equivalent(schedule.sampler, schedule.sampler_params),
    )


def check_schedule_sizes(schedule: "Schedule", *, dataset_size: int, batch_size: int, epochs: int) -> None:
    """Refuse a schedule built for other sizes than the accountant's (n, B, epochs): q = B/n, b = ⌈n/B⌉.

    The sampler name alone does not pin the claim down: a schedule of the right sampler at a larger B
    (a larger q, fewer bins) within the accounted number of steps spends more privacy than proven.
    Unlike a sampler mismatch this cannot be allowed: no report could say what ε such a run has.
    """
    params = schedule.sampler_params
    used = {
        "dataset_size": schedule.dataset_size, "batch_size": params.get("batch_size"), "epochs": params.get("epochs")
    }
    problems = []
    if used["dataset_size"] != dataset_size:
        problems.append(f"dataset_size {used['dataset_size']} (accounted {dataset_size})")
    if used["batch_size"] != batch_size:
        problems.append(f"batch_size {used['batch_size']} (accounted {batch_size})")
    if used["epochs"] is None or used["epochs"] > epochs:
        problems.append(f"epochs {used['epochs']} (accounted {epochs})")
    rate = params.get("sample_rate")
    if rate is not None and not math.isclose(rate, batch_size / dataset_size, rel_tol=1e-12):
        problems.append(f"sample_rate {rate} (accounted q = B/n = {batch_size / dataset_size})")
    bins = params.get("bins")
    if bins is not None and bins != math.ceil(dataset_size / batch_size):
        problems.append(f"bins {bins} (accounted b = ⌈n/B⌉ = {math.ceil(dataset_size / batch_size)})")
    if problems:
        raise SamplerMismatchError(
            f"the schedule was built with {', '.join(problems)}: the claimed epsilon does not describe it; "
            "re-run the schedule and calibrate stages with the same data and batching"
        )
