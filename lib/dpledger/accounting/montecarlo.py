"""Monte Carlo accounting of balls-in-bins batching with a non-negative correlation matrix C (004
§2–4).

Dominating pair (004 Lemma 3.2): P = (1/b) Σ_i N(m_i, σ²I_n) vs Q = N(0, σ²I_n) with m_i the sum of
the columns of C in slot i of every epoch. The privacy loss of x = m_bin + σZ depends on Z only
through U = MZ ~ N(0, G), G = MMᵀ (b × b), so a sample costs O(b²) instead of O(n·b):

    remove (x ~ P):  Y = LSE_i[(G[bin, i] − G_ii/2 + σ U_i)/σ²] − log b
    add    (x ~ Q):  Y = log b − LSE_i[(σ U_i − G_ii/2)/σ²]

δ(ε) = E[(1 − e^{ε−Y})_+] is estimated for both directions and the larger is used (screened in
float32 with one exp per term, exact in float64 where the screen cannot rule a sample out:
:class:`Screen`). A pair may be a composition of independent pieces (bins redrawn every epoch: one
b-bin epoch per piece); Y adds up. Samples are generated in memory-bounded chunks from a seed, so
the same seed gives common random numbers across σ (004 Alg. 2) and a different seed gives the fresh
samples EVR needs (004 §3.4).
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from dpledger.accounting.mc_sampling import (
    BLOCK,
    CUDA_BYTES_PER_VALUE,
    CUDA_MAX_VALUES,
    CUDA_MEMORY_FRACTION,
    MEMORY_VALUES,
    DominatingPair,
    Draw,
    block_ranges,
    chunk_rows,
    chunk_values,
    draw_chunk,
    draws,
    fixed_bins_pair,
    gram_factor,
    redrawn_bins_pair,
    single_threaded,
    toeplitz_gram,
    toeplitz_modes,
)
from dpledger.precision import exactly

__all__ = [
    "BLOCK",
    "CUDA_BYTES_PER_VALUE",
    "CUDA_MAX_VALUES",
    "CUDA_MEMORY_FRACTION",
    "DeltaEstimate",
    "DominatingPair",
    "Draw",
    "KERNEL_LIMIT",
    "MEMORY_VALUES",
    "PreparedPair",
    "Screen",
    "block_ranges",
    "chunk_rows",
    "chunk_values",
    "correlate",
    "draw_chunk",
    "draws",
    "epsilon_from_losses",
    "estimate_delta",
    "fixed_bins_pair",
    "gram_factor",
    "hockey_stick",
    "losses",
    "redrawn_bins_pair",
    "single_threaded",
    "toeplitz_gram",
    "toeplitz_modes",
    "worker_count",
]
"""The pair and its samples (:mod:`.mc_sampling`) are read through this module as well."""


def correlate(normals: torch.Tensor, factor: torch.Tensor, diagonal: bool) -> torch.Tensor:
    """U = W Fᵀ, a sample of N(0, G) per row (F diagonal for C = I: O(b) instead of O(b²))."""
    if diagonal:
        return normals * torch.diagonal(factor).to(normals.dtype)
    return normals @ factor.T.to(normals.dtype)


def losses(
    gram: torch.Tensor, bins: torch.Tensor, correlated: torch.Tensor, sigma: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Privacy losses (remove, add) of one piece at noise σ (module docstring)."""
    log_bins = math.log(gram.shape[0])
    half_norms = torch.diagonal(gram) / 2
    shift = correlated * sigma - half_norms
    remove = torch.logsumexp((gram[bins] + shift) / sigma**2, dim=1) - log_bins
    add = log_bins - torch.logsumexp(shift / sigma**2, dim=1)
    return remove, add


def hockey_stick(loss: torch.Tensor, epsilon: float) -> torch.Tensor:
    """(1 − e^{ε − Y})_+ per sample; its mean is δ̂(ε)."""
    return torch.clamp(-torch.expm1(epsilon - loss), min=0.0)


KERNEL_LIMIT = 60.0


class Screen:
    """Both directions' losses at σ in float32 with one exp per term, and a bound on their rounding
    error.

    With a_i = (σU_i − G_ii/2)/σ², t = max_i a_i and e_i = e^{a_i − t}, S = Σ_i e_i:

        add    = log b − t − log S
        remove = t + log Σ_i e_i·K[bin, i] − log b,  K = e^{G/σ²}
               = t + log(S + e_bin·(e^{G_bin,bin/σ²} − 1)) − log b  for diagonal G (C = I, fixed
               bins)

    (every term is non-negative, since G >= 0 for C >= 0, so no sum cancels). Where G/σ² exceeds
    KERNEL_LIMIT (K would overflow float32) remove is the plain LSE of a_i + G[bin, i]/σ².

    a_i is computed as (W·(F/σ)ᵀ)_i − G_ii/(2σ²), W the float32 normals. Error bound (u = 2⁻²⁴): LSE
    is 1-Lipschitz in the max norm of its terms; each a_i carries a few roundings relative to |a_i|
    and G_ii/σ², plus, for a dense factor F, at most b·u·max_j|W_j|·max_i Σ_j|F_ij|/σ from the
    product. Relative to S >= 1: rounding a_i − t costs e_i·|a_i − t|·u <= u/e per term, exp a few
    u, the sum of b non-negative terms (b − 1)u, K and the product 2u; a term that underflows (e_i <
    2⁻¹²⁶) is off by at most 2⁻¹²⁶·e^{KERNEL_LIMIT}. So |Y₃₂ − Y| <= (1.4·b + 4·scale + 10)·u with
    scale = max_i |a_i| + max G/σ² (+ the factor term), and ``margin`` = 10⁻³ + 10⁻⁵·(b + scale) per
    piece exceeds it by more than 40×. A sample whose two float32 losses are both at most ε − margin
    has hockey-stick value exactly 0.
    """

    def __init__(self, prepared: "PreparedPair", sigma: float):
        self.pieces = []
        for gram, factor, diagonal in zip(prepared.grams, prepared.factors, prepared.diagonal):
            scaled = gram / sigma**2
            largest = float(scaled.max())
            fallback = largest > KERNEL_LIMIT
            self.pieces.append(
                {
                    "half": (torch.diagonal(scaled) / 2).to(torch.float32),
                    "factor": (factor / sigma).to(torch.float32),
                    "diagonal": diagonal,
                    "largest": largest,
                    "row_sum": 0.0 if diagonal else float(factor.abs().sum(dim=1).max()) / sigma,
                    "quad": scaled.to(torch.float32) if fallback else None,
                    "boost": torch.expm1(torch.diagonal(scaled)).to(torch.float32)
                    if diagonal
                    else None,
                    "kernel": None if fallback or diagonal else scaled.exp().to(torch.float32),
                }
            )

    @exactly  # the margin assumes float32 products (2⁻²⁴), not TF32: dpledger/precision.py
    def __call__(self, chunk: list[Draw]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(remove, add, margin) per sample: float32 losses within ``margin`` of the exact ones."""
        remove = add = margin = 0.0
        for draw, piece in zip(chunk, self.pieces):
            bins = piece["half"].shape[0]
            log_bins = math.log(bins)
            terms = correlate(draw.normals, piece["factor"], piece["diagonal"]).sub_(piece["half"])
            top = terms.amax(dim=1)
            scale = torch.maximum(top.abs(), terms.amin(dim=1).abs()) + piece["largest"]
            if not piece["diagonal"]:
                scale = scale + bins * piece["row_sum"] * draw.normals.abs().amax(dim=1)
            if piece["quad"] is not None:
                piece_remove = torch.logsumexp(terms + piece["quad"][draw.bins], dim=1) - log_bins
            exponentials = terms.sub_(top[:, None]).exp_()
            total = exponentials.sum(dim=1)
            if piece["diagonal"] and piece["quad"] is None:
                own = exponentials.gather(1, draw.bins[:, None])[:, 0]
                piece_remove = top + torch.log(total + own * piece["boost"][draw.bins]) - log_bins
            elif piece["quad"] is None:
                piece_remove = (
                    top
                    + torch.log((exponentials * piece["kernel"][draw.bins]).sum(dim=1))
                    - log_bins
                )
            remove = remove + piece_remove
            add = add + (log_bins - top - torch.log(total))
            margin = margin + (1e-3 + 1e-5 * (bins + scale))
        return remove, add, margin


class PreparedPair:
    """A pair with its factors computed once, in float64 (G) and the sampling dtype (F)."""

    def __init__(self, pair: DominatingPair, device: torch.device = torch.device("cpu")):
        self.pair = pair
        self.device = device
        self.grams = [torch.as_tensor(g, dtype=torch.float64, device=device) for g in pair.grams]
        self.factors = [gram_factor(g) for g in self.grams]
        self.diagonal = [
            bool(torch.count_nonzero(g - torch.diag(torch.diagonal(g))) == 0) for g in self.grams
        ]

    def chunk_losses(
        self, chunk: list[Draw], sigma: float, dtype=torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        remove = add = 0.0
        for draw, gram, factor, diagonal in zip(chunk, self.grams, self.factors, self.diagonal):
            correlated = correlate(draw.normals.to(dtype), factor, diagonal)
            piece_remove, piece_add = losses(gram.to(dtype), draw.bins, correlated, sigma)
            remove, add = remove + piece_remove, add + piece_add
        return remove, add

    @single_threaded
    def positive_losses(
        self, sigma: float, samples: int, seed: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """All positive privacy losses (remove, add) at σ on ``samples`` draws in float64; memory
        O(samples) (ε(δ) at a fixed σ needs them all)."""
        kept: tuple[list, list] = ([], [])
        for piece in draws(self.pair, samples, seed, device=self.device):
            for index, loss in enumerate(self.chunk_losses(piece, sigma, torch.float64)):
                kept[index].append(loss[loss > 0].cpu().numpy())
        return np.concatenate(kept[0]), np.concatenate(kept[1])

    @exactly
    def chunk_loss_bounds(
        self, chunk: list[Draw], low: float, high: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Upper bounds on the (remove, add) losses over σ ∈ [low, high]: each term of each LSE is
        bounded at the endpoints separately (a/σ² and u/σ are monotone in σ), and LSE is monotone.
        Computed in float32; the third tensor is each row's largest term magnitude, for a rounding
        margin."""
        remove = add = scale = 0.0
        for draw, gram, factor, diagonal in zip(chunk, self.grams, self.factors, self.diagonal):
            gram32 = gram.to(torch.float32)
            correlated = correlate(draw.normals, factor, diagonal)
            half_norms = torch.diagonal(gram32) / 2
            linear_hi = torch.maximum(correlated / low, correlated / high)
            linear_lo = torch.minimum(correlated / low, correlated / high)
            quad = gram32[draw.bins] - half_norms
            quad_hi = torch.maximum(quad / low**2, quad / high**2)
            log_bins = math.log(gram.shape[0])
            remove = remove + torch.logsumexp(quad_hi + linear_hi, dim=1) - log_bins
            add = add + log_bins - torch.logsumexp(linear_lo - half_norms / low**2, dim=1)
            scale = scale + torch.amax(quad_hi.abs() + linear_hi.abs() + linear_lo.abs(), dim=1)
        return remove, add, scale


@dataclass(frozen=True)
class DeltaEstimate:
    """δ̂ at (σ, ε) from ``samples`` samples, per direction, with a normal-approximation 95%
    interval."""

    delta: float
    delta_remove: float
    delta_add: float
    stderr: float
    samples: int

    @property
    def interval(self) -> tuple[float, float]:
        return (max(self.delta - 1.96 * self.stderr, 0.0), self.delta + 1.96 * self.stderr)


def worker_count(device: torch.device) -> int:
    """Threads for independent chunks: the CPU cores this process may use (one on CUDA, which
    queues)."""
    if device.type == "cuda":
        return 1
    return (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )


def _block_sums(
    prepared: PreparedPair,
    screen: Screen,
    samples: int,
    seed: int,
    blocks: tuple[int, int],
    sigma: float,
    epsilon: float,
) -> np.ndarray:
    """Per block of ``blocks``: (direction, [Σ f, Σ f²]) of the hockey-stick values f. Only samples
    the float32 :class:`Screen` cannot rule out get their losses computed in float64; the rest have
    f = 0."""
    chunk = draw_chunk(prepared.pair, samples, seed, blocks, prepared.device)
    remove, add, margin = screen(chunk)
    threshold = epsilon - margin
    sums = np.zeros((blocks[1] - blocks[0], 2, 2))
    rows = torch.nonzero(~((remove <= threshold) & (add <= threshold)))[:, 0]
    if rows.numel() == 0:
        return sums
    kept = [Draw(d.bins[rows], d.normals[rows]) for d in chunk]
    block = (rows // BLOCK).cpu()
    for direction, loss in enumerate(prepared.chunk_losses(kept, sigma, torch.float64)):
        terms = hockey_stick(loss, epsilon).cpu()
        for moment, values in enumerate((terms, terms**2)):
            sums[:, direction, moment] = torch.zeros(len(sums), dtype=torch.float64).index_add_(
                0, block, values
            )
    return sums


@single_threaded
def estimate_delta(
    pair: DominatingPair,
    sigma: float,
    epsilon: float,
    samples: int,
    seed: int,
    chunk: int | None = None,
    device: torch.device = torch.device("cpu"),
    workers: int | None = None,
) -> DeltaEstimate:
    """Monte Carlo δ̂(ε) at noise σ (the larger direction), exact in float64 (see :class:`Screen`).

    Chunks (on the CPU one block by default: its tensors stay in cache, twice as fast as 32768-row
    chunks at b = 128; on CUDA :func:`chunk_rows`) run on ``workers`` threads (default
    :func:`worker_count`; the Philox fills and torch's kernels release the GIL), each with one chunk
    in flight, so memory is ``workers`` × the bound of :func:`chunk_rows` (on CUDA up to a quarter
    of the free memory). Sums are kept per block and added in block order, so the result does not
    depend on the chunk size or the number of workers."""
    prepared = PreparedPair(pair, device)
    screen = Screen(prepared, sigma)
    ranges = block_ranges(samples, chunk or (BLOCK if device.type == "cpu" else None), pair, device)
    workers = min(workers or worker_count(device), len(ranges))

    def run(blocks: tuple[int, int]) -> np.ndarray:
        return _block_sums(prepared, screen, samples, seed, blocks, sigma, epsilon)

    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            parts = list(pool.map(run, ranges))
    else:
        parts = [run(blocks) for blocks in ranges]
    totals = np.concatenate(parts).sum(axis=0)
    means = totals[:, 0] / samples
    variances = np.maximum(totals[:, 1] / samples - means**2, 0.0)
    worst = int(np.argmax(means))
    return DeltaEstimate(
        float(means[worst]),
        float(means[0]),
        float(means[1]),
        float(math.sqrt(variances[worst] / samples)),
        samples,
    )


def epsilon_from_losses(
    losses_by_direction: tuple[np.ndarray, np.ndarray], samples: int, delta: float
) -> float:
    """Smallest ε >= 0 with δ̂(ε) <= δ in both directions (δ̂ is decreasing in ε; bisection)."""

    def delta_hat(epsilon: float) -> float:
        return max(
            float(np.sum(-np.expm1(epsilon - y[y > epsilon]))) / samples
            for y in losses_by_direction
        )

    if delta_hat(0.0) <= delta:
        return 0.0
    low, high = 0.0, max(float(np.max(y)) for y in losses_by_direction if y.size)
    for _ in range(80):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if delta_hat(mid) > delta else (low, mid)
    return high
