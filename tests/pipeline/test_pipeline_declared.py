"""Each stage declares exactly the params keys it reads, from one table that dvc.yaml is generated
from: a stage run against a recording params view reads nothing it does not declare, and a changed
``data`` key reruns calibrate, schedule and train (their training split changes)."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest
import yaml

from dpledger.params import Params, load_params
from dpledger.pipeline.declared import STAGE_INPUTS, RecordingParams, is_declared
from dpledger.pipeline.dvc_yaml import render

REPO = Path(__file__).resolve().parents[2]
DVC_STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]

# One small run of every stage (about a minute on two cores): the reads do not depend on the size.
SMALL = {
    "batching": {"epochs": 1, "batch_size": 128},
    "calibrate": {"group_sizes": [1, 2], "curve_points": 4},
    "audit": {
        "observations": 20_000,
        "pattern_observations": 2_000,
        "one_run": {"canaries": 200},
    },
}


def test_dvc_yaml_is_what_the_table_generates():
    assert (REPO / "dvc.yaml").read_text() == render(), (
        "dvc.yaml is stale: run `make dvc-yaml` and commit it"
    )


def test_dvc_yaml_params_are_the_tables():
    for stage, row in STAGE_INPUTS.items():
        assert tuple(DVC_STAGES[stage]["params"]) == row.params


@pytest.mark.parametrize("stage", ["calibrate", "schedule", "train"])
def test_a_data_change_reruns_every_stage_that_reads_the_split(stage):
    """`dvc exp run -S data.test_fraction=0.3` reran verify, audit and report only: a model, a
    calibration and a schedule made on the old split were reported beside tests on the new one."""
    declared = tuple(DVC_STAGES[stage]["params"])
    for key in ("data.test_fraction", "data.name", "data.path", "data.max_length"):
        assert is_declared(key, declared), f"dvc.yaml stage {stage} does not declare {key}"


def test_the_recording_view_records_dotted_reads_and_whole_sections():
    params = load_params(REPO / "params.yaml")
    view = RecordingParams(params)
    assert isinstance(view, Params) and isinstance(view.data, type(params.data))
    assert view.data.test_fraction == params.data.test_fraction
    view.train.model_dump()
    assert view.reads == {"data.test_fraction", "train"}
    assert is_declared("data.test_fraction", ("data",)) and not is_declared("data", ("data.path",))
    with pytest.raises(AttributeError):
        view.seed = 3


def _small_params(root: Path) -> Path:
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    for section, values in SMALL.items():
        for key, value in values.items():
            if isinstance(value, dict):
                raw[section][key].update(value)
            else:
                raw[section][key] = value
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.slow
def test_every_stage_reads_only_the_params_it_declares(tmp_path):
    """Every stage, in pipeline order, on a recording view of the params: an undeclared read would
    let a params change leave the stage's outputs stale."""
    params = load_params(_small_params(tmp_path))
    shutil.copytree(REPO / "data", tmp_path / "data", dirs_exist_ok=True)
    undeclared = {}
    for stage, row in STAGE_INPUTS.items():
        view = RecordingParams(params)
        importlib.import_module(f"dpledger.pipeline.{stage}").run(view, tmp_path)
        missing = sorted(
            read for read in view.reads if not is_declared(read, row.params + row.checked)
        )
        if missing:
            undeclared[stage] = missing
        assert view.reads, f"stage {stage} read no params: the view was bypassed"
    assert undeclared == {}, f"stages read params they do not declare: {undeclared}"
