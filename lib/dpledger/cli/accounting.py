"""``dpledger epsilon`` (ε of a described run) and ``dpledger noise`` (σ for a target ε)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import typer

from dpledger.cli import strict_json
from dpledger.errors import ParamsError


def _description(sampler: str, noise_multiplier: float, sample_rate: Optional[float], steps: Optional[int],
                 dataset_size: Optional[int], batch_size: Optional[int], batches_per_epoch: Optional[int],
                 epochs: Optional[int], group_size: int, mechanism: str, bands: int,
                 mechanism_params: Optional[str]):
    from dpledger.accounting import describe
    from dpledger.mechanisms import MECHANISMS, banded_params

    if mechanism not in MECHANISMS:
        raise ParamsError(f"--mechanism = {mechanism!r} is invalid: allowed values are {', '.join(MECHANISMS)}")
    if mechanism_params is not None:
        try:
            matrix = json.loads(mechanism_params)
        except json.JSONDecodeError as error:
            raise ParamsError(f"--mechanism-params is not valid JSON: {error.msg}") from None
    elif mechanism in ("toeplitz", "blt"):
        raise ParamsError(f"--mechanism-params is missing: mechanism {mechanism} needs its coefficients as JSON "
                          f"(e.g. '{{\"buffer_decays\": [0.9], \"output_scales\": [0.2]}}' for blt)")
    else:
        matrix = banded_params(bands) if mechanism == "banded" else {}
    return describe(sampler=sampler, noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps,
                    dataset_size=dataset_size, batch_size=batch_size, batches_per_epoch=batches_per_epoch,
                    epochs=epochs, group_size=group_size, mechanism=mechanism, mechanism_params=matrix)


def _accountant(name: str, samples: int, verify_samples: int, seed: int, evr_delta_ratio: float,
                discretization: float):
    from dpledger.accounting import get_accountant

    if not 1e-6 <= discretization <= 1e-1:
        raise ParamsError(f"--discretization = {discretization} is invalid: it must lie in [1e-6, 0.1]")
    return get_accountant(name, samples=samples, verify_samples=verify_samples, seed=seed,
                          evr_delta_ratio=evr_delta_ratio, discretization=discretization)


def _check_delta(delta: float) -> None:
    if not 0.0 < delta < 1.0:
        raise ParamsError(f"--delta = {delta} is invalid: it must lie in (0, 1)")


def _emit(payload: dict[str, Any], as_json: bool, headline: str) -> None:
    if as_json:
        typer.echo(strict_json.dumps(payload))
        return
    typer.echo(headline)
    for sentence in payload["assumptions"]:
        typer.echo(f"  - {sentence}")


SAMPLER_HELP = "poisson | fixed | balls-in-bins (bins fixed across epochs) | balls-in-bins-redrawn"

# Options shared by ``epsilon`` and ``noise``: declared once so both commands describe a run the same way.
Delta = Annotated[float, typer.Option("--delta", help="target δ")]
SampleRate = Annotated[Optional[float], typer.Option("--sample-rate", help="q (or give dataset and batch size)")]
Steps = Annotated[Optional[int], typer.Option("--steps", help="steps (default epochs × batches per epoch)")]
AccountantName = Annotated[str, typer.Option("--accountant", help="pld | rdp | montecarlo")]
Sampler = Annotated[str, typer.Option("--sampler", help=SAMPLER_HELP)]
GroupSize = Annotated[int, typer.Option("--group-size", help="k: add/remove up to k examples")]
DatasetSize = Annotated[Optional[int], typer.Option("--dataset-size", help="N training examples")]
BatchSize = Annotated[Optional[int], typer.Option("--batch-size", help="B (expected size for poisson)")]
BatchesPerEpoch = Annotated[Optional[int], typer.Option("--batches-per-epoch", help="b bins per epoch")]
Epochs = Annotated[Optional[int], typer.Option("--epochs", help="E")]
Mechanism = Annotated[str, typer.Option("--mechanism", help="identity | banded | toeplitz | blt")]
Bands = Annotated[int, typer.Option("--bands", help="w for --mechanism banded")]
MechanismParams = Annotated[Optional[str], typer.Option("--mechanism-params", help="JSON coefficients of C")]
VerifySamples = Annotated[int, typer.Option("--verify-samples", help="fresh Monte Carlo samples (EVR)")]
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
        accountant: AccountantName = "pld",
        sampler: Sampler = "poisson",
        group_size: GroupSize = 1,
        dataset_size: DatasetSize = None,
        batch_size: BatchSize = None,
        batches_per_epoch: BatchesPerEpoch = None,
        epochs: Epochs = None,
        mechanism: Mechanism = "identity",
        bands: Bands = 1,
        mechanism_params: MechanismParams = None,
        samples: Annotated[int, typer.Option("--samples", help="Monte Carlo samples (estimate)")] = 1 << 17,
        verify_samples: VerifySamples = 1 << 20,
        evr_delta_ratio: Annotated[float, typer.Option("--evr-delta-ratio", help="estimate at δ' = ratio·δ")] = 0.5,
        seed: Seed = 0,
        discretization: Discretization = 1e-4,
        as_json: AsJson = False,
    ) -> None:
        """Print ε at δ for DP-SGD / DP-FTRL with the given noise, sampling and sizes."""
        _check_delta(delta)
        description = _description(sampler, noise_multiplier, sample_rate, steps, dataset_size, batch_size,
                                   batches_per_epoch, epochs, group_size, mechanism, bands, mechanism_params)
        result = _accountant(accountant, samples, verify_samples, seed, evr_delta_ratio, discretization).epsilon(description, delta)
        payload = {"epsilon": result.epsilon, "delta": delta, "accountant": accountant, "sampler": sampler,
                   "noise_multiplier": noise_multiplier, "steps": description.steps,
                   "sample_rate": description.sample_rate, "group_size": group_size,
                   "assumptions": result.assumptions, "details": result.details}
        _emit(payload, as_json, f"epsilon = {result.epsilon:.6g} at delta = {delta:g} ({accountant}, {sampler})")

    @app.command("noise")
    def noise(
        epsilon: Annotated[float, typer.Option("--epsilon", help="target ε")],
        delta: Delta,
        sample_rate: SampleRate = None,
        steps: Steps = None,
        accountant: AccountantName = "pld",
        sampler: Sampler = "poisson",
        group_size: GroupSize = 1,
        dataset_size: DatasetSize = None,
        batch_size: BatchSize = None,
        batches_per_epoch: BatchesPerEpoch = None,
        epochs: Epochs = None,
        mechanism: Mechanism = "identity",
        bands: Bands = 1,
        mechanism_params: MechanismParams = None,
        samples: Annotated[int, typer.Option("--samples", help="Monte Carlo samples (calibration)")] = 1 << 17,
        verify_samples: VerifySamples = 1 << 20,
        evr_delta_ratio: Annotated[float, typer.Option("--evr-delta-ratio", help="calibrate at δ' = ratio·δ")] = 0.5,
        seed: Seed = 0,
        discretization: Discretization = 1e-4,
        as_json: AsJson = False,
    ) -> None:
        """Print the smallest noise multiplier σ whose proven ε at δ is at most the target."""
        from dpledger.accounting import calibrate_noise

        description = _description(sampler, 1.0, sample_rate, steps, dataset_size, batch_size, batches_per_epoch,
                                   epochs, group_size, mechanism, bands, mechanism_params)
        chosen = _accountant(accountant, samples, verify_samples, seed, evr_delta_ratio, discretization)
        calibration = calibrate_noise(chosen, description, epsilon, delta)
        result = calibration.result
        payload = {"noise_multiplier": calibration.noise_multiplier, "epsilon": result.epsilon, "delta": delta,
                   "target_epsilon": epsilon, "accountant": accountant, "sampler": sampler,
                   "steps": description.steps, "sample_rate": description.sample_rate, "group_size": group_size,
                   "assumptions": result.assumptions, "details": result.details}
        _emit(payload, as_json, f"noise_multiplier = {calibration.noise_multiplier:.6g} "
                                f"(epsilon = {result.epsilon:.6g} at delta = {delta:g}; {accountant}, {sampler})")
