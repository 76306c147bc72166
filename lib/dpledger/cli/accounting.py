"""``dpledger epsilon`` (ε of a described run) and ``dpledger noise`` (σ for a target ε)."""

from __future__ import annotations

import json
import math
from typing import Any, Optional

import typer

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


def _emit(payload: dict[str, Any], as_json: bool, headline: str) -> None:
    if as_json:
        typer.echo(json.dumps(_jsonable(payload), indent=2))
        return
    typer.echo(headline)
    for sentence in payload["assumptions"]:
        typer.echo(f"  - {sentence}")


def _jsonable(value: Any) -> Any:
    """Strict JSON: ∞ becomes the string "inf" (JSON has no Infinity), containers recursively."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


SAMPLER_HELP = "poisson | fixed | balls-in-bins (bins fixed across epochs) | balls-in-bins-redrawn"


def register(app: typer.Typer) -> None:
    """Add ``epsilon`` and ``noise`` to the ``dpledger`` app."""

    @app.command("epsilon")
    def epsilon(
        noise_multiplier: float = typer.Option(..., "--noise-multiplier", help="σ: noise std / clip norm"),
        delta: float = typer.Option(..., "--delta", help="target δ"),
        sample_rate: Optional[float] = typer.Option(None, "--sample-rate", help="q (or give dataset and batch size)"),
        steps: Optional[int] = typer.Option(None, "--steps", help="steps (default epochs × batches per epoch)"),
        accountant: str = typer.Option("pld", "--accountant", help="pld | rdp | montecarlo"),
        sampler: str = typer.Option("poisson", "--sampler", help=SAMPLER_HELP),
        group_size: int = typer.Option(1, "--group-size", help="k: add/remove up to k examples"),
        dataset_size: Optional[int] = typer.Option(None, "--dataset-size", help="N training examples"),
        batch_size: Optional[int] = typer.Option(None, "--batch-size", help="B (expected size for poisson)"),
        batches_per_epoch: Optional[int] = typer.Option(None, "--batches-per-epoch", help="b bins per epoch"),
        epochs: Optional[int] = typer.Option(None, "--epochs", help="E"),
        mechanism: str = typer.Option("identity", "--mechanism", help="identity | banded | toeplitz | blt"),
        bands: int = typer.Option(1, "--bands", help="w for --mechanism banded"),
        mechanism_params: Optional[str] = typer.Option(None, "--mechanism-params", help="JSON coefficients of C"),
        samples: int = typer.Option(1 << 17, "--samples", help="Monte Carlo samples (estimate)"),
        verify_samples: int = typer.Option(1 << 20, "--verify-samples", help="fresh Monte Carlo samples (EVR)"),
        evr_delta_ratio: float = typer.Option(0.5, "--evr-delta-ratio", help="estimate at δ' = ratio·δ"),
        seed: int = typer.Option(0, "--seed", help="Monte Carlo seed"),
        discretization: float = typer.Option(1e-4, "--discretization", help="PLD value discretization interval"),
        as_json: bool = typer.Option(False, "--json", help="print a JSON object"),
    ) -> None:
        """Print ε at δ for DP-SGD / DP-FTRL with the given noise, sampling and sizes."""
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
        epsilon: float = typer.Option(..., "--epsilon", help="target ε"),
        delta: float = typer.Option(..., "--delta", help="target δ"),
        sample_rate: Optional[float] = typer.Option(None, "--sample-rate", help="q (or give dataset and batch size)"),
        steps: Optional[int] = typer.Option(None, "--steps", help="steps (default epochs × batches per epoch)"),
        accountant: str = typer.Option("pld", "--accountant", help="pld | rdp | montecarlo"),
        sampler: str = typer.Option("poisson", "--sampler", help=SAMPLER_HELP),
        group_size: int = typer.Option(1, "--group-size", help="k: add/remove up to k examples"),
        dataset_size: Optional[int] = typer.Option(None, "--dataset-size", help="N training examples"),
        batch_size: Optional[int] = typer.Option(None, "--batch-size", help="B (expected size for poisson)"),
        batches_per_epoch: Optional[int] = typer.Option(None, "--batches-per-epoch", help="b bins per epoch"),
        epochs: Optional[int] = typer.Option(None, "--epochs", help="E"),
        mechanism: str = typer.Option("identity", "--mechanism", help="identity | banded | toeplitz | blt"),
        bands: int = typer.Option(1, "--bands", help="w for --mechanism banded"),
        mechanism_params: Optional[str] = typer.Option(None, "--mechanism-params", help="JSON coefficients of C"),
        samples: int = typer.Option(1 << 17, "--samples", help="Monte Carlo samples (calibration)"),
        verify_samples: int = typer.Option(1 << 20, "--verify-samples", help="fresh Monte Carlo samples (EVR)"),
        evr_delta_ratio: float = typer.Option(0.5, "--evr-delta-ratio", help="calibrate at δ' = ratio·δ"),
        seed: int = typer.Option(0, "--seed", help="Monte Carlo seed"),
        discretization: float = typer.Option(1e-4, "--discretization", help="PLD value discretization interval"),
        as_json: bool = typer.Option(False, "--json", help="print a JSON object"),
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
