"""The accounting's limits, each named once: the accountants enforce them, and params.yaml and the
CLI declare them from here (this module imports nothing, so params validation stays light).
"""

MAX_EPSILON = 100.0
"""The largest target ε: beyond it no noise multiplier >= 1e-3 is needed and the claim says
nothing."""

DISCRETIZATION = 1e-4
"""Default PLD value_discretization_interval (dp-accounting's default); finer is slower and
tighter."""

DISCRETIZATION_RANGE = (1e-6, 1e-2)
"""The PLD interval of a claim (calibrate.pld_discretization, and the CLI's --discretization):
coarser than 0.01 the pessimistic bound is a valid but visibly loose claim, finer than 1e-6 the
grids no longer fit memory."""

TABLE_DISCRETIZATION_RANGE = (1e-6, 1e-1)
"""The PLD interval of the group table and the ε-vs-step curve: context beside the claim, so it may
be as coarse as the allocation accountant's curve grid (0.1)."""

MIN_MC_SAMPLES = 1000
"""The fewest Monte Carlo samples (estimation or verification) an accountant is built with."""

MAX_MC_SAMPLES = 1 << 26
"""The most Monte Carlo estimation samples params.yaml and the CLI accept (minutes on 2 cores)."""

MAX_GROUP_SIZE = 1024
"""The largest k of the group-privacy table (the mixture has k + 1 components)."""

MAX_BANDS = 4096
"""The largest w of a w-banded correlation matrix."""
