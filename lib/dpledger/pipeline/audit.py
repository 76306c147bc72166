"""Stage ``audit``: audit the batched Gaussian mechanism with the sampler actually used, at the
calibrated σ, and judge the ledger's claim (optionally also DP-SGD with gradient canaries)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from dpledger import io, paths
from dpledger.accounting.record import CalibrationRecord
from dpledger.audit import plots
from dpledger.audit.bgm import BgmAudit, audit_bgm
from dpledger.audit.estimate import AuditStatistics
from dpledger.audit.one_run import audit_run
from dpledger.audit.result import AuditResult, Claim, epsilon_versus_observations, tradeoff_points
from dpledger.audit.simulate import GameScores
from dpledger.params import Params
from dpledger.sampling.guard import check_schedule
from dpledger.sampling.registry import options_for
from dpledger.sampling.schedule import Schedule
from dpledger.seals import verified_record, verified_schedule


def _inputs(root: Path) -> tuple[CalibrationRecord, Schedule]:
    """The calibration record and the schedule, each verified (see ``dpledger.seals``)."""
    record = verified_record(root / paths.CALIBRATION, "audit")
    return record, verified_schedule(root / paths.SCHEDULE_DIR, "audit")


def run(params: Params, root: Path) -> dict[str, Any]:
    """Compute the audit and write artifacts/audit/, metrics/audit.json and plots/audit/."""
    audit = params.audit
    record, schedule = _inputs(root)
    check = check_schedule(record.description, schedule, allow_mismatch=True)
    ledger = f"ledger: {record.accountant} accountant assuming '{record.sampler}' sampling"
    statistics = AuditStatistics(audit.confidence, audit.threshold, audit.split_fraction)
    mechanism = _mechanism(params, record, schedule, ledger, statistics)
    result, scores = audit_bgm(mechanism)
    correlated = (
        []
        if record.mechanism == "identity"
        else [
            f"The ledger's mechanism is '{record.mechanism}' (correlated noise); "
            "this audit models independent noise per step."
        ]
    )
    assumptions = list(result.assumptions) + correlated
    measured = epsilon_versus_observations(scores, record.delta, statistics)
    details: dict[str, Any] = {
        **result.to_dict(),
        "assumptions": assumptions,
        "sampler_accounted": record.sampler,
        "sampler_used": schedule.sampler,
        "sampler_warning": check.warning(),
        "epsilon_vs_observations": measured,
    }
    metrics = {
        **_flat(result.summary()),
        "sampler_accounted": record.sampler,
        "sampler_mismatch": not check.matches,
    }
    if audit.dpsgd:
        dpsgd = _audit_dpsgd(params, mechanism)
        details["dpsgd"] = {**dpsgd.to_dict(), "assumptions": list(dpsgd.assumptions) + correlated}
        metrics.update(
            {
                f"dpsgd_{key}": value
                for key, value in _flat(dpsgd.summary()).items()
                if key != "sampler"
            }
        )
    run_metrics, run_details = audit_run(
        audit.one_run,
        schedule,
        root / paths.TRAIN_DIR,
        noise_multiplier=record.noise_multiplier,
        epsilon=record.epsilon,
        delta=record.delta,
        correlated=record.mechanism != "identity",
        secure=params.train.secure_noise,
    )
    metrics.update(run_metrics)
    details.update(run_details)
    _write_plots(root, schedule, record, result, scores, measured, audit.confidence)
    io.write_json(root / paths.AUDIT, details)
    io.write_json(root / paths.metrics("audit"), metrics)
    return metrics


def _mechanism(
    params: Params,
    record: CalibrationRecord,
    schedule: Schedule,
    ledger: str,
    statistics: AuditStatistics,
) -> BgmAudit:
    """The audited mechanism: the ledger's σ, sizes and claim with the sampler used, at
    ``audit.observations`` games, or ``audit.pattern_observations`` where the sampler's own pattern
    is simulated (rounded down to an even count)."""
    audit = params.audit
    mechanism = BgmAudit(
        schedule.sampler,
        dataset_size=schedule.dataset_size,
        batch_size=record.batch_size,
        epochs=record.epochs,
        noise_multiplier=record.noise_multiplier,
        observations=audit.observations,
        delta=record.delta,
        statistics=statistics,
        claim=Claim(record.epsilon, record.delta, ledger),
        options=options_for(schedule.sampler, **schedule.sampler_params),
        seed=params.seed,
        backend=audit.backend,
    )
    observations = (
        audit.pattern_observations
        if mechanism.audited().simulated_by_sampler
        else audit.observations
    )
    return replace(mechanism, observations=observations - observations % 2)


def _write_plots(
    root: Path,
    schedule: Schedule,
    record: CalibrationRecord,
    result: AuditResult,
    scores: GameScores,
    measured: list[tuple[int, float]],
    confidence: float,
) -> None:
    """plots/audit/: the trade-off curve against the claim and ε_emp against the observations."""
    with io.atomic_dir(root / paths.plots("audit")) as folder:
        title = f"BGM audit, sampler '{schedule.sampler}', N = {result.observations:,}"
        plots.write_tradeoff(
            folder,
            tradeoff_points(scores, confidence),
            epsilon_claimed=record.epsilon,
            epsilon_emp=result.estimate.epsilon,
            delta=record.delta,
            title=title,
        )
        plots.write_epsilon_vs_observations(
            folder, measured, result.judgement.projection, epsilon_claimed=record.epsilon
        )


def _audit_dpsgd(params: Params, mechanism: BgmAudit) -> Any:
    """The DP-SGD canary audit of the stage's ``mechanism`` (the ledger's σ, sizes, claim and the
    sampler used) with ``audit.dpsgd_observations`` training runs, on the MLP and digits
    (``audit.dpsgd_model: digits``) or on the train stage's model, loss and data (``train``: its
    clip norm and learning rate, SGD)."""
    from dpledger.audit.dpsgd import DpsgdAudit, audit_dpsgd, train_workload

    audit = params.audit
    config = DpsgdAudit(
        replace(mechanism, observations=audit.dpsgd_observations),
        threat_model=audit.dpsgd_threat_model,
    )
    if audit.dpsgd_model == "digits":
        return audit_dpsgd(config)
    config = replace(config, clip_norm=params.train.clip_norm, lr=params.train.lr)
    return audit_dpsgd(config, train_workload(params.data, params.train, params.seed))


def _flat(summary: dict[str, Any]) -> dict[str, Any]:
    """Scalars only (``dvc metrics diff``): an unknown N needed is written as -1."""
    return {key: (-1 if value is None else value) for key, value in summary.items()}
