"""The zoo (``zoo:NAME``): deliberately flawed trainers, each the verify stage's reference trainer
(:mod:`dpledger.verify.functorch_trainer`) with one flaw, and the tests meant to catch it.

It lives in the library (not only in tests) so that ``dpledger verify --self-check`` can show, on
the user's own machine and torch version, that the battery flags every known bug and passes correct
trainers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from dpledger.errors import ParamsError
from dpledger.verify.consecutive import Trainer
from dpledger.verify.functorch_trainer import Flaws, train_with_flaws


@dataclass(frozen=True)
class ZooMember:
    """A broken trainer: its flaw, the bug in plain words, and the tests that must flag it."""

    flaws: Flaws
    bug: str
    caught_by: tuple[str, ...]
    """Every one of these tests must fail on this trainer (others may fail too)."""


ZOO = {
    "no_clipping": ZooMember(
        Flaws(clipping="none"),
        "per-example gradients are never clipped",
        ("t1_no_clipping", "sensitivity"),
    ),
    "mini_batch_clipping": ZooMember(
        Flaws(clipping="mini_batch"),
        "the averaged gradient is clipped, not each example's",
        ("t2_minibatch_clipping", "sensitivity"),
    ),
    "per_tensor_clipping": ZooMember(
        Flaws(clipping="per_tensor"),
        "each parameter tensor is clipped to C separately (total norm up to C·√tensors)",
        ("sensitivity",),
    ),
    "uncalibrated_noise": ZooMember(
        Flaws(noise_std="uncalibrated"),
        "noise std σ instead of σ·C",
        ("t3_noise_calibration", "noise_scale"),
    ),
    "noise_divided_twice": ZooMember(
        Flaws(noise_std="divided_twice"),
        "noise std σ·C/B on the sum, then divided by B again",
        ("noise_scale", "ks_update_distribution"),
    ),
    "fixed_noise_seed": ZooMember(
        Flaws(noise_seed="fixed"), "the noise generator ignores the seed", ("t3_noise_calibration",)
    ),
    "noise_reused_every_step": ZooMember(
        Flaws(noise_steps="reused"),
        "the same noise vector is added at every step",
        ("noise_independence",),
    ),
    "noise_first_step_only": ZooMember(
        Flaws(noise_steps="first_step_only"),
        "noise is added at the first step only",
        ("noise_independence",),
    ),
}
"""The zoo by trainer name (``zoo:<name>`` on the command line)."""


def zoo_member(name: str) -> ZooMember:
    """Look up a zoo member by name."""
    if name not in ZOO:
        raise ParamsError(f"params: zoo trainer {name!r} is unknown; allowed: {list(ZOO)}")
    return ZOO[name]


def zoo_trainer(name: str) -> Trainer:
    """The protocol trainer of zoo member ``name``."""
    return partial(train_with_flaws, flaws=zoo_member(name).flaws)
