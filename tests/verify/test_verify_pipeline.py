"""The verify stage: outputs, failing on a bug after writing them, and params validation."""

import json
import subprocess
import sys

import pytest
import yaml

from dpledger.errors import DpledgerError, ParamsError
from dpledger.params import load_params, parse_params
from dpledger.params.verify import VerifyParams
from dpledger.pipeline import verify as verify_stage
from dpledger.verify.battery import TEST_NAMES
from dpledger.verify.errors import BugFoundError


def _params(repo_root, **verify):
    params = load_params(repo_root / "params.yaml")
    return params.model_copy(update={"verify": VerifyParams(**verify)})


def test_stage_writes_details_flat_metrics_and_a_plot_per_test(repo_root, tmp_path):
    metrics = verify_stage.run(_params(repo_root, trainer="reference"), tmp_path)
    details = json.loads((tmp_path / "artifacts" / "verify" / "verify.json").read_text())
    assert details["verdict"]["passed"] is True
    assert [test["name"] for test in details["tests"]] == list(TEST_NAMES)
    assert {"name", "statistic", "p_value", "passed", "diagnosis", "steps"} <= set(
        details["tests"][0]
    )
    assert details["trainer"] == "reference"
    written = json.loads((tmp_path / "metrics" / "verify.json").read_text())
    assert written == metrics
    assert all(isinstance(value, (int, float, str, bool)) for value in written.values())
    assert {"passed", "tests_run", "tests_failed", "training_steps"} <= set(written)
    assert {f"p_value_{name}" for name in TEST_NAMES} <= set(written)
    for name in TEST_NAMES:
        assert (tmp_path / "plots" / "verify" / f"{name}.png").stat().st_size > 1000
        assert (
            (tmp_path / "plots" / "verify" / f"{name}.csv").read_text().startswith("series,x,y\n")
        )


def test_stage_fails_on_a_bug_after_writing_its_outputs(repo_root, tmp_path):
    with pytest.raises(BugFoundError, match="t2_minibatch_clipping") as caught:
        verify_stage.run(_params(repo_root, trainer="zoo:mini_batch_clipping"), tmp_path)
    assert isinstance(caught.value, DpledgerError)
    details = json.loads((tmp_path / "artifacts" / "verify" / "verify.json").read_text())
    assert details["verdict"]["passed"] is False
    assert json.loads((tmp_path / "metrics" / "verify.json").read_text())["tests_failed"] >= 1


def test_stage_can_let_the_pipeline_go_on_so_the_report_shows_the_bug(repo_root, tmp_path):
    metrics = verify_stage.run(
        _params(repo_root, trainer="zoo:mini_batch_clipping", fail_pipeline=False), tmp_path
    )
    assert metrics["passed"] is False and metrics["tests_failed"] >= 1


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("significance", 0.7, "verify.significance"),
        ("optimizer", "rmsprop", "verify.optimizer"),
        ("trainer", "", "verify.trainer"),
        ("tpyo", 1, "verify.tpyo"),
    ],
)
def test_bad_verify_params_are_one_line_errors(repo_root, key, value, message):
    raw = json.loads(load_params(repo_root / "params.yaml").model_dump_json())
    raw["verify"][key] = value
    with pytest.raises(ParamsError, match=message) as caught:
        parse_params(raw)
    assert "\n" not in str(caught.value)


def test_a_bad_trainer_or_command_stops_the_stage_before_it_writes(repo_root, tmp_path):
    with pytest.raises(DpledgerError, match="cannot import"):
        verify_stage.run(_params(repo_root, trainer="no_such_module:train"), tmp_path)
    with pytest.raises(ParamsError, match="lacks the placeholders"):
        verify_stage.run(_params(repo_root, command="python train.py --init {init}"), tmp_path)
    assert not (tmp_path / "artifacts").exists() and not (tmp_path / "metrics").exists()


def test_the_stage_defaults_to_dpledgers_engine():
    assert VerifyParams().trainer == "dpledger"


def test_stage_entrypoint_exits_non_zero_on_a_bug(repo_root, tmp_path):
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    raw["verify"]["trainer"] = "zoo:uncalibrated_noise"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "stages.verify",
            "--params",
            str(tmp_path / "params.yaml"),
            "--root",
            str(tmp_path),
        ],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 2
    assert "t3_noise_calibration" in completed.stderr and completed.stderr.count("\n") == 1
    assert (tmp_path / "metrics" / "verify.json").exists()
