"""Array backends for the batched-Gaussian simulation: numpy on the CPU, torch on a GPU when
present.

The scoring kernels are written once against the common subset of the numpy and torch APIs
(``xp.exp``, ``xp.amax(x, axis=..., keepdims=...)``, ...); a backend supplies that namespace, its
random normals and the conversion of results back to numpy.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from dpledger import validation

BACKENDS = ("auto", "numpy", "torch")


class Backend(Protocol):
    """Where observations are generated: ``name`` is 'numpy' or 'torch'; ``device`` 'cpu' or 'cuda';
    ``xp`` the array namespace the scoring kernels call."""

    name: str
    device: str
    xp: Any
    parallel_chunks: bool
    """Whether chunks run on threads (numpy releases the GIL in its kernels; a GPU is already
    parallel)."""

    def generator(self, seed_sequence: np.random.SeedSequence) -> Any:
        """An independent random stream for one chunk, derived from ``seed_sequence``."""

    def normal(self, generator: Any, shape: tuple[int, ...], scale: float) -> Any:
        """float32 N(0, scale²) of ``shape``."""

    def uniform(self, generator: Any, shape: tuple[int, ...]) -> Any:
        """float64 uniforms in [0, 1) on the backend's device."""

    def integer_seed(self, generator: Any) -> int:
        """A 62-bit integer drawn from ``generator``, to seed a CPU-side numpy stream."""

    def asarray(self, values: np.ndarray) -> Any:
        """Move a numpy array to the backend."""

    def to_numpy(self, values: Any) -> np.ndarray:
        """Bring a backend array back as numpy."""


class NumpyBackend:
    """numpy on the CPU."""

    name = "numpy"
    device = "cpu"
    xp = np
    parallel_chunks = True

    def generator(self, seed_sequence: np.random.SeedSequence) -> np.random.Generator:
        return np.random.default_rng(seed_sequence)

    def normal(
        self, generator: np.random.Generator, shape: tuple[int, ...], scale: float
    ) -> np.ndarray:
        out = generator.standard_normal(shape, dtype=np.float32)
        out *= np.float32(scale)
        return out

    def uniform(self, generator: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return generator.random(shape)

    def integer_seed(self, generator: np.random.Generator) -> int:
        return int(generator.integers(2**62))

    def asarray(self, values: np.ndarray) -> np.ndarray:
        return values

    def to_numpy(self, values: Any) -> np.ndarray:
        return np.asarray(values)


class TorchBackend:
    """torch on ``device`` (a GPU where present); torch is imported only when this backend is
    chosen."""

    name = "torch"
    parallel_chunks = False

    def __init__(self, device: str) -> None:
        import torch

        self.device = device
        self.xp = torch

    def generator(self, seed_sequence: np.random.SeedSequence) -> Any:
        gen = self.xp.Generator(device=self.device)
        gen.manual_seed(int(seed_sequence.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1)))
        return gen

    def normal(self, generator: Any, shape: tuple[int, ...], scale: float) -> Any:
        return (
            self.xp.randn(shape, generator=generator, device=self.device, dtype=self.xp.float32)
            * scale
        )

    def uniform(self, generator: Any, shape: tuple[int, ...]) -> Any:
        return self.xp.rand(shape, generator=generator, device=self.device, dtype=self.xp.float64)

    def integer_seed(self, generator: Any) -> int:
        return int(self.xp.randint(2**62, (1,), generator=generator, device=self.device).item())

    def asarray(self, values: np.ndarray) -> Any:
        return self.xp.as_tensor(values, device=self.device)

    def to_numpy(self, values: Any) -> np.ndarray:
        return values.detach().cpu().numpy()


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return False
    return bool(torch.cuda.is_available())


def select_backend(name: str = "auto") -> Backend:
    """'auto' picks torch on a GPU when one is present, else numpy; 'torch' uses the GPU if
    present."""
    validation.one_of("audit.backend", name, BACKENDS)
    if name == "numpy" or (name == "auto" and not cuda_available()):
        return NumpyBackend()
    return TorchBackend("cuda" if cuda_available() else "cpu")
