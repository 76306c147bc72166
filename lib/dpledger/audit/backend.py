"""Array backends for the batched-Gaussian simulation: numpy on the CPU, torch on a GPU when present.

The scoring kernels are written once against the common subset of the numpy and torch APIs
(``xp.exp``, ``xp.amax(x, axis=..., keepdims=...)``, ...); a backend supplies that namespace, its
random normals and the conversion of results back to numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dpledger.errors import ParamsError

BACKENDS = ("auto", "numpy", "torch")


@dataclass(frozen=True)
class Backend:
    """Where observations are generated: ``name`` is 'numpy' or 'torch'; ``device`` 'cpu' or 'cuda'."""

    name: str
    device: str

    @property
    def xp(self) -> Any:
        if self.name == "numpy":
            return np
        import torch

        return torch

    @property
    def parallel_chunks(self) -> bool:
        """numpy releases the GIL in its kernels, so chunks run on threads; a GPU is already parallel."""
        return self.name == "numpy"

    def generator(self, seed_sequence: np.random.SeedSequence) -> Any:
        """An independent random stream for one chunk, derived from ``seed_sequence``."""
        if self.name == "numpy":
            return np.random.default_rng(seed_sequence)
        import torch

        gen = torch.Generator(device=self.device)
        gen.manual_seed(int(seed_sequence.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1)))
        return gen

    def normal(self, generator: Any, shape: tuple[int, ...], scale: float) -> Any:
        """float32 N(0, scale²) of ``shape``."""
        if self.name == "numpy":
            out = generator.standard_normal(shape, dtype=np.float32)
            out *= np.float32(scale)
            return out
        import torch

        return torch.randn(shape, generator=generator, device=self.device, dtype=torch.float32) * scale

    def uniform(self, generator: Any, shape: tuple[int, ...]) -> Any:
        """float64 uniforms in [0, 1) on the backend's device."""
        if self.name == "numpy":
            return generator.random(shape)
        import torch

        return torch.rand(shape, generator=generator, device=self.device, dtype=torch.float64)

    def integer_seed(self, generator: Any) -> int:
        """A 62-bit integer drawn from ``generator``, to seed a CPU-side numpy stream."""
        if self.name == "numpy":
            return int(generator.integers(2**62))
        import torch

        return int(torch.randint(2**62, (1,), generator=generator, device=self.device).item())

    def asarray(self, values: np.ndarray) -> Any:
        """Move a numpy array to the backend."""
        if self.name == "numpy":
            return values
        import torch

        return torch.as_tensor(values, device=self.device)

    def to_numpy(self, values: Any) -> np.ndarray:
        if self.name == "numpy":
            return np.asarray(values)
        return values.detach().cpu().numpy()


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return False
    return bool(torch.cuda.is_available())


def select_backend(name: str = "auto") -> Backend:
    """'auto' picks torch on a GPU when one is present, else numpy; 'torch' uses the GPU if present."""
    if name not in BACKENDS:
        raise ParamsError(f"audit.backend = {name!r} is invalid: allowed values are {', '.join(BACKENDS)}")
    if name == "numpy" or (name == "auto" and not cuda_available()):
        return Backend("numpy", "cpu")
    return Backend("torch", "cuda" if cuda_available() else "cpu")
