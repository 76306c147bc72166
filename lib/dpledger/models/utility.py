"""Utility as evidence: what a trained model is measured against, and how loud its noise is.

A private model is worth reporting only beside what no learning at all achieves:

- **classification**: the majority class of the test split, i.e. the best a constant guess can score
  (stricter than the training split's majority, which a constant guess can beat when the splits'
  class shares differ), a one-sided exact binomial p-value for "test accuracy above that rate", the
  number of distinct classes
  predicted on the test split (one means the model learned a constant), per-class precision, recall
  and F1 and the confusion matrix (scikit-learn).
- **causal LM**: the frequency model's perplexity (the unigram maximum-likelihood estimate of the
  training split, with the Good–Turing missing mass shared by the unseen tokens so that one keeps a
  finite loss) and the uniform perplexity (the vocabulary size), both on the same next-token targets
  the model's test perplexity averages. Add-one smoothing over a 50,257-token vocabulary gave most
  of the mass to unseen tokens: a model that learned only token frequencies beat it (63.4 < 100.9).

The signal-to-noise of one DP-SGD step: each clipped example contributes at most R, so the clipped
mean has norm at most R, while the noise σ·R·z/B, z ~ N(0, I_d) over the d trainable parameters, has
expected norm about σ·R·√d/B. Their ratio B/(σ·√d) is what a practitioner moves: a larger logical
batch B, more data (a smaller σ at the same ε), fewer trainable parameters d (LoRA, a smaller
model), a larger ε.

The train stage writes these numbers; the report reads them and recomputes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dpledger import io, plotting
from dpledger.data.text import PAD
from dpledger.engine.settings import ClipNoise
from dpledger.models.tasks import EVAL_CHUNK, Task, evaluating


def model_summary(model: nn.Module, trainable: list[nn.Parameter] | None = None) -> dict[str, Any]:
    """The model's class name and its total and trainable parameter counts (shared parameters once).

    ``trainable`` defaults to the parameters with ``requires_grad``; pass the engine's ``params``
    once a BK engine holds the model (it turns ``requires_grad`` off while it trains)."""
    if trainable is None:
        trainable = [p for p in model.parameters() if p.requires_grad]
    return {
        "model_architecture": type(model).__name__,
        "parameters_total": sum(p.numel() for p in model.parameters()),
        "parameters_trainable": sum(p.numel() for p in trainable),
    }


def signal_to_noise(
    noise_multiplier: float, clip_norm: float, trainable: int, batch_size: float
) -> dict[str, float]:
    """The noise's expected norm σ·R·√d/B beside the clipped mean's bound R, and their ratio
    B/(σ·√d)."""
    noise_norm = noise_multiplier * clip_norm * math.sqrt(trainable) / batch_size
    ratio = math.inf if noise_norm == 0 else clip_norm / noise_norm
    return {"noise_norm": noise_norm, "clipped_mean_bound": clip_norm, "signal_to_noise": ratio}


def tuning_hint(
    snr: dict[str, float], trainable: int, batch_size: float, noise_multiplier: float
) -> str:
    """One line for stderr and the report: the step's signal-to-noise and what moves it."""
    return (
        f"per-step signal-to-noise {snr['signal_to_noise']:.3g} = B/(σ·√d) "
        f"with B = {batch_size:g}, σ = {noise_multiplier:.3g}, "
        f"d = {trainable:,} trainable parameters "
        f"(noise norm {snr['noise_norm']:.3g} against a clipped mean of norm ≤ R = {snr['clipped_mean_bound']:g}); "  # noqa: E501
        "it grows with the logical batch (batching.batch_size; "
        "train.physical_batch_size keeps memory flat), more data, fewer trainable parameters "
        "(LoRA, a smaller model) and a larger ε"
    )


@torch.no_grad()
def predictions(task: Task, model: nn.Module, x: torch.Tensor) -> np.ndarray:
    """The predicted class of every row of ``x`` (eval mode, in chunks; each module's mode
    restored)."""
    with evaluating(model):
        return torch.cat(
            [task.logits(model, xs).argmax(1).cpu() for xs in x.split(EVAL_CHUNK)]
        ).numpy()


def majority_baseline(y_test: np.ndarray) -> tuple[int, float]:
    """The best constant guess: the test split's most frequent class (the smallest on a tie) and its
    accuracy there. No model that ignores its input scores more, whichever class it always
    predicts."""
    majority = int(np.bincount(y_test).argmax())
    return majority, float(np.mean(y_test == majority))


def above_baseline_p_value(correct: int, total: int, baseline: float) -> float:
    """P(X ≥ correct) for X ~ Binomial(total, baseline): how likely a model that is right at the
    baseline's rate is to score at least this well (one-sided exact test)."""
    from scipy.stats import binom

    return float(binom.sf(correct - 1, total, baseline))


def classification_utility(
    y_test: np.ndarray, predicted: np.ndarray, num_classes: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(flat metrics, details): the majority baseline, the binomial p-value, classes predicted,
    macro F1; details hold per-class precision/recall/F1/support and the confusion matrix (rows:
    true class)."""
    from sklearn.metrics import confusion_matrix, precision_recall_fscore_support

    labels = list(range(num_classes))
    majority, baseline = majority_baseline(y_test)
    correct = int(np.sum(predicted == y_test))
    precision, recall, f1, support = precision_recall_fscore_support(
        y_test, predicted, labels=labels, zero_division=0
    )
    metrics = {
        "baseline": "majority class",
        "baseline_class": majority,
        "baseline_accuracy": baseline,
        "test_examples": int(len(y_test)),
        "above_baseline_p_value": above_baseline_p_value(correct, len(y_test), baseline),
        "predicted_classes": int(len(np.unique(predicted))),
        "test_macro_f1": float(np.mean(f1)),
    }
    details = {
        "per_class": [
            {
                "class": c,
                "precision": float(p),
                "recall": float(r),
                "f1": float(f),
                "support": int(s),
            }
            for c, p, r, f, s in zip(labels, precision, recall, f1, support)
        ],
        "confusion_matrix": confusion_matrix(y_test, predicted, labels=labels).tolist(),
    }
    return metrics, details


def _next_tokens(ids: np.ndarray) -> np.ndarray:
    """The real tokens a causal LM is scored on: every position but the first, padding left out."""
    targets = ids[:, 1:]
    return targets[targets != PAD]


def unigram_perplexity(x_train: np.ndarray, x_test: np.ndarray, vocab_size: int) -> float:
    """exp of the mean negative log-probability of the test targets under the frequency model of
    the training targets: p(w) = (1 − m)·count(w)/N for a seen token, and the missing mass
    m = max(singletons, 1)/N (Good–Turing) shared equally by the V − seen unseen tokens."""
    counts = np.bincount(_next_tokens(x_train), minlength=vocab_size).astype(np.float64)
    total, seen = counts.sum(), int(np.count_nonzero(counts))
    targets = _next_tokens(x_test)
    if not targets.size or total == 0:
        return math.nan
    unseen = vocab_size - seen
    missing = min(max(float(np.sum(counts == 1)), 1.0) / total, 0.5) if unseen else 0.0
    probabilities = np.where(counts > 0, (1.0 - missing) * counts / total, missing / max(unseen, 1))
    return float(np.exp(-np.mean(np.log(probabilities[targets]))))


def lm_utility(x_train: np.ndarray, x_test: np.ndarray, vocab_size: int) -> dict[str, Any]:
    """Flat metrics: the unigram and uniform perplexities a causal LM must beat."""
    return {
        "baseline": "frequency model perplexity (unigram MLE of the training text)",
        "baseline_perplexity_unigram": unigram_perplexity(x_train, x_test, vocab_size),
        "baseline_perplexity_uniform": float(vocab_size),
    }


def write_confusion_matrix(folder: Path, matrix: list[list[int]]) -> None:
    """``confusion_matrix.csv`` (true, predicted, count) and its PNG: counts, rows the true
    class."""
    rows = [[t, p, count] for t, row in enumerate(matrix) for p, count in enumerate(row)]
    io.write_csv(folder / "confusion_matrix.csv", ["true", "predicted", "count"], rows)
    counts = np.asarray(matrix)
    with plotting.png(folder / "confusion_matrix.png") as axes:
        image = axes.imshow(counts, cmap="Blues")
        axes.figure.colorbar(image, ax=axes, label="test examples")
        axes.set_xlabel("predicted class")
        axes.set_ylabel("true class")
        axes.grid(False)
        if counts.shape[0] <= 12:
            axes.set_xticks(range(counts.shape[0]))
            axes.set_yticks(range(counts.shape[0]))
            for (t, p), count in np.ndenumerate(counts):
                light = count > counts.max() / 2
                axes.text(
                    p,
                    t,
                    str(count),
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if light else "black",
                )


@dataclass(frozen=True)
class Evidence:
    """What a finished run is measured against: flat ``metrics`` (metrics/train.json) and
    ``details`` (artifacts/train/utility.json: per-class table and confusion matrix)."""

    metrics: dict[str, Any]
    details: dict[str, Any]

    def write_plots(self, folder: Path) -> None:
        if "confusion_matrix" in self.details:
            write_confusion_matrix(folder, self.details["confusion_matrix"])


def measure(
    task: Task,
    model: nn.Module,
    tensors: tuple[torch.Tensor, ...],
    *,
    settings: ClipNoise,
    vocab_size: int | None,
    trainable: list[nn.Parameter] | None = None,
) -> Evidence:
    """The model summary (``trainable``: see :func:`model_summary`), the step's signal-to-noise at
    the run's clipping and noise ``settings`` and the task's baseline and per-class evidence on
    ``tensors`` = (x_train, y_train, x_test, y_test)."""
    x_train, y_train, x_test, y_test = (t.cpu().numpy() for t in tensors)
    summary = model_summary(model, trainable)
    metrics = {
        **summary,
        **signal_to_noise(
            settings.noise_multiplier,
            settings.clip_norm,
            summary["parameters_trainable"],
            settings.normalizer,
        ),
        "expected_batch_size": float(settings.normalizer),
    }
    if task.name == "causal-lm":
        return Evidence({**metrics, **lm_utility(x_train, x_test, int(vocab_size or 0))}, {})
    predicted = predictions(task, model, tensors[2])
    classes = int(max(y_train.max(), y_test.max(), predicted.max())) + 1
    flat, details = classification_utility(y_test, predicted, classes)
    return Evidence({**metrics, **flat}, details)
