"""Issue 29 item 1: utility is evidence. Each number the train stage writes against a naive
computation, and the report's "the model learned nothing" warning (a run at chance never renders "No
warnings")."""

from __future__ import annotations

import io
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dpledger.data.text import PAD
from dpledger.models import utility
from dpledger.pipeline import run_stage
from dpledger.pipeline.progress import LINES, Progress
from dpledger.report.checks import UTILITY_SIGNIFICANCE, find_findings
from helpers.report_fixtures import fabricate_project, report_params
from helpers.train_project import TRAIN_SIZE, make_project


def test_majority_baseline_is_the_best_constant_guess_on_test():
    y_test = np.array([2, 1, 1, 2, 0, 1])
    assert utility.majority_baseline(y_test) == (1, pytest.approx(3 / 6))
    assert max(np.mean(y_test == c) for c in range(3)) == utility.majority_baseline(y_test)[1]


def test_binomial_p_value_equals_the_summed_probabilities():
    n, k, p = 30, 21, 0.5
    naive = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))
    assert utility.above_baseline_p_value(k, n, p) == pytest.approx(naive, rel=1e-12)
    assert utility.above_baseline_p_value(0, n, p) == pytest.approx(1.0)


def test_per_class_metrics_and_confusion_matrix_match_a_naive_count():
    rng = np.random.default_rng(0)
    y_true, y_pred = rng.integers(0, 4, 200), rng.integers(0, 4, 200)
    y_pred[y_true == 3] = 3  # class 3 always found
    metrics, details = utility.classification_utility(y_true, y_pred, 5)
    for row in details["per_class"]:
        c = row["class"]
        tp = int(np.sum((y_pred == c) & (y_true == c)))
        precision = tp / max(int(np.sum(y_pred == c)), 1)
        recall = tp / max(int(np.sum(y_true == c)), 1)
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        assert (row["precision"], row["recall"], row["f1"]) == pytest.approx(
            (precision, recall, f1)
        )
        assert row["support"] == int(np.sum(y_true == c))
    counts = Counter(zip(y_true.tolist(), y_pred.tolist()))
    assert details["confusion_matrix"] == [[counts[(t, p)] for p in range(5)] for t in range(5)]
    assert details["per_class"][3]["recall"] == 1.0 and details["per_class"][4]["support"] == 0
    assert metrics["predicted_classes"] == 4
    assert metrics["test_macro_f1"] == pytest.approx(
        np.mean([r["f1"] for r in details["per_class"]])
    )


def test_unigram_perplexity_is_the_training_frequency_model_of_the_next_tokens():
    # targets 0 0 1 2 (the first token is never a target): 2 singletons, missing mass 2/4
    x_train = np.array([[9, 0, 0, 1], [9, 2, PAD, PAD]])
    x_test = np.array([[9, 0, 3, PAD]])  # targets 0 3
    vocab = 10
    missing = 2 / 4
    log_p = [math.log((1 - missing) * 2 / 4), math.log(missing / (vocab - 3))]
    assert utility.unigram_perplexity(x_train, x_test, vocab) == pytest.approx(
        math.exp(-sum(log_p) / 2)
    )
    metrics = utility.lm_utility(x_train, x_test, vocab)
    assert metrics["baseline_perplexity_uniform"] == vocab


def test_a_model_that_learned_only_frequencies_does_not_beat_the_baseline():
    """Over a GPT-2-sized vocabulary, add-one smoothing (perplexity 100.9 in the LM example) was
    beaten by a model that had learned only the token frequencies (63.4)."""
    rng = np.random.default_rng(0)
    zipf = 1.0 / np.arange(1, 201) ** 1.1
    tokens = rng.choice(200, size=(2, 400, 33), p=zipf / zipf.sum())
    x_train, x_test = tokens
    vocab = 50_257
    baseline = utility.unigram_perplexity(x_train, x_test, vocab)
    counts = np.bincount(x_train[:, 1:].ravel(), minlength=vocab) + 1e-3  # learned frequencies
    learned = counts / counts.sum()
    frequencies_only = math.exp(-np.mean(np.log(learned[x_test[:, 1:].ravel()])))
    assert baseline <= frequencies_only * 1.01, (baseline, frequencies_only)


def test_noise_norm_is_the_expected_norm_of_the_added_noise():
    sigma, clip, d, batch = 1.3, 0.7, 4000, 64
    snr = utility.signal_to_noise(sigma, clip, d, batch)
    draws = torch.randn(200, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    measured = float((sigma * clip * draws / batch).norm(dim=1).mean())
    assert snr["noise_norm"] == pytest.approx(measured, rel=0.01)
    assert snr["signal_to_noise"] == pytest.approx(batch / (sigma * math.sqrt(d)))
    line = utility.tuning_hint(snr, d, batch, sigma)
    assert "physical_batch_size" in line and "LoRA" in line and "ε" in line


def test_model_summary_counts_trainable_and_shared_parameters_once():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 3))
    model[1].weight = torch.nn.Parameter(model[1].weight.detach().clone())
    model[0].requires_grad_(False)
    assert utility.model_summary(model) == {
        "model_architecture": "Sequential",
        "parameters_total": 3 * 4 + 4 + 4 * 3 + 3,
        "parameters_trainable": 4 * 3 + 3,
    }


def test_train_stage_writes_baseline_per_class_confusion_and_model(tmp_path):
    params = make_project(tmp_path, epochs=2)
    metrics = run_stage("train", params, tmp_path)
    flat = json.loads((tmp_path / "metrics/train.json").read_text())
    assert all(not isinstance(v, (dict, list)) for v in flat.values())
    assert flat["baseline"] == "majority class" and 0.05 < flat["baseline_accuracy"] < 0.2
    assert (
        flat["model_architecture"] == "MLP"
        and flat["parameters_trainable"] == flat["parameters_total"] > 0
    )
    assert (
        metrics["test_accuracy"] > flat["baseline_accuracy"]
        and flat["above_baseline_p_value"] < 1e-10
    )
    assert flat["signal_to_noise"] == pytest.approx(
        64 / (1.0 * math.sqrt(flat["parameters_trainable"]))
    )
    details = json.loads((tmp_path / "artifacts/train/utility.json").read_text())
    assert (
        len(details["per_class"]) == 10
        and sum(map(sum, details["confusion_matrix"])) == flat["test_examples"]
    )
    diagonal = sum(details["confusion_matrix"][c][c] for c in range(10))
    assert diagonal == round(flat["test_accuracy"] * flat["test_examples"])
    assert (tmp_path / "plots/train/confusion_matrix.png").stat().st_size > 0


def _render(root: Path) -> tuple[list[str], str]:
    from dpledger.pipeline.report import run

    run(report_params(), root)
    kinds = json.loads((root / "metrics/report.json").read_text())
    return kinds, (root / "reports/report.md").read_text()


def test_a_run_on_labels_it_cannot_learn_is_reported_as_having_learned_nothing(tmp_path):
    """A real run at chance (labels independent of the inputs): the report leads with the warning
    and never says "No warnings", whatever else holds."""
    fabricate_project(tmp_path)
    params = make_project(tmp_path, epochs=1)
    rng = np.random.default_rng(0)
    arrays = {"x_train": rng.random((TRAIN_SIZE, 64)), "x_test": rng.random((1000, 64))}
    arrays |= {"y_train": rng.integers(0, 2, TRAIN_SIZE), "y_test": rng.integers(0, 2, 1000)}
    np.savez(tmp_path / "noise.npz", **arrays)
    settings_ = yaml.safe_load(params.read_text())
    settings_["data"] = {**settings_["data"], "name": "npz", "path": str(tmp_path / "noise.npz")}
    params.write_text(yaml.safe_dump(settings_))
    run_stage("train", params, tmp_path)
    flat = json.loads((tmp_path / "metrics/train.json").read_text())
    assert flat["above_baseline_p_value"] > UTILITY_SIGNIFICANCE or flat["predicted_classes"] == 1
    _, markdown = _render(tmp_path)
    assert "No warnings" not in markdown and "The model learned nothing" in markdown
    assert markdown.index("The model learned nothing") < markdown.index("## Headline")
    # accuracy row
    assert "learned nothing" in markdown.split("## Headline")[1].split("Privacy spent")[0]


def _utility_kinds(metrics: dict[str, dict]) -> list[str]:
    kinds = [f.kind for f in find_findings(metrics, mc_failure_warning=1e-6)]
    return [kind for kind in kinds if kind in ("learned-nothing", "utility-unchecked")]


def _train_metrics(**changes: object) -> dict[str, dict]:
    root_metrics = {
        "test_accuracy": 0.5,
        "baseline": "majority class",
        "baseline_accuracy": 0.517,
        "above_baseline_p_value": 0.7,
        "predicted_classes": 1,
        "signal_to_noise": 0.02,
    }
    return {"train": {**root_metrics, **changes}}


@pytest.mark.parametrize(
    "changes",
    [
        {},  # chance, one class: the run
        {"predicted_classes": 2},  # below the baseline
        # not significantly above
        {
            "test_accuracy": 0.53,
            "above_baseline_p_value": 0.3,
            "predicted_classes": 2,
        },
        # one class cannot score 99 %, but says so
        {
            "test_accuracy": 0.99,
            "above_baseline_p_value": 1e-50,
        },
    ],
)
def test_chance_or_one_class_is_a_learned_nothing_warning(changes):
    findings = find_findings(_train_metrics(**changes), mc_failure_warning=1e-6)
    found = [f for f in findings if f.kind == "learned-nothing"]
    assert found and found[0].severity == "warning"
    assert "signal-to-noise" in found[0].message and "physical_batch_size" in found[0].message


def test_a_clearly_better_model_is_no_finding():
    metrics = _train_metrics(test_accuracy=0.9, above_baseline_p_value=1e-40, predicted_classes=2)
    assert _utility_kinds(metrics) == []


def test_language_model_no_better_than_unigram_is_a_warning():
    lm = {
        "test_perplexity": 240.0,
        "baseline": "unigram perplexity",
        "baseline_perplexity_unigram": 230.0,
    }
    assert _utility_kinds({"train": lm}) == ["learned-nothing"]
    lm["test_perplexity"] = 120.0
    assert _utility_kinds({"train": lm}) == []


def test_train_metrics_without_a_baseline_cannot_be_all_clear():
    assert _utility_kinds({"train": {"test_accuracy": 0.9}}) == ["utility-unchecked"]


@settings(max_examples=60, deadline=None)
@given(
    baseline=st.floats(0.01, 0.99),
    below=st.floats(0.0, 1.0),
    classes=st.integers(1, 10),
    p_value=st.floats(0.0, 1.0),
)
def test_no_accuracy_at_or_below_the_baseline_passes(baseline, below, classes, p_value):
    metrics = _train_metrics(
        test_accuracy=baseline * below,
        baseline_accuracy=baseline,
        predicted_classes=classes,
        above_baseline_p_value=p_value,
    )
    assert _utility_kinds(metrics) == ["learned-nothing"]


def test_progress_off_a_terminal_is_a_few_plain_lines_with_loss_and_epsilon():
    stream = io.StringIO()
    progress = Progress(1000, 0, stream=stream)
    for step in range(1000):
        progress.update(loss=2.0 - step / 1000, epsilon=step / 500)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert (
        len(lines) == LINES and lines[-1] == "train: step 1000/1000 (100 %), loss 1.001, ε spent 2"
    )
    assert Progress(5, 5, stream=stream).enabled is False  # a resumed, finished run prints nothing


def test_compare_remarks_when_epsilon_moves_and_utility_does_not():
    """The issue's case: the same chance accuracy at ε = 8 and ε = 2 must not pass without
    comment."""
    from dpledger.report.compare import compare_headlines

    train = _train_metrics()["train"]
    old = {"calibrate": {"epsilon": 8.0}, "train": train}
    new = {"calibrate": {"epsilon": 2.0}, "train": train}
    rows = {row.label: row for row in compare_headlines(old, new, mc_failure_warning=1e-6)}
    assert (rows["Utility"].old, rows["Utility"].new) == ("learned nothing", "learned nothing")
    assert rows["Utility"].change == "ε changed, utility did not: learned nothing at either ε"
    assert "learned-nothing" in rows["Warnings"].new
    better = {
        "calibrate": {"epsilon": 2.0},
        "train": {
            **train,
            "test_accuracy": 0.9,
            "predicted_classes": 2,
            "above_baseline_p_value": 1e-40,
        },
    }
    row = {r.label: r for r in compare_headlines(old, better, mc_failure_warning=1e-6)}["Utility"]
    assert (row.new, row.change) == ("38.3 points above baseline", "changed")
    assert rows["Baseline accuracy (best constant guess)"].new == "51.7 %"
