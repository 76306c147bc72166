"""Bad inputs outside accounting that ended in a traceback or checked the wrong thing (issue 21,
items 10-11)."""

from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from dpledger.errors import DpledgerError, ParamsError
from dpledger.params import parse_params

REPO = Path(__file__).resolve().parents[2]


def _invoke(*args: str):
    from dpledger.cli import app

    return CliRunner().invoke(app, list(args))


def _params_with(section: str, key: str, value) -> dict:
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw[section][key] = value
    return raw


@pytest.mark.parametrize("command", ["", "   "])
def test_an_empty_verify_command_is_refused_not_replaced_by_the_built_in_trainer(command):
    result = _invoke("verify", "--command", command, "--no-progress")
    # was: PASSED: dpledger
    assert isinstance(result.exception, ParamsError) and result.stdout == ""
    assert str(result.exception) == (
        f"--command = {command!r} is invalid: it is empty: give a command, or null to use "
        "verify.trainer"
    )
    with pytest.raises(ParamsError, match=r"params: verify.command = '.*' is invalid: it is empty"):
        parse_params(_params_with("verify", "command", command))


def test_an_unterminated_quote_in_verify_command_is_one_line():
    template = 'python train.py "{init} {data} {out}'
    with pytest.raises(ParamsError) as error:
        parse_params(_params_with("verify", "command", template))
    assert str(error.value) == (
        f"params: verify.command = {template!r} is invalid: it cannot be split into arguments (No "
        "closing quotation)"
    )
    from dpledger.verify.protocol import parse_command_template

    with pytest.raises(ParamsError, match="cannot be split into arguments"):
        parse_command_template(template)


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    (tmp_path / "hostile_plugins.py").write_text(
        textwrap.dedent("""
        import numpy as np

        def two_arguments(dataset_size, batch_size):
            return [np.arange(batch_size)]

        def not_iterable(dataset_size, batch_size, epochs, seed):
            return 42
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "hostile_plugins"
    sys.modules.pop("hostile_plugins", None)


def test_a_plugin_sampler_with_the_wrong_signature_is_one_line(plugin_module):
    from dpledger.sampling.registry import build_schedule

    with pytest.raises(ParamsError) as error:
        build_schedule(
            f"{plugin_module}:two_arguments", dataset_size=10, batch_size=2, epochs=1, seed=0
        )
    assert str(error.value) == (
        "sampler = 'hostile_plugins:two_arguments' is invalid: two_arguments(dataset_size, "
        "batch_size) cannot be "
        "called as (dataset_size, batch_size, epochs, seed)"
    )
    with pytest.raises(ParamsError, match="returned int, not an iterable of index arrays"):
        build_schedule(
            f"{plugin_module}:not_iterable", dataset_size=10, batch_size=2, epochs=1, seed=0
        )


@pytest.mark.parametrize("kind", ["file", "under-a-file"])
def test_an_unwritable_plots_folder_is_refused_before_the_battery_runs(tmp_path, kind):
    (tmp_path / "a_file").write_text("x")
    plots = tmp_path / "a_file" if kind == "file" else tmp_path / "a_file" / "plots"
    result = _invoke("verify", "--plots", str(plots), "--no-progress")
    # was a traceback after minutes of battery
    assert isinstance(result.exception, ParamsError), result.exception
    assert str(result.exception).startswith(f"--plots = {str(plots)!r} is invalid: ")


@pytest.fixture(scope="module")
def built_root(tmp_path_factory):
    """A project root holding the calibrate and schedule outputs of a small, coarsely accounted run
    (~10 s)."""
    from dpledger.pipeline import run_stage

    root = tmp_path_factory.mktemp("root")
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["batching"]["epochs"] = 1
    raw["calibrate"].update(
        group_sizes=[1], curve_points=2, table_discretization=0.1, pld_discretization=1e-2
    )
    (root / "params.yaml").write_text(yaml.safe_dump(raw))
    for stage in ("calibrate", "schedule"):
        run_stage(stage, root / "params.yaml", root)
    return root


def _run_stage(name: str, root: Path) -> str:
    from dpledger.pipeline import run_stage

    with pytest.raises(DpledgerError) as error:
        run_stage(name, root / "params.yaml", root)
    assert "\n" not in str(error.value)
    return str(error.value)


@pytest.mark.parametrize(
    "content, reason",
    [("not json", "JSONDecodeError"), ('{"epsilon": 3}', "TypeError"), ("[1, 2]", "TypeError")],
)
@pytest.mark.parametrize("stage", ["train", "audit"])
def test_a_corrupt_calibration_record_is_one_line_naming_it(
    built_root, tmp_path, content, reason, stage
):
    root = tmp_path / "root"
    shutil.copytree(built_root, root)
    (root / "artifacts/calibration/calibration.json").write_text(content)
    message = _run_stage(stage, root)
    assert message.startswith(
        f"{root / 'artifacts/calibration/calibration.json'} is unreadable or corrupt ({reason}"
    )
    assert message.endswith("rebuild it with `dvc repro -f calibrate`")


@pytest.mark.parametrize("damage", ["garbage", "truncated", "missing-array"])
def test_a_corrupt_schedule_is_one_line_naming_it(built_root, tmp_path, damage):
    root = tmp_path / "root"
    shutil.copytree(built_root, root)
    npz = root / "artifacts/schedule/schedule.npz"
    if damage == "garbage":
        npz.write_bytes(b"garbage")
    elif damage == "truncated":
        npz.write_bytes(npz.read_bytes()[:200])
    else:
        np.savez(npz, indices=np.zeros(3, dtype=np.int64))
    message = _run_stage("train", root)
    assert message.startswith(f"{root / 'artifacts/schedule'} is unreadable or corrupt (")
    assert message.endswith("rebuild it with `dvc repro -f schedule`")
    result = _invoke("schedule-stats", str(root / "artifacts/schedule"))
    assert isinstance(result.exception, DpledgerError) and "is unreadable or corrupt" in str(
        result.exception
    )


@pytest.mark.parametrize(
    "args, flag",
    [
        # was ValueError: scale < 0 (found by the fuzz)
        (
            ["audit", "selfcheck", "--epsilon", "-inf"],
            "--epsilon",
        ),
        (["audit", "selfcheck", "--noise-multiplier", "nan"], "--noise-multiplier"),
        (["audit", "dpsgd", "--lr", "inf"], "--lr"),
        (
            [
                "audit",
                "bgm",
                "--sampler",
                "poisson",
                "--steps",
                "4",
                "--noise-multiplier",
                "1",
                "--observations",
                "200",
                "--confidence",
                "1.5",
            ],
            "--confidence",
        ),
    ],
)
def test_audit_flags_out_of_range_are_one_line(args, flag):
    result = _invoke(*args, "--json")
    assert isinstance(result.exception, ParamsError) and result.stdout == ""
    assert str(result.exception).startswith(f"{flag} = ")
