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

import functools
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterator, TypeVar

import numpy as np
import torch

from dpledger import philox_normal
from dpledger.precision import exactly

BLOCK = 1 << 12
MEMORY_VALUES = 1 << 22
CUDA_MAX_VALUES = 1 << 28
"""On CUDA a chunk may hold up to this many normals (1 GiB of float32) where free memory allows:
each chunk costs a host sync (the screen's survivors) and a few dozen launches, so
4M-value chunks left an H100 idle between them."""
CUDA_MEMORY_FRACTION = 0.25
CUDA_BYTES_PER_VALUE = 32
"""Bytes of device memory per normal in flight: the float32 normals and their concatenation, U, the
LSE terms and their exponentials, a gathered kernel row (about 8 float32 values)."""
T = TypeVar("T")


def single_threaded(function: Callable[..., T]) -> Callable[..., T]:
    """Run ``function`` with torch on one thread, then restore the thread count. The chunked tensors
    here are small enough that intra-op threading costs more than it gains, most of all on a shared
    CPU."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return function(*args, **kwargs)
        finally:
            torch.set_num_threads(before)

    return wrapper


@dataclass(frozen=True)
class DominatingPair:
    """The balls-in-bins dominating pair, as the Gram matrices G = MMᵀ of its independent pieces."""

    grams: tuple[np.ndarray, ...]

    @property
    def bins(self) -> int:
        return self.grams[0].shape[0]

    def max_sensitivity(self) -> float:
        """√(Σ_pieces max_i ‖m_i‖²): the unamplified Gaussian with this sensitivity dominates the
        pair."""
        return math.sqrt(sum(float(np.max(np.diag(g))) for g in self.grams))


def toeplitz_modes(values: torch.Tensor, bins: int, rows: int) -> torch.Tensor:
    """M (rows × b) for Toeplitz C with coefficients ``values`` (differentiable): M[t, i] = s[t −
    i], s the coefficients folded over epochs, s[e·b + r] = Σ_{e' <= e} c[e'·b + r]."""
    values = values[:rows]
    epochs = math.ceil(rows / bins)
    padded = torch.nn.functional.pad(values, (0, epochs * bins - values.shape[0]))
    folded = torch.cumsum(padded.reshape(epochs, bins), dim=0).reshape(-1)[:rows]
    lag = torch.arange(rows)[:, None] - torch.arange(bins)[None, :]
    return torch.where(lag >= 0, folded[lag.clamp(min=0)], torch.zeros((), dtype=values.dtype))


def toeplitz_gram(values: torch.Tensor, bins: int, rows: int) -> torch.Tensor:
    modes = toeplitz_modes(values, bins, rows)
    return modes.T @ modes


def fixed_bins_pair(values: np.ndarray, bins: int, steps: int) -> DominatingPair:
    """Bins fixed across epochs (004 Def. 3.1), Toeplitz C truncated to the first ``steps``
    steps."""
    gram = toeplitz_gram(torch.as_tensor(values[:steps], dtype=torch.float64), bins, steps)
    return DominatingPair((gram.numpy(),))


def redrawn_bins_pair(bins: int, steps: int) -> DominatingPair:
    """Bins redrawn every epoch with independent noise (C = I): a composition of one-epoch pairs."""
    full, rest = divmod(steps, bins)
    pieces = [np.eye(bins)] * full
    if rest:
        pieces.append(np.diag((np.arange(bins) < rest).astype(float)))
    return DominatingPair(tuple(pieces))


def gram_factor(gram: torch.Tensor) -> torch.Tensor:
    """F with F Fᵀ = G: Cholesky, or a square root where G is singular (bins unused before the end
    of an epoch). A diagonal G keeps a diagonal F, which ``correlate``'s O(b) path relies on
    (``eigh`` would order the eigenvalues and put the square roots off the diagonal)."""
    diagonal = torch.diagonal(gram)
    if torch.count_nonzero(gram - torch.diag(diagonal)) == 0:
        return torch.diag(diagonal.clamp(min=0).sqrt())
    factor, info = torch.linalg.cholesky_ex(gram)
    if int(info) == 0:
        return factor
    values, vectors = torch.linalg.eigh(gram)
    return vectors * values.clamp(min=0).sqrt()


@dataclass(frozen=True)
class Draw:
    """One chunk of a piece: the bin of the differing example and U ~ N(0, G) for each sample."""

    bins: torch.Tensor
    normals: torch.Tensor


def chunk_rows(pair: DominatingPair, device: torch.device = torch.device("cpu")) -> int:
    """Samples per chunk: whole blocks, at most :func:`chunk_values` normals in flight unless one
    block is larger.

    Memory bound: a chunk holds rows × b × pieces float32 normals plus a few tensors of that size
    (U, the LSE arguments), so peak memory is O(max(values, BLOCK · b · pieces)) values whatever
    the sample count; pieces = 1 for fixed bins, E for redrawn bins.
    """
    per_row = pair.bins * len(pair.grams)
    return BLOCK * max(1, chunk_values(device) // (BLOCK * per_row))


def chunk_values(device: torch.device) -> int:
    """Normals one chunk may hold: MEMORY_VALUES on the CPU (cache-sized chunks are fastest there);
    on CUDA a quarter of the free device memory at CUDA_BYTES_PER_VALUE each, between MEMORY_VALUES
    and CUDA_MAX_VALUES. The results do not depend on it (samples are seeded per block)."""
    if device.type != "cuda":
        return MEMORY_VALUES
    free, _ = torch.cuda.mem_get_info(device)
    affordable = int(free * CUDA_MEMORY_FRACTION) // CUDA_BYTES_PER_VALUE
    return min(CUDA_MAX_VALUES, max(MEMORY_VALUES, affordable))


def _block(
    pair: DominatingPair, seed: int, block: int, piece: int, rows: int, device: torch.device
) -> Draw:
    """Block ``block`` of piece ``piece``: seeded from (seed, block, piece) alone, so the samples do
    not depend on how blocks are grouped into chunks, on thread counts, or on the order chunks run
    in.

    The normals must reach far into the tail: a float32 draw with a hard cap (torch's ``randn`` on
    the CPU takes its Box–Muller radius from 24-bit uniforms and never lands beyond radius 5.77,
    where a Gaussian pair does with probability 2⁻²⁴) differs in total variation, and so may bias
    δ̂, by up to (b/2)·2⁻²⁴ (4e-6 at b = 128), which EVR's bound does not cover. On the CPU they
    come from the engine's Philox4x32-10 Box–Muller (:mod:`dpledger.philox_normal`, keyed by the
    block's seed; the bins from numpy's SFC64): radius to 9.5σ, truncated tail mass below 1e-19 a
    draw, each draw within 4·2⁻²⁴ of the exact value of its words (float32 rounding is 2⁻²⁴), five
    times cheaper than numpy's float64 ziggurat rounded to float32. On CUDA torch's float64
    ``randn`` (Philox, Box–Muller on 53-bit uniforms), rounded. The losses are those of these
    float32 values: a relative perturbation of a few 2⁻²⁴ per normal, which, like the rounding to
    float32 before, EVR's bound does not count."""
    words = np.random.SeedSequence((int(seed), block, piece)).generate_state(3, np.uint32)
    if device.type == "cuda":
        generator = torch.Generator(device=device)
        generator.manual_seed(int(words[0]) << 32 | int(words[1]))
        bins = torch.randint(0, pair.bins, (rows,), generator=generator, device=device)
        normals = torch.randn(
            (rows, pair.bins), generator=generator, device=device, dtype=torch.float64
        )
        return Draw(bins, normals.to(torch.float32))
    rng = np.random.Generator(np.random.SFC64(int(words[0])))
    normals = np.empty(rows * pair.bins, np.float32)
    philox_normal.fill_standard_normal(normals, (int(words[1]), int(words[2])), step=0)
    return Draw(
        torch.from_numpy(rng.integers(0, pair.bins, rows)),
        torch.from_numpy(normals.reshape(rows, pair.bins)),
    )


def block_ranges(
    samples: int,
    chunk: int | None,
    pair: DominatingPair,
    device: torch.device = torch.device("cpu"),
) -> list[tuple[int, int]]:
    """[first, last) block ranges of the chunks: ``chunk`` samples rounded up to whole blocks
    (default :func:`chunk_rows` on ``device``)."""
    per_chunk = max(1, math.ceil((chunk or chunk_rows(pair, device)) / BLOCK))
    blocks = math.ceil(samples / BLOCK)
    return [(first, min(first + per_chunk, blocks)) for first in range(0, blocks, per_chunk)]


def draw_chunk(
    pair: DominatingPair, samples: int, seed: int, blocks: tuple[int, int], device: torch.device
) -> list[Draw]:
    """The samples of blocks [first, last), one Draw per piece."""
    pieces = []
    for piece in range(len(pair.grams)):
        parts = [
            _block(pair, seed, k, piece, min(BLOCK, samples - k * BLOCK), device)
            for k in range(*blocks)
        ]
        pieces.append(
            Draw(torch.cat([p.bins for p in parts]), torch.cat([p.normals for p in parts]))
        )
    return pieces


def draws(
    pair: DominatingPair,
    samples: int,
    seed: int,
    chunk: int | None = None,
    device: torch.device = torch.device("cpu"),
) -> Iterator[list[Draw]]:
    """Chunks of samples (one Draw per piece), reproducible from ``seed`` (common random numbers).

    Samples come in blocks of BLOCK seeded independently (:func:`_block`); a chunk is a run of whole
    blocks (:func:`block_ranges`)."""
    for blocks in block_ranges(samples, chunk, pair, device):
        yield draw_chunk(pair, samples, seed, blocks, device)


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
