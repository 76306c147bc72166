"""Stage ``calibrate``: the noise multiplier σ (and correlation matrix C) that meets the privacy
budget.

Reads ``seed``, ``data`` (for the training-set size n), ``batching`` and ``calibrate``. Sizes: q =
B/n, b = ceil(n/B) batches (bins) per epoch, steps = epochs · b. Writes
``artifacts/calibration/calibration.json`` (the :class:`CalibrationRecord`: σ, C as mechanism_params
for ``dpledger.mechanisms.noise_stream``, ε of every applicable accountant with assumptions, the
group table and the ε-vs-step curve), ``metrics/calibrate.json`` (flat) and ``plots/calibrate/`` (ε
vs step, ε vs group size, RMSE vs ε per mechanism; CSV + PNG).
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from dpledger import io, plotting
from dpledger.accounting import (
    ACCOUNTANTS,
    AccountantResult,
    CalibrationRecord,
    MechanismDescription,
    calibrate_noise,
    epsilon_curve,
    get_accountant,
    group_table,
    resolve_accountant,
)
from dpledger.accounting.accountants import accountant_type
from dpledger.accounting.accountants.montecarlo import poisson_at_same_noise
from dpledger.accounting.description import vacuous_delta_warning
from dpledger.accounting.group import GroupEpsilon
from dpledger.accounting.optimize import RmseSetting, amplified_rmse, optimize_matrix
from dpledger.data import load_data
from dpledger.mechanisms import banded_params, coefficients
from dpledger.mechanisms.rmse import prefix_rmse
from dpledger.params import CalibrateParams, Params, check_dataset_size
from dpledger.pipeline.preflight import check_training_inputs
from dpledger.sampling.registry import build_sampler
from dpledger.seals import seal_record


def describe_run(params: Params, dataset_size: int) -> MechanismDescription:
    """The mechanism params.yaml describes over ``dataset_size`` training examples (σ still
    unknown)."""
    check_dataset_size(params, dataset_size)
    sizes = {
        "batch_size": params.batching.batch_size,
        "epochs": params.batching.epochs,
        "seed": params.seed,
    }
    return build_sampler(
        params.calibrate.sampler, dataset_size=dataset_size, **sizes
    ).mechanism_description()


def accountant_settings(params: Params) -> dict[str, Any]:
    cal = params.calibrate
    return {
        "samples": cal.mc_samples,
        "failure_probability": cal.mc_failure_probability,
        "seed": params.seed,
        "evr_delta_ratio": cal.evr_delta_ratio,
        "discretization": cal.pld_discretization,
        "device": cal.mc_device,
        "verification": cal.mc_verification,
    }


def accountant_name(cal: CalibrateParams) -> str:
    """calibrate.accountant, with ``auto`` resolved for the sampler and mechanism."""
    return resolve_accountant(cal.accountant, cal.sampler, cal.mechanism)


def choose_matrix(
    cal: CalibrateParams, description: MechanismDescription, seed: int
) -> dict[str, Any]:
    """mechanism_params of C: none for identity, the w-banded square root, or an optimized
    Toeplitz/BLT."""
    if cal.mechanism == "identity":
        return {}
    if cal.mechanism == "banded":
        return banded_params(min(cal.bands, description.steps))
    if cal.optimize_steps == 0 and cal.mechanism == "toeplitz":
        return {
            "coefficients": coefficients(
                "banded", banded_params(cal.bands), description.steps
            ).tolist()
        }
    optimized = optimize_matrix(
        cal.mechanism,
        cal.epsilon,
        cal.evr_delta_ratio * cal.delta,
        description.batches_per_epoch,
        description.epochs,
        steps=cal.optimize_steps,
        samples=cal.optimize_samples,
        seed=seed,
        buffers=cal.blt_buffers,
        init_bands=min(cal.bands, description.steps),
        progress=sys.stderr.isatty(),
    )
    return optimized.mechanism_params


def other_accountants(
    params: Params, description: MechanismDescription, chosen: str
) -> list[AccountantResult]:
    """ε at the calibrated σ from every other deterministic accountant that supports the
    description (a sampled one only as the claim: a Monte Carlo verification takes minutes, and a
    deterministic claim needs no sampled cross-check)."""
    results = []
    for name in ACCOUNTANTS:
        if name == chosen or not accountant_type(name).deterministic:
            continue
        accountant = get_accountant(name, **accountant_settings(params))
        if accountant.unsupported(description) is None:
            results.append(accountant.epsilon(description, params.calibrate.delta))
    return results


def rmse_rows(
    params: Params, description: MechanismDescription, mechanism_params: dict[str, Any]
) -> list[list]:
    """RMSE vs ε per mechanism under balls-in-bins (Monte Carlo σ) and without amplification (004
    §5.1)."""
    cal = params.calibrate
    bins, epochs = description.batches_per_epoch, description.epochs
    mechanisms = [("identity", {})]
    mechanisms += [(f"banded-{w}", banded_params(w)) for w in (2, 4, 8, 16, 32, 64) if w <= bins]
    if cal.mechanism in ("toeplitz", "blt"):
        mechanisms.append((f"{cal.mechanism}-calibrated", mechanism_params))
    rows = []
    for label, mech_params in mechanisms:
        kind = label.split("-")[0]
        for eps in cal.rmse_epsilons:
            setting = RmseSetting(eps, cal.delta, bins, epochs, cal.rmse_samples, params.seed)
            result = amplified_rmse(kind, mech_params, setting)
            rows.append([label, eps, result.rmse, result.unamplified_rmse, result.noise_multiplier])
    return rows


def run(params: Params, root: Path) -> dict[str, Any]:
    """Calibrate σ (and C), compute every applicable ε, the group table and the curves; write the
    outputs."""
    cal = params.calibrate
    dataset = load_data(params.data, params.seed)
    description = describe_run(params, dataset.train_size)
    check_training_inputs(params, dataset)
    name = accountant_name(cal)
    accountant = get_accountant(name, **accountant_settings(params))
    matrix = choose_matrix(cal, description, params.seed)
    description = replace(description, mechanism=cal.mechanism, mechanism_params=matrix)
    calibration = calibrate_noise(accountant, description, cal.epsilon, cal.delta)
    sigma = calibration.noise_multiplier
    described = description.with_noise(sigma)
    result = calibration.result
    poisson_same_noise = poisson_at_same_noise(described, cal.delta)
    warning = vacuous_delta_warning(cal.delta, dataset.train_size)
    assumptions = ([warning] if warning else []) + list(result.assumptions)
    others = other_accountants(params, described, name)
    groups = group_table(described, cal.delta, cal.group_sizes, cal.table_discretization)
    curve = epsilon_curve(
        accountant, described, cal.delta, result.epsilon, cal.curve_points, cal.table_discretization
    )
    rows = rmse_rows(params, described, matrix) if cal.sampler == "balls-in-bins" else []
    record = CalibrationRecord(
        description=described,
        epsilon=result.epsilon,
        delta=cal.delta,
        accountant=name,
        assumptions=assumptions,
        accountants=[result] + others,
        group=[g.to_dict() for g in groups],
        epsilon_curve=curve,
    )
    metrics = _metrics(record, described, result, others, groups, poisson_same_noise)
    metrics["delta_at_least_one_over_n"] = warning is not None
    with io.atomic_dir(root / "artifacts" / "calibration") as folder:
        seal_record(folder, record)
    io.write_json(root / "metrics" / "calibrate.json", metrics)
    _write_plots(root / "plots" / "calibrate", record, groups, rows)
    return metrics


def _metrics(
    record: CalibrationRecord,
    description: MechanismDescription,
    result: AccountantResult,
    others: list[AccountantResult],
    groups: list[GroupEpsilon],
    poisson_same_noise: float | None,
) -> dict:
    metrics: dict[str, Any] = {
        "noise_multiplier": record.noise_multiplier,
        "epsilon": record.epsilon,
        "delta": record.delta,
        "accountant": record.accountant,
        "sampler": record.sampler,
        "mechanism": record.mechanism,
        "steps": record.steps,
        "sample_rate": description.sample_rate,
        "batches_per_epoch": description.batches_per_epoch,
        "epochs": description.epochs,
        "dataset_size": record.dataset_size,
        "batch_size": record.batch_size,
        "rmse": prefix_rmse(
            coefficients(record.mechanism, record.mechanism_params, record.steps),
            record.noise_multiplier,
        ),
    }
    if "mc_failure_probability" in result.details:
        metrics["mc_failure_probability"] = result.details["mc_failure_probability"]
        metrics["mc_samples"] = result.details["samples"]
        metrics["mc_verify_samples"] = result.details["verify_samples"]
        metrics["mc_delta_verified"] = result.details["delta_estimate_verify"]
    if "epsilon_lower" in result.details:
        metrics["epsilon_lower"] = result.details["epsilon_lower"]
    for other in others:
        metrics[f"epsilon_{other.accountant}"] = other.epsilon
    if poisson_same_noise is not None:
        metrics["epsilon_poisson_same_noise"] = poisson_same_noise
    for row in groups:
        for method in ("mog", "conversion"):
            value = getattr(row, method)
            if value is not None:
                metrics[f"group_epsilon_{method}_k{row.group_size}"] = (
                    value if math.isfinite(value) else "inf"
                )
    return metrics


def _write_plots(
    folder: Path, record: CalibrationRecord, groups: list[GroupEpsilon], rows: list[list]
) -> None:
    io.write_csv(
        folder / "epsilon_vs_step.csv", ["step", "epsilon"], [list(p) for p in record.epsilon_curve]
    )
    with plotting.png(folder / "epsilon_vs_step.png") as axes:
        axes.plot(
            [p[0] for p in record.epsilon_curve], [p[1] for p in record.epsilon_curve], marker="o"
        )
        axes.set_xlabel("steps taken")
        axes.set_ylabel(f"ε spent (δ = {record.delta:g})")
        axes.set_title(f"{record.accountant}, {record.sampler}, σ = {record.noise_multiplier:.4g}")

    table = [[g.group_size, _cell(g.mog), _cell(g.conversion), _cell(g.linear)] for g in groups]
    io.write_csv(
        folder / "epsilon_vs_group.csv", ["group_size", "mog", "conversion", "linear"], table
    )
    with plotting.png(folder / "epsilon_vs_group.png") as axes:
        for index, (label, style) in enumerate(
            (
                ("mixture of Gaussians", "o-"),
                ("group conversion", "s--"),
                ("k·ε₁ at the same δ (reference, not a bound)", ":"),
            )
        ):
            points = [
                (row[0], row[index + 1])
                for row in table
                if isinstance(row[index + 1], float) and math.isfinite(row[index + 1])
            ]
            if points:
                axes.plot(*zip(*points), style, label=label)
        axes.set_xlabel("group size k")
        axes.set_ylabel("ε")
        axes.set_title(groups[0].note[:70] if groups and groups[0].mog is None else "group-level ε")
        if axes.get_legend_handles_labels()[0]:
            axes.legend()

    io.write_csv(
        folder / "rmse_vs_epsilon.csv",
        ["mechanism", "epsilon", "rmse_balls_in_bins", "rmse_unamplified", "noise_multiplier"],
        rows,
    )
    with plotting.png(folder / "rmse_vs_epsilon.png") as axes:
        for label in dict.fromkeys(row[0] for row in rows):
            mine = [row for row in rows if row[0] == label]
            line = axes.plot(
                [r[1] for r in mine],
                [r[2] for r in mine],
                marker="o",
                label=f"{label} (balls-in-bins)",
            )
            axes.plot(
                [r[1] for r in mine],
                [r[3] for r in mine],
                linestyle="--",
                color=line[0].get_color(),
            )
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_xlabel("ε")
        axes.set_ylabel("prefix-sum RMSE (σ‖AC⁻¹‖_F/√n)")
        axes.set_title(
            "RMSE vs ε (dashed: unamplified)" if rows else "RMSE vs ε: balls-in-bins sampler only"
        )
        if rows:
            axes.legend()


def _cell(value: float | None) -> float | str:
    return "" if value is None else float(value)
