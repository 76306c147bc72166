"""Verify, don't trust, what train and audit read: the calibration record and the schedule.

- The claim is recomputed for the description the record carries (σ, sampler, sizes, mechanism) with
  the record's own accountant (and its settings, from the record's result details) wherever that
  accountant is deterministic — every accountant but Monte Carlo, so a new deterministic one is
  checked without change here — and a record whose ε does not follow from its σ is refused (e.g. σ
  hand-edited from 1.244 to 0.3).
- A Monte Carlo claim cannot be recomputed cheaply (its Estimate-Verify-Release draws millions of
  samples), so calibrate seals the record: ``seal.json`` holds the SHA-256 of the record as
  verified, and a record that no longer matches it (σ, mechanism, or anything else edited) is
  refused.
- The schedule's header carries the SHA-256 of its index arrays and of its own fields
  (``Schedule.digest``); an edited ``schedule.npz`` (e.g. example 0 put in every batch) or a
  relabelled sampler, seed or size in ``schedule.json`` (e.g. shuffle renamed poisson) no longer
  matches and is refused.

Threat model: an honest but mistaken user, or artifacts pulled from a shared DVC remote — a
deliberate forger can recompute a digest; the recomputation of a deterministic claim cannot be
fooled that way.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from dpledger import io
from dpledger.accounting import accountant_of, get_accountant
from dpledger.accounting.record import CalibrationRecord
from dpledger.errors import DpledgerError
from dpledger.sampling.schedule import DIGEST_KEY, Schedule

SEAL = "seal.json"
RELATIVE_TOLERANCE = 1e-6


def record_digest(record: CalibrationRecord) -> str:
    """SHA-256 of the record's canonical JSON (keys sorted): any edited field changes it."""
    return hashlib.sha256(
        json.dumps(record.to_dict(), sort_keys=True, default=str).encode()
    ).hexdigest()


def seal_record(folder: Path, record: CalibrationRecord) -> None:
    """Write ``calibration.json`` and its seal into ``folder`` (the calibrate stage's output)."""
    record.save(folder / "calibration.json")
    io.write_json(folder / SEAL, {"record_sha256": record_digest(record)})


def load_record(path: Path, stage: str) -> CalibrationRecord:
    """The record at ``path``, or one line naming the file when it is missing or malformed."""
    if not path.exists():
        raise DpledgerError(f"{stage}: {path} is missing; run the calibrate stage first")
    with io.reading_artifact(path, "calibrate"):
        return CalibrationRecord.from_dict(io.read_json(path))


def verified_record(path: Path, stage: str) -> CalibrationRecord:
    """The record at ``path``, refused with one line unless its seal matches and (deterministic
    accountant) its claimed ε is what its accountant gives at its σ."""
    record = load_record(path, stage)
    check_seal(path.parent / SEAL, record, stage)
    reproduce_claim(record, stage)
    return record


def check_seal(seal: Path, record: CalibrationRecord, stage: str) -> None:
    """Refuse a record that differs from the one calibrate verified and sealed."""
    try:
        expected = io.read_json(seal)["record_sha256"]
    except (OSError, ValueError, TypeError, KeyError):
        raise DpledgerError(
            f"{stage}: {seal} is missing or unreadable, "
            "so the calibration record cannot be checked; re-run the calibrate stage"
        ) from None
    if expected != record_digest(record):
        raise DpledgerError(
            f"{stage}: "
            f"{seal.parent / 'calibration.json'} differs from the record calibrate verified "
            "(edited σ, mechanism or claim?); re-run the calibrate stage"
        )


def reproduce_claim(record: CalibrationRecord, stage: str) -> float | None:
    """ε of the record's accountant at the record's σ and sampler description, or None for Monte
    Carlo (checked by the seal); refuses, with one line, a record whose claimed ε differs."""
    chosen = next((r for r in record.accountants if r.accountant == record.accountant), None)
    accountant = accountant_of(chosen) if chosen else get_accountant(record.accountant)
    if not accountant.deterministic:
        return None
    try:
        epsilon = accountant.epsilon(record.description, record.delta).epsilon
    except DpledgerError as error:
        raise DpledgerError(
            f"{stage}: the calibration record cannot be re-accounted ({error}); "
            "re-run the calibrate stage"
        ) from None
    if not math.isclose(epsilon, record.epsilon, rel_tol=RELATIVE_TOLERANCE):
        raise DpledgerError(
            f"{stage}: "
            f"calibration.json claims ε = {record.epsilon:.6g} at σ = {record.noise_multiplier:.6g}, "  # noqa: E501
            f"but the {record.accountant} accountant gives ε = {epsilon:.6g} for that σ and sampler; "  # noqa: E501
            "the record was edited or comes from other code — re-run the calibrate stage"
        )
    return epsilon


def verified_schedule(folder: Path, stage: str) -> Schedule:
    """The schedule in ``folder``, refused with one line when unreadable or when its arrays do not
    match the digest its header recorded."""
    if not (folder / "schedule.json").exists():
        raise DpledgerError(
            f"{stage}: {folder / 'schedule.json'} is missing; run the schedule stage first"
        )
    with io.reading_artifact(folder, "schedule"):
        schedule = Schedule.load(folder)
    if schedule.metadata.get(DIGEST_KEY) != schedule.digest():
        raise DpledgerError(
            f"{stage}: {folder / 'schedule.npz'} does not match the digest in schedule.json "
            "(edited batches, "
            "sampler, seed or sizes?); re-run the schedule stage"
        )
    return schedule
