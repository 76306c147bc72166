"""The self-check's comparison: the engine's pass against the naive per-example loop, within the
tolerances of the check's precision, and the record of what was compared and found
(:class:`SelfCheckResult`, the ledger's ``self_check`` entry).

Used by :mod:`dpledger.engine.self_check`, which runs both computations and re-exports the public
names here.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn

from dpledger.engine.validators import UnsupportedLayerError

TOLERANCE: dict[torch.dtype, float] = {
    torch.float64: 1e-9,
    torch.float32: 1e-3,
    torch.bfloat16: 5e-2,
    torch.float16: 5e-2,
}
"""Largest relative error accepted, per precision of the check.

float64: the engine and the loop sum the same terms in different orders, so they differ by
round-off, ~1e-16 per operation; measured at most 6e-16 on the zoo, tiny GPT-2 and BERT and the
digits and LM examples (1e-12 on a gradient that cancels exactly), so 1e-9 is three orders above
round-off and seven below a 1 % error in a rule. float32: round-off is ~6e-8 per operation and
grows through depth and with B·T-term sums (measured at most 4e-7 on the same models); 1e-3
separates that from a wrong rule (errors of a rule are of the order of the gradient itself: a
missing term, a wrong factor), not from a slip below 0.1 %. bfloat16 (the training dtype under
``train.precision: bf16`` autocast, or a model kept in half precision): 8 significant bits, so each
rounded product is off by up to 2⁻⁹ ≈ 2e-3 relative, and the engine's bf16 operands (clip factor
truncated to 8 bits, docs/precision.md) and the loop's autograd products round at different places;
5e-2 is the tolerance the engine's own bf16 tests state against a float32 loop, still an order
below a rule that is 10 % off (float16: the same 5e-2)."""

ZERO_GRADIENT_FLOOR: dict[torch.dtype, float] = {
    torch.float64: 1e-5,
    torch.float32: 1e-3,
    torch.bfloat16: 1e-2,
    torch.float16: 1e-2,
}
"""A parameter's error is relative to the sum of the examples' clipped contributions to it, but at
least to this share of the whole sum's: a gradient that is zero in exact arithmetic (an attention
key's bias: softmax ignores a shift shared by all keys) comes out as round-off in both computations,
~eps × the terms that cancel, and its own scale would turn that into relative errors of order 1.
With a floor f, round-off up to tolerance·f of the whole sum passes (f = 1e-5: 1e-14, ~90·eps in
float64; 1e-3: 1e-6, ~16·eps in float32) and a 5 % error is still caught on any parameter carrying
more than 2e-13 (float64) or 2e-5 (float32) of it; bf16's 1e-2 lets round-off of 5e-4 of the whole
sum pass, ~16 bf16 epsilons, as float32's floor does."""

LOSS_TOLERANCE_FACTOR = 10.0
"""The losses of one example alone and in the batch are the same operations on the same numbers
except for batched-kernel reduction orders: their tolerance is the precision's, times this margin,
relative."""

WORST_SHOWN = 3


class SelfCheckError(UnsupportedLayerError):
    """The engine's private gradient on the user's model differs from the naive per-example loop
    (the message names the worst parameters, their layers and the relative error)."""


@dataclass(frozen=True)
class Arithmetic:
    """The precision one comparison runs in: ``cast``, the dtype the copy, its inputs and weights
    are cast to (None: left as the model and rows are, training's own dtype); ``autocast``, the
    dtype both forward passes run under ``torch.autocast`` in (None: no autocast); ``key``, the
    dtype whose tolerance applies; ``label``, how the record names it."""

    cast: torch.dtype | None
    autocast: torch.dtype | None
    key: torch.dtype
    label: str

    def forward(self, device: torch.device) -> contextlib.AbstractContextManager:
        """The context the forward passes run in: autocast as training runs it, else nothing."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.autocast)


def full_precision(dtype: torch.dtype) -> Arithmetic:
    """The copy cast to ``dtype`` (float64, or float32 where float64 does not fit), no autocast."""
    return Arithmetic(dtype, None, dtype, str(dtype).removeprefix("torch."))


@dataclass(frozen=True)
class ParameterError:
    """One trainable parameter's relative error: ‖engine − loop‖ / Σ_i ‖C_i·w_i·g_i‖ over its
    coordinates (at least ``ZERO_GRADIENT_FLOOR`` of the same sum over all parameters)."""

    name: str
    layer: str
    relative_error: float


@dataclass(frozen=True)
class SelfCheckResult:
    """What the self-check compared and found; ``passed`` when every error is within ``tolerance``
    and, where there is one, the comparison in the training dtype passed too.

    ``max_relative_error`` is the largest of: the whole clipped sum's ‖Δ‖/‖S‖, the worst parameter's
    error, the worst per-example norm's |Δ|/‖w_i·g_i‖ and the worst per-example loss's.
    ``training``: the same comparison in the dtype training runs in (the model's parameter dtype,
    under training's autocast), beside the float64 proof: a rule exact in float64 can still be wrong
    in float32 (a rule that branches on the dtype); it is this record itself where the check already
    ran in training's precision."""

    passed: bool
    max_relative_error: float
    sum_relative_error: float
    norm_relative_error: float
    loss_relative_error: float
    worst_parameters: tuple[ParameterError, ...]
    examples: int
    padding_rows: int
    parameters_checked: int
    parameters_trainable: int
    elements_checked: int
    dtype: str
    tolerance: float
    clipping: str
    seconds: float
    training: SelfCheckResult | None = None
    batch_rows: int = 0
    """Rows of the training batch whose rows' losses alone were compared with theirs in it, in
    training's precision (0: none given)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the ledger's ``self_check`` entry)."""
        return {
            "passed": self.passed,
            "max_relative_error": self.max_relative_error,
            "sum_relative_error": self.sum_relative_error,
            "norm_relative_error": self.norm_relative_error,
            "loss_relative_error": self.loss_relative_error,
            "worst_parameters": [asdict(worst) for worst in self.worst_parameters],
            "examples": self.examples,
            "padding_rows": self.padding_rows,
            "parameters_checked": self.parameters_checked,
            "parameters_trainable": self.parameters_trainable,
            "elements_checked": self.elements_checked,
            "dtype": self.dtype,
            "tolerance": self.tolerance,
            "clipping": self.clipping,
            "seconds": self.seconds,
            "batch_rows": self.batch_rows,
            **(self.training.training_entries() if self.training is not None else {}),
        }

    def training_entries(self) -> dict[str, Any]:
        """The ``training_*`` entries of the ledger's record: this comparison as the one in the
        training dtype."""
        return {
            "training_passed": self.passed,
            "training_dtype": self.dtype,
            "training_tolerance": self.tolerance,
            "training_max_relative_error": self.max_relative_error,
            "training_worst_parameters": [asdict(worst) for worst in self.worst_parameters],
        }

    def within_tolerance(self) -> bool:
        """Whether this comparison's own errors are within its tolerance (the one in the training
        dtype aside)."""
        worst = self.worst_parameters[0].relative_error if self.worst_parameters else 0.0
        own = max(self.sum_relative_error, self.norm_relative_error, worst)
        loss_ok = self.loss_relative_error <= self.tolerance * LOSS_TOLERANCE_FACTOR
        return own <= self.tolerance and loss_ok

    def failure(self, scope: str = "") -> str:
        """One line naming what differs (empty when passed); the float64 comparison's first, else
        the training dtype's. ``scope`` follows "self-check" (which check, where)."""
        if self.passed:
            return ""
        if self.training is not None and self.within_tolerance():
            return self.training.failure(f" in the training dtype (the {self.dtype} check passed)")
        batch = f" and a training batch of {self.batch_rows} rows" if self.batch_rows else ""
        where = f"{self.examples} examples{batch}, {self.dtype}, tolerance {self.tolerance:g}"
        if self.loss_relative_error > self.tolerance * LOSS_TOLERANCE_FACTOR:
            return (
                f"self-check{scope}: each example's loss alone differs from its loss in the batch "
                f"(relative error {self.loss_relative_error:.3g}; {where}): "
                "the model mixes examples or is random with dropout off, "
                "so per-example clipping bounds nothing; "
                "make each example's loss depend on it alone"
            )
        failing = [w for w in self.worst_parameters if w.relative_error > self.tolerance]
        if not failing:
            return (
                f"self-check{scope}: "
                "the engine's per-example norms differ from the naive per-example loop's "
                f"(relative error {self.norm_relative_error:.3g}; {where}); "
                "do not train privately with this model"
            )
        layers = ", ".join(dict.fromkeys(w.layer for w in failing))
        worst = ", ".join(f"{w.name} {w.relative_error:.3g}" for w in failing)
        return (
            f"self-check{scope}: the engine's private gradient of layer(s) "
            f"{layers} differs from the naive per-example loop (relative error {worst}; {where}): "
            "its per-layer rule is wrong for this model; fix or unregister the rule, "
            "or freeze the layer"
        )


@dataclass
class NaiveResult:
    """The oracle's results: losses and norms per example, per parameter the clipped sum and its
    scale."""

    losses: Tensor
    norms: Tensor
    sums: dict[str, Tensor]
    scales: dict[str, Tensor]


@dataclass
class EnginePass:
    """The engine's results on the same rows: losses and norms per example, per parameter the
    clipped sum (noise off)."""

    losses: Tensor
    norms: Tensor
    sums: dict[str, Tensor]


def relative(difference: Tensor, scale: Tensor, floor: float = 0.0) -> float:
    """|difference| / max(scale, floor), elementwise max; 0/0 = 0 (nothing compared), x/0 = inf."""
    difference, scale = difference.double().abs(), scale.double().abs().clamp_min(floor)
    undefined = torch.where(difference > 0, math.inf, 0.0)
    ratio = torch.where(scale > 0, difference / scale.clamp_min(1e-300), undefined)
    return float(ratio.max()) if ratio.numel() else 0.0


def compare(
    naive: NaiveResult,
    engine: EnginePass,
    names: Sequence[str],
    model: nn.Module,
    arithmetic: Arithmetic,
    clipping: str,
    started: float,
    counts: tuple[int, int],
) -> SelfCheckResult:
    """The record: errors per parameter (worst first), of the whole sum, the norms and the losses,
    within the tolerances of ``arithmetic.key``. ``counts``: real examples checked and trainable
    parameters of the user's model."""
    dtype = arithmetic.key
    tolerance = TOLERANCE[dtype]
    floor = ZERO_GRADIENT_FLOOR[dtype] * float(sum(naive.scales.values()))
    modules = dict(model.named_modules())
    errors = []
    errors_of = {n: engine.sums[n].double() - naive.sums[n].double() for n in names}
    for name in names:
        difference = errors_of[name].norm()
        layer = name.rsplit(".", 1)[0] if "." in name else ""
        label = f"{layer or '<model>'} ({type(modules[layer]).__name__})"
        errors.append(ParameterError(name, label, relative(difference, naive.scales[name], floor)))
    errors.sort(key=lambda e: e.relative_error, reverse=True)
    whole = math.sqrt(sum(float(errors_of[n].square().sum()) for n in names))
    size = math.sqrt(sum(float(naive.sums[n].double().square().sum()) for n in names))
    sum_error = relative(torch.tensor(whole), torch.tensor(size), floor)
    norm_error = relative(engine.norms - naive.norms, naive.norms)
    loss_floor = ZERO_GRADIENT_FLOOR[dtype] * float(naive.losses.abs().max())
    loss_error = relative(engine.losses - naive.losses, naive.losses, loss_floor)
    worst = max(sum_error, norm_error, errors[0].relative_error)
    passed = worst <= tolerance and loss_error <= tolerance * LOSS_TOLERANCE_FACTOR
    return SelfCheckResult(
        passed=passed,
        max_relative_error=max(worst, loss_error),
        sum_relative_error=sum_error,
        norm_relative_error=norm_error,
        loss_relative_error=loss_error,
        worst_parameters=tuple(errors[:WORST_SHOWN]),
        examples=counts[0],
        padding_rows=1,
        parameters_checked=len(names),
        parameters_trainable=counts[1],
        elements_checked=sum(naive.sums[n].numel() for n in names),
        dtype=arithmetic.label,
        tolerance=tolerance,
        clipping=clipping,
        seconds=time.perf_counter() - started,
    )
