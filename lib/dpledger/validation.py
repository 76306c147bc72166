"""The house refusal of a bad value, written once: ``<name> = <value> is invalid: <requirement>``.

Every check raises a one-line :class:`ParamsError` that names the parameter (with the place it comes
from, such as ``params`` or ``audit``, where given) and says what is allowed, so a wording is not
restated by hand at each check. Strings are shown quoted (``'fast'``), numbers as given.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from dpledger.errors import ParamsError

INTERVALS = {"open": "()", "closed": "[]", "left-open": "(]", "right-open": "[)"}
"""The brackets of each kind of interval :func:`within` checks."""


def invalid(name: str, value: Any, requirement: str, *, where: str | None = None) -> ParamsError:
    """The refusal of ``value`` for ``name`` (``where: name = value is invalid: requirement``)."""
    shown = repr(value) if isinstance(value, str) else value
    place = f"{where}: " if where else ""
    return ParamsError(f"{place}{name} = {shown} is invalid: {requirement}")


def one_of(
    name: str, value: Any, allowed: Iterable[str], *, where: str | None = None, note: str = ""
) -> None:
    """Refuse ``value`` unless it is one of ``allowed`` (listed in the message, then ``note``)."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise invalid(name, value, f"allowed values are {', '.join(allowed)}{note}", where=where)


def within(
    name: str,
    value: float,
    low: float,
    high: float,
    *,
    interval: str = "open",
    where: str | None = None,
) -> None:
    """Refuse ``value`` (NaN included) outside the ``interval`` (a key of :data:`INTERVALS`) from
    ``low`` to ``high``."""
    left, right = INTERVALS[interval]
    above = value >= low if left == "[" else value > low
    below = value <= high if right == "]" else value < high
    if not (above and below):
        span = f"{left}{_number(low)}, {_number(high)}{right}"
        raise invalid(name, value, f"it must lie in {span}", where=where)


def at_least(
    name: str, value: float, minimum: float, *, integer: bool = False, where: str | None = None
) -> None:
    """Refuse ``value`` below ``minimum`` (or, with ``integer``, anything but an integer)."""
    if integer and int(value) != value:
        raise invalid(name, value, f"it must be an integer >= {_number(minimum)}", where=where)
    if not value >= minimum:
        kind = "an integer >= " if integer else "at least "
        raise invalid(name, value, f"it must be {kind}{_number(minimum)}", where=where)


def positive(
    name: str, value: float, *, allow_zero: bool = False, where: str | None = None
) -> None:
    """Refuse a value that is not a finite number > 0 (>= 0 with ``allow_zero``)."""
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        sign = ">= 0" if allow_zero else "> 0"
        raise invalid(name, value, f"it must be a finite number {sign}", where=where)


def _number(value: float) -> str:
    """A bound as the messages print it: integers plainly, others in the shortest form."""
    return str(value) if isinstance(value, int) else f"{value:g}"
