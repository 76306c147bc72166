"""Self-check: run the battery on correct trainers and on every zoo member over several seeds.

A correct trainer is classified correctly when it passes; a zoo member when it fails and every test
named in its ``caught_by`` fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dpledger.verify.battery import run_battery
from dpledger.verify.flawed_trainers import ZOO, zoo_member
from dpledger.verify.protocol import load_trainer
from dpledger.verify.result import BatteryResult

CORRECT_TRAINERS = ("dpledger", "reference", "opacus")


@dataclass(frozen=True)
class SelfCheckRow:
    """One trainer over all seeds."""

    trainer: str
    expected: str
    """'pass' for a correct trainer, else the tests that must fail."""
    seeds: int
    correct: int
    failed_tests_by_seed: tuple[tuple[str, ...], ...]
    max_steps: int
    max_wall_time_s: float

    def to_json(self) -> dict:
        return {
            "trainer": self.trainer,
            "expected": self.expected,
            "seeds": self.seeds,
            "classified_correctly": self.correct,
            "failed_tests_by_seed": [list(tests) for tests in self.failed_tests_by_seed],
            "max_training_steps": self.max_steps,
            "max_wall_time_s": round(self.max_wall_time_s, 3),
        }


def classified_correctly(trainer: str, result: BatteryResult) -> bool:
    """Whether the battery's verdict on ``trainer`` is the right one."""
    if not trainer.startswith("zoo:"):
        return result.passed
    caught_by = zoo_member(trainer.removeprefix("zoo:")).caught_by
    return not result.passed and set(caught_by) <= set(result.failed_tests)


def self_check(
    seeds: Sequence[int],
    trainers: Sequence[str] = CORRECT_TRAINERS + tuple(f"zoo:{name}" for name in ZOO),
    optimizer: str = "sgd",
    significance: float = 0.01,
) -> list[SelfCheckRow]:
    """Run the battery on each trainer for each seed and count correct classifications."""
    rows = []
    for trainer in trainers:
        function = load_trainer(trainer)
        results = [
            run_battery(
                function,
                trainer_name=trainer,
                seed=seed,
                optimizer=optimizer,
                significance=significance,
                progress=False,
            )
            for seed in seeds
        ]
        expected = (
            "pass"
            if not trainer.startswith("zoo:")
            else "fail " + ", ".join(zoo_member(trainer.removeprefix("zoo:")).caught_by)
        )
        rows.append(
            SelfCheckRow(
                trainer=trainer,
                expected=expected,
                seeds=len(results),
                correct=sum(classified_correctly(trainer, result) for result in results),
                failed_tests_by_seed=tuple(tuple(result.failed_tests) for result in results),
                max_steps=max(result.training_steps for result in results),
                max_wall_time_s=max(result.wall_time_s for result in results),
            )
        )
    return rows
