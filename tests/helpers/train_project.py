"""Fixtures for the train-stage tests: a project folder with a calibration record and a schedule (no
tests here).

The record and schedule are built directly from their contracts (not by the calibrate/schedule
stages), so these tests exercise the train stage alone; the record's ε is the PLD accountant's at
its σ and the record is sealed, as the train stage checks both.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from dpledger.accounting import describe, get_accountant
from dpledger.accounting.record import CalibrationRecord
from dpledger.sampling.schedule import Schedule
from dpledger.seals import seal_record

TRAIN_SIZE = 1438  # the default digits split


def poisson_schedule(
    dataset_size: int, batch_size: int, epochs: int, seed: int, sampler: str = "poisson"
) -> Schedule:
    rng = np.random.default_rng(seed)
    steps_per_epoch = int(round(dataset_size / batch_size))
    batches = [
        np.flatnonzero(rng.random(dataset_size) < batch_size / dataset_size)
        for _ in range(steps_per_epoch * epochs)
    ]
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in batches])])
    indices = np.concatenate(batches)
    return Schedule(
        indices=indices,
        offsets=offsets,
        padding=np.zeros(len(indices), bool),
        sampler=sampler,
        sampler_params={"batch_size": batch_size, "epochs": epochs},
        seed=seed,
        dataset_size=dataset_size,
        steps_per_epoch=steps_per_epoch,
    )


def genuine_record(
    *,
    noise_multiplier: float,
    sampler: str,
    steps: int,
    batch_size: int,
    dataset_size: int,
    epochs: int,
    mechanism: str = "identity",
    mechanism_params: dict | None = None,
    delta: float = 1e-5,
) -> CalibrationRecord:
    """A record whose ε is what its accountant gives at its σ (train and audit recompute it): PLD
    where it applies, else Monte Carlo's claim is left at 3.0 (the seal, not a recomputation,
    protects it)."""
    accountant = (
        "pld" if sampler in ("poisson", "fixed") and mechanism == "identity" else "montecarlo"
    )
    description = describe(
        sampler=sampler,
        dataset_size=dataset_size,
        batch_size=batch_size,
        epochs=epochs,
        mechanism=mechanism,
        mechanism_params=mechanism_params,
    )
    description = description.with_steps(steps).with_noise(noise_multiplier)
    epsilon = (
        get_accountant("pld").epsilon(description, delta).epsilon if accountant == "pld" else 3.0
    )
    curve = [(s, epsilon * (s / steps) ** 0.5) for s in range(10, steps, 10)] + [(steps, epsilon)]
    return CalibrationRecord(
        description=description,
        epsilon=epsilon,
        delta=delta,
        accountant=accountant,
        assumptions=["fixture"],
        epsilon_curve=curve,
    )


def make_project(
    root: Path,
    *,
    train: dict | None = None,
    epochs: int = 2,
    batch_size: int = 64,
    noise_multiplier: float = 1.0,
    sampler: str = "poisson",
    accounted: str = "poisson",
    schedule: Schedule | None = None,
    mechanism: str = "identity",
    mechanism_params: dict | None = None,
) -> Path:
    """Write params.yaml, artifacts/calibration/calibration.json and artifacts/schedule/ under
    ``root``."""
    schedule = schedule or poisson_schedule(TRAIN_SIZE, batch_size, epochs, seed=7, sampler=sampler)
    record = genuine_record(
        noise_multiplier=noise_multiplier,
        sampler=accounted,
        steps=schedule.num_steps,
        batch_size=batch_size,
        dataset_size=TRAIN_SIZE,
        epochs=epochs,
        mechanism=mechanism,
        mechanism_params=mechanism_params or {},
    )
    folder = root / "artifacts/calibration"
    folder.mkdir(parents=True, exist_ok=True)
    seal_record(folder, record)
    schedule.save(root / "artifacts/schedule")
    params = yaml.safe_load((Path(__file__).resolve().parents[2] / "params.yaml").read_text())
    params["batching"] = {"batch_size": batch_size, "epochs": epochs}
    params["train"] = {**params["train"], **(train or {})}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return root / "params.yaml"
