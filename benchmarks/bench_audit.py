"""Audit benchmarks: generation speed against a plain numpy baseline, and the issue's acceptance
settings.

    python -m benchmarks.bench_audit                 # speed (shuffle, T = 100, E = 1), about 30 s
    python -m benchmarks.bench_audit --acceptance    # ε_emp at 10⁷ observations, Poisson repeats,
    bugs

The baseline is the direct implementation of the score (float64 normals, scipy logsumexp per
hypothesis, one thread), measured in the same run so machine load affects both sides.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import numpy as np
from scipy.special import logsumexp

from dpledger.audit.backend import select_backend
from dpledger.audit.bgm import BgmAudit, accounted_epsilon, audit_bgm
from dpledger.audit.models import SlotModel
from dpledger.audit.simulate import simulate_scores

STEPS = 100


def baseline_rate(games: int, sigma: float = 1.0) -> float:
    """Observations/s of the plain version: float64 normals, two scipy logsumexp per game."""
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    for present in (True, False):
        x = rng.standard_normal((games, STEPS)) * sigma
        x[:, 0] += 2.0 if present else 1.0
        logsumexp(2.0 * x / sigma**2, axis=1) - logsumexp(x / sigma**2, axis=1)
    return 2 * games / (time.perf_counter() - started)


def dpledger_rate(games: int, backend: str, sigma: float = 1.0) -> float:
    model = SlotModel(sigma, 1, (1.0,) * STEPS, 2.0, 1.0)
    chosen = select_backend(backend)
    simulate_scores(model, min(games, 100_000), seed=1, backend=chosen, progress=False)  # warm-up
    started = time.perf_counter()
    simulate_scores(model, games, seed=0, backend=chosen, progress=False)
    return 2 * games / (time.perf_counter() - started)


def speed(games: int) -> dict[str, float]:
    base = baseline_rate(games // 4)
    rows = {"baseline_obs_per_s": base, "numpy_obs_per_s": dpledger_rate(games, "numpy")}
    if select_backend("auto").device == "cuda":
        rows["gpu_obs_per_s"] = dpledger_rate(games * 10, "torch")
    rows["numpy_speedup"] = rows["numpy_obs_per_s"] / base
    return rows


def audit(
    sampler: str,
    sigma: float,
    observations: int,
    steps: int = STEPS,
    batch_size: int = 1,
    **options,
) -> dict:
    config = BgmAudit(
        sampler,
        dataset_size=steps * batch_size,
        batch_size=batch_size,
        epochs=1,
        noise_multiplier=sigma,
        observations=observations,
        delta=1e-5,
        options=options,
        progress=False,
    )
    result, _ = audit_bgm(config)
    summary = result.summary()
    return {
        key: summary[key]
        for key in ("epsilon_emp", "epsilon_claimed", "verdict", "observations", "wall_time_s")
    }


def sigma_for_poisson_epsilon(target: float, steps: int, batch_size: int) -> float:
    """σ at which the Poisson PLD ε of one epoch (q = 1/steps) equals ``target`` (bisection)."""
    low, high = 0.3, 60.0
    for _ in range(40):
        mid = (low * high) ** 0.5
        eps = accounted_epsilon(
            "poisson",
            noise_multiplier=mid,
            dataset_size=steps * batch_size,
            batch_size=batch_size,
            steps=steps,
            delta=1e-5,
        )
        low, high = (mid, high) if eps > target else (low, mid)
    return high


def acceptance(
    observations: int, repeats: int, poisson_observations: int, bug_observations: int
) -> dict:
    out: dict = {"shuffle": {s: audit("shuffle", s, observations) for s in (0.5, 1.0, 1.5)}}
    poisson_run = BgmAudit(
        "poisson",
        dataset_size=STEPS,
        batch_size=1,
        epochs=1,
        noise_multiplier=1.0,
        observations=poisson_observations,
        delta=1e-5,
        progress=False,
    )
    poisson = [audit_bgm(replace(poisson_run, seed=1000 + r))[0] for r in range(repeats)]
    out["poisson_repeats"] = {
        "repeats": repeats,
        "observations": poisson_observations,
        "contradictions": sum(r.judgement.verdict == "contradicted" for r in poisson),
        "epsilon_emp_max": max(r.estimate.epsilon for r in poisson),
        "epsilon_claimed": poisson[0].claim.epsilon,
    }
    bugs = {}
    for target in (0.1, 0.2, 0.4):  # 002 §7 settings: n = 10 000, B = 100, T = 100, K = 1000
        sigma = sigma_for_poisson_epsilon(target, 100, 100)
        bugs[target] = {
            "sigma": sigma,
            "shuffle": audit("shuffle", sigma, bug_observations, batch_size=100)["epsilon_emp"],
            "partial-shuffle K=1000": audit(
                "partial-shuffle", sigma, bug_observations, batch_size=100, buffer_size=1000
            )["epsilon_emp"],
            "batch-then-shuffle": audit(
                "batch-then-shuffle", sigma, bug_observations, batch_size=100
            )["epsilon_emp"],
        }
    out["bugs"] = bugs
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--games", type=int, default=2_000_000)
    parser.add_argument("--acceptance", action="store_true")
    parser.add_argument("--observations", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--poisson-observations", type=int, default=10_000_000)
    parser.add_argument("--bug-observations", type=int, default=1_000_000)
    args = parser.parse_args()
    report = {"speed_T100_E1": speed(args.games)}
    if args.acceptance:
        report["acceptance"] = acceptance(
            args.observations, args.repeats, args.poisson_observations, args.bug_observations
        )
    print(json.dumps(report, indent=2, default=float))


if __name__ == "__main__":
    main()
