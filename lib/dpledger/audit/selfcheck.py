"""Self-check of the estimator: audit, many times, a mechanism whose ε is known, and count false
alarms.

A valid threshold method reports ε_emp > ε (a false alarm) in at most 1 − confidence of the audits.

- ``laplace``: output Laplace(1, 1/ε) on D vs Laplace(0, 1/ε) on D' (pure ε-DP). Every threshold
  above 1 has (1 − FNR)/FPR = e^ε exactly, so every threshold is tight: the hardest case for a
  method that takes a maximum over thresholds.
- ``poisson``: the batched Gaussian mechanism with Poisson sampling against its PLD ε (the
  accountant is pessimistic, so the true ε is at most the claim).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from tqdm import tqdm

from dpledger import validation
from dpledger.audit.bgm import accounted_epsilon, simulate_bgm
from dpledger.audit.estimate import clopper_pearson_upper, estimate_epsilon
from dpledger.audit.samplers import audited_sampler
from dpledger.errors import ParamsError
from dpledger.params.bounds import MAX_SELFCHECK_OBSERVATIONS, refuse_beyond

SELFCHECK_MECHANISMS = ("laplace", "poisson")

ScoreDraw = Callable[[int], tuple[np.ndarray, np.ndarray]]
"""Repeat index -> the scores of the games with the canary present and with it absent."""


@dataclass(frozen=True)
class SelfCheck:
    """False alarms of ``method`` over ``repeats`` audits of a mechanism with known
    ``epsilon_true``."""

    mechanism: str
    method: str
    epsilon_true: float
    repeats: int
    observations: int
    confidence: float
    false_alarms: int
    false_alarm_rate: float
    false_alarm_rate_upper: float
    allowed_rate: float
    epsilon_emp: list[float]

    @property
    def passed(self) -> bool:
        """No evidence (at 95%) that the false-alarm rate exceeds 1 − confidence."""
        lower = 1.0 - float(
            clopper_pearson_upper(self.repeats - self.false_alarms, self.repeats, 0.05)
        )
        return lower <= self.allowed_rate

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


def run_selfcheck(
    mechanism: str = "laplace",
    *,
    method: str = "bonferroni",
    repeats: int = 100,
    observations: int = 20_000,
    epsilon: float = 1.0,
    steps: int = 100,
    noise_multiplier: float = 1.0,
    delta: float = 1e-5,
    confidence: float = 0.95,
    seed: int = 0,
    progress: bool = True,
) -> SelfCheck:
    """Run ``repeats`` audits of ``observations`` games each; ``epsilon`` is the Laplace ε,
    ``steps`` and ``noise_multiplier`` set the Poisson BGM (q = 1/steps, one epoch)."""
    validation.one_of("mechanism", mechanism, SELFCHECK_MECHANISMS, where="audit selfcheck")
    _check_sizes(repeats, observations)
    games = observations // 2
    streams = np.random.SeedSequence(seed).spawn(repeats)
    epsilon_true, scores = _known_mechanism(
        mechanism, games, streams, epsilon, steps, noise_multiplier, delta
    )
    estimates = []
    for index in tqdm(
        range(repeats), desc=f"selfcheck ({mechanism}, {method})", disable=not progress, leave=False
    ):
        present, absent = scores(index)
        estimates.append(
            estimate_epsilon(
                present, absent, delta=delta, confidence=confidence, method=method
            ).epsilon
        )
    alarms = int(np.sum(np.asarray(estimates) > epsilon_true))
    return SelfCheck(
        mechanism=mechanism,
        method=method,
        epsilon_true=float(epsilon_true),
        repeats=repeats,
        observations=2 * games,
        confidence=confidence,
        false_alarms=alarms,
        false_alarm_rate=alarms / repeats,
        false_alarm_rate_upper=float(clopper_pearson_upper(alarms, repeats, 0.05)),
        allowed_rate=1.0 - confidence,
        epsilon_emp=[float(e) for e in estimates],
    )


def _check_sizes(repeats: int, observations: int) -> None:
    """Refuse (one line) too few repeats or observations, or more games than the bound allows."""
    if repeats < 1 or observations < 4:
        raise ParamsError(
            f"audit selfcheck: repeats = {repeats}, observations = {observations}: "
            "need repeats >= 1 and observations >= 4"
        )
    refuse_beyond(
        f"audit selfcheck: repeats = {repeats} × observations = {observations}",
        repeats * observations,
        MAX_SELFCHECK_OBSERVATIONS,
        "games",
        "lower --repeats or --observations",
    )


def _known_mechanism(
    mechanism: str,
    games: int,
    streams: list[np.random.SeedSequence],
    epsilon: float,
    steps: int,
    noise_multiplier: float,
    delta: float,
) -> tuple[float, ScoreDraw]:
    """The mechanism's true ε and its draw of ``games`` present and absent scores per repeat (each
    repeat from its own stream)."""
    if mechanism == "laplace":
        epsilon_true = epsilon

        def scores(index: int) -> tuple[np.ndarray, np.ndarray]:
            rng = np.random.default_rng(streams[index])
            return rng.laplace(1.0, 1.0 / epsilon, games), rng.laplace(0.0, 1.0 / epsilon, games)
    else:
        audited = audited_sampler(
            "poisson", dataset_size=steps, batch_size=1, epochs=1, noise_multiplier=noise_multiplier
        )
        epsilon_true = accounted_epsilon(
            "poisson",
            noise_multiplier=noise_multiplier,
            dataset_size=steps,
            batch_size=1,
            steps=steps,
            delta=delta,
        )

        def scores(index: int) -> tuple[np.ndarray, np.ndarray]:
            seed_index = int(streams[index].generate_state(1)[0])
            game_scores, _ = simulate_bgm(
                audited, 2 * games, seed=seed_index, backend="numpy", progress=False
            )
            return game_scores.present, game_scores.absent

    return epsilon_true, scores
