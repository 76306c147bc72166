"""The three numbers about the run itself, side by side at the top of the report: the proven ε (an
upper bound, the ledger's), the last-iterate heuristic (not a guarantee) and the one-run ε_emp (a
lower bound for this very run, from canaries in its own noisy sums). The finding when ε_emp exceeds
the claim is ``one-run-contradicted`` (:mod:`dpledger.report.checks`)."""

from __future__ import annotations

from dpledger.report.document import Badge, Strong, Text, text
from dpledger.report.formatting import (
    MISSING,
    format_lower,
    format_percent,
    format_upper,
    format_value,
)
from dpledger.report.inputs import ReportInputs
from dpledger.report.tables import NOT_RUN

ONE_RUN_TONES = {"consistent": "good", "contradicted": "bad"}


CEILING_KEYS = ("one_run_ceiling", "power_ceiling")
"""Where metrics/audit.json states the most ε_emp the one-run audit could ever show."""


def run_evidence_row(inputs: ReportInputs, kinds: set[str] = frozenset()) -> tuple[Text, ...]:
    """Proven ε · last-iterate heuristic · one-run ε_emp, with the one-run verdict re-derived: red
    when the findings say ε_emp exceeds the claim (whatever the file's verdict), and never green
    where the claim is above the audit's power ceiling (it could not have seen a violation)."""
    label = text(Strong("This run"))
    if not inputs.ran("audit"):
        return label, text(MISSING), text(), text(NOT_RUN)
    m = inputs.metrics["audit"]
    heuristic = m.get("epsilon_last_iterate_heuristic")
    one_run = m.get("epsilon_emp_one_run")
    result = f"proven ε ≤ {format_upper(m.get('epsilon_claimed'))} · last-iterate heuristic ε ≈ {format_value(heuristic) if heuristic is not None else 'n/a'} · one-run ε_emp ≥ {format_lower(one_run) if one_run is not None else 'n/a'}"  # noqa: E501
    confidence = m.get("one_run_confidence")
    details = " · ".join(
        f"{name} {value}".strip()
        for name, value in (
            ("canaries", m.get("one_run_canaries")),
            ("confidence", format_percent(confidence) if confidence is not None else None),
            ("method", m.get("one_run_method")),
            ("ceiling ε", format_value(m["one_run_ceiling"]) if "one_run_ceiling" in m else None),
            ("", m.get("noise_support")),
        )
        if value is not None
    )
    caveat = "the heuristic is not a guarantee (final model only, linear losses)"
    details = f"{details} · {caveat}" if details else caveat
    verdict = str(m.get("one_run_verdict", "not run"))
    ceiling = next((m[key] for key in CEILING_KEYS if m.get(key) is not None), None)
    claimed = m.get("epsilon_claimed")
    if "one-run-contradicted" in kinds:
        verdict = "contradicted"
    elif verdict == "consistent" and (
        ceiling is None or not isinstance(claimed, (int, float)) or claimed > ceiling
    ):
        verdict = "cannot test the claim" if ceiling is not None else "no power ceiling stated"
    if ceiling is not None:
        details += f" · power ceiling ε ≤ {format_value(ceiling)} (the most it could show)"
    return (
        label,
        text(Strong(result)),
        text(details),
        text(Badge(verdict, ONE_RUN_TONES.get(verdict, "warn"))),
    )
