"""The one check, shared by train and audit, that the run accounted is the run the schedule makes.

Accounted samplers (what ``calibrate.sampler`` may name) are the accounting vocabulary's laws
(:data:`dpledger.accounting.description.ACCOUNTED_SAMPLINGS`). A schedule is described in that
vocabulary (:func:`schedule_description`): its law is the ``accounted_as`` its sampler class
declares (None, for samplers no sound accountant covers: then its own name), or the declared
``accounted_as`` of a plugin; its sizes are those it was built with. :func:`check_schedule` compares
that description with the record's in one comparison naming every field that differs. Pad/truncate
is a variant of balls-in-bins and keeps that law: the accounting concerns the summed gradient, where
a padding or truncated row is a zero gradient (004 §5.2.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dpledger.accounting.description import ACCOUNTED_SAMPLINGS, MechanismDescription
from dpledger.errors import SamplerMismatchError
from dpledger.sampling.registry import SAMPLERS

if TYPE_CHECKING:
    from dpledger.sampling.schedule import Schedule

ACCOUNTED_SAMPLERS = tuple(ACCOUNTED_SAMPLINGS)


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
        """The name compared with the accountant's: the plugin's declaration, else the sampler
        itself."""
        return self.used_as or self.used

    @property
    def matches(self) -> bool:
        return self.accounted == self.effective

    def warning(self) -> str | None:
        """The sentence the report puts at the top when the two differ, else None."""
        if self.matches:
            return None
        reason = (
            ""
            if self.effective in ACCOUNTED_SAMPLERS
            else f" No sound accountant exists for '{self.effective}'."
        )
        return (
            f"The accountant assumed the '{self.accounted}' sampler but training used {self.describe_used()}: "  # noqa: E501
            f"the claimed epsilon does not describe this run.{reason}"
        )

    def describe_used(self) -> str:
        """The used sampler, quoted, with a plugin's declaration."""
        if self.used_as is None:
            return f"'{self.used}'"
        return f"'{self.used}' (declared equivalent to '{self.used_as}')"

    def assumption(self) -> str | None:
        """For a plugin matched through its declaration: the sentence saying the match rests on
        it."""
        if self.used_as is None:
            return None
        return (
            f"The batches came from the plugin sampler '{self.used}', "
            f"which declares itself equivalent to '{self.used_as}'; "
            "dpledger does not prove this declaration (the audit tests it empirically)."
        )

    def to_metrics(self) -> dict[str, Any]:
        """Flat keys for metrics/train.json: sampler_accounted, sampler_used, sampler_mismatch."""
        return {
            "sampler_accounted": self.accounted,
            "sampler_used": self.used,
            "sampler_mismatch": not self.matches,
        }


def declared_equivalent(sampler: str, sampler_params: dict[str, Any]) -> str | None:
    """The accounted sampler a plugin schedule declared (``accounted_as``), or None."""
    if ":" not in sampler:
        return None
    return sampler_params.get("accounted_as")


def schedule_description(schedule: "Schedule") -> MechanismDescription:
    """The run the schedule's batches make, in the accountants' vocabulary (σ unknown: 0): its law
    and its sizes as built (q = the Poisson rate it drew with, else B/n; b = its steps per
    epoch)."""
    params = schedule.sampler_params
    built = SAMPLERS.get(schedule.sampler)
    law = built.accounted_as if built is not None else declared_equivalent(schedule.sampler, params)
    batch_size = params.get("batch_size")
    rate = batch_size / schedule.dataset_size if isinstance(batch_size, int) else None
    return MechanismDescription(
        sampler=law or schedule.sampler,
        noise_multiplier=0.0,
        steps=schedule.num_steps,
        sample_rate=params.get("sample_rate", rate),
        batches_per_epoch=schedule.steps_per_epoch,
        epochs=params.get("epochs"),
        dataset_size=schedule.dataset_size,
        batch_size=batch_size,
    )


def check_schedule(
    accounted: MechanismDescription, schedule: "Schedule", *, allow_mismatch: bool
) -> SamplerCheck:
    """Compare the schedule's description with the accounted one; refuse, naming every field that
    differs, unless only the sampler differs and the mismatch is explicitly allowed (the report then
    flags it).

    The sampler name alone does not pin the claim down: a schedule of the right sampler at a larger
    B (a larger q, fewer bins) within the accounted number of steps spends more privacy than proven,
    so a size that differs is never allowed: no report could say what ε such a run has.
    """
    used = schedule_description(schedule)
    check = SamplerCheck(
        accounted=accounted.sampler,
        used=schedule.sampler,
        allowed_mismatch=allow_mismatch,
        used_as=declared_equivalent(schedule.sampler, schedule.sampler_params),
    )
    differences = accounted.sampling_differences(used)
    sizes_differ = len(differences) > (0 if check.matches else 1)
    if sizes_differ or not (check.matches or allow_mismatch):
        if not check.matches:
            differences[0] = f"sampler {check.describe_used()} (accounted '{accounted.sampler}')"
        hint = (
            "re-run the schedule and calibrate stages with the same data and batching"
            if sizes_differ
            else "make calibrate.sampler and schedule.sampler equal, "
            "or set train.allow_sampler_mismatch: "
            "true to train anyway and have the report flag the mismatch"
        )
        raise SamplerMismatchError(
            f"the schedule was built with {', '.join(differences)}: "
            f"the claimed epsilon does not describe it; {hint}"
        )
    return check
