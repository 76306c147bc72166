"""A fabricated project: every file the report reads, written from the stage contracts (common to
all report tests).

``fabricate_project`` writes flat metrics, detail JSONs, training artifacts and real matplotlib PNGs
for the five upstream stages, optionally with the problems the report must put first.
"""

from __future__ import annotations

import io as bytes_io
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from dpledger.params import Params, load_params  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]

PLOTS = {
    "calibrate": ("epsilon_vs_step", "epsilon_vs_group_size"),
    "schedule": ("batch_size_histogram",),
    "train": ("training_curves",),
    "verify": ("verify_tests",),
    "audit": ("tradeoff_curve", "epsilon_emp_vs_n"),
}


@dataclass(frozen=True)
class Problems:
    """Which failures to plant in the fabricated outputs."""

    sampler_mismatch: bool = False
    verify_failed: bool = False
    audit_contradicted: bool = False
    mc_failure_probability: float | None = None


ALL_PROBLEMS = Problems(True, True, True, 1e-3)


def report_params(**report: object) -> Params:
    """The repository's params.yaml, validated, with the report section overridden."""
    params = load_params(REPO_ROOT / "params.yaml")
    return params.model_copy(update={"report": params.report.model_copy(update=report)})


def fabricate_project(
    root: Path, problems: Problems = Problems(), skip: tuple[str, ...] = ()
) -> Path:
    """Write a complete set of upstream outputs under ``root`` (stages in ``skip`` left out)."""
    accounting = "montecarlo" if problems.mc_failure_probability is not None else "pld"
    used = "shuffle" if problems.sampler_mismatch else "poisson"
    outputs = {
        "calibrate": _calibrate(root, accounting, problems.mc_failure_probability),
        "schedule": _schedule(root, used),
        "train": _train(root, used, problems.sampler_mismatch),
        "verify": _verify(root, problems.verify_failed),
        "audit": _audit(root, problems.audit_contradicted, used),
    }
    for stage, write in outputs.items():
        if stage not in skip:
            write()
            for name in PLOTS[stage]:
                _write(root / "plots" / stage / f"{name}.png", _png(stage, name))
                _write(root / "plots" / stage / f"{name}.csv", b"x,y\n0,0\n1,1\n")
    return root


def _write(path: Path, content: bytes | str | dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, dict):
        content = json.dumps(content, indent=2)
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)


def _calibrate(root: Path, accountant: str, mc_failure: float | None):
    metrics = {
        "noise_multiplier": 1.0731,
        "epsilon": 3.0000049,
        "delta": 1e-5,
        "accountant": accountant,
        "sampler": "poisson",
        "mechanism": "identity",
        "steps": 225,
        "sample_rate": 64 / 1438,
        "mechanism_rmse": 0.0421,
    }
    if mc_failure is not None:
        metrics["mc_failure_probability"] = mc_failure
    record = {
        "noise_multiplier": 1.0731,
        "epsilon": 3.0000049,
        "delta": 1e-5,
        "accountant": accountant,
        "sampler": "poisson",
        "assumptions": [
            "Poisson sampling: each example joins each step independently with probability q = "
            "0.0445",
            "zero-out adjacency; every intermediate model is released",
        ],
        "steps": 225,
        "batch_size": 64,
        "dataset_size": 1438,
        "epochs": 10,
        "mechanism": "identity",
        "mechanism_params": {"coefficients": [1.0] + [0.0] * 40},
        "accountants": [
            {
                "accountant": "pld",
                "epsilon": 3.0000049,
                "delta": 1e-5,
                "details": {},
                "assumptions": ["zero-out adjacency; every intermediate model is released"],
            },
            {
                "accountant": "rdp",
                "epsilon": 3.41,
                "delta": 1e-5,
                "assumptions": ["RDP conversion"],
                "details": {},
            },
        ],
        "group": [
            {
                "group_size": 1,
                "mog": 3.0000049,
                "conversion": 3.0000049,
                "linear": 3.0000049,
                "note": "",
            },
            {"group_size": 2, "mog": 6.37, "conversion": 6.9, "linear": 6.0000098, "note": ""},
            {"group_size": 4, "mog": 13.90001, "conversion": 15.2, "linear": 12.00002, "note": ""},
            {
                "group_size": 8,
                "mog": 31.2,
                "conversion": float("inf"),
                "linear": 24.00004,
                "note": "PLD tail",
            },
        ],
        "epsilon_curve": [[s, 3.0000049 * s / 225] for s in range(0, 226, 25)],
    }

    def write() -> None:
        _write(root / "metrics" / "calibrate.json", metrics)
        _write(root / "artifacts" / "calibration" / "calibration.json", record)

    return write


def _schedule(root: Path, sampler: str):
    metrics = {
        "sampler": sampler,
        "num_steps": 225,
        "dataset_size": 1438,
        "batch_size_mean": 63.9,
        "batch_size_std": 7.8,
        "batch_size_min": 41,
        "batch_size_max": 88,
        "padding_rows": 0,
    }
    header = {
        "sampler": sampler,
        "sampler_params": {"batch_size": 64},
        "seed": 0,
        "dataset_size": 1438,
        "steps_per_epoch": 22,
        "num_steps": 225,
        "normalizer": None,
        "metadata": {},
    }

    def write() -> None:
        _write(root / "metrics" / "schedule.json", metrics)
        _write(root / "artifacts" / "schedule" / "schedule.json", header)

    return write


def _train(root: Path, used: str, mismatch: bool):
    metrics = {
        "test_accuracy": 0.8861,
        "final_train_loss": 0.4213,
        "epsilon_spent": 3.0000049,
        "steps_done": 225,
        "throughput_examples_per_s": 5120.4,
        "wall_time_s": 12.7,
        "sampler_accounted": "poisson",
        "sampler_used": used,
        "sampler_mismatch": mismatch,
        "self_check_ran": True,
        "self_check_passed": True,
        "self_check_max_relative_error": 2.1e-16,
        "self_check_examples": 4,
        "self_check_parameters_checked": 4,
        "self_check_parameters_trainable": 4,
        "self_check_dtype": "float64",
        "self_check_seconds": 0.21,
        "baseline": "majority class",
        "baseline_class": 3,
        "baseline_accuracy": 0.1083,
        "test_examples": 360,
        "above_baseline_p_value": 1.2e-190,
        "predicted_classes": 10,
        "test_macro_f1": 0.8843,
        "model_architecture": "MLP",
        "parameters_total": 19210,
        "parameters_trainable": 19210,
        "signal_to_noise": 0.4123,
    }

    def write() -> None:
        _write(root / "metrics" / "train.json", metrics)
        _write(
            root / "artifacts" / "train" / "summary.json",
            {"model": "mlp", "ledger": {"steps": 225}},
        )
        _write(root / "artifacts" / "train" / "model.pt", b"\x00binary checkpoint")

    return write


def _verify(root: Path, failed: bool):
    tests = [
        {
            "name": "no_clipping",
            "statistic": 0.41,
            "p_value": 0.62,
            "passed": True,
            "diagnosis": "",
            "steps": 3,
        },
        {
            "name": "minibatch_clipping",
            "statistic": 5.2 if failed else 0.3,
            "p_value": 1e-4 if failed else 0.44,
            "passed": not failed,
            "diagnosis": "ΔL grows with B: clipping is applied to the batch, not per example"
            if failed
            else "",
            "steps": 3,
        },
        {
            "name": "noise_calibration",
            "statistic": 1.1,
            "p_value": 0.27,
            "passed": True,
            "diagnosis": "",
            "steps": 3,
        },
        {
            "name": "opacus_only",
            "statistic": None,
            "p_value": None,
            "passed": True,
            "skipped": True,
            "diagnosis": "not applicable to this trainer",
            "steps": 0,
        },
    ]
    metrics = {
        "passed": not failed,
        "tests_run": 3,
        "tests_failed": int(failed),
        "training_steps": 9,
    }
    metrics.update({f"p_value_{t['name']}": t["p_value"] for t in tests if not t.get("skipped")})
    details = {
        "verdict": {
            "passed": not failed,
            "findings": ["per-example clipping missing"] if failed else [],
        },
        "tests": tests,
        "trainer": "dpledger",
    }

    def write() -> None:
        _write(root / "metrics" / "verify.json", metrics)
        _write(root / "artifacts" / "verify" / "verify.json", details)

    return write


def _audit(root: Path, contradicted: bool, sampler: str):
    emp = 4.2 if contradicted else 0.83
    metrics = {
        "epsilon_emp": emp,
        "epsilon_claimed": 3.0000049,
        "verdict": "contradicted" if contradicted else "consistent",
        "observations": 100000,
        "confidence": 0.95,
        "threshold_method": "bonferroni",
        "sampler": sampler,
    }
    details = {
        "threat_models": {
            "partially_informed": {"epsilon_emp": emp, "fpr": 0.01},
            "worst_case": {"epsilon_emp": emp},
        },
        "by_observations": [
            {"observations": n, "epsilon_emp": emp * (1 - 1 / np.sqrt(n))}
            for n in (100, 1000, 10000)
        ],
        "scores": list(np.linspace(0.0, 1.0, 5000)),
    }

    def write() -> None:
        _write(root / "metrics" / "audit.json", metrics)
        _write(root / "artifacts" / "audit" / "audit.json", details)

    return write


@lru_cache(maxsize=None)
def _png(stage: str, name: str) -> bytes:
    """A real (small) matplotlib figure, drawn once per test session."""
    x = np.linspace(0, 1, 60)
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=80)
    if "histogram" in name:
        ax.hist(np.random.default_rng(0).normal(64, 8, 500), bins=20, color="tab:blue")
    else:
        ax.plot(x, np.sqrt(x) * 3, color="tab:red", label=name)
        ax.legend()
    ax.set_title(f"{stage}: {name}")
    buffer = bytes_io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()
