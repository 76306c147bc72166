"""The report's utility section: the model trained, its metric beside its baseline, per-class
precision, recall and F1, and DP tuning help (the step's signal-to-noise and what moves it).

Everything is read from metrics/train.json and artifacts/train/utility.json, which the train stage
wrote (dpledger.models.utility); nothing is recomputed. The confusion matrix is among the train
plots.
"""

from __future__ import annotations

from typing import Any

from dpledger.report.document import Block, BulletList, Code, Heading, Paragraph, Text, text
from dpledger.report.formatting import format_percent, format_value
from dpledger.report.inputs import ReportInputs
from dpledger.report.tables import NOT_RUN, records_table


def utility_section(inputs: ReportInputs) -> list[Block]:
    """Model, baseline, per-class table and tuning help; 'not run' without train metrics."""
    blocks: list[Block] = [Heading(3, "Utility")]
    if not inputs.ran("train"):
        return [*blocks, Paragraph(text(NOT_RUN))]
    m = inputs.metrics["train"]
    blocks.append(Paragraph(_model_sentence(m)))
    blocks.append(Paragraph(_baseline_sentence(m)))
    details = inputs.train_files.get("utility.json")
    per_class = details.get("per_class") if isinstance(details, dict) else None
    if (
        isinstance(per_class, list)
        and per_class
        and all(isinstance(row, dict) for row in per_class)
    ):
        blocks += [Paragraph(text("Per class, on the test split:")), records_table(per_class)]
    if "signal_to_noise" in m:
        blocks += tuning_help(m)
    return blocks


def _model_sentence(m: dict[str, Any]) -> Text:
    if "model_architecture" not in m:
        return text("The train stage recorded no model summary.")
    return text(
        "Model ",
        Code(str(m["model_architecture"])),
        ": "
        f"{format_value(m.get('parameters_trainable'))} trainable of {format_value(m.get('parameters_total'))} parameters.",  # noqa: E501
    )


def _baseline_sentence(m: dict[str, Any]) -> Text:
    if "baseline_accuracy" in m:
        return text(
            f"Test accuracy {format_percent(m.get('test_accuracy'))} against {format_percent(m['baseline_accuracy'])} for always predicting class {format_value(m.get('baseline_class'))} "  # noqa: E501
            "(the test split's majority, the best constant guess); "
            f"one-sided binomial p = {format_value(m.get('above_baseline_p_value'))} that a model right at the baseline's rate scores as well, "  # noqa: E501
            f"on {format_value(m.get('test_examples'))} test examples; classes predicted: "
            f"{format_value(m.get('predicted_classes'))}; "
            f"macro F1 {format_value(m.get('test_macro_f1'))}."
        )
    if "baseline_perplexity_unigram" in m:
        return text(
            f"Test perplexity {format_value(m.get('test_perplexity'))} against {format_value(m['baseline_perplexity_unigram'])} for the training split's token frequencies "  # noqa: E501
            "(unigram, add-one smoothed) "
            f"and {format_value(m.get('baseline_perplexity_uniform'))} for a uniform guess over the vocabulary."  # noqa: E501
        )
    return text(
        "No baseline was recorded (an older train stage): "
        "re-run train to compare the model with one."
    )


def tuning_help(m: dict[str, Any]) -> list[Block]:
    """The step's signal-to-noise B/(σ·√d) and the levers that move it."""
    intro = text(
        "DP tuning: "
        f"each step adds noise of expected norm σ·R·√d/B = {format_value(m.get('noise_norm'))} to a clipped mean of norm at most R = {format_value(m.get('clipped_mean_bound'))} "  # noqa: E501
        f"(B = {format_value(m.get('expected_batch_size'))} expected examples a step, "
        f"d = {format_value(m.get('parameters_trainable'))} trainable parameters, "
        f"σ = {format_value(m.get('noise_multiplier'))}): "
        f"a signal-to-noise of at most {format_value(m.get('signal_to_noise'))} per step. "
        "What raises it:"
    )
    levers = (
        text(
            "a larger logical batch (",
            Code("batching.batch_size"),
            "; ",
            Code("train.physical_batch_size"),
            " splits it to fit memory): σ grows more slowly than B at the same ε",
        ),
        text("more training data: a smaller sampling rate needs a smaller σ for the same ε"),
        text(
            "fewer trainable parameters (LoRA, a smaller model, frozen layers): "
            "the noise norm grows as √d"
        ),
        text("a larger ε (a smaller σ), when the privacy budget allows"),
        text(
            Code("train.clipping: automatic"),
            " and ",
            Code("train.optimizer: adam"),
            " often learn where flat clipping and sgd stall at these ratios",
        ),
    )
    return [Paragraph(intro), BulletList(levers)]
