"""The Book-Keeping DP engine (003) and the per-example reference trainer it is tested against.

Standalone use (see docs/engine.md)::

    retain_freed_memory()   # CPU: keep the heap between steps (glibc; see allocator.py)
    engine = BKEngine(model, optimizer, clip_norm=1.0, noise_multiplier=1.1, normalizer=64, seed=0)
    for x, y in batches:
        engine.private_step(F.cross_entropy(model(x), y, reduction="none"))
    engine.self_check(lambda m, x, y: F.cross_entropy(m(x), y, reduction="none"), x, y)  # exact?
"""

import functools

from dpledger.engine.allocator import retain_freed_memory
from dpledger.engine.bk import BKEngine, UnsupportedLayerError
from dpledger.engine.clipping import CLIPPING_MODES, clip_factors
from dpledger.engine.noise import NoiseSource
from dpledger.engine.optimizers import (
    LR_SCHEDULES,
    OPTIMIZERS,
    LrSchedule,
    make_optimizer,
    make_scheduler,
)
from dpledger.engine.reference import ReferenceTrainer, clipped_sum, per_example_gradients
from dpledger.engine.self_check import SelfCheckError, SelfCheckResult
from dpledger.engine.self_check import run_self_check as _run_self_check
from dpledger.engine.settings import ClipNoise
from dpledger.engine.validators import replace_batchnorm

run_self_check = functools.partial(_run_self_check, engine_type=BKEngine)
"""``engine/self_check.py``'s check with this package's :class:`BKEngine` (see
``BKEngine.self_check``)."""

__all__ = [
    "BKEngine",
    "ClipNoise",
    "UnsupportedLayerError",
    "CLIPPING_MODES",
    "clip_factors",
    "NoiseSource",
    "OPTIMIZERS",
    "LR_SCHEDULES",
    "LrSchedule",
    "make_optimizer",
    "make_scheduler",
    "ReferenceTrainer",
    "clipped_sum",
    "per_example_gradients",
    "replace_batchnorm",
    "run_self_check",
    "SelfCheckError",
    "SelfCheckResult",
    "retain_freed_memory",
]
