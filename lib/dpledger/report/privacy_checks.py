"""The report's checks of the privacy claim itself: whether any evidence contradicts the claimed ε
(the audits' lower bounds, the outputs' σ and sources, the sampler, the budget spent, δ, the Monte
Carlo failure probability, the implementation tests). Collected by
:func:`dpledger.report.checks.find_findings`.
"""

from __future__ import annotations

from typing import Any

from dpledger.report.finding import Finding, exceeds, real
from dpledger.report.formatting import format_lower, format_percent, format_upper, format_value
from dpledger.report.sealed import disagreements
from dpledger.sampling.guard import SamplerCheck, declared_equivalent


def delta_vacuous(metrics: dict[str, dict[str, Any]]) -> Finding | None:
    calibrate = metrics.get("calibrate", {})
    if calibrate.get("delta_at_least_one_over_n") is not True:
        return None
    return Finding(
        kind="delta-vacuous",
        severity="warning",
        title="δ ≥ 1/n",
        message=(
            f"δ = {format_value(calibrate.get('delta'))} is at least 1/n for n = {format_value(calibrate.get('dataset_size'))} examples: "  # noqa: E501
            "a mechanism that publishes one example outright meets it, so the (ε, δ) "
            "claim says little. Use δ < 1/n."
        ),
    )


def audit_contradicted(
    metrics: dict[str, dict[str, Any]], details: dict[str, Any]
) -> Finding | None:
    """Re-derived from the numbers shown: ε_emp above any claimed ε the report shows (the record's,
    calibrate's or the audit's) contradicts it, whatever verdict the audit wrote; only an invalid
    threshold (``max``) gives no bound. An audit that says ``contradicted`` is believed."""
    audit = metrics.get("audit", {})
    record = details.get("calibrate") if isinstance(details.get("calibrate"), dict) else {}
    claims = [
        audit.get("epsilon_claimed"),
        metrics.get("calibrate", {}).get("epsilon"),
        record.get("epsilon"),
    ]
    empirical = audit.get("epsilon_emp")
    exceeded = [float(c) for c in claims if exceeds(empirical, c)]
    claimed = min(exceeded) if exceeded else next((c for c in claims if c is not None), None)
    contradicted = audit.get("verdict") == "contradicted" or (
        audit.get("threshold_valid") is not False and bool(exceeded)
    )
    if not contradicted:
        return None
    confidence = audit.get("confidence")
    at = f" at {format_percent(confidence)} confidence" if confidence is not None else ""
    return Finding(
        kind="audit-contradicted",
        severity="warning",
        title="Audit contradicts the claimed ε",
        message=(
            f"The canary audit found ε_emp ≥ {format_lower(empirical)}{at}, "
            f"above the claimed ε = {format_upper(claimed)}: "
            "this run leaks more than its privacy claim allows."
        ),
    )


def _claims(metrics: dict[str, dict[str, Any]], details: dict[str, Any]) -> list[Any]:
    """Every claimed ε the report shows: the sealed record's, calibrate's and the audit's."""
    record = details.get("calibrate") if isinstance(details.get("calibrate"), dict) else {}
    return [
        metrics.get("audit", {}).get("epsilon_claimed"),
        metrics.get("calibrate", {}).get("epsilon"),
        record.get("epsilon"),
    ]


def lower_bound_contradicts(
    metrics: dict[str, dict[str, Any]], details: dict[str, Any], emp_key: str, verdict_key: str
) -> bool:
    """Re-derived, not read: an audit lower bound above any claimed ε contradicts it whatever
    verdict the metrics file states (an edited ``consistent`` beside ε_emp = 9 against ε ≤ 3); a
    stated ``contradicted`` is believed."""
    audit = metrics.get("audit", {})
    if audit.get(verdict_key) == "contradicted":
        return True
    empirical = audit.get(emp_key)
    return any(exceeds(empirical, claim) for claim in _claims(metrics, details))


def one_run_contradicted(
    metrics: dict[str, dict[str, Any]], details: dict[str, Any]
) -> Finding | None:
    """A warning when the one-run audit's lower bound exceeds the claimed ε."""
    if not lower_bound_contradicts(metrics, details, "epsilon_emp_one_run", "one_run_verdict"):
        return None
    audit = metrics.get("audit", {})
    confidence = audit.get("one_run_confidence")
    at = f" at {format_percent(confidence)} confidence" if confidence is not None else ""
    claimed = min(float(c) for c in _claims(metrics, details) if real(c) is not None)
    return Finding(
        kind="one-run-contradicted",
        severity="warning",
        title="The run's own canaries contradict the claimed ε",
        message=(
            f"{format_value(audit.get('one_run_canaries'))} canaries in this run's noisy sums give ε_emp ≥ {format_lower(audit.get('epsilon_emp_one_run'))}{at} "  # noqa: E501
            f"({audit.get('one_run_method')}), "
            f"above the claimed ε = {format_upper(claimed)}: "
            "this run did not add the noise its ledger claims."
        ),
    )


def dpsgd_contradicted(
    metrics: dict[str, dict[str, Any]], details: dict[str, Any]
) -> Finding | None:
    """A warning when the DP-SGD canary audit (audit.dpsgd) contradicts the claim."""
    if not lower_bound_contradicts(metrics, details, "dpsgd_epsilon_emp", "dpsgd_verdict"):
        return None
    audit = metrics.get("audit", {})
    return Finding(
        kind="dpsgd-contradicted",
        severity="warning",
        title="The DP-SGD audit contradicts the claimed ε",
        message=(
            f"Gradient canaries in real training runs give ε_emp ≥ {format_lower(audit.get('dpsgd_epsilon_emp'))} (verdict {audit.get('dpsgd_verdict', 'unstated')}), above or against the claimed ε: "  # noqa: E501
            "the training code leaks more than its privacy claim allows."
        ),
    )


def sources_disagree(
    metrics: dict[str, dict[str, Any]],
    details: dict[str, Any],
    train_files: dict[str, Any],
    seals: list[str],
) -> Finding | None:
    found = seals + disagreements(metrics, details, train_files)
    if not found:
        return None
    return Finding(
        kind="sources-disagree",
        severity="warning",
        title="The outputs disagree with the sealed record",
        message=(
            "; ".join(found)
            + ". The numbers shown come from files edited or written by different runs: "
            "trust the sealed calibration record and re-run the pipeline from the first stage that disagrees."  # noqa: E501
        ),
    )


def sigma_disagrees(
    metrics: dict[str, dict[str, Any]], details: dict[str, Any], train_files: dict[str, Any]
) -> Finding | None:
    sources = sigma_sources(metrics, details, train_files)
    if len(set(sources.values())) <= 1:
        return None
    stated = ", ".join(f"{source} σ = {format_value(value)}" for source, value in sources.items())
    return Finding(
        kind="sigma-mismatch",
        severity="warning",
        title="σ used ≠ σ claimed",
        message=(
            f"The outputs disagree on the noise multiplier ({stated}): "
            "the claimed ε was proven for one σ and training may have used another. "
            "Re-run the pipeline from calibrate."
        ),
    )


def sigma_sources(
    metrics: dict[str, dict[str, Any]], details: dict[str, Any], train_files: dict[str, Any]
) -> dict[str, float]:
    """The noise multiplier as each output states it: the σ training used (its ledger and metrics),
    the calibration record's and calibrate's metrics'."""
    record = details.get("calibrate") if isinstance(details.get("calibrate"), dict) else {}
    ledger = (
        train_files.get("ledger.json") if isinstance(train_files.get("ledger.json"), dict) else {}
    )
    found = {
        "training ledger": ledger.get("noise_multiplier"),
        "train metrics": metrics.get("train", {}).get("noise_multiplier"),
        "calibration record": record.get("noise_multiplier"),
        "calibrate metrics": metrics.get("calibrate", {}).get("noise_multiplier"),
    }
    return {source: float(value) for source, value in found.items() if real(value) is not None}


def sampler_check(
    metrics: dict[str, dict[str, Any]], details: dict[str, Any]
) -> SamplerCheck | None:
    """The guard's comparison rebuilt from train's metrics (else calibrate's and schedule's), or
    None if unknown.

    A plugin schedule is compared by the ``accounted_as`` it declared, read from the schedule
    header.
    """
    train = metrics.get("train", {})
    accounted = train.get("sampler_accounted", metrics.get("calibrate", {}).get("sampler"))
    used = train.get("sampler_used", metrics.get("schedule", {}).get("sampler"))
    if accounted is None or used is None:
        return None
    header = details.get("schedule") if isinstance(details.get("schedule"), dict) else {}
    sampler_params = (
        header.get("sampler_params") if isinstance(header.get("sampler_params"), dict) else {}
    )
    used_as = (
        declared_equivalent(str(used), sampler_params) if header.get("sampler") == used else None
    )
    return SamplerCheck(
        accounted=str(accounted), used=str(used), allowed_mismatch=True, used_as=used_as
    )


def sampler_mismatch(metrics: dict[str, dict[str, Any]], details: dict[str, Any]) -> Finding | None:
    check = sampler_check(metrics, details)
    flagged = metrics.get("train", {}).get("sampler_mismatch")
    mismatch = flagged if isinstance(flagged, bool) else (check is not None and not check.matches)
    if not mismatch:
        return None
    sentence = check.warning() if check is not None else None
    return Finding(
        kind="sampler-mismatch",
        severity="warning",
        title="Sampler used ≠ sampler accounted",
        message=sentence
        or "Training flagged a sampler mismatch: the claimed epsilon does not describe this run.",
    )


def sampler_declared(metrics: dict[str, dict[str, Any]], details: dict[str, Any]) -> Finding | None:
    check = sampler_check(metrics, details)
    if check is None or not check.matches or check.assumption() is None:
        return None
    return Finding(
        kind="sampler-declared",
        severity="notice",
        title="Sampler equivalence declared, not proven",
        message=str(check.assumption()),
    )


def budget_exceeded(metrics: dict[str, dict[str, Any]]) -> Finding | None:
    calibrate, train = metrics.get("calibrate", {}), metrics.get("train", {})
    problems = []
    if exceeds(train.get("epsilon_spent"), calibrate.get("epsilon")):
        problems.append(
            f"spent ε = {format_upper(train['epsilon_spent'])}, "
            f"more than the claimed ε = {format_upper(calibrate['epsilon'])}"
        )
    if exceeds(train.get("steps_done"), calibrate.get("steps")):
        problems.append(
            f"took {train['steps_done']} steps but the accountant covered {calibrate['steps']}"
        )
    if not problems:
        return None
    return Finding(
        kind="budget-exceeded",
        severity="warning",
        title="Training exceeded the accounted budget",
        message="Training " + "; ".join(problems) + ".",
    )


def verify_failed(metrics: dict[str, dict[str, Any]], details: dict[str, Any]) -> Finding | None:
    verify = metrics.get("verify", {})
    failed_count = real(verify.get("tests_failed")) or 0
    if verify.get("passed") is not False and failed_count <= 0:
        return None
    tests = (
        (details.get("verify") or {}).get("tests")
        if isinstance(details.get("verify"), dict)
        else None
    )
    failed = [t for t in tests or [] if isinstance(t, dict) and t.get("passed") is False]
    count = len(failed) or format_value(verify.get("tests_failed"))
    total = verify.get("tests_run")
    of = f" of {format_value(total)}" if total is not None else ""
    described = "; ".join(
        f"{t.get('name', '?')} (p = {format_value(t.get('p_value'))})"
        + (f": {t['diagnosis']}" if t.get("diagnosis") else "")
        for t in failed
    )
    return Finding(
        kind="verify-failed",
        severity="warning",
        title="An implementation test failed",
        message=(
            f"{count}{of} implementation test(s) failed"
            + (f" — {described}" if described else "")
            + ". The trainer may not clip or noise as the accountant assumes."
        ),
    )


def mc_failure(metrics: dict[str, dict[str, Any]], threshold: float) -> Finding | None:
    probability = metrics.get("calibrate", {}).get("mc_failure_probability")
    if not exceeds(probability, threshold):
        return None
    return Finding(
        kind="mc-failure",
        severity="warning",
        title="Monte Carlo failure probability above threshold",
        message=(
            f"The Monte Carlo accountant's failure probability is {format_value(probability)}, "
            f"above report.mc_failure_warning = {format_value(threshold)}: "
            f"the claimed ε holds only with probability 1 − {format_value(probability)}."
        ),
    )
