"""params.yaml validation: every bad value stops with one line naming the key, the value and what is allowed."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dpledger.errors import ParamsError
from dpledger.params import check_dataset_size, load_params, parse_params

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def raw() -> dict:
    return yaml.safe_load((REPO / "params.yaml").read_text())


def _with(raw: dict, dotted: str, value) -> dict:
    changed = copy.deepcopy(raw)
    *parents, leaf = dotted.split(".")
    node = changed
    for part in parents:
        node = node[part]
    node[leaf] = value
    return changed


def _without(raw: dict, dotted: str) -> dict:
    changed = copy.deepcopy(raw)
    *parents, leaf = dotted.split(".")
    node = changed
    for part in parents:
        node = node[part]
    del node[leaf]
    return changed


def test_repository_params_are_valid():
    params = load_params(REPO / "params.yaml")
    assert params.calibrate.epsilon > 0
    assert 0 < params.calibrate.delta < 1


@pytest.mark.parametrize(
    "key, value, allowed",
    [
        ("calibrate.epsilon", 0.0, "greater than 0"),
        ("calibrate.epsilon", -1.0, "greater than 0"),
        ("calibrate.delta", 0.0, "greater than 0"),
        ("calibrate.delta", 1.0, "less than 1"),
        ("calibrate.delta", 2.0, "less than 1"),
        ("calibrate.sampler", "shuffled", "allowed values"),
        ("calibrate.accountant", "moments", "allowed values"),
        ("train.model", "resnet9000", "allowed values"),
        ("batching.batch_size", 0, "greater than or equal to 1"),
        ("batching.epochs", 0, "greater than or equal to 1"),
        ("data.name", "imagenet", "allowed values"),
        ("data.test_fraction", 1.5, "less than 1"),
        ("seed", -3, "greater than or equal to 0"),
    ],
)
def test_bad_value_names_key_value_and_allowed_range(raw, key, value, allowed):
    with pytest.raises(ParamsError) as excinfo:
        parse_params(_with(raw, key, value))
    message = str(excinfo.value)
    assert key in message
    assert repr(value) in message
    assert allowed in message
    assert "\n" not in message


@pytest.mark.parametrize("key", ["seed", "data", "batching", "calibrate", "calibrate.epsilon", "calibrate.delta", "train"])
def test_missing_key_is_named(raw, key):
    with pytest.raises(ParamsError, match=rf"{key} is missing"):
        parse_params(_without(raw, key))


@pytest.mark.parametrize("key", ["calibrate.epsilom", "train.clipnorm", "typo_section"])
def test_unknown_key_is_named(raw, key):
    with pytest.raises(ParamsError, match=rf"{key} is not a known key"):
        parse_params(_with(raw, key, 1))


def test_batch_larger_than_dataset_is_refused(raw):
    params = parse_params(_with(raw, "batching.batch_size", 5000))
    with pytest.raises(ParamsError, match=r"batching.batch_size = 5000 .*at most the training-set size, 1438"):
        check_dataset_size(params, 1438)


def test_non_mapping_file_is_refused(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(ParamsError, match="mapping"):
        load_params(path)


def test_stage_with_bad_params_prints_one_line_and_writes_nothing(raw, tmp_path):
    bad = tmp_path / "params.yaml"
    bad.write_text(yaml.safe_dump(_with(raw, "calibrate.epsilon", -2.0)))
    result = subprocess.run(
        [sys.executable, "-m", "stages.calibrate", "--params", str(bad), "--root", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == ["error: params: calibrate.epsilon = -2.0 is invalid: Input should be greater than 0"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]
