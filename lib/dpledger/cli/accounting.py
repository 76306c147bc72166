"""``dpledger epsilon`` (ε of a described run) and ``dpledger noise`` (σ for a target ε)."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Optional

import typer

from dpledger.cli import strict_json
from dpledger.errors import ParamsError
from dpledger.params.calibrate import CalibrateParams

MAX_BANDS = CalibrateParams.model_fields["bands"].metadata[-1].le
MIN_NOISE = 1e-2


def _default(key: str) -> Any:
    """The params.yaml default of ``calibrate.<key>``: the CLI and the pipeline share one set of defaults."""
    return CalibrateParams.model_fields[key].default


def _description(sampler: str, noise_multiplier: float, sample_rate: Optional[float], steps: Optional[int],
                 dataset_size: Optional[int], batch_size: Optional[int], batches_per_epoch: Optional[int],
                 epochs: Optional[int], group_size: int, mechanism: str, bands: int,
                 mechanism_params: Optional[str]):
    from dpledger.accounting import describe
    from dpledger.mechanisms import MECHANISMS, banded_params

    if mechanism not in MECHANISMS:
        raise ParamsError(f"--mechanism = {mechanism!r} is invalid: allowed values are {', '.join(MECHANISMS)}")
    if not 1 <= bands <= MAX_BANDS:
        raise ParamsError(f"--bands = {bands} is invalid: it must be an integer in [1, {MAX_BANDS}]")
    if steps is None and epochs is None:
        raise ParamsError("--epochs (or --steps) is missing: say how long the run is; nothing defaults to one epoch")
    if mechanism_params is not None:
        try:
            matrix = json.loads(mechanism_params)
        except json.JSONDecodeError as error:
            raise ParamsError(f"--mechanism-params is not valid JSON: {error.msg}") from None
        if not isinstance(matrix, dict):
            raise ParamsError("--mechanism-params is invalid: it must be a JSON object such as "
                              "'{\"coefficients\": [1, 0.5]}' (toeplitz) or "
                              "'{\"buffer_decays\": [0.9], \"output_scales\": [0.2]}' (blt)")
    elif mechanism in ("toeplitz", "blt"):
        raise ParamsError(f"--mechanism-params is missing: mechanism {mechanism} needs its coefficients as JSON "
                          f"(e.g. '{{\"buffer_decays\": [0.9], \"output_scales\": [0.2]}}' for blt)")
    else:
        matrix = banded_params(bands) if mechanism == "banded" else {}
    return describe(sampler=sampler, noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps,
                    dataset_size=dataset_size, batch_size=batch_size, batches_per_epoch=batches_per_epoch,
                    epochs=epochs, group_size=group_size, mechanism=mechanism, mechanism_params=matrix)


def _accountant(name: str, description, samples: int, failure_probability: Optional[float], seed: int,
                evr_delta_ratio: float, discretization: float, device: str):
    from dpledger.accounting import default_accountant, get_accountant

    if not 1e-6 <= discretization <= 1e-1:
        raise ParamsError(f"--discretization = {discretization} is invalid: it must lie in [1e-6, 0.1]")
    if name == "auto":
        name = default_accountant(description.sampler, description.mechanism)
    return get_accountant(name, samples=samples, failure_probability=failure_probability, seed=seed,
                          evr_delta_ratio=evr_delta_ratio, discretization=discretization, device=device)


def _check_delta(delta: float, dataset_size: Optional[int]) -> list[str]:
    """Refuse a δ outside (0, 1) (NaN included); warn (returned lines) when δ >= 1/n."""
    from dpledger.accounting.description import vacuous_delta_warning

    if not (math.isfinite(delta) and 0.0 < delta < 1.0):
        raise ParamsError(f"--delta = {delta} is invalid: it must be a finite number in (0, 1)")
    if dataset_size is not None and dataset_size < 1:
        raise ParamsError(f"--dataset-size = {dataset_size} is invalid: it must be at least 1")
    warning = vacuous_delta_warning(delta, dataset_size)
    return [warning] if warning else []


def _failure_text(details: dict[str, Any]) -> str:
    """'; Monte Carlo failure probability β' beside ε, or '' for deterministic accountants."""
    if "mc_failure_probability" not in details:
        lower = details.get("epsilon_lower")
        return "" if lower is None else f"; lower bound {lower:.6g}"
    return f"; holds except with probability {details['mc_failure_probability']:.3g} (Monte Carlo)"


def _emit(payload: dict[str, Any], as_json: bool, headline: str) -> None:
    if as_json:
        typer.echo(strict_json.dumps(payload))
        return
    for warning in payload["warnings"]:
        typer.echo(warning)
    typer.echo(headline)
    for sentence in payload["assumptions"]:
        typer.echo(f"  - {sentence}")


SAMPLER_HELP = "poisson | fixed | balls-in-bins (bins fixed across epochs) | balls-in-bins-redrawn"

# Options shared by ``epsilon`` and ``noise``: declared once so both commands describe a run the same way.
Delta = Annotated[float, typer.Option("--delta", help="target δ")]
SampleRate = Annotated[Optional[float], typer.Option("--sample-rate", help="q (or give dataset and batch size)")]
Steps = Annotated[Optional[int], typer.Option("--steps", help="steps (default epochs × batches per epoch)")]
AccountantName = Annotated[str, typer.Option("--accountant", help="auto | pld | rdp | allocation | montecarlo")]
Sampler = Annotated[str, typer.Option("--sampler", help=SAMPLER_HELP)]
GroupSize = Annotated[int, typer.Option("--group-size", help="k: add/remove up to k examples")]
DatasetSize = Annotated[Optional[int], typer.Option("--dataset-size", help="N training examples")]
BatchSize = Annotated[Optional[int], typer.Option("--batch-size", help="B (expected size for poisson)")]
BatchesPerEpoch = Annotated[Optional[int], typer.Option("--batches-per-epoch", help="b bins per epoch")]
Epochs = Annotated[Optional[int], typer.Option("--epochs", help="E")]
Mechanism = Annotated[str, typer.Option("--mechanism", help="identity | banded | toeplitz | blt")]
Bands = Annotated[int, typer.Option("--bands", help="w for --mechanism banded")]
MechanismParams = Annotated[Optional[str], typer.Option("--mechanism-params", help="JSON coefficients of C")]
FailureProbability = Annotated[Optional[float], typer.Option(
    "--failure-probability", help="Monte Carlo failure probability (default min(δ/10, 1e-6)); sets the EVR samples")]
EvrDeltaRatio = Annotated[float, typer.Option("--evr-delta-ratio", help="Monte Carlo: estimate at δ' = ratio·δ")]
Device = Annotated[str, typer.Option("--device", help="Monte Carlo: auto | cpu | cuda")]
MonteCarloSamples = Annotated[int, typer.Option("--samples", help="Monte Carlo samples (estimate / calibrate σ)")]
Seed = Annotated[int, typer.Option("--seed", help="Monte Carlo seed")]
Discretization = Annotated[float, typer.Option("--discretization", help="PLD value discretization interval")]
AsJson = Annotated[bool, typer.Option("--json", help="print a JSON object")]


def register(app: typer.Typer) -> None:
    """Add ``epsilon`` and ``noise`` to the ``dpledger`` app."""

    @app.command("epsilon")
    def epsilon(
        noise_multiplier: Annotated[float, typer.Option("--noise-multiplier", help="σ: noise std / clip norm")],
        delta: Delta,
        sample_rate: SampleRate = None,
        steps: Steps = None,
        accountant: AccountantName = _default("accountant"),
        sampler: Sampler = "poisson",
        group_size: GroupSize = 1,
        dataset_size: DatasetSize = None,
        batch_size: BatchSize = None,
        batches_per_epoch: BatchesPerEpoch = None,
        epochs: Epochs = None,
        mechanism: Mechanism = "identity",
        bands: Bands = 1,
        mechanism_params: MechanismParams = None,
        samples: MonteCarloSamples = _default("mc_samples"),
        failure_probability: FailureProbability = _default("mc_failure_probability"),
        evr_delta_ratio: EvrDeltaRatio = _default("evr_delta_ratio"),
        seed: Seed = 0,
        discretization: Discretization = _default("pld_discretization"),
        device: Device = _default("mc_device"),
        as_json: AsJson = False,
    ) -> None:
        """Print ε at δ for DP-SGD / DP-FTRL with the given noise, sampling and sizes."""
        warnings = _check_delta(delta, dataset_size)
        if not (math.isfinite(noise_multiplier) and noise_multiplier >= MIN_NOISE):
            raise ParamsError(f"--noise-multiplier = {noise_multiplier} is invalid: it must be a finite number >= "
                              f"{MIN_NOISE:g} (below it ε is in the hundreds and the accountants' grids explode)")
        description = _description(sampler, noise_multiplier, sample_rate, steps, dataset_size, batch_size,
                                   batches_per_epoch, epochs, group_size, mechanism, bands, mechanism_params)
        chosen = _accountant(accountant, description, samples, failure_probability, seed, evr_delta_ratio,
                             discretization, device)
        result = chosen.epsilon(description, delta)
        payload = {"epsilon": result.epsilon, "delta": delta, "accountant": chosen.name, "sampler": sampler,
                   "noise_multiplier": noise_multiplier, "steps": description.steps,
                   "sample_rate": description.sample_rate, "group_size": group_size, "warnings": warnings,
                   "assumptions": result.assumptions, "details": result.details}
        _emit(payload, as_json, f"epsilon = {result.epsilon:.6g} at delta = {delta:g} ({chosen.name}, {sampler}"
                                f"{_failure_text(result.details)})")

    @app.command("noise")
    def noise(
        epsilon: Annotated[float, typer.Option("--epsilon", help="target ε")],
        delta: Delta,
        sample_rate: SampleRate = None,
        steps: Steps = None,
        accountant: AccountantName = _default("accountant"),
        sampler: Sampler = "poisson",
        group_size: GroupSize = 1,
        dataset_size: DatasetSize = None,
        batch_size: BatchSize = None,
        batches_per_epoch: BatchesPerEpoch = None,
        epochs: Epochs = None,
        mechanism: Mechanism = "identity",
        bands: Bands = 1,
        mechanism_params: MechanismParams = None,
        samples: MonteCarloSamples = _default("mc_samples"),
        failure_probability: FailureProbability = _default("mc_failure_probability"),
        evr_delta_ratio: EvrDeltaRatio = _default("evr_delta_ratio"),
        seed: Seed = 0,
        discretization: Discretization = _default("pld_discretization"),
        device: Device = _default("mc_device"),
        as_json: AsJson = False,
    ) -> None:
        """Print the smallest noise multiplier σ whose proven ε at δ is at most the target."""
        from dpledger.accounting import calibrate_noise

        warnings = _check_delta(delta, dataset_size)
        description = _description(sampler, 1.0, sample_rate, steps, dataset_size, batch_size, batches_per_epoch,
                                   epochs, group_size, mechanism, bands, mechanism_params)
        chosen = _accountant(accountant, description, samples, failure_probability, seed, evr_delta_ratio,
                             discretization, device)
        calibration = calibrate_noise(chosen, description, epsilon, delta)
        result = calibration.result
        payload = {"noise_multiplier": calibration.noise_multiplier, "epsilon": result.epsilon, "delta": delta,
                   "target_epsilon": epsilon, "accountant": chosen.name, "sampler": sampler,
                   "steps": description.steps, "sample_rate": description.sample_rate, "group_size": group_size,
                   "warnings": warnings, "assumptions": result.assumptions, "details": result.details}
        _emit(payload, as_json, f"noise_multiplier = {calibration.noise_multiplier:.6g} "
                                f"(epsilon = {result.epsilon:.6g} at delta = {delta:g}; {chosen.name}, {sampler}"
                                f"{_failure_text(result.details)})")
