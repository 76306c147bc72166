"""Old and new headline side by side, for a pull request: metrics of a git revision against this
tree.

The old metrics are read with ``git show REV:metrics/<stage>.json``; nothing is recomputed. The
warnings row runs the same checks as the report on each side's flat metrics.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from dpledger.errors import DpledgerError
from dpledger.report.checks import find_findings
from dpledger.report.document import Code, Document, Heading, Paragraph, Table, text
from dpledger.report.formatting import (
    MISSING,
    format_change,
    format_lower,
    format_percent,
    format_upper,
    format_value,
)
from dpledger.report.inputs import UPSTREAM_STAGES


@dataclass(frozen=True)
class HeadlineMetric:
    """One compared figure: where it lives in the flat metrics and how it reads."""

    label: str
    stage: str
    key: str
    show: Callable[[Any], str] = format_value


HEADLINE_METRICS = (
    HeadlineMetric("Claimed ε", "calibrate", "epsilon", format_upper),
    HeadlineMetric("δ", "calibrate", "delta"),
    HeadlineMetric("Accountant", "calibrate", "accountant"),
    HeadlineMetric("Noise multiplier σ", "calibrate", "noise_multiplier"),
    HeadlineMetric("Mechanism", "calibrate", "mechanism"),
    HeadlineMetric("Sampler accounted", "calibrate", "sampler"),
    HeadlineMetric("Sampler used", "schedule", "sampler"),
    HeadlineMetric("Empirical ε (lower bound)", "audit", "epsilon_emp", format_lower),
    HeadlineMetric("Audit verdict", "audit", "verdict"),
    HeadlineMetric("Implementation tests passed", "verify", "passed"),
    HeadlineMetric("Implementation tests failed", "verify", "tests_failed"),
    HeadlineMetric("Test accuracy", "train", "test_accuracy", format_percent),
    HeadlineMetric(
        "Baseline accuracy (best constant guess)", "train", "baseline_accuracy", format_percent
    ),
    HeadlineMetric("Test perplexity", "train", "test_perplexity"),
    HeadlineMetric("Baseline perplexity (unigram)", "train", "baseline_perplexity_unigram"),
    HeadlineMetric("Signal-to-noise per step", "train", "signal_to_noise"),
    HeadlineMetric("Trainable parameters", "train", "parameters_trainable"),
    HeadlineMetric("ε spent", "train", "epsilon_spent", format_upper),
    HeadlineMetric("Throughput (examples/s)", "train", "throughput_examples_per_s"),
    HeadlineMetric("Training wall time (s)", "train", "wall_time_s"),
)
NOT_RUN = "not run"


@dataclass(frozen=True)
class ComparedRow:
    label: str
    old: str
    new: str
    change: str


def revision_metrics(root: str | Path, revision: str) -> tuple[str, dict[str, dict[str, Any]]]:
    """(short commit id, stage -> flat metrics) at ``revision``; a stage without metrics there maps
    to {}."""
    resolved = _git(root, "rev-parse", "--verify", "--quiet", "--short", f"{revision}^{{commit}}")
    if resolved is None:
        raise DpledgerError(
            f"report --compare: {revision!r} is not a git revision of the repository at {root}"
        )
    metrics = {}
    for stage in UPSTREAM_STAGES:
        shown = _git(root, "show", f"{revision}:./metrics/{stage}.json")
        try:
            loaded = json.loads(shown) if shown is not None else {}
        except json.JSONDecodeError:
            loaded = {}
        metrics[stage] = loaded if isinstance(loaded, dict) else {}
    return resolved, metrics


def _git(root: str | Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError) as error:
        raise DpledgerError(f"report --compare needs git: {error}") from None
    return done.stdout.strip() if done.returncode == 0 else None


def compare_headlines(
    old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]], *, mc_failure_warning: float
) -> list[ComparedRow]:
    """Rows of the side-by-side table, the warnings first."""
    rows = [_warnings_row(old, new, mc_failure_warning), _utility_row(old, new, mc_failure_warning)]
    for metric in HEADLINE_METRICS:
        old_value, new_value = (
            old.get(metric.stage, {}).get(metric.key),
            new.get(metric.stage, {}).get(metric.key),
        )
        rows.append(
            ComparedRow(
                metric.label,
                _shown(metric, old),
                _shown(metric, new),
                format_change(old_value, new_value)
                if old_value is not None and new_value is not None
                else "",
            )
        )
    return rows


def _shown(metric: HeadlineMetric, metrics: dict[str, dict[str, Any]]) -> str:
    stage = metrics.get(metric.stage) or {}
    if not stage:
        return NOT_RUN
    return metric.show(stage[metric.key]) if metric.key in stage else MISSING


def _warnings_row(
    old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]], threshold: float
) -> ComparedRow:
    def kinds(metrics: dict[str, dict[str, Any]]) -> str:
        found = [
            f.kind
            for f in find_findings(metrics, mc_failure_warning=threshold)
            if f.severity == "warning"
        ]
        return ", ".join(found) or "none"

    before, after = kinds(old), kinds(new)
    return ComparedRow("Warnings", before, after, "" if before == after else "changed")


def _utility(metrics: dict[str, dict[str, Any]], threshold: float) -> str:
    """One side's utility verdict, from the same checks as the report."""
    train = metrics.get("train") or {}
    if not train:
        return NOT_RUN
    kinds = {f.kind for f in find_findings(metrics, mc_failure_warning=threshold)}
    if "learned-nothing" in kinds:
        return "learned nothing"
    if "baseline_accuracy" in train and "test_accuracy" in train:
        points = 100 * (train["test_accuracy"] - train["baseline_accuracy"])
        return f"{format_value(points)} points above baseline"
    if "baseline_perplexity_unigram" in train and "test_perplexity" in train:
        return f"perplexity {format_value(train['test_perplexity'])} < unigram {format_value(train['baseline_perplexity_unigram'])}"  # noqa: E501
    return "no baseline"


def _utility_row(
    old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]], threshold: float
) -> ComparedRow:
    """Utility beside its baseline on each side; the change column says when ε moved and utility did
    not."""
    before, after = _utility(old, threshold), _utility(new, threshold)
    epsilons = [side.get("calibrate", {}).get("epsilon") for side in (old, new)]
    metric = "test_accuracy" if "test_accuracy" in new.get("train", {}) else "test_perplexity"
    values = [side.get("train", {}).get(metric) for side in (old, new)]
    if epsilons[0] != epsilons[1] and None not in epsilons and values[0] == values[1] is not None:
        change = "ε changed, utility did not" + (
            ": learned nothing at either ε" if after == before == "learned nothing" else ""
        )
    else:
        change = "" if before == after else "changed"
    return ComparedRow("Utility", before, after, change)


def comparison_document(rows: list[ComparedRow], old_label: str, new_label: str) -> Document:
    """The side-by-side table as a document (rendered to Markdown for a PR comment)."""
    table = Table(
        ("", old_label, new_label, "change"),
        tuple((text(row.label), text(row.old), text(row.new), text(row.change)) for row in rows),
        headline=True,
    )
    intro = Paragraph(
        text(
            "Headline metrics of ",
            Code(old_label),
            " and ",
            Code(new_label),
            ", read from ",
            Code("metrics/*.json"),
            ".",
        )
    )
    return Document(
        title="dpledger: headline comparison", blocks=(Heading(2, "Headline"), intro, table)
    )
