"""Independent references the tests check the library against (and the benchmarks time as the naive
method): written the slow, obvious way, sharing no code with what they check."""

import math

import numpy as np


def gram_from_matrix(matrix: np.ndarray, bins: int) -> np.ndarray:
    """G = MMᵀ from a dense lower-triangular C >= 0: M's rows m_i = Σ_e C[:, e·b + i] (004 Lemma
    3.2)."""
    matrix = np.asarray(matrix, dtype=np.float64)
    assert not np.any(np.triu(matrix, 1)), "C must be lower-triangular"
    assert not np.any(matrix < 0), "the balls-in-bins dominating pair needs C >= 0"
    steps = matrix.shape[0]
    padded = np.zeros((steps, math.ceil(steps / bins) * bins))
    padded[:, :steps] = matrix
    modes = padded.reshape(steps, -1, bins).sum(axis=1)
    return modes.T @ modes


def naive_losses(
    modes: np.ndarray, sigma: float, samples: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """The O(n·b) balls-in-bins sampler: x = m_bin + σZ in n dimensions, Y = log P(x)/Q(x) directly,
    in both directions (remove, add)."""
    generator = np.random.default_rng(seed)
    modes = np.asarray(modes, dtype=np.float64)
    bins = generator.integers(0, modes.shape[1], samples)
    noise = generator.standard_normal((samples, modes.shape[0]))
    log_bins = math.log(modes.shape[1])
    half_norms = 0.5 * np.sum(modes**2, axis=0)

    def log_ratio(points: np.ndarray) -> np.ndarray:
        scores = (points @ modes - half_norms) / sigma**2
        top = scores.max(axis=1, keepdims=True)
        return (top[:, 0] + np.log(np.exp(scores - top).sum(axis=1))) - log_bins

    remove = log_ratio(modes.T[bins] + sigma * noise)
    add = -log_ratio(sigma * noise)
    return remove, add
