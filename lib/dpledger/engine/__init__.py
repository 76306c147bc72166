"""The Book-Keeping DP engine (003) and the per-example reference trainer it is tested against.

Standalone use (see README, section train)::

    retain_freed_memory()   # CPU: keep the heap between steps (glibc; see allocator.py)
    engine = BKEngine(model, optimizer, clip_norm=1.0, noise_multiplier=1.1, normalizer=64, seed=0)
    for x, y in batches:
        engine.private_step(F.cross_entropy(model(x), y, reduction="none"))
    engine.self_check(lambda m, x, y: F.cross_entropy(m(x), y, reduction="none"), x, y)  # exact?
"""

from dpledger.engine.allocator import retain_freed_memory
from dpledger.engine.bk import BKEngine, UnsupportedLayerError
from dpledger.engine.clipping import CLIPPING_MODES, clip_factors
from dpledger.engine.consecutive import consecutive_batches, consecutive_indices, train_consecutive
from dpledger.engine.noise import NoiseSource
from dpledger.engine.optimizers import OPTIMIZERS, make_optimizer
from dpledger.engine.reference import ReferenceTrainer, clipped_sum, per_example_gradients
from dpledger.engine.self_check import SelfCheckError, SelfCheckResult, run_self_check
from dpledger.engine.validators import replace_batchnorm

__all__ = [
    "BKEngine",
    "UnsupportedLayerError",
    "CLIPPING_MODES",
    "clip_factors",
    "consecutive_batches",
    "consecutive_indices",
    "train_consecutive",
    "NoiseSource",
    "OPTIMIZERS",
    "make_optimizer",
    "ReferenceTrainer",
    "clipped_sum",
    "per_example_gradients",
    "replace_batchnorm",
    "run_self_check",
    "SelfCheckError",
    "SelfCheckResult",
    "retain_freed_memory",
]
