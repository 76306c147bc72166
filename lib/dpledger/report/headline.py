"""The headline table: the claim, the evidence for and against it, utility and cost, each with its
verdict."""

from __future__ import annotations

from typing import Any

from dpledger.ledger import PUBLIC_KEY_WARNING
from dpledger.report.checks import Finding
from dpledger.report.document import (
    Badge,
    Block,
    Code,
    Heading,
    Strong,
    Table,
    Text,
    Tone,
    text,
)
from dpledger.report.formatting import (
    MISSING,
    format_lower,
    format_percent,
    format_upper,
    format_value,
)
from dpledger.report.inputs import ReportInputs
from dpledger.report.run_evidence import run_evidence_row
from dpledger.report.self_check import self_check_row
from dpledger.report.tables import NOT_RUN

VERDICT_TONES: dict[str, Tone] = {
    "consistent": "good",
    "contradicted": "bad",
    "inconclusive": "warn",
}
_FROM_RECORD = ("epsilon", "delta", "accountant", "sampler", "mechanism", "steps")
"""The claim's fields read from the sealed calibration record rather than from
metrics/calibrate.json."""


def headline(inputs: ReportInputs, findings: list[Finding]) -> list[Block]:
    """The main table; a row's verdict turns red when a finding concerns it."""
    kinds = {f.kind for f in findings}
    rows = [
        _claim_row(inputs, kinds),
        *_across_runs_rows(inputs),
        _sampler_row(inputs, kinds),
        _audit_row(inputs, kinds),
        run_evidence_row(inputs, kinds),
        _verify_row(inputs),
        self_check_row(inputs.metrics, inputs.ran("train"), inputs.train_files.get("ledger.json")),
        _accuracy_row(inputs, kinds),
        _spent_row(inputs, kinds),
        _noise_key_row(inputs),
        _cost_row(inputs),
        _placement_row(inputs),
    ]
    return [
        Heading(2, "Headline"),
        Table(("", "result", "details", "verdict"), tuple(rows), headline=True),
    ]


def _claim_row(inputs: ReportInputs, kinds: set[str]) -> tuple[Text, ...]:
    label = text(Strong("Claimed ε"))
    if not inputs.ran("calibrate"):
        return label, text(MISSING), text(), text(NOT_RUN)
    record = (
        inputs.details.get("calibrate") if isinstance(inputs.details.get("calibrate"), dict) else {}
    )
    m = {
        **inputs.metrics["calibrate"],
        **{k: record[k] for k in _FROM_RECORD if record.get(k) is not None},
    }
    details = _joined(
        ("accountant", m.get("accountant")),
        ("sampler", m.get("sampler")),
        ("mechanism", m.get("mechanism")),
        ("σ used", inputs.metrics["train"].get("noise_multiplier", m.get("noise_multiplier"))),
        ("lower bound ε", m.get("epsilon_lower")),
        ("steps", m.get("steps")),
        ("Monte Carlo samples", m.get("mc_samples")),
        ("Monte Carlo failure probability", m.get("mc_failure_probability")),
    )
    if kinds & {"audit-contradicted", "one-run-contradicted", "dpsgd-contradicted"}:
        verdict = Badge("contradicted", "bad")
    elif kinds & {
        "sampler-mismatch",
        "budget-exceeded",
        "mc-failure",
        "sigma-mismatch",
        "sources-disagree",
    } or ("self-check-failed" in kinds):
        verdict = Badge("does not hold as stated", "bad")
    else:
        verdict = Badge("proven", "good")
    result = f"ε = {format_upper(m.get('epsilon'))} at δ = {format_value(m.get('delta'))}"
    return label, text(Strong(result)), text(details), text(verdict)


def _across_runs_rows(inputs: ReportInputs) -> list[tuple[Text, ...]]:
    """The released model's ε across the runs that trained it (``pipeline/prior_runs.py``): a row
    only where the model continues an earlier private run."""
    train = inputs.metrics["train"]
    if "epsilon_composed" not in train:
        return []
    label = text(Strong("ε across runs"))
    result = text(
        Strong(
            f"ε = {format_upper(train['epsilon_composed'])} at δ = {format_value(train.get('delta_composed'))}"  # noqa: E501
        )
    )
    composed, disjoint = train.get("prior_runs_composed"), train.get("prior_runs_declared_disjoint")
    if composed:
        details = f"this run composed with {format_value(composed)} earlier private run(s) on overlapping data, by {format_value(train.get('composition'))}: the released model's guarantee"  # noqa: E501
        return [(label, result, text(details), text(Badge("composed", "good")))]
    details = f"{format_value(disjoint)} earlier private run(s) declared disjoint from this run's data (train.prior_data: disjoint), not verified beyond differing training rows"  # noqa: E501
    return [(label, result, text(details), text(Badge("declared disjoint", "warn")))]


def _sampler_row(inputs: ReportInputs, kinds: set[str]) -> tuple[Text, ...]:
    label = text(Strong("Sampler"))
    train = inputs.metrics["train"]
    accounted = train.get("sampler_accounted", inputs.metrics["calibrate"].get("sampler"))
    used = train.get("sampler_used", inputs.metrics["schedule"].get("sampler"))
    if accounted is None and used is None:
        return label, text(MISSING), text(), text(NOT_RUN)
    result = text(Code(format_value(used)), " used, ", Code(format_value(accounted)), " accounted")
    schedule = inputs.metrics["schedule"]
    details = _joined(
        ("batch size", _mean_std(schedule.get("batch_size_mean"), schedule.get("batch_size_std"))),
        ("steps", schedule.get("num_steps")),
    )
    if "sampler-mismatch" in kinds:
        verdict = Badge("mismatch", "bad")
    elif accounted is None or used is None:
        verdict = Badge("unchecked", "warn")
    else:
        verdict = Badge("match", "good")
    return label, result, text(details), text(verdict)


def _audit_row(inputs: ReportInputs, kinds: set[str]) -> tuple[Text, ...]:
    label = text(Strong("Empirical ε"))
    if not inputs.ran("audit"):
        return label, text(MISSING), text(), text(NOT_RUN)
    m = inputs.metrics["audit"]
    confidence = m.get("confidence")
    result = f"ε_emp ≥ {format_lower(m.get('epsilon_emp'))}"
    details = _joined(
        ("confidence", format_percent(confidence) if confidence is not None else None),
        ("observations", m.get("observations")),
        ("threshold", m.get("threshold_method")),
        ("sampler", m.get("sampler")),
        ("DP-SGD audit", _dpsgd(m, kinds)),
    )
    verdict = "contradicted" if "audit-contradicted" in kinds else str(m.get("verdict", "unknown"))
    if verdict == "consistent" and "dpsgd-contradicted" in kinds:
        verdict = "contradicted"
    return (
        label,
        text(Strong(result)),
        text(details),
        text(Badge(verdict, VERDICT_TONES.get(verdict, "warn"))),
    )


def _dpsgd(m: dict[str, Any], kinds: set[str]) -> str | None:
    """The DP-SGD canary audit's result, its verdict re-derived (checks.lower_bound_contradicts)."""
    if m.get("dpsgd_verdict") is None and m.get("dpsgd_epsilon_emp") is None:
        return None
    verdict = "contradicted" if "dpsgd-contradicted" in kinds else m.get("dpsgd_verdict")
    return f"ε_emp ≥ {format_lower(m.get('dpsgd_epsilon_emp'))} ({verdict})"


def _verify_row(inputs: ReportInputs) -> tuple[Text, ...]:
    label = text(Strong("Implementation tests"))
    if not inputs.ran("verify"):
        return label, text(MISSING), text(), text(NOT_RUN)
    m = inputs.metrics["verify"]
    run, failed = m.get("tests_run"), m.get("tests_failed")
    if isinstance(run, int) and isinstance(failed, int):
        result = f"{run - failed} / {run} passed"
    else:
        result = f"{format_value(run)} run, {format_value(failed)} failed"
    p_values = [
        (key.removeprefix("p_value_"), value)
        for key, value in m.items()
        if key.startswith("p_value_")
    ]
    details = ", ".join(f"{name} p = {format_value(value)}" for name, value in p_values)
    if m.get("battery_model"):
        details = f"on {m['battery_model']}: {details}"
    passed = m.get("passed") is True and not (isinstance(failed, int) and failed > 0)
    verdict = Badge("passed", "good") if passed else Badge("failed", "bad")
    return label, text(result), text(details), text(verdict)


def _accuracy_row(inputs: ReportInputs, kinds: set[str]) -> tuple[Text, ...]:
    """The task's metric beside its baseline: test accuracy against the majority class, or for a
    language model test perplexity (exp of the token-weighted mean test loss) against the unigram
    perplexity."""
    m = inputs.metrics["train"]
    perplexity = "test_perplexity" in m
    label = text(Strong("Test perplexity" if perplexity else "Test accuracy"))
    if not inputs.ran("train"):
        return label, text(MISSING), text(), text(NOT_RUN)
    if "learned-nothing" in kinds:
        verdict = text(Badge("learned nothing", "bad"))
    else:
        verdict = (
            text(Badge("above baseline", "good"))
            if "baseline" in m
            else text(Badge("no baseline", "warn"))
        )
    model = _joined(
        ("model", m.get("model_architecture")),
        ("trainable parameters", m.get("parameters_trainable")),
        ("of", m.get("parameters_total")),
        ("signal-to-noise", m.get("signal_to_noise")),
    )
    if perplexity:
        details = _joined(
            ("frequency baseline", m.get("baseline_perplexity_unigram")),
            ("uniform", m.get("baseline_perplexity_uniform")),
            ("test loss", m.get("test_loss")),
            ("train perplexity", m.get("train_perplexity")),
            ("final train loss", m.get("final_train_loss")),
        )
        result = text(Strong(format_value(m.get("test_perplexity"))))
        return label, result, text(" · ".join(filter(None, (details, model)))), verdict
    baseline = m.get("baseline_accuracy")
    details = " · ".join(
        filter(
            None,
            (
                f"baseline (best constant guess) {format_percent(baseline)}"
                if baseline is not None
                else "",
                _joined(
                    ("macro F1", m.get("test_macro_f1")),
                    ("classes predicted", m.get("predicted_classes")),
                ),
                _joined(("final train loss", m.get("final_train_loss"))),
                model,
            ),
        )
    )
    return label, text(Strong(format_percent(m.get("test_accuracy")))), text(details), verdict


def _spent_row(inputs: ReportInputs, kinds: set[str]) -> tuple[Text, ...]:
    label = text(Strong("Privacy spent"))
    if not inputs.ran("train"):
        return label, text(MISSING), text(), text(NOT_RUN)
    m = inputs.metrics["train"]
    result = f"ε = {format_upper(m.get('epsilon_spent'))} after {format_value(m.get('steps_done'))} steps"  # noqa: E501
    if "budget-exceeded" in kinds:
        verdict = Badge("over budget", "bad")
    elif "sources-disagree" in kinds:
        verdict = Badge("disagrees with the record", "bad")
    else:
        verdict = Badge("within budget", "good")
    return label, text(result), text(), text(verdict)


def _cost_row(inputs: ReportInputs) -> tuple[Text, ...]:
    """The run's size; its wall time and throughput live in the untracked timing/train.json, so
    that the tracked report does not change with the machine (a run's metrics from before that
    still show them)."""
    label = text(Strong("Cost"))
    if not inputs.ran("train"):
        return label, text(MISSING), text(), text()
    m = inputs.metrics["train"]
    throughput = m.get("throughput_examples_per_s")
    if throughput is not None:
        result = f"{format_value(throughput)} examples/s"
        details = _joined(("training wall time", _seconds(m.get("wall_time_s"))))
    else:
        result = f"{format_value(m.get('steps_done'))} steps"
        details = "wall time and throughput: timing/train.json (untracked: they vary by machine)"
    return label, text(result), text(details), text()


def _placement_row(inputs: ReportInputs) -> tuple[Text, ...]:
    """How the run was sharded (pipeline/sharding.py); the peak memory per rank is in
    metrics/train.json (it varies by machine)."""
    label = text(Strong("Placement"))
    m = inputs.metrics["train"]
    if not inputs.ran("train") or "sharding" not in m:
        return label, text(MISSING), text(), text()
    ranks = m.get("ranks", 1)
    if m["sharding"] == "fsdp":
        result = f"FSDP over {ranks} ranks"
        details = "parameters, gradients and optimizer state sharded; model gathered to publish"
    else:
        result = "one process" if ranks == 1 else f"data-parallel over {ranks} ranks"
        details = "a full copy of the model on every rank" if ranks > 1 else ""
    return label, text(result), text(details), text()


def _noise_key_row(inputs: ReportInputs) -> tuple[Text, ...]:
    """Where the noise key came from (pipeline/noise_key.py); red when the tracked seed gives it."""
    label = text(Strong("Noise key"))
    source = inputs.metrics["train"].get("noise_key_source")
    if not source:
        return label, text(MISSING), text(), text(NOT_RUN) if not inputs.ran("train") else text()
    if inputs.metrics["train"].get("noise_key_public"):
        return label, text(source), text(Strong(PUBLIC_KEY_WARNING)), text(Badge("public", "bad"))
    return label, text(source), text(), text(Badge("secret", "good"))


def _joined(*pairs: tuple[str, Any]) -> str:
    return " · ".join(f"{name} {format_value(value)}" for name, value in pairs if value is not None)


def _mean_std(mean: Any, std: Any) -> str | None:
    if mean is None:
        return None
    return f"{format_value(mean)} ± {format_value(std)}" if std is not None else format_value(mean)


def _seconds(value: Any) -> str | None:
    return None if value is None else f"{format_value(value)} s"
