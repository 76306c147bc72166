"""A generated image set for trying image classification offline (docs/recipes.md): an npz
of ``(N, H, W, C)`` uint8 images (channels last, as most image files and libraries store them) with
a label each, for the built-in ``cnn`` and a small ViT. Deterministic for a given seed.

Each image is a stripe pattern on a noisy background; its label is the stripes' orientation
(0 horizontal, 1 vertical, 2 and 3 the two diagonals). Colour, phase, contrast and the noise are
drawn independently of the label, so only the orientation decides, and it is local: a 3×3
convolution or a 4×4 patch sees it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpledger import io

ORIENTATIONS = ("horizontal", "vertical", "diagonal", "anti-diagonal")


def stripes(labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``(len(labels), size, size, 3)`` uint8 images: period-4 stripes of the labels' orientations,
    each with a random colour, phase and contrast, plus Gaussian pixel noise."""
    rows, cols = np.mgrid[0:size, 0:size]
    coordinate = np.stack([rows, cols, rows + cols, rows - cols])[labels]  # (N, H, W)
    phase = rng.uniform(0, 2 * np.pi, (len(labels), 1, 1))
    wave = np.sin(np.pi / 2 * coordinate + phase)  # period 4 pixels
    contrast = rng.uniform(0.5, 1.0, (len(labels), 1, 1, 1))
    colour = rng.uniform(0.2, 1.0, (len(labels), 1, 1, 3))
    image = 0.5 + 0.5 * contrast * wave[..., None] * colour + rng.normal(0, 0.15, (*wave.shape, 3))
    return np.clip(np.round(255 * image), 0, 255).astype(np.uint8)


def write_example(path: str | Path, *, examples: int = 2000, size: int = 16, seed: int = 0) -> None:
    """Write ``path`` (an npz with ``x``: (N, size, size, 3) uint8, ``y``: int64 labels 0..3,
    balanced)."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(examples) % len(ORIENTATIONS))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    io.write_npz(path, x=stripes(labels, size, rng), y=labels.astype(np.int64))
