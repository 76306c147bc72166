"""The accountants, one module each over the interface of :mod:`.base`, and their registry.

Every module of this package but ``base`` is an accountant: its name is the module's name and its
class is the module's ``ACCOUNTANT``. So a new accountant is one module here (plus its test): the
names params.yaml and the CLI accept, the settings, the order ``auto`` tries and the cross-checks
are all read from the modules. Listing the names imports nothing (params validation stays light);
the classes load on first use.

| accountant   | samplers                                   | group k > 1 | correlated C |
|--------------|--------------------------------------------|-------------|--------------|
| ``pld``      | poisson, fixed                             | yes (MoG)   | no           |
| ``rdp``      | poisson                                    | no          | no           |
| ``allocation`` | balls-in-bins-redrawn, balls-in-bins (C = I) | no        | no           |
| ``montecarlo`` | balls-in-bins (any C >= 0), balls-in-bins-redrawn (C = I) | no | yes    |

``auto`` (:func:`resolve_accountant`) picks the first accountant by ``auto_rank`` that covers the
sampler and mechanism, as each one's :meth:`unsupported` says: today pld for poisson/fixed,
allocation for balls-in-bins with C = I (deterministic and tighter than Monte Carlo), montecarlo for
correlated noise.
"""

from __future__ import annotations

import functools
import pkgutil
from dataclasses import fields
from importlib import import_module
from typing import Any

from dpledger import validation
from dpledger.accounting.accountants.base import Accountant, require_support
from dpledger.accounting.description import describe
from dpledger.accounting.record import AccountantResult
from dpledger.errors import ParamsError

__all__ = [
    "ACCOUNTANTS",
    "Accountant",
    "accountant_of",
    "accountant_type",
    "auto_order",
    "get_accountant",
    "require_support",
    "resolve_accountant",
    "settings",
    "settings_of",
]

ACCOUNTANTS = tuple(
    sorted(
        module.name
        for module in pkgutil.iter_modules(__path__)
        if module.name != "base" and not module.name.startswith("_")
    )
)
"""The accountants' names: the modules of this package (read without importing them)."""


@functools.cache
def accountant_type(name: str) -> type:
    """The class of accountant ``name`` (its module's ``ACCOUNTANT``); an unknown name is
    refused."""
    if name not in ACCOUNTANTS:
        allowed = ", ".join(ACCOUNTANTS)
        raise validation.invalid("accountant", name, f"allowed values are auto, {allowed}")
    return import_module(f"{__name__}.{name}").ACCOUNTANT


@functools.cache
def auto_order() -> tuple[str, ...]:
    """The accountants ``auto`` may stand for, tightest first (by their ``auto_rank``): the
    deterministic PLD and allocation bounds before the sampled Monte Carlo one (rdp, only pld's
    looser cross-check, has none)."""
    ranked = [(accountant_type(n).auto_rank, n) for n in ACCOUNTANTS]
    return tuple(name for rank, name in sorted(r for r in ranked if r[0] is not None))


def settings_of(name: str) -> tuple[str, ...]:
    """The settings accountant ``name`` takes: its dataclass fields less its name."""
    return tuple(f.name for f in fields(accountant_type(name)) if f.name != "name")


@functools.cache
def settings() -> tuple[str, ...]:
    """Every setting some accountant takes (a caller may hand one bundle of them to any one)."""
    return tuple(sorted({setting for name in ACCOUNTANTS for setting in settings_of(name)}))


def get_accountant(name: str, **given: Any) -> Accountant:
    """The accountant called ``name`` configured with those of ``given`` settings it takes
    (:func:`settings_of`); the others must be settings of another accountant (one bundle serves
    all), else the call is refused."""
    kind = accountant_type(name)
    unknown = sorted(set(given) - set(settings()))
    if unknown:
        allowed = ", ".join(settings())
        raise ParamsError(f"accountant settings {unknown} are unknown: allowed are {allowed}")
    own = settings_of(name)
    return kind(**{key: value for key, value in given.items() if key in own})


def accountant_of(result: AccountantResult) -> Accountant:
    """The accountant configured as it was for ``result``: its settings read from the result's
    details (which also hold what it found, such as a PLD's method or a Monte Carlo δ estimate)."""
    own = settings_of(result.accountant)
    found = {key: value for key, value in result.details.items() if key in own}
    return get_accountant(result.accountant, **found)


def _covers(name: str, sampler: str, mechanism: str) -> bool:
    probe = describe(sampler=sampler, dataset_size=2, batch_size=1, epochs=1, mechanism=mechanism)
    return get_accountant(name).unsupported(probe) is None


def resolve_accountant(name: str, sampler: str, mechanism: str = "identity") -> str:
    """``name``, or for ``auto`` the first of :func:`auto_order` whose :meth:`unsupported` accepts
    the sampler with the mechanism. Where none does, the most general one that accepts the sampler
    (the last of the order), so that its refusal says what to change."""
    if name != "auto":
        return name
    order = auto_order()
    covering = [candidate for candidate in order if _covers(candidate, sampler, mechanism)]
    if covering:
        return covering[0]
    fallback = [candidate for candidate in order if _covers(candidate, sampler, "identity")]
    return fallback[-1] if fallback else order[0]
