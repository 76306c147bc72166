"""DP-SGD (Audit), 002 Alg. 1: gradient canaries in real training runs, under three threat models.

Each game trains a fresh model with dpledger's engine (``BKEngine``, exact per-example clipping) on
a :class:`Workload` — by default an MLP on the embedded digits data, or the train stage's own model,
task loss and training data (:func:`train_workload`: ``hf``, plugin or zoo models, images or text) —
with a fresh sampler seed, and releases per step o_t = ⟨g̃_t, ĝ⟩/C², where g̃_t is the engine's
noisy clipped sum and ĝ a random canary of norm C (so the canary counts ±1 and the noise is N(0,
σ²); 002 digest §3.4 scaling). The audited record is example 0; its gradient is the canary (D) or
zero (D'), added through the engine's canary hook instead of its own gradient.

- ``natural``: only the record's canary (means 0 / +1; Λ^N).
- ``partially-informed``: also −ĝ in place of the last example of every batch holding neither the
  record nor ⊥ (means −1 / +1 / 0; Λ^PI, 002 §5.3).
- ``worst-case``: equivalent to the batched Gaussian mechanism (002 §5.3), audited as such.

Scores are the exact likelihood ratios of the canary counts, with the natural gradients' projection
on ĝ treated as noise-free (002 §6.3.2 bias): the score is then not optimal, but the audit stays
valid because the games are real training runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from dpledger import validation
from dpledger.audit.backend import select_backend
from dpledger.audit.bgm import BgmAudit, audit_bgm
from dpledger.audit.models import BgmModel, SlotModel
from dpledger.audit.result import AuditResult, conclude
from dpledger.audit.samplers import TARGET_INDEX
from dpledger.audit.simulate import GameScores
from dpledger.engine import BKEngine
from dpledger.models import Task
from dpledger.params.bounds import (
    MAX_DPSGD_EPOCHS,
    MAX_DPSGD_OBSERVATIONS,
    refuse_beyond,
)
from dpledger.sampling.registry import build_sampler

THREAT_MODELS = ("natural", "partially-informed", "worst-case")
SHIFTS = {"natural": (1.0, 0.0), "partially-informed": (2.0, 1.0)}


@dataclass(frozen=True)
class DpsgdAudit:
    """What one DP-SGD audit plays: the threat model, the clip norm C and learning rate of every
    training run, and ``mechanism``, the batched Gaussian mechanism the runs release (the sampler
    with the options the training schedule used, e.g. ``last_batch``, ``pad_truncate``,
    ``buffer_size``; ``dataset_size`` the first n training rows; σ, epochs, games, statistics, seed
    and the claim judged, by default the PLD ε of ``claim_sampler`` at the same σ, sample rate and
    number of steps). The worst-case threat model audits ``mechanism`` itself."""

    mechanism: BgmAudit
    threat_model: str = "partially-informed"
    clip_norm: float = 1.0
    lr: float = 0.5


@dataclass(frozen=True)
class Workload:
    """What every game trains: a fresh model from ``build()`` (called after seeding torch), its
    task's per-example loss, and the training rows ``x``/``y`` (the audited record is row 0)."""

    name: str
    x: torch.Tensor
    y: torch.Tensor
    task: Task
    build: Callable[[], nn.Module]


def digits_workload(seed: int) -> Workload:
    """The default: the zoo MLP with cross-entropy on the embedded digits training split."""
    from dpledger.data import load_dataset
    from dpledger.models import build_model

    data = load_dataset("digits", None, 0.2, seed)
    x, y = torch.as_tensor(data.x_train), torch.as_tensor(data.y_train)
    return Workload(
        "digits (MLP)",
        x,
        y,
        Task("classification"),
        lambda: build_model("mlp", tuple(x.shape[1:]), int(y.max()) + 1),
    )


def train_workload(data_params: Any, train_params: Any, seed: int) -> Workload:
    """The train stage's model (``train.model``/``model_options``/``task``) on the ``data``
    section's training split, each game's model built as the train stage builds it (hf: its
    checkpoint or config; dropout as configured)."""
    from dpledger.data import load_data
    from dpledger.models import build_task_model, task_for

    data = load_data(data_params, seed)
    task = task_for(train_params.model, train_params.task, data)
    return Workload(
        f"{data_params.name} ({train_params.model}, {task.name})",
        torch.as_tensor(data.x_train),
        torch.as_tensor(data.y_train),
        task,
        lambda: build_task_model(
            train_params.model,
            train_params.model_options,
            task,
            data,
            lora=train_params.lora,
        ),
    )


def canary_outputs(
    config: DpsgdAudit, workload: Workload, *, present: bool, canary: torch.Tensor, seed: int
) -> np.ndarray:
    """One game: a DP-SGD run on D (``present``) or D' over ``workload``'s first ``dataset_size``
    rows; returns o_t = ⟨g̃_t, ĝ⟩/C² for every step."""
    mechanism = config.mechanism
    torch.manual_seed(seed)
    model = workload.build().train()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=config.lr)
    engine = BKEngine(
        model,
        optimizer,
        clip_norm=config.clip_norm,
        noise_multiplier=mechanism.noise_multiplier,
        normalizer=mechanism.batch_size,
        seed=seed,
    )
    pieces = [
        piece.reshape(p.shape)
        for piece, p in zip(torch.split(canary, [p.numel() for p in engine.params]), engine.params)
    ]
    batches = build_sampler(
        mechanism.sampler,
        dataset_size=mechanism.dataset_size,
        batch_size=mechanism.batch_size,
        epochs=mechanism.epochs,
        seed=seed,
        **mechanism.options,
    ).batches()
    outputs = []
    for batch in batches:
        indices = batch.indices[~batch.padding]
        holds_record = bool(np.any(indices == TARGET_INDEX))
        kept = indices[indices != TARGET_INDEX]
        count = 1.0 if (holds_record and present) else 0.0
        if config.threat_model == "partially-informed" and not holds_record and kept.size:
            kept, count = kept[:-1], -1.0
        if kept.size:
            rows = torch.as_tensor(kept, dtype=torch.long)
            engine.backward(workload.task.losses(model, workload.x[rows], workload.y[rows]))
        engine.step(canary=[count * piece for piece in pieces] if count else None)
        released = torch.cat([view.reshape(-1) for view in engine.last_noisy_sum])
        outputs.append(float(released @ canary) / config.clip_norm**2)
    engine.detach()
    return np.asarray(outputs)


def audit_dpsgd(config: DpsgdAudit, workload: Workload | None = None) -> AuditResult:
    """Audit DP-SGD under ``config`` on ``workload`` (default: the MLP on digits,
    :func:`digits_workload`)."""
    _refuse_bad(config)
    mechanism = config.mechanism
    workload = workload or digits_workload(mechanism.seed)
    _check_dataset_size(mechanism, workload)
    if config.threat_model == "worst-case":
        return _worst_case(config)
    score_model = _score_model(config)
    canary = _canary(config, workload)
    started = time.perf_counter()
    outputs = _play(config, workload, canary)
    seconds = time.perf_counter() - started
    steps = len(outputs[True][0])
    setting = {
        "threat_model": config.threat_model,
        "dataset": workload.name,
        **mechanism.run_setting({"steps": steps}),
        "clip_norm": config.clip_norm,
        "lr": config.lr,
        "sampler_options": dict(mechanism.options),
        "seed": mechanism.seed,
        "trainer": "dpledger.engine.BKEngine (exact per-example clipping, canary hook)",
    }
    assumptions = [
        (
            f"{config.threat_model} threat model (002 Alg. 1): "
            "the adversary inserts gradient canaries and sees ⟨g̃_t, ĝ⟩ every step."
        ),
        "Zero-out adjacency: the audited record's gradient is the canary on D and zero on D'.",
        (
            "Every game is a real training run with a fresh model (re-initialised, "
            "or the same checkpoint), sampler seed and noise."
        ),
    ]
    timing = {
        "wall_time_s": round(seconds, 3),
        "observations_per_s": round(2 * len(outputs[True]) / max(seconds, 1e-9), 2),
    }
    return conclude(
        _scores(config, score_model, outputs),
        mechanism.judged_claim(steps),
        mechanism.statistics,
        audit=f"dpsgd-{config.threat_model}",
        sampler=mechanism.sampler,
        setting=setting,
        assumptions=assumptions,
        timing=timing,
    )


def _refuse_bad(config: DpsgdAudit) -> None:
    """One line for an unknown threat model or a run too large to play."""
    validation.one_of("threat_model", config.threat_model, THREAT_MODELS, where="audit")
    observations, epochs = config.mechanism.observations, config.mechanism.epochs
    refuse_beyond(
        f"audit: dpsgd observations = {observations}",
        observations,
        MAX_DPSGD_OBSERVATIONS,
        "training runs",
        "lower audit.dpsgd_observations",
    )
    refuse_beyond(
        f"audit: dpsgd observations = {observations} × epochs = {epochs}",
        observations * epochs,
        MAX_DPSGD_EPOCHS,
        "epochs of training",
        "lower the observations or the epochs",
    )
    if config.threat_model != "worst-case" and (observations < 4 or observations % 2):
        raise validation.invalid(
            "observations", observations, "it must be an even number >= 4", where="audit"
        )


def _check_dataset_size(mechanism: BgmAudit, workload: Workload) -> None:
    available, n = workload.x.shape[0], mechanism.dataset_size
    if not mechanism.batch_size <= n <= available:
        raise validation.invalid(
            "dataset_size", n, f"it must lie in [batch_size, {available}]", where="audit"
        )


def _worst_case(config: DpsgdAudit) -> AuditResult:
    """The worst-case threat model is the batched Gaussian mechanism (002 §5.3), audited as such."""
    result, _ = audit_bgm(config.mechanism)
    return replace(result, audit="dpsgd-worst-case")


def _score_model(config: DpsgdAudit) -> BgmModel:
    """The Λ^N / Λ^PI score: the sampler's placement model with the threat model's canary means
    (where the placement has no closed form, the record's memberships in pilot runs of the sampler
    itself)."""
    model = config.mechanism.audited().model
    present, absent = SHIFTS[config.threat_model]
    return replace(model, shift_present=present, shift_absent=absent)


def _canary(config: DpsgdAudit, workload: Workload) -> torch.Tensor:
    """A random direction of norm C over the model's trainable parameters (seeded by the audit's
    seed)."""
    seed = config.mechanism.seed
    torch.manual_seed(seed)
    numel = sum(p.numel() for p in workload.build().parameters() if p.requires_grad)
    canary = torch.randn(numel, generator=torch.Generator().manual_seed(seed))
    return canary * (config.clip_norm / canary.norm())


def _play(
    config: DpsgdAudit, workload: Workload, canary: torch.Tensor
) -> dict[bool, list[np.ndarray]]:
    """The games, alternating D and D', each with its own seed; one intra-op thread (small per-step
    tensors)."""
    games = config.mechanism.observations // 2
    outputs: dict[bool, list[np.ndarray]] = {True: [], False: []}
    seeds = np.random.SeedSequence(config.mechanism.seed).generate_state(2 * games)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for index in tqdm(
            range(2 * games),
            desc=f"audit dpsgd ({config.threat_model})",
            disable=not config.mechanism.progress,
            leave=False,
        ):
            present = index % 2 == 0
            outputs[present].append(
                canary_outputs(
                    config, workload, present=present, canary=canary, seed=int(seeds[index])
                )
            )
    finally:
        torch.set_num_threads(threads)
    return outputs


def _scores(
    config: DpsgdAudit, score_model: BgmModel, outputs: dict[bool, list[np.ndarray]]
) -> GameScores:
    backend = select_backend("numpy")
    background = -1.0 if config.threat_model == "partially-informed" else 0.0
    return GameScores(
        *(
            backend.to_numpy(
                score_model.score(
                    backend, _as_rows(np.stack(outputs[side]) - background, score_model)
                )
            )
            for side in (True, False)
        )
    )


def _as_rows(outputs: np.ndarray, model: BgmModel) -> np.ndarray:
    """Arrange (games × steps) outputs as the score model's rows: (games·epochs × slots) for a slot
    model (its support only), unchanged for independent steps and membership patterns."""
    outputs = outputs.astype(np.float32)
    if not isinstance(model, SlotModel):
        return outputs
    weights = np.asarray(model.slot_weights)
    rows = outputs.reshape(outputs.shape[0] * model.epochs, weights.size)[:, weights > 0]
    if model.same_slot_every_epoch:
        return np.ascontiguousarray(rows.reshape(outputs.shape[0], model.epochs, -1).sum(axis=1))
    return np.ascontiguousarray(rows)
