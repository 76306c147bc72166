"""Output models of the batched Gaussian mechanism (002 App. A) seen from one record, with exact
likelihood-ratio scores (002 §3.3).

Every released batch sum is ``background + shift + N(0, σ²)``. The background (the other records'
known contribution) is subtracted before scoring, so a model describes only the deviation: where the
record under test lands (a slot per epoch, independent steps, or a set of steps) and by how much it
shifts its batch under D (target present, ``shift_present``) and under D' (target zeroed out,
``shift_absent``). The score of an observation is log p_D(x)/p_D'(x), marginalized over where the
record landed: the most powerful statistic for the pair.

Each model simulates a chunk of games (``simulate``) and scores it (``score``) with operations
common to numpy and torch, so the same code runs on the CPU and on a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from dpledger import validation
from dpledger.audit.backend import Backend
from dpledger.errors import ParamsError

PatternSource = Callable[[np.random.Generator, int], np.ndarray]


def _check_shifts(noise_multiplier: float, shift_present: float, shift_absent: float) -> None:
    if not noise_multiplier > 0:
        raise validation.invalid(
            "noise_multiplier", noise_multiplier, "it must be > 0", where="audit"
        )
    if not (shift_present > 0 and shift_absent >= 0):
        raise ParamsError(
            f"audit: shifts (present {shift_present}, absent {shift_absent}) are invalid: "
            f"present must be > 0 and absent >= 0"
        )


def _float64(xp: Any, x: Any) -> Any:
    return x.astype(np.float64) if xp is np else x.double()


def _logsumexp(xp: Any, a: Any) -> Any:
    """Row-wise log Σ exp(a) over the last axis, stable."""
    top = xp.amax(a, axis=-1, keepdims=True)
    return xp.log(xp.sum(xp.exp(a - top), axis=-1)) + top[..., 0]


@dataclass(frozen=True)
class SlotModel:
    """The record lands in exactly one of T slots (batches) per epoch, slot t with probability
    ``slot_weights[t]``: drawn afresh every epoch (shuffle, redrawn bins, partial shuffle,
    batch-then-shuffle), or once for all epochs (``same_slot_every_epoch``: balls-in-bins with fixed
    bins, sequential). Score per epoch: log Σ_t w_t N(x_t; Δ₁)/N(x_t; 0) − log Σ_t w_t N(x_t;
    Δ₀)/N(x_t; 0) (002 §3.3, log domain), summed over epochs (002 §4.2).

    With a slot shared by all epochs the per-slot sums over epochs are a sufficient statistic
    (y_t ~ N(E·Δ·[t = J], E·σ²)), so the slot is marginalized once and E epochs cost one.
    """

    noise_multiplier: float
    epochs: int
    slot_weights: tuple[float, ...]
    shift_present: float
    shift_absent: float
    same_slot_every_epoch: bool = False

    def __post_init__(self) -> None:
        _check_shifts(self.noise_multiplier, self.shift_present, self.shift_absent)
        weights = np.asarray(self.slot_weights, dtype=np.float64)
        if weights.ndim != 1 or weights.size == 0 or np.any(weights < 0) or not weights.sum() > 0:
            raise ParamsError(
                "audit: slot_weights must be a non-empty list of non-negative numbers"
            )
        if self.epochs < 1:
            raise validation.invalid("epochs", self.epochs, "it must be >= 1", where="audit")

    @property
    def _support_weights(self) -> np.ndarray:
        """Probabilities of the slots the record can land in; other slots carry no information."""
        weights = np.asarray(self.slot_weights, dtype=np.float64)
        weights = weights[weights > 0]
        return weights / weights.sum()

    @property
    def _uniform(self) -> bool:
        weights = self._support_weights
        return bool(np.allclose(weights, weights[0]))

    @property
    def _rows_per_game(self) -> int:
        return 1 if self.same_slot_every_epoch else self.epochs

    @property
    def _scale(self) -> float:
        """Shift and noise multiplier of one simulated row (epochs merged when the slot is
        shared)."""
        return float(self.epochs) if self.same_slot_every_epoch else 1.0

    @property
    def _std(self) -> float:
        return self.noise_multiplier * math.sqrt(self._scale)

    def simulate(self, backend: Backend, generator: Any, games: int, present: bool) -> Any:
        weights = self._support_weights
        rows = games * self._rows_per_game
        x = backend.normal(generator, (rows, weights.size), self._std)
        shift = (self.shift_present if present else self.shift_absent) * self._scale
        if shift == 0:
            return x
        xp = backend.xp
        if self._uniform:
            x[:, 0] += shift  # slots are exchangeable in the score: put the record in slot 0 (WLOG)
            return x
        cumulative = backend.asarray(np.cumsum(weights)[:-1])
        slots = xp.searchsorted(cumulative, backend.uniform(generator, (rows,)), side="right")
        x[xp.arange(rows, device=backend.device), slots] += shift
        return x

    def score(self, backend: Backend, x: Any) -> Any:
        """Scores of the games in ``x`` (which is overwritten: the kernel works in place)."""
        xp = backend.xp
        inv_var = 1.0 / self._std**2
        present, absent = self.shift_present * self._scale, self.shift_absent * self._scale
        top = xp.amax(x, axis=-1, keepdims=True)
        x -= top  # every exponent below is <= 0: no overflow
        log_present, log_absent = self._log_sums(backend, x, inv_var, present, absent)
        per_row = (
            log_present
            - log_absent
            + _float64(xp, top[:, 0]) * ((present - absent) * inv_var)
            - (present**2 - absent**2) * inv_var / 2.0
        )
        return xp.sum(xp.reshape(per_row, (-1, self._rows_per_game)), axis=1)

    def _log_sums(
        self, backend: Backend, x: Any, inv_var: float, present: float, absent: float
    ) -> tuple[Any, Any]:
        """(log Σ_t w_t e^{Δ₁ x_t/s²}, log Σ_t w_t e^{Δ₀ x_t/s²}); for uniform weights e^{2a} is
        computed as (e^a)² when Δ₁ = 2Δ₀ (shuffle, Partially-Informed): one exponential per
        entry."""
        xp = backend.xp
        weights = self._support_weights
        if self._uniform and absent > 0 and present == 2 * absent:
            x *= absent * inv_var
            xp.exp(x, out=x)
            log_absent = xp.log(xp.sum(x, axis=-1, dtype=xp.float64))
            x *= x
            return xp.log(xp.sum(x, axis=-1, dtype=xp.float64)), log_absent
        log_w = (
            -math.log(weights.size)
            if self._uniform
            else backend.asarray(np.log(weights).astype(np.float32))
        )

        def log_sum(shift: float) -> Any:
            return xp.log(xp.sum(xp.exp(x * (shift * inv_var) + log_w), axis=-1, dtype=xp.float64))

        return log_sum(present), (log_sum(absent) if absent > 0 else 0.0)


@dataclass(frozen=True)
class StepMixtureModel:
    """The record joins each of ``steps`` steps independently with probability q (Poisson,
    fixed-size subsets drawn fresh each step). Exact ratio: Σ_s log[(1−q) + q·N(x_s;Δ₁)/N(x_s;0)] −
    log[(1−q) + q·N(x_s;Δ₀)/N(x_s;0)]."""

    noise_multiplier: float
    steps: int
    inclusion_probability: float
    shift_present: float
    shift_absent: float

    def __post_init__(self) -> None:
        _check_shifts(self.noise_multiplier, self.shift_present, self.shift_absent)
        validation.within(
            "inclusion probability",
            self.inclusion_probability,
            0,
            1,
            interval="left-open",
            where="audit",
        )
        if self.steps < 1:
            raise validation.invalid("steps", self.steps, "it must be >= 1", where="audit")

    def simulate(self, backend: Backend, generator: Any, games: int, present: bool) -> Any:
        x = backend.normal(generator, (games, self.steps), self.noise_multiplier)
        shift = self.shift_present if present else self.shift_absent
        if shift == 0:
            return x
        joined = backend.uniform(generator, (games, self.steps)) < self.inclusion_probability
        return x + joined * np.float32(shift)

    def score(self, backend: Backend, x: Any) -> Any:
        xp = backend.xp
        x = _float64(xp, x)
        q = self.inclusion_probability
        log_stay = math.log1p(-q) if q < 1 else -math.inf
        inv_var = 1.0 / self.noise_multiplier**2

        def log_mixture(shift: float) -> Any:
            ratio = x * (shift * inv_var) - shift**2 * inv_var / 2.0 + math.log(q)
            return xp.logaddexp(xp.full_like(ratio, log_stay), ratio)

        total = xp.sum(log_mixture(self.shift_present), axis=1)
        if self.shift_absent > 0:
            total = total - xp.sum(log_mixture(self.shift_absent), axis=1)
        return total


@dataclass(frozen=True)
class PatternModel:
    """The record's step memberships come from running a sampler (plugins and samplers without a
    closed form). ``draw_patterns(rng, n)`` returns n fresh (n × steps) membership counts for the
    record; ``score_patterns`` (M × steps, drawn independently of the audited games) define the
    score log mean_m N(x; Δ₁·p_m)/N(x; 0) − log mean_m N(x; Δ₀·p_m)/N(x; 0): the exact ratio with
    the sampler's law replaced by M draws from it (any fixed score gives a valid audit)."""

    noise_multiplier: float
    score_patterns: np.ndarray
    draw_patterns: PatternSource
    shift_present: float
    shift_absent: float

    def __post_init__(self) -> None:
        _check_shifts(self.noise_multiplier, self.shift_present, self.shift_absent)
        if self.score_patterns.ndim != 2 or self.score_patterns.shape[0] < 1:
            raise ParamsError("audit: score_patterns must be a non-empty (patterns × steps) matrix")

    def simulate(self, backend: Backend, generator: Any, games: int, present: bool) -> Any:
        steps = self.score_patterns.shape[1]
        x = backend.normal(generator, (games, steps), self.noise_multiplier)
        shift = self.shift_present if present else self.shift_absent
        if shift == 0:
            return x
        rng = np.random.default_rng(backend.integer_seed(generator))
        patterns = self.draw_patterns(rng, games).astype(np.float32)
        return x + backend.asarray(patterns) * np.float32(shift)

    def score(self, backend: Backend, x: Any) -> Any:
        xp = backend.xp
        patterns = backend.asarray(self.score_patterns.astype(np.float64))
        projections = _float64(xp, x) @ patterns.T
        norms = xp.sum(patterns * patterns, axis=1)
        inv_var = 1.0 / self.noise_multiplier**2

        def log_mean(shift: float) -> Any:
            exponents = projections * (shift * inv_var) - norms * (shift**2 * inv_var / 2.0)
            return _logsumexp(xp, exponents) - math.log(patterns.shape[0])

        total = log_mean(self.shift_present)
        if self.shift_absent > 0:
            total = total - log_mean(self.shift_absent)
        return total


BgmModel = SlotModel | StepMixtureModel | PatternModel
