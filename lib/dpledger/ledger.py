"""Checkpoints that carry the privacy ledger, so a killed run resumes and never spends privacy
twice.

A checkpoint is two files: the weights ``checkpoint-step<N>.pt`` (model, optimizer and learning-rate
schedule state and the run's secret noise key only: tensors, numbers and strings, read with
``torch.load(weights_only=True)``, so no code in it can run) and the ledger ``checkpoint.json``
beside it: logical steps taken = the schedule position reached (the noise of step t is a function of
(key, t), so no RNG state beyond the key), the per-step history, a fingerprint of every input, and
the name and SHA-256 of its weights file. The key is in the weights file only, never in a JSON
file: the folder is git-ignored and not pushed (``pipeline/noise_key.py``). Each save writes the new
weights file first, then atomically replaces the ledger to name it, then deletes the previous
weights file; a kill at any moment therefore leaves a ledger that names an intact weights file, and
the rerun resumes from the last completed checkpoint. Only a ledger whose fingerprint matches the
current inputs and whose digest matches its weights file leads to that file being read at all. The
weights file also holds the ledger it was saved with: a ledger that differs from it (e.g.
``steps_done`` rewound from 230 to 100 while still naming ``checkpoint-step230.pt``, which would run
130 noisy steps twice and spend their privacy again) is refused with one line, never resumed. A
changed input (config, calibration, schedule, data, code) restarts training from step 0; so does a
ledger that cannot be read or does not match its weights file (a damaged or edited file), saying
why.

This module sits below the engine and the pipeline: the engine is a library without it, and the
train stage, the publisher and the model card read the :class:`Ledger`.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import re
import shutil
import sys
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.optim.lr_scheduler import LRScheduler

from dpledger import io
from dpledger.errors import DpledgerError

PUBLIC_KEY_WARNING = "no privacy guarantee against anyone who has this repository"
"""What a run whose noise key is derivable from tracked files is warned with (train stage, report,
model card)."""


@dataclass(frozen=True)
class Ledger:
    """Privacy bookkeeping of a run: logical steps taken out of the schedule's, ε spent so far, the
    σ used, how many examples were dropped for a non-finite gradient norm, and the engine's
    self-check."""

    steps_done: int
    total_steps: int
    epsilon_spent: float
    delta: float
    noise_multiplier: float
    fingerprint: str
    history: dict[str, list[float]] = field(default_factory=dict)
    nonfinite_examples: int = 0
    self_check: dict[str, Any] = field(default_factory=dict)
    """The engine's self-check of the run (``SelfCheckResult.to_dict``); empty if it did not run."""
    noise_key_source: str = ""
    """Where the noise key came from, in words (never the key)."""
    noise_key_public: bool = False
    """The key is derivable from tracked files: no privacy guarantee against anyone who has them."""
    threads: int = 0
    """The intra-op thread count the steps ran at (CPU reductions and MKL's matrix products round
    differently at another count, so a resumed run takes this one back); 0: not recorded."""

    @property
    def schedule_position(self) -> int:
        """The next schedule step to run (logical steps and schedule steps coincide)."""
        return self.steps_done


def fingerprint(*parts: Any) -> str:
    """SHA-256 of JSON-serialisable parts, the bytes of any files (Path) and the contents of any
    arrays among them."""
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


def _weights_name(ledger_file: Path, steps_done: int) -> str:
    return f"{ledger_file.stem}-step{steps_done}.pt"


def _is_weights_name(ledger_file: Path, name: str) -> bool:
    return re.fullmatch(rf"{re.escape(ledger_file.stem)}-step\d+\.pt", name) is not None


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save_checkpoint(
    ledger_file: Path,
    ledger: Ledger,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler | None = None,
    *,
    noise_key: str | None = None,
) -> None:
    """Write this step's weights file (with the secret ``noise_key``, hexadecimal, if given), then
    the ledger naming it (each atomically), then delete older weights files: the ledger on disk
    always names an intact weights file."""
    weights = ledger_file.with_name(_weights_name(ledger_file, ledger.steps_done))
    with io.atomic_path(weights) as tmp:
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "ledger": _sealed(ledger),
        }
        state["scheduler"] = scheduler.state_dict() if scheduler is not None else None
        state["noise_key"] = noise_key
        torch.save(state, tmp)
    record = {
        **asdict(ledger),
        "weights_file": weights.name,
        "weights_sha256": _file_digest(weights),
    }
    io.write_json(ledger_file, record)
    for old in ledger_file.parent.iterdir():
        if old != weights and _is_weights_name(ledger_file, old.name):
            old.unlink()


def _sealed(ledger: Ledger) -> str:
    """The ledger as canonical JSON (NaN losses included), as stored in its weights file."""
    return json.dumps(
        json.loads(json.dumps(asdict(ledger), default=io.json_default)), sort_keys=True
    )


def _check_bound(path: Path, ledger_file: Path, ledger: Ledger, state: dict[str, Any]) -> None:
    """Refuse a ledger that is not the one its weights file was saved with (naming the first
    differing field)."""
    try:
        saved = json.loads(state["ledger"])
    except (KeyError, TypeError, ValueError):
        saved = None
    if isinstance(saved, dict) and json.dumps(saved, sort_keys=True) == _sealed(ledger):
        return
    ours = asdict(ledger)
    field_name = next(
        (k for k in ours if not isinstance(saved, dict) or saved.get(k) != ours[k]), "ledger"
    )
    was = (
        saved.get(field_name)
        if isinstance(saved, dict) and field_name != "history"
        else "another value"
    )
    raise DpledgerError(
        "train: "
        f"{ledger_file} says {field_name} = {str(ours[field_name])[:40]} but {path.name} was saved with {field_name} = {str(was)[:40]} "  # noqa: E501
        "(an edited ledger; resuming would spend privacy twice); "
        f"delete {path.parent} to start over from step 0"
    )


def _starting_over(why: str) -> None:
    print(f"train: {why}; starting over from step 0", file=sys.stderr)


def load_checkpoint(ledger_file: Path, expected_fingerprint: str) -> dict[str, Any] | None:
    """The saved state (ledger, model, optimizer, scheduler, noise_key) if a checkpoint exists, was
    made from the same inputs and is intact, else None (start over).

    The weights file is read (weights-only) only after the ledger's fingerprint and the file's
    digest match.
    """
    if not ledger_file.exists():
        return None
    try:
        raw = io.read_json(ledger_file)
        weights_name, weights_sha256 = raw.pop("weights_file"), raw.pop("weights_sha256")
        ledger = Ledger(**raw)
        if not isinstance(weights_name, str) or not _is_weights_name(ledger_file, weights_name):
            raise ValueError(weights_name)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:
        _starting_over(
            f"the checkpoint ledger {ledger_file} cannot be read ({type(error).__name__})"
        )
        return None
    if ledger.fingerprint != expected_fingerprint:
        return None
    path = ledger_file.with_name(weights_name)
    if not path.exists() or _file_digest(path) != weights_sha256:
        _starting_over(f"{path} is missing or does not match its ledger (a damaged or edited file)")
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
        raise DpledgerError(
            f"train: {path} cannot be loaded "
            f"({(str(error).splitlines() or [type(error).__name__])[0][:120]}); "
            f"delete {path.parent} to start over from step 0"
        ) from None
    if not isinstance(state, dict) or not {"model", "optimizer"} <= state.keys():
        raise DpledgerError(
            f"train: {path} is not a checkpoint; delete {path.parent} to start over from step 0"
        )
    _check_bound(path, ledger_file, ledger, state)
    parts = ("model", "optimizer", "scheduler", "noise_key")
    return {"ledger": ledger, **{part: state.get(part) for part in parts}}


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Delete what an interrupted atomic write left in ``folder`` (``.name.XXXX.tmp`` files and
    ``.name.XXXX`` folders), so DVC never caches them as outputs; returns what was removed."""
    if not folder.is_dir():
        return []
    stale = [
        p for p in folder.iterdir() if p.name.startswith(".") and (p.suffix == ".tmp" or p.is_dir())
    ]
    for item in stale:
        shutil.rmtree(item) if item.is_dir() else item.unlink()
    return stale
