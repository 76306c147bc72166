"""Third-party chatter that says nothing about the claim, kept out of a stage's stderr.

- dp_accounting's RDP accountant logs (absl) "_compute_log_a_frac failed to converge ... Excluding
  this order" for each Rényi order whose series it cannot sum; dropping an order can only make ε
  larger, so the claim stays an upper bound. The lines are dropped and counted; one note says how
  many.
- transformers logs at warning level (newly initialised heads, deprecations, paths of local folders)
  and draws progress bars when it saves a model: errors only, no bars, unless the user sets
  ``TRANSFORMERS_VERBOSITY`` or ``HF_HUB_DISABLE_PROGRESS_BARS`` themselves.
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from typing import Iterator

RDP_NOT_CONVERGED = "_compute_log_a_frac failed to converge"


class _DropRdpConvergence(logging.Filter):
    """Drops dp_accounting's per-order convergence warnings, counting them."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith(RDP_NOT_CONVERGED):
            self.dropped += 1
            return False
        return True


@contextmanager
def quiet_third_party(stage: str) -> Iterator[None]:
    """Within the block: RDP convergence warnings dropped (one note at the end) and transformers at
    error level without progress bars."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    transformers = sys.modules.get("transformers")  # imported already: the variables were read then
    if transformers is not None and os.environ["TRANSFORMERS_VERBOSITY"] == "error":
        transformers.logging.set_verbosity_error()
    if transformers is not None and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1":
        transformers.logging.disable_progress_bar()
    absl = logging.getLogger("absl")
    drop = _DropRdpConvergence()
    absl.addFilter(drop)
    try:
        yield
    finally:
        absl.removeFilter(drop)
        if drop.dropped:
            print(
                f"note: {stage}: the RDP accountant skipped {drop.dropped} Rényi order(s) "
                "whose series did not converge; skipping an order can only raise its ε, "
                "so the bounds stand",
                file=sys.stderr,
            )
