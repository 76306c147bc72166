"""The balls-in-bins dominating pair (004 Lemma 3.2) as Gram matrices, and its seeded samples.

Samples are generated in memory-bounded chunks of independently seeded blocks, so the same seed
gives common random numbers across σ (004 Alg. 2) and a different seed gives the fresh samples EVR
needs (004 §3.4). :mod:`dpledger.accounting.montecarlo` computes the privacy losses of these
samples.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

import numpy as np
import torch

from dpledger import philox_normal

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
