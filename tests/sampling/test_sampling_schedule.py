"""The schedule artifact, its statistics, the schedule stage, its params, its CLI and bad inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from dpledger.cli import app
from dpledger.errors import ParamsError
from dpledger.params import parse_params
from dpledger.params.schedule import BUILT_SAMPLERS
from dpledger.pipeline import run_stage
from dpledger.sampling import SAMPLERS, Schedule, build_sampler, build_schedule, steps_per_epoch
from dpledger.sampling.stats import batch_size_histogram, schedule_stats

CONTRACT_METRICS = {
    "sampler", "num_steps", "dataset_size", "batch_size_mean", "batch_size_std",
    "batch_size_min", "batch_size_max", "padding_rows", "epochs", "steps_per_epoch",
    "pad_truncate", "truncated_examples",
}  # fmt: skip


def test_params_list_the_same_built_in_samplers_as_the_registry():
    assert set(BUILT_SAMPLERS) == set(SAMPLERS)


def test_schedule_round_trips_through_its_files(tmp_path):
    schedule = build_schedule(
        "balls-in-bins", dataset_size=101, batch_size=8, epochs=3, seed=5, pad_truncate=True
    )
    schedule.save(tmp_path)
    loaded = Schedule.load(tmp_path)
    for field in ("indices", "offsets", "padding"):
        assert np.array_equal(getattr(loaded, field), getattr(schedule, field))
    assert loaded.header() == json.loads(json.dumps(schedule.header()))
    assert loaded.normalizer == 8 and loaded.sampler_params["pad_truncate"] is True


def test_steps_per_epoch_is_ceil_for_accounted_samplers_and_floor_when_dropping():
    assert steps_per_epoch(1438, 64) == 23 and steps_per_epoch(1438, 64, drop_last=True) == 22
    for name in ("poisson", "fixed", "balls-in-bins", "balls-in-bins-redrawn"):
        assert (
            build_sampler(name, dataset_size=1438, batch_size=64, epochs=2, seed=0).num_steps == 46
        )
    assert (
        build_sampler("poisson", dataset_size=1438, batch_size=64, epochs=1, seed=0).sample_rate
        == 64 / 1438
    )


def test_stats_agree_with_a_direct_count():
    schedule = build_schedule(
        "balls-in-bins", dataset_size=50, batch_size=4, epochs=2, seed=1, pad_truncate=True
    )
    sizes = [int((~schedule.batch(t)[1]).sum()) for t in range(schedule.num_steps)]
    stats = schedule_stats(schedule)
    assert (
        stats["batch_size_mean"] == pytest.approx(np.mean(sizes))
        and stats["batch_size_max"] == max(sizes) <= 4
    )
    assert stats["padding_rows"] == 4 * schedule.num_steps - sum(sizes)
    truncated = sum(
        max(0, len(b.indices) - 4)
        for b in build_sampler(
            "balls-in-bins", dataset_size=50, batch_size=4, epochs=2, seed=1
        ).batches()
    )
    assert stats["truncated_examples"] == truncated > 0
    seen = {
        int(i) for t in range(schedule.num_steps) for i, pad in zip(*schedule.batch(t)) if not pad
    }
    assert stats["examples_never_used"] == 50 - len(seen)
    assert all(isinstance(value, (int, float, str, bool)) for value in stats.values())
    sizes_seen, counts = batch_size_histogram(schedule)
    assert dict(zip(sizes_seen.tolist(), counts.tolist())) == {
        s: sizes.count(s) for s in set(sizes)
    }


def write_params(tmp_path, repo_root, **schedule_section):
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    raw["schedule"].update(schedule_section)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, raw


@pytest.mark.parametrize(
    "section",
    [
        {"sampler": "poisson"},
        {"sampler": "balls-in-bins", "pad_truncate": True},
        {"sampler": "partial-shuffle", "buffer_size": 100},
    ],
)
def test_schedule_stage_writes_artifact_metrics_and_plots(tmp_path, repo_root, section):
    params_path, raw = write_params(tmp_path, repo_root, **section)
    metrics = run_stage("schedule", params_path, tmp_path)
    assert CONTRACT_METRICS <= set(metrics)
    assert json.loads((tmp_path / "metrics/schedule.json").read_text()) == {
        k: v for k, v in metrics.items() if k != "stage_wall_time_s"
    }
    schedule = Schedule.load(tmp_path / "artifacts/schedule")
    assert schedule.sampler == section["sampler"] and schedule.seed == raw["seed"]
    assert metrics["dataset_size"] == schedule.dataset_size == 1438
    assert metrics["num_steps"] == schedule.num_steps == raw["batching"]["epochs"] * 23
    rows = (tmp_path / "plots/schedule/batch_sizes.csv").read_text().splitlines()
    assert (
        rows[0] == "batch_size,steps"
        and sum(int(r.split(",")[1]) for r in rows[1:]) == schedule.num_steps
    )
    assert (tmp_path / "plots/schedule/batch_sizes.png").read_bytes()[:4] == b"\x89PNG"


def test_schedule_stage_refuses_a_batch_larger_than_the_dataset_and_writes_nothing(
    tmp_path, repo_root
):
    params_path, raw = write_params(tmp_path, repo_root)
    raw["batching"]["batch_size"] = 5000
    params_path.write_text(yaml.safe_dump(raw))
    with pytest.raises(
        ParamsError, match="batching.batch_size = 5000 .* at most the training-set size, 1438"
    ):
        run_stage("schedule", params_path, tmp_path)
    assert not (tmp_path / "artifacts").exists() and not (tmp_path / "metrics").exists()


@pytest.mark.parametrize(
    "section, message",
    [
        (
            {"sampler": "shufle"},
            "schedule.sampler = 'shufle' is invalid: allowed values are poisson",
        ),
        (
            {"sampler": "shuffle", "pad_truncate": True},
            "schedule.pad_truncate = True is invalid: .*balls-in-bins",
        ),
        (
            {"sampler": "partial-shuffle"},
            "schedule.buffer_size = None is invalid: .*needs the buffer K",
        ),
        ({"sampler": "partial-shuffle", "buffer_size": 0}, "schedule.buffer_size = 0 is invalid"),
        (
            {"sampler": "poisson", "buffer_size": 8},
            "schedule.buffer_size = 8 is invalid: only .*partial-shuffle",
        ),
        (
            {"sampler": "shuffle", "last_batch": "pad"},
            "schedule.last_batch = 'pad' is invalid: allowed values",
        ),
        ({"sampler": "poisson", "padtruncate": True}, "schedule.padtruncate is not a known key"),
    ],
)
def test_bad_schedule_params_are_one_line_errors(repo_root, section, message):
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    raw["schedule"] = section
    with pytest.raises(ParamsError, match=message) as caught:
        parse_params(raw)
    assert "\n" not in str(caught.value)


def test_plugin_names_pass_params_validation(repo_root):
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    raw["schedule"] = {"sampler": "plugins.samplers:my_sampler"}
    assert parse_params(raw).schedule.sampler == "plugins.samplers:my_sampler"


SIZES = {"dataset_size": 100, "batch_size": 10, "epochs": 2, "seed": 0}


@pytest.mark.parametrize(
    "name, changes, message",
    [
        (
            "shuffle",
            {"batch_size": 101},
            "batch_size = 101 is invalid: it must be in \\[1, 100\\] \\(the dataset has 100",
        ),
        ("poisson", {"batch_size": 0}, "batch_size = 0 is invalid"),
        ("poisson", {"dataset_size": 0}, "dataset_size = 0 is invalid"),
        ("poisson", {"epochs": 0}, "epochs = 0 is invalid"),
        ("poisson", {"seed": -1}, "seed = -1 is invalid"),
        (
            "poisson",
            {"sample_rate": 0.0},
            "sample_rate = 0.0 is invalid: the Poisson rate q must be in \\(0, 1\\]",
        ),
        ("poisson", {"sample_rate": 1.5}, "sample_rate = 1.5 is invalid"),
        (
            "partial-shuffle",
            {"buffer_size": 0},
            "buffer_size = 0 is invalid: it must be >= 1 \\(the shuffle buffer K\\)",
        ),
        (
            "balls-in-bins",
            {"bins": 0},
            "bins = 0 is invalid: it must be >= 1 \\(bins per epoch, b\\)",
        ),
        ("shuffle", {"last_batch": "pad"}, "last_batch = 'pad' is invalid"),
        (
            "shuffle",
            {"pad_truncate": True},
            "pad_truncate = True is invalid: sampler 'shuffle' takes options: last_batch",
        ),
        ("poisson", {"batch_size": 2.5}, "batch_size = 2.5 is invalid: it must be an integer"),
        ("nope", {}, "sampler = 'nope' is invalid: allowed values are poisson"),
    ],
)
def test_bad_sampler_arguments_are_one_line_errors(name, changes, message):
    arguments = {**SIZES, **changes}
    if name == "partial-shuffle":
        arguments.setdefault("buffer_size", 5)
    with pytest.raises(ParamsError, match=message):
        build_schedule(name, **arguments)


def test_resuming_past_the_end_is_refused():
    with pytest.raises(ParamsError, match="start = 21 is invalid"):
        next(build_sampler("shuffle", **SIZES).batches(21))


def test_cli_samplers_lists_each_sampler_with_what_accounts_for_it():
    listed = json.loads(CliRunner().invoke(app, ["samplers", "--json"]).output)
    by_name = {row["name"]: row for row in listed}
    assert set(by_name) == set(SAMPLERS)
    assert (
        by_name["poisson"]["accounted_as"] == "poisson"
        and by_name["shuffle"]["accounted_as"] is None
    )
    text = CliRunner().invoke(app, ["samplers"]).output
    assert "NONE (no sound accountant)" in text and "module:callable" in text


def test_cli_schedule_stats_reads_a_saved_schedule(tmp_path):
    schedule = build_schedule("poisson", **SIZES)
    schedule.save(tmp_path)
    result = CliRunner().invoke(app, ["schedule-stats", str(tmp_path), "--json"])
    assert result.exit_code == 0 and json.loads(result.output) == json.loads(
        json.dumps(schedule_stats(schedule))
    )
    missing = CliRunner().invoke(app, ["schedule-stats", str(tmp_path / "none")])
    assert isinstance(missing.exception, ParamsError)
