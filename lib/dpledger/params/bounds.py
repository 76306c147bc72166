"""Upper bounds on every count and size, so a typo (``1e12``) is refused with one line instead of a
silent hang.

Fixed limits are pydantic ``le=`` bounds on the fields; those that depend on several values (steps
times dataset size, a model's parameter count, games times their length) are estimated up front
against the machine's memory or a time budget of the order of an hour on a 2-core CPU, by
:func:`refuse_beyond`.
"""

from __future__ import annotations

import os

from dpledger.errors import ParamsError

MAX_EPOCHS = 100_000
MAX_TRAIN_STEPS = 10_000_000  # epochs × batches per epoch: days of training even for a tiny model
MAX_AUDIT_OBSERVATIONS = 100_000_000  # two float64 score arrays of 400 MB each
# games × Gaussians per game: ~35 min at 2.3e7 draws/s on 2 CPU cores
MAX_AUDIT_DRAWS = 50_000_000_000
MAX_PATTERN_OBSERVATIONS = 1_000_000  # one run of the (plugin) sampler per game
MAX_DPSGD_OBSERVATIONS = 10_000  # one training run per game: ~40 min for the default digits MLP
MAX_DPSGD_EPOCHS = 100_000  # runs × epochs per run of the DP-SGD audit
# one float32 per canary and step is kept (memory is checked as well)
MAX_ONE_RUN_CANARIES = 10_000_000
MAX_SELFCHECK_OBSERVATIONS = 1_000_000_000  # repeats × games of `dpledger audit selfcheck`
MAX_MODEL_PARAMETERS = 1_000_000_000
MAX_WIDTH = 1_000_000  # any single integer model option (hidden width, channels, dim, depth, ...)
MAX_LIST_LENGTH = 64  # lists in params (group sizes, RMSE epsilons, hidden layers)
# fp32 weights, gradient, clipped sum, noise, two optimizer moments, margin
BYTES_PER_MODEL_PARAMETER = 32
MEMORY_FRACTION = 0.5  # share of the machine's RAM one array (schedule, model) may take


def machine_memory() -> int:
    """Physical memory in bytes (POSIX ``sysconf``); 64 GiB where the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return 64 << 30


def refuse_beyond(what: str, amount: int, limit: int, unit: str, hint: str) -> None:
    """Raise one line when ``amount`` (the up-front estimate of ``what``) exceeds ``limit``."""
    if amount > limit:
        raise ParamsError(
            f"params: {what} is too large: "
            f"{amount:,} {unit} exceeds the limit of {limit:,} {unit}; {hint}"
        )


def refuse_beyond_memory(what: str, nbytes: int, hint: str) -> None:
    """Raise one line when an array estimated at ``nbytes`` would take more than half the machine's
    memory."""
    limit = int(machine_memory() * MEMORY_FRACTION)
    if nbytes > limit:
        raise ParamsError(
            f"params: {what} is too large: it needs about {nbytes / 2**30:,.1f} GiB of memory, "
            f"more than half of this machine's {machine_memory() / 2**30:,.1f} GiB; {hint}"
        )
