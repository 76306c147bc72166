"""What an accountant is asked about: one DP-SGD / DP-FTRL run, described without computing
anything.

Conventions (shared by calibrate, schedule and the CLI):
- noise std = noise_multiplier × clip norm, added once per step to the SUM of clipped gradients;
- sample_rate q = batch_size / dataset_size (Poisson: expected batch size B);
- steps = epochs × batches_per_epoch with batches_per_epoch = ceil(dataset_size / batch_size); for
  balls-in-bins these are the b bins of 004 §3.1;
- adjacency: add or remove up to ``group_size`` examples (k = 1 is example-level DP).

The accounted samplers (:data:`ACCOUNTED_SAMPLINGS`) are this module's vocabulary, as
dp-accounting's ``DpEvent`` classes are its own: each names one sampling law and says it in the
ledger's words. A sampler in :mod:`dpledger.sampling` refers to one by name (``accounted_as``);
accountants say which they cover in their ``unsupported()``. The meaning of a name never changes: a
new law gets a new name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from dpledger import validation
from dpledger.errors import ParamsError


@dataclass(frozen=True)
class AccountedSampling:
    """One sampling law the accountants know: its name and its sentence in the ledger.

    ``law`` is formatted with the description's q, B, N, b and E. ``whole_epochs``: the law draws
    per epoch (bins), so a run is a whole number of epochs (steps = epochs × b).
    """

    name: str
    law: str
    whole_epochs: bool = False

    def sentence(self, description: "MechanismDescription") -> str:
        d = description
        return self.law.format(
            q=f"{d.sample_rate:.6g}",
            B=d.batch_size,
            N=d.dataset_size,
            b=d.batches_per_epoch,
            E=d.epochs,
        )


ACCOUNTED_SAMPLINGS = {
    law.name: law
    for law in (
        AccountedSampling(
            "poisson",
            "Poisson sampling: each example joins each step independently with probability q = {q}",
        ),
        AccountedSampling(
            "fixed",
            "fixed-size sampling: "
            "each step uses a fresh uniformly random subset of B = {B} of N = {N} examples "
            "(not a shuffle)",
        ),
        AccountedSampling(
            "balls-in-bins",
            "balls-in-bins: each example is put in one of b = {b} bins once, "
            "and the bins are reused in the same order every epoch ({E} epochs)",
            whole_epochs=True,
        ),
        AccountedSampling(
            "balls-in-bins-redrawn",
            "balls-in-bins redrawn every epoch: "
            "each epoch puts every example in one of b = {b} bins afresh ({E} epochs)",
            whole_epochs=True,
        ),
    )
}
SAMPLERS = tuple(ACCOUNTED_SAMPLINGS)
SAMPLING_FIELDS = (
    "sampler",
    "dataset_size",
    "batch_size",
    "sample_rate",
    "batches_per_epoch",
    "epochs",
    "steps",
)
# fewer is a prefix of the accounted run, which the claim covers
AT_MOST_ACCOUNTED = (
    "epochs",
    "steps",
)


@dataclass(frozen=True)
class MechanismDescription:
    """A sampled (possibly correlated-noise) Gaussian mechanism run for ``steps`` steps.

    ``dataset_size`` and ``batch_size`` may be None where only ``sample_rate`` is known (Poisson);
    the fixed-batch and balls-in-bins accountants need them (or ``batches_per_epoch``).
    """

    sampler: str
    noise_multiplier: float
    steps: int
    sample_rate: float
    batches_per_epoch: int
    epochs: int
    dataset_size: int | None = None
    batch_size: int | None = None
    group_size: int = 1
    mechanism: str = "identity"
    mechanism_params: dict[str, Any] = field(default_factory=dict)

    def with_noise(self, noise_multiplier: float) -> "MechanismDescription":
        return replace(self, noise_multiplier=noise_multiplier)

    def with_steps(self, steps: int) -> "MechanismDescription":
        """The same mechanism stopped after ``steps`` steps (epochs rounded up for
        balls-in-bins)."""
        return replace(self, steps=steps, epochs=max(1, math.ceil(steps / self.batches_per_epoch)))

    def sampling_sentence(self) -> str:
        """How batches are drawn, in the ledger's words (see :data:`ACCOUNTED_SAMPLINGS`)."""
        return ACCOUNTED_SAMPLINGS[self.sampler].sentence(self)

    def sampling_differences(self, used: "MechanismDescription") -> list[str]:
        """Every sampling field in which the run ``used`` describes leaves the run this one accounts
        for: another sampler or size, or more epochs or steps. Where the samplers differ only n, B
        and the epochs are compared (the laws' own fields, q, b and steps, then differ by nature); b
        only for laws drawn per epoch (a per-step law's accountant reads q and the steps, not b)."""
        if used.sampler != self.sampler:
            compared: tuple[str, ...] = ("sampler", "dataset_size", "batch_size", "epochs")
        elif ACCOUNTED_SAMPLINGS[self.sampler].whole_epochs:
            compared = SAMPLING_FIELDS
        else:
            compared = tuple(name for name in SAMPLING_FIELDS if name != "batches_per_epoch")
        differences = []
        for name in compared:
            accounted, actual = getattr(self, name), getattr(used, name)
            if name in AT_MOST_ACCOUNTED:
                differs = actual > accounted
            elif isinstance(accounted, float):
                differs = not math.isclose(actual, accounted, rel_tol=1e-12)
            else:
                differs = actual != accounted
            if differs:
                differences.append(f"{name} {actual} (accounted {accounted})")
        return differences


def describe(
    *,
    sampler: str,
    noise_multiplier: float = 1.0,
    dataset_size: int | None = None,
    batch_size: int | None = None,
    sample_rate: float | None = None,
    steps: int | None = None,
    epochs: int | None = None,
    batches_per_epoch: int | None = None,
    group_size: int = 1,
    mechanism: str = "identity",
    mechanism_params: dict[str, Any] | None = None,
) -> MechanismDescription:
    """Build a description from whichever sizes are given; inconsistent or missing sizes raise
    ParamsError."""
    validation.one_of("sampler", sampler, SAMPLERS)
    validation.positive("noise_multiplier", noise_multiplier, allow_zero=True)
    for name, value in (
        ("dataset_size", dataset_size),
        ("batch_size", batch_size),
        ("steps", steps),
        ("epochs", epochs),
        ("batches_per_epoch", batches_per_epoch),
        ("group_size", group_size),
    ):
        if value is not None:
            validation.at_least(name, value, 1, integer=True)
    sample_rate, batches_per_epoch = _rate_and_bins(
        dataset_size, batch_size, sample_rate, batches_per_epoch
    )
    steps, epochs = _steps_and_epochs(sampler, steps, epochs, batches_per_epoch)
    return MechanismDescription(
        sampler=sampler,
        noise_multiplier=float(noise_multiplier),
        steps=int(steps),
        sample_rate=float(sample_rate),
        batches_per_epoch=int(batches_per_epoch),
        epochs=int(epochs),
        dataset_size=dataset_size,
        batch_size=batch_size,
        group_size=int(group_size),
        mechanism=mechanism,
        mechanism_params=dict(mechanism_params or {}),
    )


def _rate_and_bins(
    dataset_size: int | None,
    batch_size: int | None,
    sample_rate: float | None,
    batches_per_epoch: int | None,
) -> tuple[float, int]:
    """(q, b) from whichever of the sizes are given; contradicting or missing sizes raise
    ParamsError."""
    if dataset_size is not None and batch_size is not None:
        if batch_size > dataset_size:
            raise validation.invalid(
                "batch_size", batch_size, f"it must be at most dataset_size = {dataset_size}"
            )
        rate = batch_size / dataset_size
        if sample_rate is not None and not math.isclose(sample_rate, rate, rel_tol=1e-9):
            raise ParamsError(
                f"sample_rate = {sample_rate} contradicts batch_size / dataset_size = {rate}"
            )
        sample_rate = rate
        if batches_per_epoch is not None and batches_per_epoch != math.ceil(
            dataset_size / batch_size
        ):
            raise ParamsError(
                f"batches_per_epoch = {batches_per_epoch} contradicts dataset_size / batch_size: "
                f"{dataset_size} examples in batches of {batch_size} take {math.ceil(dataset_size / batch_size)} per epoch "  # noqa: E501
                "(give one of the two)"
            )
        batches_per_epoch = math.ceil(dataset_size / batch_size)
    if sample_rate is None and batches_per_epoch is not None:
        sample_rate = 1.0 / batches_per_epoch
    if sample_rate is None:
        raise ParamsError(
            "sample_rate is missing: give it, or dataset_size and batch_size, or batches_per_epoch"
        )
    validation.within("sample_rate", sample_rate, 0, 1, interval="left-open")
    batches_per_epoch = batches_per_epoch or max(1, math.ceil(1.0 / sample_rate - 1e-9))
    return sample_rate, batches_per_epoch


def _steps_and_epochs(
    sampler: str, steps: int | None, epochs: int | None, batches_per_epoch: int
) -> tuple[int, int]:
    """(steps, epochs) from either (one epoch where neither is given); a contradiction, or a
    sampler that runs whole epochs stopped inside one, raises ParamsError."""
    if steps is None:
        steps = (epochs or 1) * batches_per_epoch
    elif epochs is not None and epochs != math.ceil(steps / batches_per_epoch):
        raise ParamsError(
            f"steps = {steps} contradicts epochs = {epochs} of {batches_per_epoch} batches: "
            f"{epochs} epochs take {(epochs - 1) * batches_per_epoch + 1} to {epochs * batches_per_epoch} steps "  # noqa: E501
            "(give one of the two)"
        )
    epochs = epochs or max(1, math.ceil(steps / batches_per_epoch))
    if ACCOUNTED_SAMPLINGS[sampler].whole_epochs and steps != epochs * batches_per_epoch:
        raise ParamsError(
            f"steps = {steps} is invalid for {sampler}: "
            f"it must equal epochs × batches_per_epoch = {epochs} × {batches_per_epoch}"
        )
    return steps, epochs


def vacuous_delta_warning(delta: float, dataset_size: int | None) -> str | None:
    """δ >= 1/n admits mechanisms that publish an example outright: the (ε, δ) claim then says
    little."""
    if dataset_size is None or delta < 1.0 / dataset_size:
        return None
    return (
        f"WARNING: delta = {delta:g} >= 1/n = {1.0 / dataset_size:.3g} "
        f"(n = {dataset_size} examples): "
        "a mechanism that publishes one random example outright meets this delta, "
        "so the claim says little; use delta < 1/n"
    )
