"""How far each noise path reaches, and the δ a shorter reach would leak.

Every path draws a standard normal by Box–Muller: |z| ≤ √(−2 ln u_min), u_min the least uniform its
bits can form. A sampler that cannot go beyond k·σ makes a crafted canary a perfect distinguisher:
when an example adds its clipped contribution C to a coordinate (the worst direction: one
coordinate), the released value exceeds k·σ·C with probability P(Z > k − 1/σ), which is impossible
without the example. Over a run that is at most (expected uses of one example) · P(Z > k − 1/σ), a
δ no accountant counts. The paths (:mod:`dpledger.engine.noise`):

- ``philox`` (CPU, float32): Philox words, a zero radius word refined by a second one, so
  u_min = ½·2⁻⁶⁴: k = 9.49.
- ``torch-float64`` (every other device and dtype, CUDA included: fixed chunks drawn by torch in
  float64, then rounded): 53-bit uniforms, k = 8.57.
- ``secure`` (os.urandom, float64 Box–Muller on (w + ½)/2⁵³): u_min = 2⁻⁵⁴, k = 8.65.
- for comparison, torch's own float32 draw (24-bit uniforms): k = 5.77; a float32 inverse CDF
  about 5.2; CUDA's float32 normal about 6.7. The engine uses none of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.stats import norm

# least uniform each path can form (see the module docstring)
LEAST_UNIFORM = {
    "philox": 0.5 * 2.0**-64,
    "torch-float64": 2.0**-53,
    "secure": 0.5 * 2.0**-53,
    "torch-float32": 2.0**-24,
}


def reach(path: str) -> float:
    """k: the largest |z| in units of σ the path can draw, √(−2 ln u_min)."""
    return math.sqrt(-2.0 * math.log(LEAST_UNIFORM[path]))


def tail_delta(k: float, noise_multiplier: float, expected_uses: float) -> float:
    """δ leaked by a sampler capped at ``k``·σ: an example's ``expected_uses`` (steps it is in, in
    expectation) times the chance its contribution C pushes a coordinate past the cap,
    P(Z > k − 1/σ) (union bound over uses)."""
    return float(expected_uses * norm.sf(k - 1.0 / noise_multiplier))


@dataclass(frozen=True)
class NoiseSupport:
    """The run's noise path, its reach and the δ a cap there would leak."""

    path: str
    reach: float
    tail_delta: float

    def line(self) -> str:
        """The report's line."""
        return f"noise support ≥ {self.reach:.2f}σ ({self.path}); tail δ ≤ {self.tail_delta:.1e}"


def noise_support(path: str, noise_multiplier: float, expected_uses: float) -> NoiseSupport:
    """The support facts of a run drawing on ``path`` at ``noise_multiplier``."""
    k = reach(path)
    return NoiseSupport(path, k, tail_delta(k, noise_multiplier, expected_uses))
