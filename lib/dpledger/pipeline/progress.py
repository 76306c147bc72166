"""Training progress on stderr: a tqdm bar with the loss and ε spent on a terminal; elsewhere (DVC, a CI
log, a pipe) one plain line at every tenth of the run, so a long run shows it is alive without flooding."""

from __future__ import annotations

import sys
from typing import TextIO

from tqdm import tqdm

LINES = 10
"""Plain lines per run when stderr is not a terminal (plus one at the end)."""


class Progress:
    """Steps ``initial..total`` of a run; ``update`` after each step with its loss and the ε spent so far."""

    def __init__(self, total: int, initial: int, *, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.total, self.done = total, initial
        self.enabled = enabled and total > initial
        self.every = max(1, (total - initial) // LINES)
        self.bar = None
        if self.enabled and self.stream.isatty():
            self.bar = tqdm(total=total, initial=initial, desc="train", unit="step", file=self.stream)

    def update(self, loss: float, epsilon: float) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.4g}", epsilon=f"{epsilon:.3g}", refresh=False)
            self.bar.update(1)
        elif self.done % self.every == 0 or self.done == self.total:
            percent = 100 * self.done / self.total
            print(
                f"train: step {self.done}/{self.total} ({percent:.0f} %), loss {loss:.4g}, ε spent {epsilon:.3g}",
                file=self.stream,
                flush=True,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
