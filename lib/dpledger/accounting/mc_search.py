"""The Monte Carlo σ search on common random numbers (004 Alg. 2): bracket σ on a pilot, keep only
the samples whose loss can exceed ε inside the bracket, and bisect on them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from dpledger.accounting.montecarlo import (
    DominatingPair,
    Draw,
    PreparedPair,
    correlate,
    draws,
    hockey_stick,
    losses,
    single_threaded,
)


@dataclass(frozen=True)
class SigmaSearch:
    """Result of Alg. 2: σ with δ̂(σ) = δ on common random numbers, and what the search did.

    ``kept`` holds the samples whose loss can exceed ε near σ (all others contribute 0 there), so a
    caller can differentiate δ̂ at σ through them (004 §4.2).
    """

    noise_multiplier: float
    delta_hat: float
    samples: int
    survivors: int
    passes: int
    kept: list[list[Draw]] = field(default_factory=list, repr=False)


@single_threaded
def calibrate_sigma(
    pair: DominatingPair,
    epsilon: float,
    delta: float,
    samples: int,
    seed: int,
    upper: float,
    pilot_samples: int = 1 << 14,
    chunk: int | None = None,
    tolerance: float = 1e-7,
    guess: float | None = None,
    device: torch.device = torch.device("cpu"),
) -> SigmaSearch:
    """Smallest σ (to ``tolerance`` relative) with δ̂(σ) <= δ on ``samples`` fixed samples (004 Alg.
    2).

    ``upper`` is a σ known to satisfy the target (the unamplified Gaussian's). A pilot on the first
    ``pilot_samples`` samples brackets σ (or ``guess`` does, e.g. the previous σ while optimizing
    C); one pass over all samples then keeps only those whose loss can exceed ε anywhere in the
    bracket (the rest contribute 0 there), and bisection runs on them.
    """
    prepared = PreparedPair(pair, device)
    if guess is None:
        pilot = _Survivors.collect(
            prepared, min(pilot_samples, samples), seed, chunk, epsilon, upper / 1e4, upper
        )
        guess = pilot.bisect(epsilon, delta, upper / 1e4, upper, tolerance=1e-3)
    low, high = guess / 1.1, min(guess * 1.1, upper)
    for passes in range(1, 60):
        survivors = _Survivors.collect(prepared, samples, seed, chunk, epsilon, low, high)
        if survivors.delta_hat(epsilon, low) <= delta and low > upper / 1e6:
            low, high = low / 1.5, low
            continue
        if survivors.delta_hat(epsilon, high) > delta:
            if high >= upper:
                return SigmaSearch(
                    upper,
                    survivors.delta_hat(epsilon, high),
                    samples,
                    survivors.size,
                    passes,
                    survivors.chunks,
                )
            low, high = high, min(high * 1.5, upper)
            continue
        sigma = survivors.bisect(epsilon, delta, low, high, tolerance)
        return SigmaSearch(
            sigma,
            survivors.delta_hat(epsilon, sigma),
            samples,
            survivors.size,
            passes,
            survivors.chunks,
        )
    raise RuntimeError("Monte Carlo σ search did not bracket the target")


@dataclass
class _Survivors:
    """Samples whose loss can exceed ε for σ in [low, high]; δ̂ there is their sum over all
    samples."""

    prepared: PreparedPair
    chunks: list[list[Draw]]
    samples: int
    correlated: list[list[torch.Tensor]] | None = None

    @property
    def size(self) -> int:
        return sum(int(chunk[0].bins.shape[0]) for chunk in self.chunks)

    @classmethod
    def collect(
        cls,
        prepared: PreparedPair,
        samples: int,
        seed: int,
        chunk: int | None,
        epsilon: float,
        low: float,
        high: float,
    ) -> "_Survivors":
        kept = []
        for piece in draws(prepared.pair, samples, seed, chunk, prepared.device):
            remove, add, scale = prepared.chunk_loss_bounds(piece, low, high)
            threshold = epsilon - 1e-3 - 1e-5 * scale
            mask = (remove > threshold) | (add > threshold)
            if bool(mask.any()):
                kept.append([Draw(d.bins[mask], d.normals[mask]) for d in piece])
        return cls(prepared, kept, samples)

    def delta_hat(self, epsilon: float, sigma: float) -> float:
        if self.correlated is None:
            self.correlated = [
                [
                    correlate(d.normals.to(torch.float64), f, diag)
                    for d, f, diag in zip(piece, self.prepared.factors, self.prepared.diagonal)
                ]
                for piece in self.chunks
            ]
        totals = np.zeros(2)
        for piece, correlated in zip(self.chunks, self.correlated):
            remove = add = 0.0
            for draw, values, gram in zip(piece, correlated, self.prepared.grams):
                piece_remove, piece_add = losses(gram, draw.bins, values, sigma)
                remove, add = remove + piece_remove, add + piece_add
            totals += [
                float(hockey_stick(remove, epsilon).sum()),
                float(hockey_stick(add, epsilon).sum()),
            ]
        return float(totals.max() / self.samples)

    def bisect(
        self, epsilon: float, delta: float, low: float, high: float, tolerance: float
    ) -> float:
        while high - low > tolerance * high:
            mid = 0.5 * (low + high)
            low, high = (mid, high) if self.delta_hat(epsilon, mid) > delta else (low, mid)
        return high
