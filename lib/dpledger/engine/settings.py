"""The clipping and noise of a DP-SGD run as one frozen record, built once and passed whole.

Before this record the same keyword bundle (clip norm, σ, the batch size the noisy sum is divided
by, the clipping style, the correlated-noise mechanism) was restated at each call from the train
stage to the engine, the utility evidence and the tuning hint; one record keeps them equal by
construction. The noise key is not part of it: it is a secret (``pipeline/noise_key.py``), and a
record may be printed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ClipNoise:
    """What each step privatizes with: clip ``clip_norm`` (``clipping`` style, ``automatic_gamma``
    for automatic clipping), noise σ·R with σ = ``noise_multiplier`` from ``mechanism`` (its
    parameters and ``num_steps`` for correlated noise; ``secure_noise``: fresh OS CSPRNG draws), the
    sum divided by ``normalizer`` (the expected logical batch size)."""

    clip_norm: float
    noise_multiplier: float
    normalizer: float
    clipping: str = "flat"
    automatic_gamma: float = 0.01
    mechanism: str = "identity"
    mechanism_params: dict[str, Any] = field(default_factory=dict)
    num_steps: int | None = None
    secure_noise: bool = False

    def engine_options(self) -> dict[str, Any]:
        """The record as ``BKEngine``'s keyword arguments."""
        return {
            "clip_norm": self.clip_norm,
            "noise_multiplier": self.noise_multiplier,
            "normalizer": self.normalizer,
            "clipping": self.clipping,
            "automatic_gamma": self.automatic_gamma,
            "mechanism": self.mechanism,
            "mechanism_params": dict(self.mechanism_params),
            "num_steps": self.num_steps,
            "secure_noise": self.secure_noise,
        }
