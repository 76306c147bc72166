"""Issue 29 item 6: mistakes surface in the first stage that can see them (calibrate, before
accounting), as one line; channels-last images are recognised; third-party chatter is not shown as
an alarm; the LM example stays out of the default pipeline."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from dpledger.data import load_dataset
from dpledger.errors import ParamsError
from dpledger.models import build_task_model, task_for
from dpledger.pipeline import calibrate, run_stage
from dpledger.quiet import RDP_NOT_CONVERGED, quiet_third_party

REPO = Path(__file__).resolve().parents[2]
TINY_VIT = {
    "model_type": "vit",
    "image_size": 8,
    "patch_size": 4,
    "num_channels": 3,
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 32,
}


def _images(path: Path, shape: tuple[int, ...], count: int = 40) -> Path:
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.integers(0, 256, (count, *shape), dtype=np.uint8), y=np.arange(count) % 2)
    return path


def _project(root: Path, *, data: dict | None = None, train: dict | None = None) -> Path:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["data"] = {**params["data"], **(data or {})}
    params["train"] = {**params["train"], **(train or {})}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return root / "params.yaml"


@pytest.mark.parametrize(
    "train, match",
    [
        (
            {"model": "hf", "model_options": {"config": dict(TINY_VIT)}},
            r"train.model_options.init = 'pretrained'",
        ),
        ({"model": "cnn", "model_options": {"channels": [0]}}, r"train.model_options.channels = 0"),
        ({"model": "hf", "model_options": {"path": "data/no-such-model"}}, r"no such folder"),
        ({"model": "transformer", "task": "causal-lm"}, r"train.task = 'causal-lm' is invalid"),
    ],
)
def test_calibrate_refuses_a_bad_model_in_one_line_before_any_accounting(
    tmp_path, monkeypatch, train, match
):
    def no_accounting(*args, **kwargs):
        raise AssertionError("accounting ran before the model was checked")

    monkeypatch.setattr(calibrate, "calibrate_noise", no_accounting)
    monkeypatch.setattr(calibrate, "choose_matrix", no_accounting)
    with pytest.raises(ParamsError, match=match) as refused:
        run_stage("calibrate", _project(tmp_path, train=train), tmp_path)
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "artifacts").exists() and not (tmp_path / "metrics").exists()


def test_channels_last_images_are_read_channels_first_with_a_note(tmp_path, capsys):
    path = _images(tmp_path / "hwc.npz", (8, 8, 3))
    data = load_dataset("npz", str(path), 0.25, seed=0)
    assert data.input_shape == (3, 8, 8)
    assert "channels-last (N, H, W, C)" in capsys.readouterr().err
    raw = np.load(path)["x"].astype(np.float32) / 255.0
    order = np.random.default_rng(0).permutation(40)[10:]  # split_dataset's training rows
    np.testing.assert_array_equal(data.x_train, raw[order].transpose(0, 3, 1, 2))


@pytest.mark.parametrize("shape", [(3, 8, 8), (1, 8, 8), (8, 8)])
def test_channels_first_and_grey_images_are_unchanged_and_silent(tmp_path, capsys, shape):
    data = load_dataset("npz", str(_images(tmp_path / "chw.npz", shape)), 0.25, seed=0)
    assert data.input_shape == (shape if len(shape) == 3 else (1, *shape))
    assert capsys.readouterr().err == ""


def test_the_builtin_cnn_sees_three_channels_of_a_channels_last_file(tmp_path):
    data = load_dataset("npz", str(_images(tmp_path / "hwc.npz", (8, 8, 3))), 0.25, seed=0)
    model = build_task_model("cnn", {}, task_for("cnn", "classification", data), data)
    assert model.net[0].in_channels == 3


def test_a_vit_on_channels_last_images_builds_and_on_mismatched_channels_is_one_line(tmp_path):
    options = {"config": dict(TINY_VIT), "init": "random"}
    data = load_dataset("npz", str(_images(tmp_path / "hwc.npz", (8, 8, 3))), 0.25, seed=0)
    # converted: it fits
    build_task_model("hf", options, task_for("hf", "classification", data), data)
    grey = load_dataset("npz", str(_images(tmp_path / "grey.npz", (8, 8))), 0.25, seed=0)
    with pytest.raises(
        ParamsError, match=r"batch of shape \(2, 1, 8, 8\) \(images are read as \(N, C, H, W\)\)"
    ) as e:
        build_task_model("hf", options, task_for("hf", "classification", grey), grey)
    assert "\n" not in str(e.value)


def test_rdp_convergence_warnings_become_one_note_and_other_warnings_pass(capsys, caplog):
    absl = logging.getLogger("absl")
    with quiet_third_party("calibrate"):
        for alpha in (1.1, 1.2):
            absl.warning(RDP_NOT_CONVERGED + " after 1000 iterations with alpha=%f.", alpha)
        absl.warning("something else")
    err = capsys.readouterr().err
    assert "skipped 2 Rényi order(s)" in err and err.count("\n") == 1
    assert [r.getMessage() for r in caplog.records] == ["something else"]


def test_the_default_pipeline_never_plans_the_lm_examples_prepare_stage():
    """`dvc repro` (targets: the root dvc.yaml) with dvc-vars.yaml's data_dir at its default."""
    from dvc.repo import Repo
    from dvc.repo.reproduce import plan_repro

    assert yaml.safe_load((REPO / "dvc-vars.yaml").read_text())["data_dir"] == "data"
    with Repo(str(REPO)) as repo:
        planned = plan_repro(repo.index.graph, repo.stage.collect("dvc.yaml"))
        names = {stage.addressing for stage in planned}
    assert "report" in names and not any("examples/lm" in name for name in names)


def test_prepare_writes_nothing_to_stderr(tmp_path, capfd):
    from stages.prepare import main

    torch.manual_seed(0)
    main(out=tmp_path / "lm", architecture="gpt2")
    assert capfd.readouterr().err == ""


def test_the_sentiment_generator_is_balanced_deterministic_and_tokenized_offline(tmp_path):
    from transformers import AutoTokenizer

    from dpledger.data.example_sentiment import NEGATIVE, POSITIVE, sentences, write_example

    rows = sentences(400, seed=3)
    assert rows == sentences(400, seed=3) and sum(label for _, label in rows) == 200
    for text, label in rows:
        words = set(text.split())
        assert len(words & set(POSITIVE if label else NEGATIVE)) == 1 and not words & set(
            NEGATIVE if label else POSITIVE
        )
    write_example(tmp_path / "sentiment", count=50)
    tokenizer = AutoTokenizer.from_pretrained(
        tmp_path / "sentiment" / "tokenizer", local_files_only=True
    )
    ids = tokenizer("the soup was truly wonderful")["input_ids"]
    assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
    assert tokenizer.unk_token_id not in ids and len(tokenizer) <= 200
    assert (tmp_path / "sentiment" / "sentiment.csv").read_text().splitlines()[0] == "text,label"
