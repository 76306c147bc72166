"""DP-SGD (Audit), 002 Alg. 1: gradient canaries in real training runs, under three threat models.

Each game trains a fresh model with dpledger's engine (``BKEngine``, exact per-example clipping)
on the embedded data, with a fresh sampler seed, and releases per step o_t = ⟨g̃_t, ĝ⟩/C², where g̃_t
is the engine's noisy clipped sum and ĝ a random canary of norm C (so the canary counts ±1 and the
noise is N(0, σ²); 002 digest §3.4 scaling). The audited record is example 0; its gradient is the
canary (D) or zero (D'), added through the engine's canary hook instead of its own gradient.

- ``natural``: only the record's canary (means 0 / +1; Λ^N).
- ``partially-informed``: also −ĝ in place of the last example of every batch holding neither the
  record nor ⊥ (means −1 / +1 / 0; Λ^PI, 002 §5.3).
- ``worst-case``: equivalent to the batched Gaussian mechanism (002 §5.3), audited as such.

Scores are the exact likelihood ratios of the canary counts, with the natural gradients' projection
on ĝ treated as noise-free (002 §6.3.2 bias): the score is then not optimal, but the audit stays valid
because the games are real training runs.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from dpledger.audit.backend import select_backend
from dpledger.audit.bgm import accounted_epsilon, audit_bgm, claim_sample_rate
from dpledger.audit.models import BgmModel, SlotModel
from dpledger.audit.result import AuditResult, conclude
from dpledger.audit.samplers import TARGET_INDEX, audited_sampler
from dpledger.audit.simulate import GameScores
from dpledger.data import load_dataset
from dpledger.engine import BKEngine
from dpledger.errors import ParamsError
from dpledger.models import build_model
from dpledger.params.bounds import (
    MAX_DPSGD_EPOCHS,
    MAX_DPSGD_OBSERVATIONS,
    refuse_beyond,
)
from dpledger.sampling.registry import build_sampler

THREAT_MODELS = ("natural", "partially-informed", "worst-case")
SHIFTS = {"natural": (1.0, 0.0), "partially-informed": (2.0, 1.0)}


def canary_outputs(
    *,
    threat_model: str,
    present: bool,
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    sampler: str,
    batch_size: int,
    epochs: int,
    noise_multiplier: float,
    clip_norm: float,
    lr: float,
    canary: torch.Tensor,
    seed: int,
    sampler_options: dict[str, Any] | None = None,
) -> np.ndarray:
    """One game: a DP-SGD run on D (``present``) or D'; returns o_t = ⟨g̃_t, ĝ⟩/C² for every step."""
    torch.manual_seed(seed)
    model = build_model("mlp", tuple(x_train.shape[1:]), int(y_train.max()) + 1)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    engine = BKEngine(
        model, optimizer, clip_norm=clip_norm, noise_multiplier=noise_multiplier, normalizer=batch_size, seed=seed
    )
    pieces = [piece.reshape(p.shape) for piece, p in zip(torch.split(canary, [p.numel() for p in engine.params]), engine.params)]
    batches = build_sampler(
        sampler, dataset_size=x_train.shape[0], batch_size=batch_size, epochs=epochs, seed=seed, **(sampler_options or {})
    ).batches()
    outputs = []
    for batch in batches:
        indices = batch.indices[~batch.padding]
        holds_record = bool(np.any(indices == TARGET_INDEX))
        kept = indices[indices != TARGET_INDEX]
        count = 1.0 if (holds_record and present) else 0.0
        if threat_model == "partially-informed" and not holds_record and kept.size:
            kept, count = kept[:-1], -1.0
        if kept.size:
            rows = torch.as_tensor(kept, dtype=torch.long)
            engine.backward(F.cross_entropy(model(x_train[rows]), y_train[rows], reduction="none"))
        engine.step(canary=[count * piece for piece in pieces] if count else None)
        released = torch.cat([view.reshape(-1) for view in engine.last_noisy_sum])
        outputs.append(float(released @ canary) / clip_norm**2)
    engine.detach()
    return np.asarray(outputs)


def _score_model(
    threat_model: str, sampler: str, dataset_size: int, batch_size: int, epochs: int, sigma: float,
    options: dict[str, Any] | None,
):
    """The Λ^N / Λ^PI score: the sampler's placement model with the threat model's canary means (where
    the placement has no closed form, the record's memberships in pilot runs of the sampler itself)."""
    model = audited_sampler(
        sampler, dataset_size=dataset_size, batch_size=batch_size, epochs=epochs, noise_multiplier=sigma,
        options=options,
    ).model
    present, absent = SHIFTS[threat_model]
    return replace(model, shift_present=present, shift_absent=absent)


def audit_dpsgd(
    *,
    threat_model: str = "partially-informed",
    sampler: str = "shuffle",
    observations: int = 1000,
    epochs: int = 1,
    batch_size: int = 64,
    noise_multiplier: float = 1.0,
    clip_norm: float = 1.0,
    lr: float = 0.5,
    dataset_size: int | None = None,
    method: str = "bonferroni",
    delta: float = 1e-5,
    confidence: float = 0.95,
    split_fraction: float = 0.2,
    seed: int = 0,
    progress: bool = True,
    sampler_options: dict[str, Any] | None = None,
    epsilon_claimed: float | None = None,
    claim_basis: str | None = None,
) -> AuditResult:
    """Audit DP-SGD on the embedded digits data, every run batched by ``sampler`` with ``sampler_options``
    (the options the training schedule used, e.g. ``last_batch``, ``pad_truncate``, ``buffer_size``).

    The claim is ``epsilon_claimed`` (e.g. the ledger's ε, described by ``claim_basis``), by default the
    Poisson PLD ε at the same σ, q = B/n and number of steps."""
    if threat_model not in THREAT_MODELS:
        raise ParamsError(f"audit: threat_model = {threat_model!r} is invalid: allowed values are {', '.join(THREAT_MODELS)}")
    refuse_beyond(f"audit: dpsgd observations = {observations}", observations, MAX_DPSGD_OBSERVATIONS,
                  "training runs", "lower audit.dpsgd_observations")
    refuse_beyond(f"audit: dpsgd observations = {observations} × epochs = {epochs}", observations * epochs,
                  MAX_DPSGD_EPOCHS, "epochs of training", "lower the observations or the epochs")
    data = load_dataset("digits", None, 0.2, seed)
    n = data.train_size if dataset_size is None else dataset_size
    if not batch_size <= n <= data.train_size:
        raise ParamsError(f"audit: dataset_size = {n} is invalid: it must be in [batch_size, {data.train_size}]")
    if threat_model == "worst-case":
        result, _ = audit_bgm(
            sampler, dataset_size=n, batch_size=batch_size, epochs=epochs, noise_multiplier=noise_multiplier,
            observations=observations, delta=delta, confidence=confidence, method=method,
            split_fraction=split_fraction, epsilon_claimed=epsilon_claimed, claim_basis=claim_basis,
            options=sampler_options, seed=seed, progress=progress,
        )
        return replace(result, audit="dpsgd-worst-case")
    if observations < 4 or observations % 2:
        raise ParamsError(f"audit: observations = {observations} is invalid: it must be an even number >= 4")
    score_model = _score_model(threat_model, sampler, n, batch_size, epochs, noise_multiplier, sampler_options)
    x_train = torch.as_tensor(data.x_train[:n])
    y_train = torch.as_tensor(data.y_train[:n])
    generator = torch.Generator().manual_seed(seed)
    numel = sum(p.numel() for p in build_model("mlp", tuple(x_train.shape[1:]), int(y_train.max()) + 1).parameters())
    canary = torch.randn(numel, generator=generator)
    canary *= clip_norm / canary.norm()
    games = observations // 2
    started = time.perf_counter()
    outputs: dict[bool, list[np.ndarray]] = {True: [], False: []}
    seeds = np.random.SeedSequence(seed).generate_state(2 * games)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny per-step tensors: intra-op threads only add contention
    try:
        for index in tqdm(range(2 * games), desc=f"audit dpsgd ({threat_model})", disable=not progress, leave=False):
            present = index % 2 == 0
            outputs[present].append(canary_outputs(
                threat_model=threat_model, present=present, x_train=x_train, y_train=y_train, sampler=sampler,
                batch_size=batch_size, epochs=epochs, noise_multiplier=noise_multiplier, clip_norm=clip_norm,
                lr=lr, canary=canary, seed=int(seeds[index]), sampler_options=sampler_options,
            ))
    finally:
        torch.set_num_threads(threads)
    seconds = time.perf_counter() - started
    backend = select_backend("numpy")
    background = -1.0 if threat_model == "partially-informed" else 0.0
    scores = GameScores(*(
        backend.to_numpy(score_model.score(backend, _as_rows(np.stack(outputs[side]) - background, score_model)))
        for side in (True, False)
    ))
    steps = len(outputs[True][0])
    if epsilon_claimed is None:
        rate = claim_sample_rate("poisson", sampler, sampler_options, n, batch_size)
        epsilon_claimed = accounted_epsilon(
            "poisson", noise_multiplier=noise_multiplier, dataset_size=n, batch_size=batch_size, steps=steps,
            delta=delta, sample_rate=rate,
        )
        q = "B/n" if rate == batch_size / n else f"{rate:g} (the sampler's sample_rate)"
        claim_basis = f"PLD accountant assuming 'poisson' sampling, q = {q}, {steps} steps"
    setting = {
        "threat_model": threat_model, "dataset": "digits", "dataset_size": n, "batch_size": batch_size,
        "epochs": epochs, "steps": steps, "noise_multiplier": noise_multiplier, "clip_norm": clip_norm, "lr": lr,
        "sampler_options": dict(sampler_options or {}), "seed": seed, "trainer": "dpledger.engine.BKEngine (exact per-example clipping, canary hook)",
    }
    assumptions = [
        f"{threat_model} threat model (002 Alg. 1): the adversary inserts gradient canaries and sees ⟨g̃_t, ĝ⟩ every step.",
        "Zero-out adjacency: the audited record's gradient is the canary on D and zero on D'.",
        "Every game is a real training run with fresh model initialisation, sampler seed and noise.",
    ]
    timing = {"wall_time_s": round(seconds, 3), "observations_per_s": round(2 * games / max(seconds, 1e-9), 2)}
    return conclude(
        scores, audit=f"dpsgd-{threat_model}", sampler=sampler, epsilon_claimed=epsilon_claimed,
        claim_basis=claim_basis or "given", delta=delta,
        confidence=confidence, method=method, split_fraction=split_fraction, setting=setting,
        assumptions=assumptions, timing=timing,
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
