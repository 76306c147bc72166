"""The report section of params.yaml: each bad value stops the stage with one line, and nothing is
written."""

from __future__ import annotations

import pytest
import yaml

from dpledger.errors import ParamsError
from dpledger.params import parse_params
from dpledger.pipeline import run_stage
from helpers.report_fixtures import REPO_ROOT, fabricate_project


def _raw() -> dict:
    return yaml.safe_load((REPO_ROOT / "params.yaml").read_text())


@pytest.mark.parametrize(
    "key, value, message",
    [
        (
            "mc_failure_warning",
            0.0,
            "params: report.mc_failure_warning = 0.0 is invalid: Input should be greater than 0",
        ),
        (
            "mc_failure_warning",
            1.0,
            "params: report.mc_failure_warning = 1.0 is invalid: Input should be less than 1",
        ),
        ("mc_failure_warning", "often", "params: report.mc_failure_warning = 'often' is invalid"),
        (
            "title",
            "",
            "params: report.title = '' is invalid: String should have at least 1 character",
        ),
        ("titel", "x", "params: report.titel is not a known key (check its spelling)"),
    ],
)
def test_bad_report_value_is_one_line_naming_key_value_and_range(key, value, message):
    raw = _raw()
    raw["report"][key] = value
    with pytest.raises(ParamsError) as error:
        parse_params(raw)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_missing_report_section_is_reported():
    raw = _raw()
    del raw["report"]
    with pytest.raises(ParamsError, match="^params: report is missing$"):
        parse_params(raw)


def test_report_stage_with_bad_params_writes_nothing(tmp_path):
    root = fabricate_project(tmp_path)
    raw = _raw()
    raw["report"]["mc_failure_warning"] = 2.0
    (root / "params.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ParamsError):
        run_stage("report", root / "params.yaml", root)
    assert not (root / "reports").exists() and not (root / "metrics/report.json").exists()
