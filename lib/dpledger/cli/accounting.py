"""``dpledger epsilon`` (ε of a described run) and ``dpledger noise`` (σ for a target ε)."""

from __future__ import annotations

import inspect
import json
import math
from dataclasses import MISSING, dataclass, fields
from typing import Annotated, Any, Callable, Optional, get_type_hints

import typer

from dpledger import validation
from dpledger.accounting.accountants import ACCOUNTANTS
from dpledger.accounting.bounds import MAX_BANDS
from dpledger.cli import strict_json
from dpledger.errors import ParamsError
from dpledger.params.calibrate import CalibrateParams

MIN_NOISE = 1e-2


def _default(key: str) -> Any:
    """The params.yaml default of ``calibrate.<key>``: the CLI and the pipeline share one set of
    defaults."""
    return CalibrateParams.model_fields[key].default


def _matrix(mechanism: str, bands: int, mechanism_params: Optional[str]) -> dict[str, Any]:
    """mechanism_params of C from --mechanism, --bands and --mechanism-params (JSON)."""
    from dpledger.mechanisms import MECHANISMS, banded_params

    validation.one_of("--mechanism", mechanism, MECHANISMS)
    validation.within("--bands", bands, 1, MAX_BANDS, interval="closed")
    if mechanism_params is not None:
        try:
            matrix = json.loads(mechanism_params)
        except json.JSONDecodeError as error:
            raise ParamsError(f"--mechanism-params is not valid JSON: {error.msg}") from None
        if not isinstance(matrix, dict):
            toeplitz = """'{"coefficients": [1, 0.5]}' (toeplitz)"""
            blt = """'{"buffer_decays": [0.9], "output_scales": [0.2]}' (blt)"""
            examples = f"{toeplitz} or {blt}"
            raise ParamsError(
                f"--mechanism-params is invalid: it must be a JSON object such as {examples}"
            )
        return matrix
    if mechanism in ("toeplitz", "blt"):
        raise ParamsError(
            f"--mechanism-params is missing: mechanism {mechanism} needs its coefficients as JSON "
            f'(e.g. \'{{"buffer_decays": [0.9], "output_scales": [0.2]}}\' for blt)'
        )
    return banded_params(bands) if mechanism == "banded" else {}


def _check_delta(delta: float, dataset_size: Optional[int]) -> list[str]:
    """Refuse a δ outside (0, 1) (NaN included); warn (returned lines) when δ >= 1/n."""
    from dpledger.accounting.description import vacuous_delta_warning

    if not (math.isfinite(delta) and 0.0 < delta < 1.0):
        raise validation.invalid("--delta", delta, "it must be a finite number in (0, 1)")
    if dataset_size is not None:
        validation.at_least("--dataset-size", dataset_size, 1)
    warning = vacuous_delta_warning(delta, dataset_size)
    return [warning] if warning else []


def _failure_text(details: dict[str, Any]) -> str:
    """'; Monte Carlo failure probability β' beside ε, or '' for deterministic accountants."""
    if "mc_failure_probability" not in details:
        lower = details.get("epsilon_lower")
        return "" if lower is None else f"; lower bound {lower:.6g}"
    return f"; holds except with probability {details['mc_failure_probability']:.3g} (Monte Carlo)"


SAMPLER_HELP = "poisson | fixed | balls-in-bins (bins fixed across epochs) | balls-in-bins-redrawn"

Delta = Annotated[float, typer.Option("--delta", help="target δ")]
SampleRate = Annotated[
    Optional[float], typer.Option("--sample-rate", help="q (or give dataset and batch size)")
]
Steps = Annotated[
    Optional[int], typer.Option("--steps", help="steps (default epochs × batches per epoch)")
]
AccountantName = Annotated[
    str, typer.Option("--accountant", help=" | ".join(("auto", *ACCOUNTANTS)))
]
Sampler = Annotated[str, typer.Option("--sampler", help=SAMPLER_HELP)]
GroupSize = Annotated[int, typer.Option("--group-size", help="k: add/remove up to k examples")]
DatasetSize = Annotated[Optional[int], typer.Option("--dataset-size", help="N training examples")]
BatchSize = Annotated[
    Optional[int], typer.Option("--batch-size", help="B (expected size for poisson)")
]
BatchesPerEpoch = Annotated[
    Optional[int], typer.Option("--batches-per-epoch", help="b bins per epoch")
]
Epochs = Annotated[Optional[int], typer.Option("--epochs", help="E")]
Mechanism = Annotated[str, typer.Option("--mechanism", help="identity | banded | toeplitz | blt")]
Bands = Annotated[int, typer.Option("--bands", help="w for --mechanism banded")]
MechanismParams = Annotated[
    Optional[str], typer.Option("--mechanism-params", help="JSON coefficients of C")
]
FailureProbability = Annotated[
    Optional[float],
    typer.Option(
        "--failure-probability",
        help="Monte Carlo failure probability (default min(δ/10, 1e-6)); sets the EVR samples",
    ),
]
EvrDeltaRatio = Annotated[
    float, typer.Option("--evr-delta-ratio", help="Monte Carlo: estimate at δ' = ratio·δ")
]
Device = Annotated[str, typer.Option("--device", help="Monte Carlo: auto | cpu | cuda")]
Verification = Annotated[
    str,
    typer.Option(
        "--verification",
        help="Monte Carlo EVR sampling: auto (importance where it needs fewer draws) | plain | "
        "importance",
    ),
]
MonteCarloSamples = Annotated[
    int, typer.Option("--samples", help="Monte Carlo samples (estimate / calibrate σ)")
]
Seed = Annotated[int, typer.Option("--seed", help="Monte Carlo seed")]
Discretization = Annotated[
    float, typer.Option("--discretization", help="PLD value discretization interval")
]
AsJson = Annotated[bool, typer.Option("--json", help="print a JSON object")]


@dataclass(frozen=True)
class RunOptions:
    """The options ``epsilon`` and ``noise`` share: how the run is described and which accountant
    reads it.

    Declared once: each field is one command-line option of both commands (:func:`_shared_command`).
    """

    delta: Delta
    sample_rate: SampleRate = None
    steps: Steps = None
    accountant: AccountantName = _default("accountant")
    sampler: Sampler = "poisson"
    group_size: GroupSize = 1
    dataset_size: DatasetSize = None
    batch_size: BatchSize = None
    batches_per_epoch: BatchesPerEpoch = None
    epochs: Epochs = None
    mechanism: Mechanism = "identity"
    bands: Bands = 1
    mechanism_params: MechanismParams = None
    samples: MonteCarloSamples = _default("mc_samples")
    failure_probability: FailureProbability = _default("mc_failure_probability")
    evr_delta_ratio: EvrDeltaRatio = _default("evr_delta_ratio")
    seed: Seed = 0
    discretization: Discretization = _default("pld_discretization")
    device: Device = _default("mc_device")
    verification: Verification = _default("mc_verification")
    as_json: AsJson = False

    def warnings(self) -> list[str]:
        """Refuse a δ outside (0, 1) (NaN included) or a dataset size below 1; warn (returned lines)
        when δ >= 1/n."""
        return _check_delta(self.delta, self.dataset_size)

    def description(self, noise_multiplier: float):
        """The run these options describe, at ``noise_multiplier``; an unaccounted sampler is
        refused with its reason."""
        from dpledger.accounting.description import SAMPLERS, describe
        from dpledger.sampling import SAMPLERS as BUILT_SAMPLERS

        if self.sampler not in SAMPLERS:
            known = BUILT_SAMPLERS.get(self.sampler)
            reason = f" ({known.unaccounted_reason})" if known else ""
            validation.one_of("--sampler", self.sampler, SAMPLERS, note=reason)
        if self.steps is None and self.epochs is None:
            raise ParamsError(
                "--epochs (or --steps) is missing: say how long the run is; "
                "nothing defaults to one epoch"
            )
        return describe(
            sampler=self.sampler,
            noise_multiplier=noise_multiplier,
            sample_rate=self.sample_rate,
            steps=self.steps,
            dataset_size=self.dataset_size,
            batch_size=self.batch_size,
            batches_per_epoch=self.batches_per_epoch,
            epochs=self.epochs,
            group_size=self.group_size,
            mechanism=self.mechanism,
            mechanism_params=_matrix(self.mechanism, self.bands, self.mechanism_params),
        )

    def chosen_accountant(self, description):
        """The accountant named by --accountant (``auto`` resolved for the description) with these
        settings."""
        from dpledger.accounting import get_accountant, resolve_accountant

        for option, key, value in (
            ("--discretization", "pld_discretization", self.discretization),
            ("--samples", "mc_samples", self.samples),
            ("--failure-probability", "mc_failure_probability", self.failure_probability),
            ("--evr-delta-ratio", "evr_delta_ratio", self.evr_delta_ratio),
        ):
            _within_params_bounds(option, key, value)
        name = resolve_accountant(self.accountant, description.sampler, description.mechanism)
        return get_accountant(
            name,
            samples=self.samples,
            failure_probability=self.failure_probability,
            seed=self.seed,
            evr_delta_ratio=self.evr_delta_ratio,
            discretization=self.discretization,
            device=self.device,
            verification=self.verification,
        )

    def emit(self, payload: dict[str, Any], headline: str) -> None:
        """Print the payload as JSON (--json), or the warnings, the headline and the assumptions."""
        if self.as_json:
            typer.echo(strict_json.dumps(payload))
            return
        for warning in payload["warnings"]:
            typer.echo(warning)
        typer.echo(headline)
        for sentence in payload["assumptions"]:
            typer.echo(f"  - {sentence}")


def _within_params_bounds(option: str, key: str, value: Any) -> None:
    """The bounds ``calibrate.<key>`` has in params.yaml, applied to its command-line option
    (``--samples 1e9`` would otherwise draw for hours): one line naming the option."""
    from pydantic import TypeAdapter, ValidationError

    field = CalibrateParams.model_fields[key]
    try:
        TypeAdapter(Annotated[field.annotation, field]).validate_python(value)
    except ValidationError as error:
        reason = error.errors()[0]["msg"]
        raise ParamsError(
            f"{option} = {value} is invalid: {reason} (the bound of calibrate.{key})"
        ) from None


def _shared_command(
    app: typer.Typer, name: str, first: inspect.Parameter, body: Callable[[Any, RunOptions], None]
) -> None:
    """Register command ``name``: its own option ``first``, then every :class:`RunOptions` field as
    an option; ``body(first_value, options)`` runs it."""
    hints = get_type_hints(RunOptions, include_extras=True)
    shared = [
        inspect.Parameter(
            f.name,
            inspect.Parameter.KEYWORD_ONLY,
            annotation=hints[f.name],
            default=inspect.Parameter.empty if f.default is MISSING else f.default,
        )
        for f in fields(RunOptions)
    ]

    def command(**values: Any) -> None:
        body(values.pop(first.name), RunOptions(**values))

    command.__signature__ = inspect.Signature(
        [first.replace(kind=inspect.Parameter.KEYWORD_ONLY), *shared]
    )
    command.__doc__ = body.__doc__
    app.command(name)(command)


def _run_fields(
    description: Any, options: RunOptions, warnings: list[str], result: Any
) -> dict[str, Any]:
    """The payload fields ``epsilon`` and ``noise`` share: the run's size, the warnings and the
    proof's terms."""
    return {
        "steps": description.steps,
        "sample_rate": description.sample_rate,
        "group_size": options.group_size,
        "warnings": warnings,
        "assumptions": result.assumptions,
        "details": result.details,
    }


def _bound_text(payload: dict[str, Any]) -> str:
    return f"\n  ({payload['bound']})" if payload.get("bound") else ""


def _epsilon(noise_multiplier: float, options: RunOptions) -> None:
    """Print ε at δ for DP-SGD / DP-FTRL with the given noise, sampling and sizes."""
    warnings = options.warnings()
    if not (math.isfinite(noise_multiplier) and noise_multiplier >= MIN_NOISE):
        raise validation.invalid(
            "--noise-multiplier",
            noise_multiplier,
            f"it must be a finite number >= {MIN_NOISE:g} "
            "(below it ε is in the hundreds and the accountants' grids explode)",
        )
    description = options.description(noise_multiplier)
    chosen = options.chosen_accountant(description)
    result = chosen.epsilon(description, options.delta)
    payload = {
        "epsilon": result.epsilon,
        "delta": options.delta,
        "accountant": chosen.name,
        "sampler": options.sampler,
        "noise_multiplier": noise_multiplier,
        **_run_fields(description, options, warnings, result),
        "bound": chosen.printed_bounds.get("epsilon"),
    }
    options.emit(
        payload,
        f"epsilon = {result.epsilon:.6g} at delta = {options.delta:g} ({chosen.name}, "
        f"{options.sampler}{_failure_text(result.details)})" + _bound_text(payload),
    )


def _noise(epsilon: float, options: RunOptions) -> None:
    """Print the smallest noise multiplier σ whose proven ε at δ is at most the target."""
    from dpledger.accounting import calibrate_noise

    warnings = options.warnings()
    description = options.description(1.0)
    chosen = options.chosen_accountant(description)
    calibration = calibrate_noise(chosen, description, epsilon, options.delta)
    result = calibration.result
    payload = {
        "noise_multiplier": calibration.noise_multiplier,
        "epsilon": result.epsilon,
        "delta": options.delta,
        "target_epsilon": epsilon,
        "accountant": chosen.name,
        "sampler": options.sampler,
        **_run_fields(description, options, warnings, result),
        "bound": chosen.printed_bounds.get("noise"),
    }
    options.emit(
        payload,
        f"noise_multiplier = {calibration.noise_multiplier:.6g} "
        f"(epsilon = {result.epsilon:.6g} at delta = {options.delta:g}; {chosen.name}, "
        f"{options.sampler}{_failure_text(result.details)})" + _bound_text(payload),
    )


def register(app: typer.Typer) -> None:
    """Add ``epsilon`` and ``noise`` to the ``dpledger`` app."""
    noise_multiplier = Annotated[
        float, typer.Option("--noise-multiplier", help="σ: noise std / clip norm")
    ]
    target = Annotated[float, typer.Option("--epsilon", help="target ε")]
    keyword = inspect.Parameter.KEYWORD_ONLY
    _shared_command(
        app,
        "epsilon",
        inspect.Parameter("noise_multiplier", keyword, annotation=noise_multiplier),
        _epsilon,
    )
    _shared_command(app, "noise", inspect.Parameter("epsilon", keyword, annotation=target), _noise)
