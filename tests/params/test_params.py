"""params.yaml validation: every bad value stops with one line naming the key, the value and what is
allowed."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dpledger.errors import ParamsError
from dpledger.params import check_dataset_size, load_params, parse_params

REPO = Path(__file__).resolve().parents[2]


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


@pytest.mark.parametrize(
    "key",
    ["seed", "data", "batching", "calibrate", "calibrate.epsilon", "calibrate.delta", "train"],
)
def test_missing_key_is_named(raw, key):
    with pytest.raises(ParamsError, match=rf"{key} is missing"):
        parse_params(_without(raw, key))


@pytest.mark.parametrize("key", ["calibrate.epsilom", "train.clipnorm", "typo_section"])
def test_unknown_key_is_named(raw, key):
    with pytest.raises(ParamsError, match=rf"{key} is not a known key"):
        parse_params(_with(raw, key, 1))


def test_batch_larger_than_dataset_is_refused(raw):
    params = parse_params(_with(raw, "batching.batch_size", 5000))
    with pytest.raises(
        ParamsError, match=r"batching.batch_size = 5000 .*at most the training-set size, 1438"
    ):
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
    assert lines == [
        "error: params: calibrate.epsilon = -2.0 is invalid: Input should be greater than 0"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


@pytest.mark.parametrize(
    "key, value",
    [
        ("batching.epochs", True),  # YAML `epochs: yes` would otherwise silently train one epoch
        ("batching.batch_size", True),
        ("seed", False),
        ("calibrate.epsilon", True),
        ("calibrate.group_sizes", [1, True]),
        ("train.physical_batch_size", True),
        ("audit.observations", True),
    ],
)
def test_boolean_where_a_number_is_expected_is_refused(raw, key, value):
    with pytest.raises(ParamsError) as excinfo:
        parse_params(_with(raw, key, value))
    message = str(excinfo.value)
    assert message.startswith(f"params: {key} = {value!r} is invalid: a boolean")
    assert "\n" not in message


def test_boolean_keys_still_take_booleans(raw):
    params = parse_params(
        _with(_with(raw, "train.secure_noise", True), "verify.fail_pipeline", False)
    )
    assert params.train.secure_noise is True and params.verify.fail_pipeline is False


@pytest.mark.parametrize("key", ["train.clip_norm", "train.lr", "train.automatic_gamma"])
def test_infinite_training_floats_are_refused_up_front(raw, key):
    # inf passed validation and only failed (clip_norm) or silently produced NaN weights (lr) in the
    # train stage
    with pytest.raises(
        ParamsError, match=rf"^params: {key} = inf is invalid: Input should be a finite number$"
    ):
        parse_params(_with(raw, key, float("inf")))


def test_seed_beyond_64_bits_is_refused_not_a_traceback_in_train(raw):
    assert parse_params(_with(raw, "seed", 2**32 - 1)).seed == 2**32 - 1
    with pytest.raises(
        ParamsError, match=r"^params: seed = 18446744073709551616 is invalid: .*less than or equal"
    ):
        parse_params(_with(raw, "seed", 2**64))


def test_duplicate_key_is_refused_not_silently_overridden(raw, tmp_path):
    text = yaml.safe_dump(raw, sort_keys=False).replace(
        "  epsilon: 3.0\n", "  epsilon: 3.0\n  epsilon: 8.0\n", 1
    )
    assert text.count("epsilon: ") >= 2
    path = tmp_path / "params.yaml"
    path.write_text(text)
    with pytest.raises(ParamsError, match=r"key 'epsilon' is given twice \(line \d+\)"):
        load_params(path)


def test_params_path_that_is_a_folder_is_one_line(tmp_path):
    with pytest.raises(ParamsError, match=r"is not a file"):
        load_params(tmp_path)


def test_fp16_without_loss_scaling_is_refused_naming_bf16(raw):
    """fp16 autocast with no loss scaling underflows an LM head's ~1e-7 gradients: refused (issue
    30)."""
    with pytest.raises(ParamsError) as error:
        parse_params(_with(raw, "train.precision", "fp16"))
    message = str(error.value)
    assert "\n" not in message and "train.precision" in message and "bf16" in message, message
    assert parse_params(_with(raw, "train.precision", "bf16")).train.precision == "bf16"
