"""The one check, shared by calibrate, train and audit, that the sampler accounted is the sampler used."""

from __future__ import annotations

from dataclasses import dataclass

from dpledger.errors import SamplerMismatchError


@dataclass(frozen=True)
class SamplerCheck:
    """Outcome of comparing the accountant's sampling assumption with the schedule's sampler."""

    accounted: str
    used: str
    allowed_mismatch: bool

    @property
    def matches(self) -> bool:
        return self.accounted == self.used

    def warning(self) -> str | None:
        """The sentence the report puts at the top when the two differ, else None."""
        if self.matches:
            return None
        return (
            f"The accountant assumed the '{self.accounted}' sampler but training used '{self.used}': "
            f"the claimed epsilon does not describe this run."
        )


def check_sampler(accounted: str, used: str, *, allow_mismatch: bool) -> SamplerCheck:
    """Compare the two samplers; raise unless they match or the mismatch is explicitly allowed."""
    check = SamplerCheck(accounted=accounted, used=used, allowed_mismatch=allow_mismatch)
    if not check.matches and not allow_mismatch:
        raise SamplerMismatchError(
            f"the accountant (calibrate.sampler) assumed '{accounted}' but the schedule was built with "
            f"'{used}' (schedule.sampler); make them equal, or set train.allow_sampler_mismatch: true "
            f"to train anyway and have the report flag the mismatch"
        )
    return check
