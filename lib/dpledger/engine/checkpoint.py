"""Checkpoints that carry the privacy ledger, so a killed run resumes and never spends privacy twice.

A checkpoint is two files: ``checkpoint.pt`` (model and optimizer state only: tensors, numbers and strings,
read with ``torch.load(weights_only=True)``, so no code in it can run) and ``checkpoint.json`` beside it,
written after it: the ledger (logical steps taken = the schedule position reached; the noise of step t is
a function of (seed, t), so no RNG state beyond it), the per-step history, a fingerprint of every input
and the SHA-256 of ``checkpoint.pt``. Only a ledger whose fingerprint matches the current inputs and whose
digest matches the weights file leads to ``checkpoint.pt`` being read at all. A changed input (config,
calibration, schedule, data, code) restarts training from step 0; so does a ledger that cannot be read
or does not match its weights file (a kill between the two writes, a truncated file), saying why.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import sys
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpledger import io
from dpledger.errors import DpledgerError


@dataclass(frozen=True)
class Ledger:
    """Privacy bookkeeping of a run: logical steps taken out of the schedule's, ε spent so far, the σ used,
    and how many examples were dropped for a non-finite gradient norm."""

    steps_done: int
    total_steps: int
    epsilon_spent: float
    delta: float
    noise_multiplier: float
    fingerprint: str
    history: dict[str, list[float]] = field(default_factory=dict)
    nonfinite_examples: int = 0

    @property
    def schedule_position(self) -> int:
        """The next schedule step to run (logical steps and schedule steps coincide)."""
        return self.steps_done


def fingerprint(*parts: Any) -> str:
    """SHA-256 of JSON-serialisable parts, the bytes of any files (Path) and the contents of any arrays among them."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            digest.update(part.name.encode())
            digest.update(part.read_bytes())
        elif isinstance(part, np.ndarray):
            digest.update(f"{part.dtype.str}{part.shape}".encode())
            digest.update(np.ascontiguousarray(part).tobytes())
        else:
            digest.update(json.dumps(part, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def ledger_path(path: Path) -> Path:
    """The JSON ledger beside the weights file ``path``."""
    return path.with_suffix(".json")


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save_checkpoint(path: Path, ledger: Ledger, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Write the weights, then the ledger naming their digest, each atomically (a kill leaves a pair that
    either matches or is recognised as not matching)."""
    with io.atomic_path(path) as tmp:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp)
    io.write_json(ledger_path(path), {**asdict(ledger), "weights_sha256": _file_digest(path)})


def _starting_over(why: str) -> None:
    print(f"train: {why}; starting over from step 0", file=sys.stderr)


def load_checkpoint(path: Path, expected_fingerprint: str) -> dict[str, Any] | None:
    """The saved state if a checkpoint exists, was made from the same inputs and is intact, else None (start over).

    The weights file is read (weights-only) only after the ledger's fingerprint and the file's digest match.
    """
    ledger_file = ledger_path(path)
    if not path.exists() and not ledger_file.exists():
        return None
    try:
        raw = io.read_json(ledger_file)
        weights_sha256 = raw.pop("weights_sha256")
        ledger = Ledger(**raw)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:
        _starting_over(f"the checkpoint ledger {ledger_file} cannot be read ({type(error).__name__})")
        return None
    if ledger.fingerprint != expected_fingerprint:
        return None
    if not path.exists() or _file_digest(path) != weights_sha256:
        _starting_over(f"{path} is missing or does not match its ledger (an interrupted or damaged write)")
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
        raise DpledgerError(
            f"train: {path} cannot be loaded ({(str(error).splitlines() or [type(error).__name__])[0][:120]}); "
            f"delete {path.parent} to start over from step 0"
        ) from None
    return {"ledger": ledger, "model": state["model"], "optimizer": state["optimizer"]}


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Delete what an interrupted atomic write left in ``folder`` (``.name.XXXX.tmp`` files and ``.name.XXXX``
    folders), so DVC never caches them as outputs; returns what was removed."""
    if not folder.is_dir():
        return []
    stale = [p for p in folder.iterdir() if p.name.startswith(".") and (p.suffix == ".tmp" or p.is_dir())]
    for item in stale:
        shutil.rmtree(item) if item.is_dir() else item.unlink()
    return stale
