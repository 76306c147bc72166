"""Training progress on stderr: a tqdm bar with the loss and ε spent on a terminal; elsewhere (DVC,
a CI log, a pipe) one plain line at every tenth of the run, so a long run shows it is alive without
flooding."""

from __future__ import annotations

import sys
from typing import TextIO

from tqdm import tqdm

LINES = 10
"""Plain lines per run when stderr is not a terminal (plus one at the end)."""
BAR_LOSSES = 100
"""Loss updates of the terminal bar per run: each is a device-to-host read of the loss
(StepLosses)."""


class Progress:
    """Steps ``initial..total`` of a run; ``update`` after each step with the ε spent so far and its
    loss, which is needed (read from the device) only where :meth:`shows_loss` says so."""

    def __init__(
        self, total: int, initial: int, *, enabled: bool = True, stream: TextIO | None = None
    ) -> None:
        self.stream = stream or sys.stderr
        self.total, self.done = total, initial
        self.enabled = enabled and total > initial
        self.bar = None
        if self.enabled and self.stream.isatty():
            self.bar = tqdm(
                total=total, initial=initial, desc="train", unit="step", file=self.stream
            )
        self.every = max(1, (total - initial) // (LINES if self.bar is None else BAR_LOSSES))

    def shows_loss(self, done: int) -> bool:
        """Whether the update after step ``done`` shows the loss: at every ``every``-th step and the
        last."""
        return self.enabled and (done % self.every == 0 or done == self.total)

    def update(self, loss: float | None, epsilon: float) -> None:
        """After each step; ``loss`` (None where not read) is shown where :meth:`shows_loss` said
        so."""
        self.done += 1
        if not self.enabled:
            return
        if self.bar is not None:
            if loss is not None:
                self.bar.set_postfix(loss=f"{loss:.4g}", epsilon=f"{epsilon:.3g}", refresh=False)
            self.bar.update(1)
        elif loss is not None and self.shows_loss(self.done):
            percent = 100 * self.done / self.total
            print(
                f"train: step {self.done}/{self.total} ({percent:.0f} %), loss {loss:.4g}, "
                f"ε spent {epsilon:.3g}",
                file=self.stream,
                flush=True,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
