"""Records of a battery run: one :class:`TestResult` per test, a :class:`BatteryResult` with the
verdict."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Sequence

from dpledger.verify.stats import SlopeTest


@dataclass(frozen=True)
class Curve:
    """One plotted series."""

    label: str
    x: tuple[float, ...]
    y: tuple[float, ...]


@dataclass(frozen=True)
class Figure:
    """What a test plots: curves against one x axis."""

    title: str
    xlabel: str
    ylabel: str
    curves: tuple[Curve, ...]
    log_x: bool = False
    kind: str = "line"
    """line | scatter (first curve as points) | cdf (an empirical CDF, drawn against N(0, 1)'s)."""


def ratio_figure(
    title: str, xlabel: str, ylabel: str, ratios: Sequence[float], reference: str
) -> Figure:
    """A ratio per context or run (points), against the line at 1 that a correct trainer gives."""
    return Figure(
        title=title,
        xlabel=xlabel,
        ylabel=ylabel,
        kind="scatter",
        curves=(
            Curve("trainer under test", tuple(float(i) for i in range(len(ratios))), tuple(ratios)),
            Curve(reference, (0.0, float(len(ratios) - 1)), (1.0, 1.0)),
        ),
    )


@dataclass(frozen=True)
class Check:
    """What a test is, the same on every trainer: its name, what it requires and what its statistic
    measures."""

    name: str
    description: str
    statistic_name: str

    def result(self, **outcome: Any) -> TestResult:
        """This check's :class:`TestResult`; ``outcome`` holds every field but the check's own
        three."""
        return TestResult(**asdict(self), **outcome)

    def slope(self, test: SlopeTest | None, **outcome: Any) -> TestResult:
        """A slope test's outcome: its t statistic and p-value (no test, too few points to fit: t =
        0, p = 1)."""
        if test is None:
            return self.result(statistic=0.0, p_value=1.0, **outcome)
        return self.result(statistic=test.t_statistic, p_value=test.p_value, **outcome)

    def deterministic(
        self,
        *,
        passed: bool,
        tolerance: float,
        details: dict[str, Any],
        note: str = "",
        **outcome: Any,
    ):
        """A check with no sampling noise: its p-value is 1 if it holds within ``tolerance``, else
        0, and its details say so (``note`` qualifies "deterministic check")."""
        noted = {
            **details,
            "tolerance": tolerance,
            "p_value_note": f"deterministic check{note}: p is 1 within the tolerance, else 0",
        }
        return self.result(p_value=1.0 if passed else 0.0, passed=passed, details=noted, **outcome)

    def pending(self, **outcome: Any) -> PendingResult:
        """This check's :class:`PendingResult`, whose verdict the Holm correction decides."""
        return PendingResult(**asdict(self), **outcome)


@dataclass(frozen=True)
class TestResult:
    """One test's statistic, p-value, verdict and plain-language diagnosis."""

    name: str
    description: str
    statistic: float
    statistic_name: str
    p_value: float
    passed: bool
    diagnosis: str
    steps: int
    skipped: bool = False
    details: dict[str, Any] = field(default_factory=dict)
    figure: Figure | None = None

    def to_json(self) -> dict[str, Any]:
        """Every field but the figure (plotted, not recorded), in the order readers expect."""
        return {name: getattr(self, name) for name in _JSON_FIELDS}


_JSON_FIELDS = (
    "name",
    "description",
    "statistic",
    "statistic_name",
    "p_value",
    "passed",
    "skipped",
    "diagnosis",
    "steps",
    "details",
)


@dataclass(frozen=True)
class BatteryResult:
    """The whole battery on one trainer."""

    trainer: str
    optimizer: str
    seed: int
    significance: float
    correction: str
    tests: tuple[TestResult, ...]
    training_steps: int
    wall_time_s: float
    heuristics: dict[str, Any]

    @property
    def passed(self) -> bool:
        return all(test.passed for test in self.tests)

    @property
    def failed_tests(self) -> list[str]:
        return [test.name for test in self.tests if not test.passed]

    @property
    def findings(self) -> list[str]:
        """One plain-language line per test, failures first."""
        ordered = sorted(self.tests, key=lambda test: test.passed)
        return [
            f"{test.name}: {'skipped' if test.skipped else 'passed' if test.passed else 'FAILED'} "
            f"— {test.diagnosis}"
            for test in ordered
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": {
                "passed": self.passed,
                "findings": self.findings,
                "failed_tests": self.failed_tests,
            },
            "tests": [test.to_json() for test in self.tests],
            "trainer": self.trainer,
            "optimizer": self.optimizer,
            "seed": self.seed,
            "significance": self.significance,
            "multiple_testing_correction": self.correction,
            "training_steps": self.training_steps,
            "wall_time_s": self.wall_time_s,
            "heuristics": self.heuristics,
        }

    def metrics(self) -> dict[str, Any]:
        """Flat scalars for metrics/verify.json."""
        flat: dict[str, Any] = {
            "passed": self.passed,
            "tests_run": sum(not test.skipped for test in self.tests),
            "tests_failed": len(self.failed_tests),
            "training_steps": self.training_steps,
            "trainer": self.trainer,
            "optimizer": self.optimizer,
            "significance": self.significance,
            "battery_wall_time_s": round(self.wall_time_s, 3),
        }
        flat.update(
            {f"p_value_{test.name}": test.p_value for test in self.tests if not test.skipped}
        )
        return flat


@dataclass(frozen=True)
class PendingResult:
    """A test whose p-value joins the Holm family; its verdict is decided once every p-value is
    known."""

    name: str
    description: str
    statistic: float
    statistic_name: str
    p_value: float
    steps: int
    explain: Callable[[bool], str]
    """The diagnosis, given whether the test passed."""
    details: dict[str, Any] = field(default_factory=dict)
    figure: Figure | None = None

    def finish(self, passed: bool) -> TestResult:
        carried = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "explain"}
        return TestResult(**carried, passed=passed, diagnosis=self.explain(passed))


def skipped_result(name: str, reason: str) -> TestResult:
    """A test that does not apply to this trainer's optimizer; it counts as passed and says why it
    was skipped."""
    return TestResult(
        name=name,
        description=reason,
        statistic=0.0,
        statistic_name="",
        p_value=1.0,
        passed=True,
        diagnosis=f"skipped: {reason}",
        steps=0,
        skipped=True,
    )
