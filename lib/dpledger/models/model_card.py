"""The model card (``README.md`` of the published folder): YAML front matter with the
``differential_privacy`` and ``dp-sgd`` tags, and a privacy statement generated from the calibration
record and the run's ledger.

The statement covers what "How to DP-fy ML" (Ponomareva et al. 2023, arXiv:2303.00654) §5.3 asks a
DP claim to report: the unit of privacy and the adjacency relation, what is released (every
iterate), the accountant and its assumptions, the sampler actually used, (ε, δ), whether
hyperparameter tuning was accounted, and the empirical audit. It states only what this stage knows:
the audit stage runs after train, so the card says where its result will be instead of claiming one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from dpledger.accounting.across_runs import Provenance
from dpledger.accounting.record import CalibrationRecord
from dpledger.ledger import PUBLIC_KEY_WARNING, Ledger
from dpledger.params.train import TrainParams
from dpledger.sampling.guard import SamplerCheck

TAGS = ("differential_privacy", "dp-sgd", "dpledger")
RELEASED = "- **What is released**: every iterate. The guarantee holds for all intermediate models of the run, not only this final one; no privacy amplification from releasing only the last iterate is claimed."  # noqa: E501
TUNING = (
    "- **Hyperparameter tuning**: not accounted. The ε above covers this one run with fixed settings; any tuning runs on the same training data (learning rate, clip norm, epochs, ...) "  # noqa: E501
    "spend privacy that this statement does not include."
)
AUDIT = "- **Empirical audit**: not part of this card. The audit stage runs after training, so this card is written before its result exists; see `reports/report.md` and `metrics/audit.json` of the same pipeline run. An audit gives a lower bound on ε; it cannot confirm the upper bound above."  # noqa: E501


@dataclass(frozen=True)
class CardFacts:
    """What the card is written from: the run's settings, its privacy record and ledger, and its
    outcome.

    ``metrics`` is the train stage's metrics; ``parameters`` is (trainable, total) parameter counts;
    ``base_model`` the pretrained folder fine-tuned (None for a model trained from scratch);
    ``provenance`` the claims the model is built from (earlier private runs it continues);
    ``files`` (what the folder holds, one line each) and ``library`` are filled in by
    :func:`dpledger.models.publish.publish`."""

    train: TrainParams
    data_name: str
    record: CalibrationRecord
    ledger: Ledger
    check: SamplerCheck
    metrics: dict[str, Any]
    parameters: tuple[int, int]
    base_model: str | None = None
    provenance: Provenance | None = None
    files: tuple[str, ...] = ()
    library: str = "pytorch"


def _front_matter(facts: CardFacts) -> str:
    tags = [*TAGS, *(["lora"] if facts.library == "peft" else [])]
    header: dict[str, Any] = {"library_name": facts.library, "tags": tags}
    return "---\n" + yaml.safe_dump(header, sort_keys=False) + "---\n"


def _unit(record: CalibrationRecord) -> str:
    k = record.description.group_size
    unit = "one training example (example-level DP)"
    if k > 1:
        unit = f"a group of up to k = {k} training examples"
    rows = record.dataset_size
    return f"- **Unit of privacy**: {unit}, i.e. one row of the training set ({rows} rows)."


def _adjacency(record: CalibrationRecord) -> str:
    prefix = "adjacency: "
    stated = [a.removeprefix(prefix) for a in record.assumptions if a.startswith(prefix)]
    k = record.description.group_size
    convention = f"add or remove {'one example' if k == 1 else f'up to k = {k} examples'}"
    return f"- **Adjacency**: {stated[0] if stated else convention}."


def _sampler(check: SamplerCheck, record: CalibrationRecord) -> str:
    used = (
        f"- **Sampler used**: {check.describe_used()}; accounted as '{check.accounted}' "
        f"({record.description.sampling_sentence()})"
    )
    if check.matches:
        return f"{used}; the two match (the train stage checked the schedule against it)."
    return f"{used}. **Warning: {check.warning()}**"


def _epsilon(facts: CardFacts) -> str:
    ledger, record = facts.ledger, facts.record
    line = f"- **(ε, δ)**: ε = {ledger.epsilon_spent:.4g} at δ = {record.delta:.3g} after {ledger.steps_done} of {ledger.total_steps} logical steps (the calibrated claim for the full run: ε = {record.epsilon:.4g})."  # noqa: E501
    if ledger.steps_done < ledger.total_steps:
        line += " Training stopped early: ε is read pessimistically from the accountant's curve."
    return line


def _across_runs(provenance: Provenance | None) -> list[str]:
    """The line naming the earlier private runs this model continues (none for a run alone)."""
    if provenance is None or provenance.is_alone():
        return []
    composed = provenance.composition
    earlier = len(composed.runs) - 1
    if earlier:
        return [
            f"- **(ε, δ) of this model across runs**: ε = {composed.epsilon:.4g} at δ = {composed.delta:.3g}. "  # noqa: E501
            f"This model continues {earlier} earlier private run(s) on training data that may overlap this run's (`train.prior_data: overlapping`); "  # noqa: E501
            f"the guarantee for the released model is their composition with this run, by {composed.method}. "  # noqa: E501
            "The ε above is this run's alone."
        ]
    disjoint = provenance.declared_disjoint
    epsilons = ", ".join(f"ε = {run.epsilon:.4g} at δ = {run.delta:.3g}" for run in disjoint)
    return [
        f"- **Earlier private training**: this model continues {len(disjoint)} earlier private run(s) ({epsilons}) "  # noqa: E501
        "whose training data the user declared disjoint from this run's (`train.prior_data: disjoint`), not verified beyond differing training rows. "  # noqa: E501
        "The ε above covers this run's data; the earlier data is covered by its own claim only if the declaration is true."  # noqa: E501
    ]


def _mechanism(facts: CardFacts) -> str:
    tp, sigma, ledger = facts.train, facts.ledger.noise_multiplier, facts.ledger
    source = ledger.noise_key_source or "an unrecorded source"
    noise = f"a Philox PRNG whose key came from {source}"
    if tp.secure_noise:
        noise = "the operating system's CSPRNG"
    line = f"- **Mechanism**: DP-SGD with per-example clipping ({tp.clipping}, clip norm R = {tp.clip_norm:g}), Gaussian noise σ·R with σ = {sigma:.6g} on each step's summed gradient (noise mechanism '{facts.record.mechanism}', drawn from {noise})."  # noqa: E501
    if ledger.noise_key_public:
        line += (
            ' <span style="color:red">**Warning: the noise key is derived from the tracked seed: '
            f"{PUBLIC_KEY_WARNING}.**</span>"
        )
    return line


def _accountant(record: CalibrationRecord) -> str:
    assumptions = "; ".join(record.assumptions)
    accountant = f"- **Accountant**: {record.accountant}."
    return f"{accountant} Its assumptions, as recorded by calibrate: {assumptions}."


def privacy_statement(facts: CardFacts) -> list[str]:
    """The privacy statement's lines (Markdown bullets): the items of Ponomareva et al. 2023
    §5.3."""
    record = facts.record
    lines = [
        _unit(record),
        _adjacency(record),
        RELEASED,
        _epsilon(facts),
        *_across_runs(facts.provenance),
        _accountant(record),
        _sampler(facts.check, record),
        _mechanism(facts),
        TUNING,
        AUDIT,
    ]
    if facts.base_model is not None and (facts.provenance is None or facts.provenance.is_alone()):
        lines.append(
            f"- **Public data**: the pretrained base model ({facts.base_model}) is not covered: "
            "the guarantee protects the fine-tuning data of this run only."
        )
    lines += [f"- **Note**: {sentence}" for sentence in (facts.check.assumption(),) if sentence]
    return lines


def _training(facts: CardFacts) -> list[str]:
    tp, record = facts.train, facts.record
    trainable, total = facts.parameters
    schedule = tp.lr_schedule
    if tp.warmup_steps:
        schedule += f" after {tp.warmup_steps} warm-up steps"
    lines = [
        f"- Model: `{tp.model}` for task `{tp.task}` on data `{facts.data_name}`; "
        f"{trainable:,} trainable of {total:,} parameters.",
        f"- Optimizer: {tp.optimizer} (lr {tp.lr:g}, {schedule}, weight decay {tp.weight_decay:g}); expected batch size {record.batch_size}, {record.epochs} epoch(s), "  # noqa: E501
        f"{record.steps} logical steps.",
    ]
    if tp.lora is not None:
        lines.append(
            f"- LoRA: rank {tp.lora.rank}, alpha {tp.lora.alpha:g}, targets {tp.lora.target_modules or 'peft default'}; every base weight frozen."  # noqa: E501
        )
    scores = {k: v for k, v in facts.metrics.items() if k.startswith(("test_", "train_"))}
    lines += [f"- {name}: {value:.4g}" for name, value in scores.items() if _number(value)]
    return lines


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def model_card(facts: CardFacts) -> str:
    """The card's text: front matter, what the folder holds, the privacy statement and the
    training run."""
    return "\n".join(
        [
            _front_matter(facts),
            "# Differentially private model (dpledger)",
            "",
            "Trained with DP-SGD by the dpledger pipeline (calibrate -> schedule -> train). "
            "Generated by the train stage from `artifacts/calibration/calibration.json` and the run's ledger.",  # noqa: E501
            "",
            "## Files",
            "",
            *[f"- {line}" for line in facts.files],
            "",
            "## Privacy statement",
            "",
            *privacy_statement(facts),
            "",
            "## Training",
            "",
            *_training(facts),
            "",
        ]
    )
