"""The zoo: deliberately broken trainers, each the reference trainer with one flaw, and the test meant to catch it.

It lives in the library (not only in tests) so that ``dpledger verify --self-check`` can show, on the
user's own machine and torch version, that the battery flags every known bug and passes correct trainers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from dpledger.errors import ParamsError
from dpledger.verify.protocol import Trainer
from dpledger.verify.reference import Flaws, train_with_flaws


@dataclass(frozen=True)
class ZooMember:
    """A broken trainer: its flaw, the bug in plain words, and the tests that must flag it."""

    name: str
    flaws: Flaws
    bug: str
    caught_by: tuple[str, ...]
    """Every one of these tests must fail on this trainer (others may fail too)."""


ZOO = (
    ZooMember(
        "no_clipping",
        Flaws(clipping="none"),
        "per-example gradients are never clipped",
        ("t1_no_clipping", "sensitivity"),
    ),
    ZooMember(
        "mini_batch_clipping",
        Flaws(clipping="mini_batch"),
        "the averaged gradient is clipped, not each example's",
        ("t2_minibatch_clipping", "sensitivity"),
    ),
    ZooMember(
        "per_tensor_clipping",
        Flaws(clipping="per_tensor"),
        "each parameter tensor is clipped to C separately (total norm up to C·√tensors)",
        ("sensitivity",),
    ),
    ZooMember(
        "uncalibrated_noise",
        Flaws(noise_std="uncalibrated"),
        "noise std σ instead of σ·C",
        ("t3_noise_calibration", "noise_scale"),
    ),
    ZooMember(
        "noise_divided_twice",
        Flaws(noise_std="divided_twice"),
        "noise std σ·C/B on the sum, then divided by B again",
        ("noise_scale", "ks_update_distribution"),
    ),
    ZooMember(
        "fixed_noise_seed", Flaws(noise_seed="fixed"), "the noise generator ignores the seed", ("t3_noise_calibration",)
    ),
    ZooMember(
        "noise_reused_every_step",
        Flaws(noise_steps="reused"),
        "the same noise vector is added at every step",
        ("noise_independence",),
    ),
    ZooMember(
        "noise_first_step_only",
        Flaws(noise_steps="first_step_only"),
        "noise is added at the first step only",
        ("noise_independence",),
    ),
)


def zoo_member(name: str) -> ZooMember:
    """Look up a zoo member by name."""
    for member in ZOO:
        if member.name == name:
            return member
    raise ParamsError(f"params: zoo trainer {name!r} is unknown; allowed: {[m.name for m in ZOO]}")


def zoo_trainer(name: str) -> Trainer:
    """The protocol trainer of zoo member ``name``."""
    return partial(train_with_flaws, flaws=zoo_member(name).flaws)
