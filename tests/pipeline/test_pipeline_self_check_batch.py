"""The train stage's self-check at the size of the batch training forwards (issue 41, item 2): a
plugin model that mixes examples only in batches of 9 rows or more trains no step, and the ledger
and metrics of a model that does not mix record the batch size checked."""

from __future__ import annotations

import json

import pytest

from adversarial.test_trust_inputs import small_project
from dpledger.engine import SelfCheckError
from dpledger.pipeline import run_stage
from engine.test_engine_self_check_batch import LargeBatchMixer

__all__ = ["make_large_batch_mixer"]  # the plugin factory of these tests


def make_large_batch_mixer(input_shape, num_classes):
    """A plugin model factory (train.model:
    test_pipeline_self_check_batch:make_large_batch_mixer)."""
    assert input_shape == (8,) and num_classes == 3
    return LargeBatchMixer()


def test_a_model_mixing_only_at_the_training_batch_size_trains_no_step(tmp_path):
    plugin = {"model": "test_pipeline_self_check_batch:make_large_batch_mixer"}
    params, _, _ = small_project(tmp_path, train=plugin)
    with pytest.raises(SelfCheckError, match=r"mixes examples") as caught:
        run_stage("train", params, tmp_path)
    assert "training batch of" in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "metrics").exists() and not (tmp_path / "artifacts/train").exists()


def test_the_training_batch_size_checked_is_in_the_ledger_and_metrics(tmp_path):
    params, _, _ = small_project(tmp_path, train={"physical_batch_size": 12})
    metrics = run_stage("train", params, tmp_path)
    record = json.loads((tmp_path / "artifacts/train/ledger.json").read_text())["self_check"]
    assert record["batch_rows"] == 12 == metrics["self_check_batch_rows"]
    assert 1 <= record["spot_batch_rows"] <= 12
    assert metrics["self_check_spot_batch_rows"] == record["spot_batch_rows"]
