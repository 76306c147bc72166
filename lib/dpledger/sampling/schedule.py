"""The schedule artifact: for each step, the indices of the examples in its batch, as actually used.

Stored compactly as one flat index array plus step offsets (CSR layout), a padding mask for the
fixed-size variants, and the sampler's name, parameters and seed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from dpledger import io


@dataclass(frozen=True)
class Schedule:
    """Batches of one training run. ``indices[offsets[t]:offsets[t+1]]`` is step t's batch.

    ``padding[i]`` is True where row i is a padding row (fixed-size balls-in-bins): its index is a
    placeholder and it must contribute exactly zero gradient. ``normalizer`` is the fixed B that
    the summed gradient is divided by, or None where the trainer divides by the expected batch size.
    """

    indices: np.ndarray
    offsets: np.ndarray
    padding: np.ndarray
    sampler: str
    sampler_params: dict[str, Any]
    seed: int
    dataset_size: int
    steps_per_epoch: int
    normalizer: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        return int(self.offsets.shape[0] - 1)

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(indices, padding mask) of step ``step``."""
        lo, hi = int(self.offsets[step]), int(self.offsets[step + 1])
        return self.indices[lo:hi], self.padding[lo:hi]

    def batches(self, start: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Iterate (indices, padding mask) from step ``start`` on."""
        for step in range(start, self.num_steps):
            yield self.batch(step)

    def batch_sizes(self) -> np.ndarray:
        """Number of real (non-padding) examples in each step."""
        real = np.concatenate([[0], np.cumsum(~self.padding)])
        return real[self.offsets[1:]] - real[self.offsets[:-1]]

    def save(self, folder: str | Path) -> None:
        """Write ``schedule.npz`` and ``schedule.json`` into ``folder`` (each atomically)."""
        folder = Path(folder)
        io.write_npz(
            folder / "schedule.npz",
            indices=np.asarray(self.indices, dtype=np.int64),
            offsets=np.asarray(self.offsets, dtype=np.int64),
            padding=np.asarray(self.padding, dtype=bool),
        )
        io.write_json(folder / "schedule.json", self.header())

    def arrays_digest(self) -> str:
        """SHA-256 of the index, offset and padding arrays as saved: the header records it so a reader can
        refuse an edited ``schedule.npz``."""
        digest = hashlib.sha256()
        for array, dtype in ((self.indices, np.int64), (self.offsets, np.int64), (self.padding, bool)):
            digest.update(np.ascontiguousarray(array, dtype=dtype).tobytes())
        return digest.hexdigest()

    def header(self) -> dict[str, Any]:
        """Everything but the index arrays: what produced the schedule."""
        return {
            "sampler": self.sampler,
            "sampler_params": self.sampler_params,
            "seed": self.seed,
            "dataset_size": self.dataset_size,
            "steps_per_epoch": self.steps_per_epoch,
            "num_steps": self.num_steps,
            "normalizer": self.normalizer,
            "metadata": {**self.metadata, "arrays_sha256": self.arrays_digest()},
        }

    @classmethod
    def load(cls, folder: str | Path) -> "Schedule":
        """Read a schedule written by :meth:`save`."""
        folder = Path(folder)
        header = json.loads((folder / "schedule.json").read_text())
        with np.load(folder / "schedule.npz") as arrays:
            indices, offsets, padding = arrays["indices"], arrays["offsets"], arrays["padding"]
        return cls(
            indices=indices,
            offsets=offsets,
            padding=padding,
            sampler=header["sampler"],
            sampler_params=header["sampler_params"],
            seed=header["seed"],
            dataset_size=header["dataset_size"],
            steps_per_epoch=header["steps_per_epoch"],
            normalizer=header["normalizer"],
            metadata=header.get("metadata", {}),
        )
