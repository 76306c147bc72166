"""The schedule artifact: for each step, the indices of the examples in its batch, as actually used.

Stored compactly as one flat index array plus step offsets (CSR layout), a padding mask for the
fixed-size variants, and the sampler's name, parameters and seed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from dpledger import io

SAVED_ARRAYS = {"indices": np.int64, "offsets": np.int64, "padding": bool}
"""The fields saved in ``schedule.npz``, with their dtypes; every other field goes to
``schedule.json``."""
DIGEST_KEY = "sha256"
"""The key in the header's metadata of :meth:`Schedule.digest` (arrays and header fields)."""


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

    def saved_arrays(self) -> dict[str, np.ndarray]:
        """The index, offset and padding arrays as ``schedule.npz`` holds them."""
        return {
            name: np.ascontiguousarray(getattr(self, name), dtype=dtype)
            for name, dtype in SAVED_ARRAYS.items()
        }

    def save(self, folder: str | Path) -> None:
        """Write ``schedule.npz`` and ``schedule.json`` into ``folder`` (each atomically)."""
        folder = Path(folder)
        io.write_npz(folder / "schedule.npz", **self.saved_arrays())
        io.write_json(folder / "schedule.json", self.header())

    def digest(self) -> str:
        """SHA-256 of the arrays as saved and of every header field (sampler, its parameters, seed,
        sizes, normalizer, metadata): the header records it so a reader can refuse an edited
        ``schedule.npz`` and a relabelled ``schedule.json`` (e.g. a shuffle schedule renamed
        ``poisson``) alike."""
        digest = hashlib.sha256()
        for array in self.saved_arrays().values():
            digest.update(array.tobytes())
        digest.update(json.dumps(self._sealed_fields(), sort_keys=True, default=str).encode())
        return digest.hexdigest()

    def _sealed_fields(self) -> dict[str, Any]:
        scalars = {
            f.name: getattr(self, f.name) for f in fields(self) if f.name not in SAVED_ARRAYS
        }
        scalars["metadata"] = {k: v for k, v in scalars["metadata"].items() if k != DIGEST_KEY}
        return {**scalars, "num_steps": self.num_steps}

    def header(self) -> dict[str, Any]:
        """Every field but the arrays (what produced the schedule), the step count and the
        digest."""
        header = self._sealed_fields()
        header["metadata"] = {**header["metadata"], DIGEST_KEY: self.digest()}
        return header

    @classmethod
    def load(cls, folder: str | Path) -> "Schedule":
        """Read a schedule written by :meth:`save`."""
        folder = Path(folder)
        header = json.loads((folder / "schedule.json").read_text())
        with np.load(folder / "schedule.npz") as saved:
            arrays = {name: saved[name] for name in SAVED_ARRAYS}
        return cls(**arrays, **{f.name: header[f.name] for f in fields(cls) if f.name in header})
