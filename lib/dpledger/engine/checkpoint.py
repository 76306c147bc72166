"""Checkpoints that carry the privacy ledger, so a killed run resumes and never spends privacy twice.

A checkpoint holds the model and optimizer state, the ledger (logical steps taken = the schedule
position reached; the noise of step t is a function of (seed, t), so no RNG state beyond it), the
per-step history, and a fingerprint of every input. A checkpoint whose fingerprint differs (a changed
config, calibration or schedule) is ignored and training restarts from step 0.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from dpledger import io


@dataclass(frozen=True)
class Ledger:
    """Privacy bookkeeping of a run: logical steps taken out of the schedule's, and ε spent so far."""

    steps_done: int
    total_steps: int
    epsilon_spent: float
    delta: float
    noise_multiplier: float
    fingerprint: str
    history: dict[str, list[float]] = field(default_factory=dict)

    @property
    def schedule_position(self) -> int:
        """The next schedule step to run (logical steps and schedule steps coincide)."""
        return self.steps_done


def fingerprint(*parts: Any) -> str:
    """SHA-256 of JSON-serialisable parts and the bytes of any files (Path) among them."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            digest.update(part.name.encode())
            digest.update(part.read_bytes())
        else:
            digest.update(json.dumps(part, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def save_checkpoint(path: Path, ledger: Ledger, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Write model, optimizer and ledger in one file, atomically (a kill leaves the previous one intact)."""
    state = {"ledger": asdict(ledger), "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    with io.atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: Path, expected_fingerprint: str) -> dict[str, Any] | None:
    """The saved state if ``path`` exists and was made from the same inputs, else None (start over)."""
    if not path.exists():
        return None
    state = torch.load(path, map_location="cpu", weights_only=False)
    ledger = Ledger(**state["ledger"])
    if ledger.fingerprint != expected_fingerprint:
        return None
    return {"ledger": ledger, "model": state["model"], "optimizer": state["optimizer"]}
