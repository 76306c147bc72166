"""``dpledger verify``: JSON output, exit codes, errors."""

import json
import subprocess
import sys

from typer.testing import CliRunner

from dpledger.cli import app

runner = CliRunner()


def test_verify_json_on_a_correct_trainer_exits_zero():
    result = runner.invoke(
        app,
        ["verify", "--trainer", "dpledger.verify.opacus_trainer:train", "--json", "--no-progress"],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["verdict"]["passed"] is True
    assert len(report["verdict"]["findings"]) == len(report["tests"])
    assert {"name", "statistic", "p_value", "passed", "diagnosis", "steps"} <= set(
        report["tests"][0]
    )


def test_verify_exits_non_zero_with_a_diagnosis_when_a_bug_is_found(tmp_path):
    completed = subprocess.run(
        [
            sys.executable,
            "-c",
            "from dpledger.cli import main; main()",
            "verify",
            "--trainer",
            "zoo:no_clipping",
            "--json",
            "--no-progress",
            "--plots",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 1, completed.stderr
    report = json.loads(completed.stdout)
    assert report["verdict"]["passed"] is False
    assert any("not clipped" in finding for finding in report["verdict"]["findings"])
    assert (tmp_path / "t1_no_clipping.png").exists()


def test_verify_refuses_bad_options_in_one_line():
    completed = subprocess.run(
        [
            sys.executable,
            "-c",
            "from dpledger.cli import main; main()",
            "verify",
            "--command",
            "train.py {init}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 2
    assert completed.stderr.count("\n") == 1 and "lacks the placeholders" in completed.stderr
    result = runner.invoke(app, ["verify", "--significance", "0.9"])
    assert result.exit_code != 0
