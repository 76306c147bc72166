"""Property-based fuzz of params.yaml and of the CLI flags (issue 21, Build 8).

Every case either succeeds or stops with one line (a :class:`DpledgerError`, which the console
script prints as ``error: ...`` with exit code 2, or click's own usage error, exit code 2), writes
nothing, and ends within a few seconds: no traceback, no hang. Values mix types, signs, magnitudes,
NaN/inf, missing and extra keys.
"""

from __future__ import annotations

import math
import signal
from contextlib import contextmanager
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dpledger.errors import DpledgerError

REPO = Path(__file__).resolve().parents[2]
BASE = yaml.safe_load((REPO / "params.yaml").read_text())
KEYS = [(section, key) for section, body in BASE.items() if isinstance(body, dict) for key in body]
FUZZ = settings(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
CASE_SECONDS = 10

hostile_numbers = st.sampled_from(
    [
        0,
        -1,
        1,
        2,
        3,
        10**9,
        10**12,
        2**64,
        -(2**63),
        1e-300,
        1e300,
        0.5,
        1e9,
        math.nan,
        math.inf,
        -math.inf,
        -0.0,
    ]
)
scalars = st.one_of(
    hostile_numbers,
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=12),
    st.sampled_from(
        ["1e9", "nan", "inf", "poisson", "module:callable", "os:system", "digits", "npz", "mlp"]
    ),
)
values = st.one_of(
    scalars,
    st.lists(scalars, max_size=4),
    st.dictionaries(
        st.text(st.characters(exclude_categories=("Cs",)), max_size=6), scalars, max_size=3
    ),
)


@contextmanager
def _time_limit(seconds: int):
    """Fail a case that runs longer than ``seconds`` (a hang) instead of waiting for it. The alarm's
    exception can land in code that swallows it (a gc callback), so expiry is also recorded and
    checked afterwards."""
    expired = []

    def expire(signum, frame):
        expired.append(True)
        raise TimeoutError(f"case ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert not expired, f"case ran longer than {seconds} s"


def _assert_one_line(error: BaseException) -> None:
    assert isinstance(error, DpledgerError), f"{type(error).__name__}: {error}"
    message = str(error)
    assert message and "\n" not in message, message


@st.composite
def edited_params(draw) -> dict:
    raw = yaml.safe_load(yaml.safe_dump(BASE))
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["set", "set", "set", "delete", "extra", "section", "seed"]))
        section, key = draw(st.sampled_from(KEYS))
        if action == "seed":
            raw["seed"] = draw(values)
        elif not isinstance(raw[section], dict):
            continue  # the section itself was replaced by a non-mapping
        elif action == "set":
            raw[section][key] = draw(values)
        elif action == "delete":
            raw[section].pop(key, None)
        elif action == "extra":
            raw[section][
                draw(st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=8))
            ] = draw(values)
        else:
            raw[section] = draw(values)
    return raw


def _cheap_checks(params) -> None:
    """What a stage checks up front once the data size is known, without running it."""
    from dpledger.models import check_model
    from dpledger.params import check_dataset_size

    check_dataset_size(params, 1438)
    check_model(params.train.model, (1, 8, 8), 10, **params.train.model_options)


@FUZZ
@given(raw=edited_params())
def test_params_yaml_is_accepted_or_refused_with_one_line(raw, tmp_path_factory):
    from dpledger.params import load_params

    folder = tmp_path_factory.mktemp("params")
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    with _time_limit(CASE_SECONDS):
        try:
            _cheap_checks(load_params(path))
        except Exception as error:  # noqa: BLE001 - the property: only DpledgerError, as one line
            _assert_one_line(error)
            result = CliRunner().invoke(
                _app(), ["stage", "train", "--params", str(path), "--root", str(folder)]
            )
            _assert_one_line(result.exception)
            # the refused stage wrote nothing
            assert sorted(p.name for p in folder.iterdir()) == ["params.yaml"]


def _app():
    from dpledger.cli import app

    return app


flag_values = st.one_of(
    st.sampled_from(
        [
            "nan",
            "inf",
            "-inf",
            "-1",
            "0",
            "1e-3",
            "1e9",
            "1e300",
            "2",
            "abc",
            "",
            "[1,2]",
            "{}",
            "-3",
        ]
    ),
    # valid sizes stay cheap; the huge ones above must be refused at once
    st.integers(-100, 100).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)

# Commands outside accounting, with the flags that take a value and the fixed flags that keep a
# valid case cheap.
COMMANDS = {
    ("audit", "bgm"): (
        [
            "--steps",
            "--epochs",
            "--noise-multiplier",
            "--observations",
            "--batch-size",
            "--confidence",
            "--delta",
            "--epsilon-claimed",
            "--split-fraction",
            "--buffer-size",
            "--seed",
            "--threshold",
            "--sampler",
            "--claim-sampler",
            "--backend",
        ],
        [
            "--sampler",
            "poisson",
            "--steps",
            "4",
            "--noise-multiplier",
            "1",
            "--observations",
            "200",
        ],
    ),
    ("audit", "selfcheck"): (
        [
            "--repeats",
            "--observations",
            "--epsilon",
            "--steps",
            "--noise-multiplier",
            "--delta",
            "--confidence",
            "--mechanism",
            "--threshold",
        ],
        ["--repeats", "2", "--observations", "200", "--steps", "4"],
    ),
    ("audit", "dpsgd"): (
        [
            "--threat-model",
            "--sampler",
            "--observations",
            "--epochs",
            "--batch-size",
            "--lr",
            "--dataset-size",
            "--threshold",
            "--delta",
            "--confidence",
            "--buffer-size",
        ],
        ["--observations", "4", "--dataset-size", "64", "--batch-size", "32"],
    ),
    ("verify",): (
        ["--trainer", "--command", "--optimizer", "--significance", "--seeds", "--plots"],
        ["--trainer", "zoo:no-such-trainer"],
    ),
    ("schedule-stats",): ([], []),
    ("samplers",): ([], []),
}


@FUZZ
@given(command=st.sampled_from(sorted(COMMANDS)), data=st.data())
def test_cli_flags_are_accepted_or_refused_with_one_line(command, data, tmp_path_factory):
    flags, fixed = COMMANDS[command]
    chosen = data.draw(st.lists(st.sampled_from(flags), max_size=2, unique=True)) if flags else []
    arguments = list(fixed)
    for flag in chosen:
        arguments += [flag, data.draw(flag_values)]
    folder = tmp_path_factory.mktemp("cli")
    if command == ("schedule-stats",):
        arguments = [str(folder / data.draw(st.sampled_from(["", "missing", "a/b"])))]
    _check_cli(
        [*command, *arguments, "--json"]
        if command != ("schedule-stats",)
        else [*command, *arguments]
    )


def _check_cli(arguments: list[str]) -> None:
    with _time_limit(CASE_SECONDS):
        result = CliRunner().invoke(_app(), arguments)
    if result.exception is None or isinstance(result.exception, SystemExit):
        # 1: a verify/audit finding; 2: usage
        assert result.exit_code in (0, 1, 2), (
            arguments,
            result.output,
        )
        if result.exit_code == 2:
            assert "Error" in result.output or "Usage" in result.output, (arguments, result.output)
    else:
        assert not isinstance(result.exception, TimeoutError), arguments
        _assert_one_line(result.exception)


ACCOUNTING_FLAGS = [
    "--delta",
    "--sample-rate",
    "--steps",
    "--accountant",
    "--sampler",
    "--group-size",
    "--dataset-size",
    "--batch-size",
    "--batches-per-epoch",
    "--epochs",
    "--mechanism",
    "--bands",
    "--mechanism-params",
    "--discretization",
]


@FUZZ
@given(command=st.sampled_from(["epsilon", "noise"]), data=st.data())
def test_accounting_flags_are_accepted_or_refused_with_one_line(command, data):
    target = ["--noise-multiplier", "1"] if command == "epsilon" else ["--epsilon", "3"]
    arguments = [
        command,
        *target,
        "--delta",
        "1e-5",
        "--dataset-size",
        "1000",
        "--batch-size",
        "100",
        "--epochs",
        "2",
    ]
    for flag in data.draw(
        st.lists(st.sampled_from([*ACCOUNTING_FLAGS, target[0]]), max_size=2, unique=True)
    ):
        arguments += [flag, data.draw(flag_values)]
    _check_cli([*arguments, "--json"])
