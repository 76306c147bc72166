"""The findings shown at the very top of the report: anything that makes the claimed epsilon
untrustworthy.

Every check reads only the flat metrics (plus, where present, the detail JSONs for a better
sentence), so the same checks run on an old revision's metrics in ``dpledger report --compare``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from dpledger.report.formatting import format_lower, format_percent, format_upper, format_value
from dpledger.report.inputs import UPSTREAM_STAGES
from dpledger.report.sealed import disagreements
from dpledger.report.self_check import self_check_findings as engine_findings
from dpledger.sampling.guard import SamplerCheck, declared_equivalent

_RELATIVE_SLACK = 1e-9
UTILITY_SIGNIFICANCE = 0.01
"""A test accuracy counts as above its majority baseline only when a model right at the baseline's
rate would score at least as well with probability below this (one-sided exact binomial test): a run
at chance then clears it about once in a hundred runs, and never while it predicts a single
class."""


@dataclass(frozen=True)
class Finding:
    """A warning (the claim may be wrong) or a notice (evidence is missing or weak)."""

    kind: str
    severity: Literal["warning", "notice"]
    title: str
    message: str


def find_findings(
    metrics: dict[str, dict[str, Any]],
    *,
    mc_failure_warning: float,
    details: dict[str, Any] | None = None,
    status: dict[str, str] | None = None,
    train_files: dict[str, Any] | None = None,
    seals: list[str] | None = None,
) -> list[Finding]:
    """All findings, warnings first (most serious first), then notices. ``seals`` lists the sealed
    inputs that no longer match their seal (``report.sealed.seal_problems``)."""
    details = details or {}
    train_files = train_files or {}
    status = status or {
        stage: ("ok" if metrics.get(stage) else "not run") for stage in UPSTREAM_STAGES
    }
    warnings = [
        _delta_vacuous(metrics),
        _audit_contradicted(metrics, details),
        _sources_disagree(metrics, details, train_files, seals or []),
        _one_run_contradicted(metrics, details),
        _dpsgd_contradicted(metrics, details),
        _sigma_disagrees(metrics, details, train_files),
        _sampler_mismatch(metrics, details),
        _budget_exceeded(metrics),
        _verify_failed(metrics, details),
        _mc_failure(metrics, mc_failure_warning),
        _nonfinite_examples(metrics, train_files),
        _loss_diverged(metrics),
        *(Finding(kind, "warning", title, say) for kind, title, say in engine_findings(metrics)),
        _learned_nothing(metrics),
    ]
    notices = [
        _utility_unchecked(metrics),
        _stages_missing(status),
        _audit_inconclusive(metrics),
        _sampler_declared(metrics, details),
        _metrics_not_flat(metrics),
    ]
    return [finding for finding in warnings + notices if finding is not None]


def _real(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _exceeds(value: Any, limit: Any) -> bool:
    value, limit = _real(value), _real(limit)
    return value is not None and limit is not None and value > limit * (1 + _RELATIVE_SLACK)


def _audit_contradicted(
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
    exceeded = [float(c) for c in claims if _exceeds(empirical, c)]
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
    return any(_exceeds(empirical, claim) for claim in _claims(metrics, details))


def _one_run_contradicted(
    metrics: dict[str, dict[str, Any]], details: dict[str, Any]
) -> Finding | None:
    """A warning when the one-run audit's lower bound exceeds the claimed ε."""
    if not lower_bound_contradicts(metrics, details, "epsilon_emp_one_run", "one_run_verdict"):
        return None
    audit = metrics.get("audit", {})
    confidence = audit.get("one_run_confidence")
    at = f" at {format_percent(confidence)} confidence" if confidence is not None else ""
    claimed = min(float(c) for c in _claims(metrics, details) if _real(c) is not None)
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


def _dpsgd_contradicted(
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


def _sampler_mismatch(
    metrics: dict[str, dict[str, Any]], details: dict[str, Any]
) -> Finding | None:
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
    return {source: float(value) for source, value in found.items() if _real(value) is not None}


def _sources_disagree(
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


def _sigma_disagrees(
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


def _nonfinite_examples(
    metrics: dict[str, dict[str, Any]], train_files: dict[str, Any]
) -> Finding | None:
    ledger = (
        train_files.get("ledger.json") if isinstance(train_files.get("ledger.json"), dict) else {}
    )
    count = _real(
        metrics.get("train", {}).get("nonfinite_examples", ledger.get("nonfinite_examples"))
    )
    if not count:
        return None
    return Finding(
        kind="nonfinite-examples",
        severity="warning",
        title="Examples dropped for a non-finite gradient",
        message=(
            f"{format_value(int(count))} example-step(s) "
            "had a NaN or infinite gradient norm and contributed nothing (clip factor 0; "
            "the privacy claim still holds). Check the data for NaN/inf values."
        ),
    )


def _loss_diverged(metrics: dict[str, dict[str, Any]]) -> Finding | None:
    train = metrics.get("train", {})
    losses = [train.get(key) for key in ("final_train_loss", "test_loss")]
    if train.get("loss_diverged") is not True and all(
        v is None or _real(v) is None or math.isfinite(v) for v in losses
    ):
        return None
    return Finding(
        kind="loss-diverged",
        severity="warning",
        title="Training loss is not finite",
        message=(
            "A training or test loss is NaN or infinite: "
            "the model diverged or the data holds non-finite values. "
            "Its accuracy numbers mean little."
        ),
    )


def _learned_nothing(metrics: dict[str, dict[str, Any]]) -> Finding | None:
    """Classification no better than its majority baseline or predicting one class; a language model
    no better than the unigram perplexity of its training tokens."""
    train = metrics.get("train", {})
    accuracy, baseline = _real(train.get("test_accuracy")), _real(train.get("baseline_accuracy"))
    perplexity, unigram = (
        _real(train.get("test_perplexity")),
        _real(train.get("baseline_perplexity_unigram")),
    )
    if accuracy is not None and baseline is not None:
        p_value = _real(train.get("above_baseline_p_value"))
        one_class = train.get("predicted_classes") == 1
        if not (
            one_class
            or accuracy <= baseline
            or (p_value is not None and p_value >= UTILITY_SIGNIFICANCE)
        ):
            return None
        found = (
            f"test accuracy {format_percent(accuracy)} against {format_percent(baseline)} for the best constant guess "  # noqa: E501
            "(always the test split's majority class)"
            + (f", binomial p = {format_value(p_value)}" if p_value is not None else "")
            + ("; it predicts a single class for every test example" if one_class else "")
        )
    elif perplexity is not None and unigram is not None:
        if math.isfinite(perplexity) and perplexity < unigram:
            return None
        found = (
            f"test perplexity {format_value(perplexity)} is no better than {format_value(unigram)}, "  # noqa: E501
            "the perplexity of the training split's token frequencies alone (uniform: "
            f"{format_value(train.get('baseline_perplexity_uniform'))})"
        )
    else:
        return None
    return Finding(
        kind="learned-nothing",
        severity="warning",
        title="The model learned nothing",
        message=f"{found[0].upper()}{found[1:]}. {_tuning_advice(train)}",
    )


def _tuning_advice(train: dict[str, Any]) -> str:
    snr = _real(train.get("signal_to_noise"))
    ratio = (
        f"The per-step signal-to-noise B/(σ·√d) is {format_value(snr)}: the noise"
        if snr is not None
        else "Noise"
    )
    return (
        f"{ratio} may drown the gradient. Raise it with a larger logical batch "
        "(batching.batch_size, with train.physical_batch_size to fit memory), more data, "
        "fewer trainable parameters (LoRA, a smaller model) or a larger ε; clipping: "
        "automatic and adam often learn where flat clipping and sgd do not."
    )


def _utility_unchecked(metrics: dict[str, dict[str, Any]]) -> Finding | None:
    """Train ran but wrote no baseline (an older train stage): whether the model learned is
    unknown."""
    train = metrics.get("train", {})
    if not train or "baseline" in train:
        return None
    return Finding(
        kind="utility-unchecked",
        severity="notice",
        title="Utility not checked against a baseline",
        message=(
            "metrics/train.json has no baseline (majority class or unigram perplexity), "
            "so whether the model learned anything is unknown; re-run the train stage."
        ),
    )


def _sampler_declared(
    metrics: dict[str, dict[str, Any]], details: dict[str, Any]
) -> Finding | None:
    check = sampler_check(metrics, details)
    if check is None or not check.matches or check.assumption() is None:
        return None
    return Finding(
        kind="sampler-declared",
        severity="notice",
        title="Sampler equivalence declared, not proven",
        message=str(check.assumption()),
    )


def _budget_exceeded(metrics: dict[str, dict[str, Any]]) -> Finding | None:
    calibrate, train = metrics.get("calibrate", {}), metrics.get("train", {})
    problems = []
    if _exceeds(train.get("epsilon_spent"), calibrate.get("epsilon")):
        problems.append(
            f"spent ε = {format_upper(train['epsilon_spent'])}, "
            f"more than the claimed ε = {format_upper(calibrate['epsilon'])}"
        )
    if _exceeds(train.get("steps_done"), calibrate.get("steps")):
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


def _verify_failed(metrics: dict[str, dict[str, Any]], details: dict[str, Any]) -> Finding | None:
    verify = metrics.get("verify", {})
    failed_count = _real(verify.get("tests_failed")) or 0
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


def _delta_vacuous(metrics: dict[str, dict[str, Any]]) -> Finding | None:
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


def _mc_failure(metrics: dict[str, dict[str, Any]], threshold: float) -> Finding | None:
    probability = metrics.get("calibrate", {}).get("mc_failure_probability")
    if not _exceeds(probability, threshold):
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


def _stages_missing(status: dict[str, str]) -> Finding | None:
    missing = [f"{stage} ({state})" for stage, state in status.items() if state != "ok"]
    if not missing:
        return None
    return Finding(
        kind="not-run",
        severity="notice",
        title="Evidence missing",
        message=f"No output from: {', '.join(missing)}. Those parts of the report show 'not run'.",
    )


def _audit_inconclusive(metrics: dict[str, dict[str, Any]]) -> Finding | None:
    audit = metrics.get("audit", {})
    if audit.get("verdict") != "inconclusive":
        return None
    return Finding(
        kind="audit-inconclusive",
        severity="notice",
        title="Audit inconclusive",
        message=(
            "The audit neither contradicts nor supports the claim "
            f"(ε_emp ≥ {format_lower(audit.get('epsilon_emp'))} from {format_value(audit.get('observations'))} observations); "  # noqa: E501
            "more observations would sharpen it."
        ),
    )


def _metrics_not_flat(metrics: dict[str, dict[str, Any]]) -> Finding | None:
    nested = [
        f"{stage}.{key}"
        for stage, values in metrics.items()
        for key, value in values.items()
        if isinstance(value, (dict, list))
    ]
    if not nested:
        return None
    return Finding(
        kind="metrics-not-flat",
        severity="notice",
        title="Metrics not flat",
        message=f"Nested values in metrics/*.json ({', '.join(nested)}): "
        "dvc metrics diff cannot compare them.",
    )
