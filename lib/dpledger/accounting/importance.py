"""Importance sampling for Estimate-Verify-Release, with weights bounded so the KL bound still
applies.

For one piece (bins fixed across epochs: one Gram matrix G) the privacy loss of each direction is
bounded by a function whose super-level set at ε is a union of half-spaces of U ~ N(0, G) with exact
Gaussian probabilities (notation of :mod:`montecarlo`, a_i the LSE's terms):

- remove (x ~ P, bin k uniform): Y = LSE_i(a_i) − log b <= max_i a_i, so Y > ε implies U ∈ A_k = ∪_i
  {U_i > t_ki}, t_ki = (σ²ε − G_ki + G_ii/2)/σ, with p_ki = P(U_i > t_ki) = Φ̄(t_ki/√G_ii) (0 where
  G_ii = 0: that term is 0 < ε).
- add (x ~ Q): Y = log b − LSE_i(a_i) <= −mean_i a_i (Jensen), so Y > ε implies 1ᵀU < s* =
  (Σ_i G_ii/2 − bσ²ε)/σ, with p = Φ(s*/√(1ᵀG1)).

Proposals: remove draws (k, i) with probability p_ki / Σ p, then U ~ N(0, G) conditioned on U_i >
t_ki; its density is φ_G(U)·N_k(U)/Σ p with N_k(U) = #{i : U_i > t_ki} >= 1, so the weight is w =
dP/dQ = M/N_k(U) with M = Σ_{k,i} p_ki / b (the mean of the per-bin union bounds). Add draws U
conditioned on 1ᵀU < s*, weight w = p =: M. In both directions f = (1 − e^{ε−Y})_+ vanishes outside
the proposal's support, so E_Q[f·w] = δ exactly and 0 <= f·w <= M (f <= 1, N_k >= 1). Hence also δ
<= M deterministically.

Verification bound: X = f·w/M ∈ [0, 1] has mean δ/M, so the Chernoff–Hoeffding KL bound of
:mod:`evr` applies to X with threshold τ/M: P(mean X <= τ/M | true δ >= δ_target) <= exp(−m·kl(τ/M ‖
δ_target/M)), and m = ⌈ln(1/β)/kl(τ/M ‖ δ/M)⌉ ≈ M × the plain count; where M <= δ no sample is
needed. It pays where M < 1, i.e. where the union of the per-coordinate tails is rare (large ε for
b; small b); with many bins and small per-step noise (004's 128 bins × 16 epochs at ε = 1: M ≈ 10)
plain sampling is cheaper and is chosen. Several pieces (bins redrawn every epoch) add their losses,
and the per-piece union does not bound the sum: plain sampling is used there.

Truncated normals are drawn by inverse CDF in float64, z = −Φ⁻¹(u·Φ(−s)) with u ∈ (0, 1], which is
exact in the far tail z > s; the untruncated side is cut at about 8.2 standard deviations (53-bit
uniforms), a total variation below 1e-15. The other coordinates follow the Gaussian conditional: U =
U_i·g/g_i + (U' − U'_i·g/g_i), g = G[:, i], U' a fresh N(0, G) draw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from dpledger.accounting import evr
from dpledger.accounting import montecarlo as mc


@dataclass(frozen=True)
class Proposal:
    """The tilted proposal of one direction: its bound M and what sampling it needs."""

    direction: str
    bound: float
    probabilities: torch.Tensor  # remove: p_ki over (k, i) flattened; add: the single p
    thresholds: torch.Tensor  # remove: t_ki (b × b); add: s* (scalar)


@dataclass(frozen=True)
class ImportanceEstimate:
    """mean(f·w) of one direction from ``samples`` draws, its standard error, and the largest f·w
    seen (<= bound). With no draws (bound <= δ) the estimate is the bound itself."""

    direction: str
    delta: float
    stderr: float
    bound: float
    samples: int
    largest: float


@dataclass(frozen=True)
class Verification:
    """Both directions' importance-sampled estimates, read like
    :class:`montecarlo.DeltaEstimate`."""

    parts: tuple[ImportanceEstimate, ImportanceEstimate]

    @property
    def delta(self) -> float:
        return max(p.delta for p in self.parts)

    @property
    def delta_remove(self) -> float:
        return self.parts[0].delta

    @property
    def delta_add(self) -> float:
        return self.parts[1].delta

    @property
    def stderr(self) -> float:
        return max(self.parts, key=lambda p: p.delta).stderr

    @property
    def interval(self) -> tuple[float, float]:
        return (max(self.delta - 1.96 * self.stderr, 0.0), self.delta + 1.96 * self.stderr)


def proposals(gram: torch.Tensor, sigma: float, epsilon: float) -> tuple[Proposal, Proposal]:
    """(remove, add) proposals of the one-piece pair with Gram matrix ``gram`` (float64) at (σ,
    ε)."""
    gram = gram.to(torch.float64)
    bins = gram.shape[0]
    diagonal = torch.diagonal(gram)
    thresholds = (sigma**2 * epsilon - gram + diagonal / 2) / sigma
    scale = diagonal.clamp(min=0).sqrt()
    used = (scale > 0).expand(bins, bins)
    log_p = torch.special.log_ndtr(-thresholds / torch.where(scale > 0, scale, 1.0))
    probabilities = torch.where(used, log_p.exp(), torch.zeros((), dtype=torch.float64))
    remove = Proposal(
        "remove", float(probabilities.sum()) / bins, probabilities.reshape(-1), thresholds
    )
    spread = max(float(gram.sum()), 0.0) ** 0.5
    cut = (float(diagonal.sum()) / 2 - bins * sigma**2 * epsilon) / sigma
    p_add = (
        float(torch.special.ndtr(torch.tensor(cut / spread, dtype=torch.float64)))
        if spread > 0
        else float(cut > 0)
    )
    add = Proposal(
        "add",
        p_add,
        torch.tensor([p_add], dtype=torch.float64),
        torch.tensor(cut, dtype=torch.float64),
    )
    return remove, add


def samples_needed(bound: float, failure: float, delta: float, threshold: float) -> int:
    """Fresh draws for the KL bound on f·w/M (module docstring); 0 where M <= δ (δ <= M proves
    it)."""
    if bound <= delta:
        return 0
    return evr.samples_for(failure, delta / bound, threshold / bound)


def _inputs(
    seed: int, block: int, rows: int, bins: int, probabilities: torch.Tensor, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(category, uniform in (0, 1], N(0, I_b) rows) of one block, seeded from (seed, block)
    alone."""
    key = np.random.SeedSequence((int(seed), block, 7919)).generate_state(2, np.uint64)
    if device.type == "cuda":
        generator = torch.Generator(device=device)
        generator.manual_seed(int(key[0] >> np.uint64(1)))
        category = torch.multinomial(
            probabilities.to(device), rows, replacement=True, generator=generator
        )
        uniform = 1.0 - torch.rand(rows, generator=generator, device=device, dtype=torch.float64)
        normals = torch.randn((rows, bins), generator=generator, device=device, dtype=torch.float64)
        return category, uniform, normals
    rng = np.random.Generator(np.random.SFC64(key))
    weights = probabilities.cpu().numpy()
    category = np.searchsorted(np.cumsum(weights / weights.sum()), rng.random(rows), side="right")
    category = np.minimum(category, weights.size - 1)
    return (
        torch.from_numpy(category),
        torch.from_numpy(1.0 - rng.random(rows)),
        torch.from_numpy(rng.standard_normal((rows, bins))),
    )


def _tail(uniform: torch.Tensor, cut: torch.Tensor) -> torch.Tensor:
    """z ~ N(0, 1) conditioned on z > cut, by inverse CDF: −Φ⁻¹(u·Φ(−cut)), exact far in the
    tail."""
    return -torch.special.ndtri(uniform * torch.special.log_ndtr(-cut).exp())


def conditioned(
    normals: torch.Tensor,
    factor: torch.Tensor,
    direction: torch.Tensor,
    spread: torch.Tensor,
    value: torch.Tensor,
) -> torch.Tensor:
    """Rows of U ~ N(0, G) conditioned on dᵀU = value, given d and Gd per row (``direction``,
    ``spread``): U = value·Gd/(dᵀGd) + (U' − dᵀU'·Gd/(dᵀGd)), U' = normals·Fᵀ (U − value·Gd/dᵀGd is
    independent of dᵀU)."""
    fresh = normals @ factor.T
    variance = (spread * direction).sum(dim=1, keepdim=True)
    projection = (fresh * direction).sum(dim=1, keepdim=True)
    return fresh + (value[:, None] - projection) * spread / variance


@mc.single_threaded
def estimate(
    gram: np.ndarray,
    proposal: Proposal,
    sigma: float,
    epsilon: float,
    samples: int,
    seed: int,
    device: torch.device = torch.device("cpu"),
) -> ImportanceEstimate:
    """mean(f·w) over ``samples`` draws from ``proposal`` (float64), in blocks of mc.BLOCK."""
    gram_t = torch.as_tensor(gram, dtype=torch.float64, device=device)
    factor = mc.gram_factor(gram_t)
    bins = gram_t.shape[0]
    thresholds = proposal.thresholds.to(device)
    if samples == 0:
        return ImportanceEstimate(proposal.direction, proposal.bound, 0.0, proposal.bound, 0, 0.0)
    total, squares, largest = 0.0, 0.0, 0.0
    for block in range(math.ceil(samples / mc.BLOCK)):
        rows = min(mc.BLOCK, samples - block * mc.BLOCK)
        category, uniform, normals = _inputs(
            seed, block, rows, bins, proposal.probabilities, device
        )
        category, uniform = category.to(device), uniform.to(device)
        if proposal.direction == "remove":
            bin_index, coordinate = category // bins, category % bins
            scale = torch.diagonal(gram_t)[coordinate].sqrt()
            value = _tail(uniform, thresholds[bin_index, coordinate] / scale) * scale
            direction = torch.nn.functional.one_hot(coordinate, bins).to(torch.float64)
            correlated = conditioned(normals, factor, direction, gram_t[coordinate], value)
            correlated[torch.arange(rows, device=device), coordinate] = value
            possible = proposal.probabilities.to(device).reshape(bins, bins)[bin_index] > 0
            hits = (correlated >= thresholds[bin_index]) & possible
            weight = proposal.bound / hits.sum(dim=1).clamp(min=1).to(torch.float64)
            loss, _ = mc.losses(gram_t, bin_index, correlated, sigma)
        else:
            spread = float(gram_t.sum()) ** 0.5
            value = -_tail(uniform, -thresholds / spread) * spread
            direction = torch.ones((rows, bins), dtype=torch.float64, device=device)
            correlated = conditioned(
                normals, factor, direction, gram_t.sum(dim=0).expand(rows, bins), value
            )
            weight = torch.full((rows,), proposal.bound, dtype=torch.float64, device=device)
            _, loss = mc.losses(
                gram_t, torch.zeros(rows, dtype=torch.long, device=device), correlated, sigma
            )
        terms = mc.hockey_stick(loss, epsilon) * weight
        total += float(terms.sum())
        squares += float((terms**2).sum())
        largest = max(largest, float(terms.max()))
    mean = total / samples
    stderr = math.sqrt(max(squares / samples - mean**2, 0.0) / samples)
    return ImportanceEstimate(proposal.direction, mean, stderr, proposal.bound, samples, largest)


def verify(
    gram: np.ndarray,
    proposals: tuple[Proposal, Proposal],
    counts: tuple[int, int],
    sigma: float,
    epsilon: float,
    seed: int,
    device: torch.device = torch.device("cpu"),
) -> Verification:
    """Both directions on their own fresh draws (seeds ``seed`` and ``seed + 1``)."""
    return Verification(
        tuple(
            estimate(gram, p, sigma, epsilon, m, seed + k, device)
            for k, (p, m) in enumerate(zip(proposals, counts))
        )
    )
