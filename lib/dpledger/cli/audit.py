"""``dpledger audit ...``: canary audits from the command line (batched Gaussian mechanism, DP-SGD,
self-check)."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from dpledger import validation
from dpledger.audit.estimate import THRESHOLD_METHODS, AuditStatistics
from dpledger.cli import strict_json
from dpledger.errors import ParamsError

audit_app = typer.Typer(
    no_args_is_help=True, help="Canary audits: an empirical lower bound on ε beside the claim."
)


def _print(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(strict_json.dumps(summary))
        return
    for key, value in summary.items():
        typer.echo(f"{key}: {value}")


def _check_threshold(threshold: str) -> None:
    validation.one_of("--threshold", threshold, THRESHOLD_METHODS)


def _statistics(threshold: str, confidence: float, split_fraction: float = 0.2) -> AuditStatistics:
    """The checked ``--threshold``, ``--confidence`` and ``--split-fraction`` as one record."""
    _check_threshold(threshold)
    _check_numbers({}, {"--confidence": confidence, "--split-fraction": split_fraction})
    return AuditStatistics(confidence, threshold, split_fraction)


def _sampler_options(sampler: str, buffer_size: Optional[int]) -> dict[str, Any]:
    if sampler == "partial-shuffle" and buffer_size is None:
        raise ParamsError(
            "--buffer-size is missing: --sampler partial-shuffle needs the shuffle buffer K "
            "(an integer >= 1)"
        )
    return {} if buffer_size is None else {"buffer_size": buffer_size}


def _check_numbers(positive: dict[str, float], probabilities: dict[str, float]) -> None:
    """One line for a non-finite or non-positive size (σ, ε, clip norm, lr) or a probability outside
    (0, 1)."""
    for flag, value in positive.items():
        validation.positive(flag, value)
    for flag, value in probabilities.items():
        validation.within(flag, value, 0, 1)


# torch.manual_seed takes at most 64 bits and numpy refuses negative seeds: one range for every
# audit command.
SEED_RANGE = {"min": 0, "max": 2**32 - 1}

# The options every audit command shares, declared once.
Threshold = Annotated[
    str,
    typer.Option("--threshold", help="bonferroni | split (valid) | max (uncorrected, not valid)"),
]
Delta = Annotated[float, typer.Option("--delta", help="δ of the claim and of ε_emp")]
Confidence = Annotated[float, typer.Option("--confidence", help="confidence of the lower bound")]
Seed = Annotated[int, typer.Option("--seed", **SEED_RANGE, help="random seed")]
BufferSize = Annotated[
    Optional[int], typer.Option("--buffer-size", help="K for --sampler partial-shuffle")
]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON")]


@audit_app.command("bgm")
def bgm(
    sampler: str = typer.Option(..., help="sampler to audit (a built-in name or module:callable)"),
    steps: int = typer.Option(..., help="T: steps per epoch (the dataset has T × B examples)"),
    epochs: int = typer.Option(1, help="E: epochs"),
    noise_multiplier: float = typer.Option(..., help="σ: noise std over the clip norm"),
    observations: int = typer.Option(..., help="games run, half on D and half on D'"),
    batch_size: int = typer.Option(1, help="B: batch size"),
    seed: Seed = 0,
    threshold: Threshold = "bonferroni",
    confidence: Confidence = 0.95,
    delta: Delta = 1e-5,
    epsilon_claimed: Optional[float] = typer.Option(
        None, help="the claim to test (default: PLD ε for --claim-sampler)"
    ),
    claim_sampler: Optional[str] = typer.Option(
        None,
        help="accountant's sampler for the claim: poisson | fixed (default: the sampler's own, "
        "else poisson)",
    ),
    buffer_size: BufferSize = None,
    split_fraction: float = typer.Option(0.2, help="held-out fraction for --threshold split"),
    backend: str = typer.Option("auto", help="auto (GPU if present) | numpy | torch"),
    as_json: AsJson = False,
) -> None:
    """Audit the batched Gaussian mechanism (Worst-Case threat model) with a sampler; print ε_emp
    and the verdict."""
    from dpledger.audit.bgm import CLAIM_ACCOUNTANTS, BgmAudit, audit_bgm
    from dpledger.audit.result import Claim
    from dpledger.sampling.registry import sampler_class

    _check_numbers({"--noise-multiplier": noise_multiplier}, {"--delta": delta})
    if steps < 1 or batch_size < 1:
        raise ParamsError(f"--steps = {steps}, --batch-size = {batch_size}: both must be >= 1")
    if epsilon_claimed is not None:
        validation.positive("--epsilon-claimed", epsilon_claimed)
    own = sampler_class(sampler).accounted_as
    claim = claim_sampler or (own if own in CLAIM_ACCOUNTANTS else "poisson")
    config = BgmAudit(
        sampler,
        dataset_size=steps * batch_size,
        batch_size=batch_size,
        epochs=epochs,
        noise_multiplier=noise_multiplier,
        observations=observations,
        delta=delta,
        statistics=_statistics(threshold, confidence, split_fraction),
        claim=None if epsilon_claimed is None else Claim(epsilon_claimed, delta, "given"),
        claim_sampler=claim,
        options=_sampler_options(sampler, buffer_size),
        seed=seed,
        backend=backend,
        progress=not as_json,
    )
    result, _ = audit_bgm(config)
    _print(
        {**result.summary(), "claim_basis": result.claim.basis, "pair": result.setting["pair"]},
        as_json,
    )


@audit_app.command("selfcheck")
def selfcheck(
    mechanism: str = typer.Option(
        "laplace", help="laplace (tight at every threshold) | poisson (BGM vs its PLD ε)"
    ),
    threshold: Threshold = "bonferroni",
    repeats: int = typer.Option(100, help="audits to run"),
    observations: int = typer.Option(20_000, help="games per audit"),
    epsilon: float = typer.Option(1.0, help="ε of the Laplace mechanism"),
    steps: int = typer.Option(100, help="steps of the Poisson BGM (q = 1/steps)"),
    noise_multiplier: float = typer.Option(1.0, help="σ of the Poisson BGM"),
    delta: Delta = 1e-5,
    confidence: Confidence = 0.95,
    seed: Seed = 0,
    as_json: AsJson = False,
) -> None:
    """Audit a mechanism with known ε many times; report how often ε_emp exceeded it (the
    false-alarm rate)."""
    from dpledger.audit.selfcheck import run_selfcheck

    statistics = _statistics(threshold, confidence)
    _check_numbers(
        {"--epsilon": epsilon, "--noise-multiplier": noise_multiplier}, {"--delta": delta}
    )
    check = run_selfcheck(
        mechanism,
        method=statistics.method,
        repeats=repeats,
        observations=observations,
        epsilon=epsilon,
        steps=steps,
        noise_multiplier=noise_multiplier,
        delta=delta,
        confidence=statistics.confidence,
        seed=seed,
        progress=not as_json,
    )
    summary = check.to_dict()
    summary.pop("epsilon_emp")
    _print(summary, as_json)


@audit_app.command("dpsgd")
def dpsgd(
    threat_model: str = typer.Option(
        "partially-informed", help="natural | partially-informed | worst-case"
    ),
    sampler: str = typer.Option("shuffle", help="sampler of the audited training runs"),
    observations: int = typer.Option(
        1000, help="training runs, half with the target and half with it zeroed out"
    ),
    epochs: int = typer.Option(1, help="epochs per run"),
    batch_size: int = typer.Option(64, help="batch size"),
    noise_multiplier: float = typer.Option(1.0, help="σ"),
    clip_norm: float = typer.Option(1.0, help="clip norm C"),
    lr: float = typer.Option(0.5, help="learning rate"),
    dataset_size: Optional[int] = typer.Option(
        None, help="use the first n training examples of the embedded data"
    ),
    threshold: Threshold = "bonferroni",
    delta: Delta = 1e-5,
    confidence: Confidence = 0.95,
    seed: Seed = 0,
    buffer_size: BufferSize = None,
    as_json: AsJson = False,
) -> None:
    """Audit DP-SGD on the embedded digits data with gradient canaries (002 Alg. 1)."""
    from dpledger.audit.bgm import BgmAudit
    from dpledger.audit.dpsgd import DpsgdAudit, audit_dpsgd, digits_workload

    _check_numbers(
        {"--noise-multiplier": noise_multiplier, "--clip-norm": clip_norm, "--lr": lr},
        {"--delta": delta},
    )
    workload = digits_workload(seed)
    mechanism = BgmAudit(
        sampler,
        dataset_size=workload.x.shape[0] if dataset_size is None else dataset_size,
        batch_size=batch_size,
        epochs=epochs,
        noise_multiplier=noise_multiplier,
        observations=observations,
        delta=delta,
        statistics=_statistics(threshold, confidence),
        options=_sampler_options(sampler, buffer_size),
        seed=seed,
        progress=not as_json,
    )
    result = audit_dpsgd(
        DpsgdAudit(mechanism, threat_model=threat_model, clip_norm=clip_norm, lr=lr), workload
    )
    _print({**result.summary(), "claim_basis": result.claim.basis}, as_json)


def register(app: typer.Typer) -> None:
    """Add ``dpledger audit ...`` to the app."""
    app.add_typer(audit_app, name="audit")
