"""The report's checks of the training run and of the evidence: examples dropped, a diverged loss,
a model that learned nothing or was not checked against a baseline, stages that did not run, an
inconclusive audit, metrics that are not flat. Collected by
:func:`dpledger.report.checks.find_findings`.
"""

from __future__ import annotations

import math
from typing import Any

from dpledger.report.finding import Finding, real
from dpledger.report.formatting import format_lower, format_percent, format_value

UTILITY_SIGNIFICANCE = 0.01
"""A test accuracy counts as above its majority baseline only when a model right at the baseline's
rate would score at least as well with probability below this (one-sided exact binomial test): a run
at chance then clears it about once in a hundred runs, and never while it predicts a single
class."""


def nonfinite_examples(
    metrics: dict[str, dict[str, Any]], train_files: dict[str, Any]
) -> Finding | None:
    ledger = (
        train_files.get("ledger.json") if isinstance(train_files.get("ledger.json"), dict) else {}
    )
    count = real(
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


def loss_diverged(metrics: dict[str, dict[str, Any]]) -> Finding | None:
    train = metrics.get("train", {})
    losses = [train.get(key) for key in ("final_train_loss", "test_loss")]
    if train.get("loss_diverged") is not True and all(
        v is None or real(v) is None or math.isfinite(v) for v in losses
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


def learned_nothing(metrics: dict[str, dict[str, Any]]) -> Finding | None:
    """Classification no better than its majority baseline or predicting one class; a language model
    no better than the unigram perplexity of its training tokens."""
    train = metrics.get("train", {})
    accuracy, baseline = real(train.get("test_accuracy")), real(train.get("baseline_accuracy"))
    perplexity, unigram = (
        real(train.get("test_perplexity")),
        real(train.get("baseline_perplexity_unigram")),
    )
    if accuracy is not None and baseline is not None:
        p_value = real(train.get("above_baseline_p_value"))
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
    snr = real(train.get("signal_to_noise"))
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


def utility_unchecked(metrics: dict[str, dict[str, Any]]) -> Finding | None:
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


def stages_missing(status: dict[str, str]) -> Finding | None:
    missing = [f"{stage} ({state})" for stage, state in status.items() if state != "ok"]
    if not missing:
        return None
    return Finding(
        kind="not-run",
        severity="notice",
        title="Evidence missing",
        message=f"No output from: {', '.join(missing)}. Those parts of the report show 'not run'.",
    )


def audit_inconclusive(metrics: dict[str, dict[str, Any]]) -> Finding | None:
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


def metrics_not_flat(metrics: dict[str, dict[str, Any]]) -> Finding | None:
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
