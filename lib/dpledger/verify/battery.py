"""The debugging battery: every test on one trainer, with Holm's correction over the stochastic
tests.

Family-wise error: the tests whose rejection signals a bug from a random sample (KS, noise scale,
noise independence) are corrected together with Holm's step-down procedure, and a rejection must be
confirmed by Holm on an independent replicate, so a correct trainer fails one of them with
probability at most ``significance`` (about ``significance``² with the confirmation). The σ = 0
tests (T1, T2, sensitivity, T3 control) are deterministic and use a floating-point tolerance; T3
passes by rejecting "slope = 0", which a correct trainer does with p ≈ 0 under common random
numbers.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from tqdm import tqdm

from dpledger.verify.clipping_checks import run_sensitivity, run_t1, run_t2
from dpledger.verify.engine_check import run_engine_self_check
from dpledger.verify.noise_checks import (
    run_noise_distribution,
    run_noise_independence,
    run_sigma_heuristic,
    skipped_noise_tests,
)
from dpledger.verify.protocol import Trainer
from dpledger.verify.result import BatteryResult, PendingResult, TestResult
from dpledger.verify.runner import BatteryConfig, Runner
from dpledger.verify.stats import holm_thresholds
from dpledger.verify.t3_checks import run_t3
from dpledger.verify.task import SyntheticTask, make_task

OPTIMIZERS = ("sgd", "adam")
TEST_NAMES = (
    "t1_no_clipping",
    "t2_minibatch_clipping",
    "sensitivity",
    "t3_noise_calibration",
    "t3_control",
    "ks_update_distribution",
    "noise_scale",
    "noise_independence",
    "engine_self_check",
)


def run_battery(
    trainer: Trainer,
    *,
    trainer_name: str,
    seed: int = 0,
    optimizer: str = "sgd",
    significance: float = 0.01,
    config: BatteryConfig = BatteryConfig(),
    progress: bool = True,
    task: SyntheticTask | None = None,
) -> BatteryResult:
    """Run every test on ``trainer`` (see :mod:`dpledger.verify.protocol`) and return the verdicts;
    ``task`` is the model and rows to train (default: the synthetic task of ``seed``,
    :func:`make_task`)."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer {optimizer!r} is not supported; use one of {OPTIMIZERS}")
    with _single_thread():
        return _run(
            trainer,
            trainer_name,
            seed,
            optimizer,
            significance,
            config,
            progress,
            task or make_task(seed),
        )


@contextmanager
def _single_thread() -> Iterator[None]:
    """The battery's model is tiny: one thread is faster than several contending ones."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _run(
    trainer: Trainer,
    trainer_name: str,
    seed: int,
    optimizer: str,
    significance: float,
    config: BatteryConfig,
    progress: bool,
    task: SyntheticTask,
) -> BatteryResult:
    started = time.perf_counter()
    runner = Runner(trainer, task, optimizer, config)
    trainer_seed = 1_000 * seed
    quiet = not progress or not sys.stderr.isatty()
    bar = tqdm(total=7, desc=f"verify {trainer_name}", unit="test", disable=quiet)

    def step(label: str, compute: Callable[[], object]):
        bar.set_postfix_str(label)
        value = compute()
        bar.update()
        return value

    t1, c_star = step("T1", lambda: run_t1(runner, config, trainer_seed, significance))
    t2 = step("T2", lambda: run_t2(runner, config, trainer_seed, significance))
    sensitivity = step("sensitivity", lambda: run_sensitivity(runner, config, trainer_seed))
    heuristics = step(
        "σ heuristic", lambda: run_sigma_heuristic(runner, config, c_star, trainer_seed + 50)
    )
    t3, control = step(
        "T3", lambda: run_t3(runner, config, heuristics, trainer_seed + 100, significance)
    )
    if optimizer == "sgd":
        noise_results = step(
            "noise", lambda: _noise_family(runner, config, c_star, trainer_seed, significance)
        )
    else:
        noise_results = skipped_noise_tests()
        bar.update()
    engine_check = step("engine", lambda: run_engine_self_check(task))
    bar.close()
    return BatteryResult(
        trainer=trainer_name,
        optimizer=optimizer,
        seed=seed,
        significance=significance,
        correction="holm",
        tests=(t1, t2, sensitivity, t3, control, *noise_results, engine_check),
        training_steps=runner.steps_used,
        wall_time_s=time.perf_counter() - started,
        heuristics={
            "c_star": heuristics.c_star,
            "sigma_star": heuristics.sigma_star,
            "sigma_grid": list(heuristics.sigma_grid),
            "sigma_loss_changes": list(heuristics.sigma_loss_changes),
            "sigma_zero_loss_change": heuristics.sigma_zero_loss_change,
            "t3_noise_multiplier": t3.details["noise_multiplier"],
            "probe_gradient_norm": runner.task.probe_norm,
            "model": task.description,
            "warmup_steps": runner.warmup_steps,
            "steps": heuristics.steps,
        },
    )


def _measure_noise_family(
    runner: Runner, config: BatteryConfig, c_star: float, seed: int
) -> list[PendingResult]:
    ks, scale, one_step = run_noise_distribution(runner, config, c_star, seed + 200)
    independence = run_noise_independence(runner, config, c_star, one_step, seed + 300)
    return [ks, scale, independence]


def _noise_family(
    runner: Runner, config: BatteryConfig, c_star: float, seed: int, significance: float
) -> list[TestResult]:
    """KS, noise scale and noise independence, decided by Holm and confirmed on an independent
    replicate.

    A test that Holm rejects is measured again with fresh seeds and fails only if Holm rejects the
    replicate too: a correct trainer then fails with probability about ``significance``², while a
    real bug (p ≈ 0 in both) still fails. The replicate costs steps only when a first-stage test
    rejects.
    """
    first = _measure_noise_family(runner, config, c_star, seed)
    first_rejected = holm_thresholds(
        {result.name: result.p_value for result in first}, significance
    )
    if not any(first_rejected.values()):
        return [result.finish(passed=True) for result in first]
    steps_before = runner.steps_used
    replicate = _measure_noise_family(runner, config, c_star, seed + 500)
    replicate_steps = runner.steps_used - steps_before
    confirmed = holm_thresholds({result.name: result.p_value for result in replicate}, significance)
    results = []
    for stage_one, stage_two in zip(first, replicate):
        rejected = first_rejected[stage_one.name]
        failed = rejected and confirmed[stage_one.name]
        finished = (stage_one if failed or not rejected else stage_two).finish(passed=not failed)
        note = (
            f" (a first sample gave p = {stage_one.p_value:.3g}; "
            "an independent replicate did not confirm it)"
            if rejected and not failed
            else ""
        )
        results.append(
            dataclasses.replace(
                finished,
                p_value=max(stage_one.p_value, stage_two.p_value)
                if rejected
                else stage_one.p_value,
                diagnosis=finished.diagnosis + note,
                steps=stage_one.steps + stage_two.steps,
                details={
                    **finished.details,
                    "first_stage_p_value": stage_one.p_value,
                    "replicate_p_value": stage_two.p_value,
                    "replicate_steps_of_family": replicate_steps,
                },
            )
        )
    return results
