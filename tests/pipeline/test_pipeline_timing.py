"""Wall times stay out of the tracked metrics, so that rerunning a stage on the same inputs leaves
`git status` clean: they go to the git-ignored timing/<stage>.json."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from dpledger.pipeline import run_stage
from dpledger.pipeline.timing import is_timing, split_timing

REPO = Path(__file__).resolve().parents[2]


def test_timing_keys_move_to_the_untracked_file(tmp_path):
    (tmp_path / "metrics").mkdir()
    metrics = {"test_accuracy": 0.9, "wall_time_s": 12.5, "throughput_examples_per_s": 300.0}
    metrics |= {"self_check_seconds": 0.2, "battery_wall_time_s": 1.8, "epsilon": 3.0}
    (tmp_path / "metrics/train.json").write_text(json.dumps(metrics))
    split_timing(tmp_path, "train", {"stage_wall_time_s": 14.0})
    kept = json.loads((tmp_path / "metrics/train.json").read_text())
    timing = json.loads((tmp_path / "timing/train.json").read_text())
    assert kept == {"test_accuracy": 0.9, "epsilon": 3.0}
    assert set(timing) == {
        "wall_time_s",
        "throughput_examples_per_s",
        "self_check_seconds",
        "battery_wall_time_s",
        "stage_wall_time_s",
    }
    assert is_timing("simulate_s") and is_timing("observations_per_s")
    assert not is_timing("steps_done") and not is_timing("noise_multiplier")


def test_a_stage_rerun_writes_identical_tracked_metrics(tmp_path):
    """The schedule stage twice: its tracked metrics are byte-identical; its wall time is in the
    ignored timing folder."""
    params = tmp_path / "params.yaml"
    params.write_text((REPO / "params.yaml").read_text())
    run_stage("schedule", params, tmp_path)
    first = (tmp_path / "metrics/schedule.json").read_bytes()
    run_stage("schedule", params, tmp_path)
    assert (tmp_path / "metrics/schedule.json").read_bytes() == first
    assert "stage_wall_time_s" in json.loads((tmp_path / "timing/schedule.json").read_text())


def test_the_timing_folder_is_ignored_by_git():
    ignored = subprocess.run(
        ["git", "check-ignore", "timing/train.json"], cwd=REPO, capture_output=True, text=True
    )
    assert ignored.returncode == 0, "timing/ must be git-ignored"


def test_no_tracked_metric_holds_a_time():
    """The committed metrics (after `make refresh`) hold no wall time."""
    for path in sorted((REPO / "metrics").glob("*.json")):
        timed = [key for key in json.loads(path.read_text()) if is_timing(key)]
        assert timed == [], f"{path.name} tracks times {timed}: run `make refresh`"
