"""The findings shown at the very top of the report: anything that makes the claimed epsilon
untrustworthy.

Every check reads only the flat metrics (plus, where present, the detail JSONs for a better
sentence), so the same checks run on an old revision's metrics in ``dpledger report --compare``.

The checks live by kind in :mod:`dpledger.report.privacy_checks` (is the claim contradicted) and
:mod:`dpledger.report.training_checks` (did training and the evidence go as they should); the
:class:`Finding` they return in :mod:`dpledger.report.finding`.
"""

from __future__ import annotations

from typing import Any

from dpledger.report import privacy_checks as privacy
from dpledger.report import training_checks as training
from dpledger.report.finding import Finding
from dpledger.report.inputs import UPSTREAM_STAGES
from dpledger.report.privacy_checks import lower_bound_contradicts, sampler_check, sigma_sources
from dpledger.report.self_check import self_check_findings as engine_findings
from dpledger.report.training_checks import UTILITY_SIGNIFICANCE

__all__ = [
    "UTILITY_SIGNIFICANCE",
    "Finding",
    "find_findings",
    "lower_bound_contradicts",
    "sampler_check",
    "sigma_sources",
]


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
        privacy.delta_vacuous(metrics),
        privacy.audit_contradicted(metrics, details),
        privacy.sources_disagree(metrics, details, train_files, seals or []),
        privacy.one_run_contradicted(metrics, details),
        privacy.dpsgd_contradicted(metrics, details),
        privacy.sigma_disagrees(metrics, details, train_files),
        privacy.sampler_mismatch(metrics, details),
        privacy.budget_exceeded(metrics),
        privacy.verify_failed(metrics, details),
        privacy.mc_failure(metrics, mc_failure_warning),
        training.nonfinite_examples(metrics, train_files),
        training.loss_diverged(metrics),
        *(Finding(kind, "warning", title, say) for kind, title, say in engine_findings(metrics)),
        training.learned_nothing(metrics),
    ]
    notices = [
        training.utility_unchecked(metrics),
        training.stages_missing(status),
        training.audit_inconclusive(metrics),
        privacy.sampler_declared(metrics, details),
        training.metrics_not_flat(metrics),
    ]
    return [finding for finding in warnings + notices if finding is not None]
