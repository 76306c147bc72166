"""Bring your own model and data: an hf checkpoint on a text file, a plugin model, the causal-LM
loss against a naive computation, and one clear line (and nothing written) for every bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpledger.data.text import PAD
from dpledger.errors import ParamsError
from dpledger.models.tasks import Task
from dpledger.params import load_params
from dpledger.pipeline import run_stage
from helpers.byo_helpers import lm_project, text_project, tiny_lm, write_labelled
from helpers.train_project import make_project


def make_mlp(input_shape, num_classes, hidden=16):
    """A plugin model factory (train.model: test_byo_models:make_mlp)."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(math.prod(input_shape), hidden),
        nn.Tanh(),
        nn.Linear(hidden, num_classes),
    )


def not_a_module(input_shape, num_classes):
    return "a model"


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> Path:
    return tiny_lm(tmp_path_factory.mktemp("byo"))


def test_hf_checkpoint_with_its_tokenizer_trains_through_the_pipeline_on_text(tmp_path, lm):
    params = lm_project(tmp_path, lm)
    metrics = run_stage("train", params, tmp_path)
    assert metrics["steps_done"] == metrics["steps_total"] > 0
    assert math.isfinite(metrics["test_perplexity"]) and metrics["test_perplexity"] > 1
    assert metrics["test_perplexity"] == pytest.approx(math.exp(metrics["test_loss"]))
    ledger = json.loads((tmp_path / "artifacts/train/ledger.json").read_text())
    assert ledger["task"] == "causal-lm" and ledger["layer_methods"]
    for name in ("loss.csv", "loss.png", "perplexity.csv", "perplexity.png"):
        assert (tmp_path / "plots/train" / name).stat().st_size > 0


def test_gpt_neox_causal_lm_from_a_config_trains_through_the_pipeline(tmp_path, lm):
    """The architecture the example used before GPT-2 (untied head, rotary positions) still
    trains."""
    config = {
        "model_type": "gpt_neox",
        "num_hidden_layers": 1,
        "hidden_size": 16,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "vocab_size": 300,
        "max_position_embeddings": 32,
    }
    params = lm_project(tmp_path, lm, model_options={"config": config, "init": "random"})
    metrics = run_stage("train", params, tmp_path)
    assert metrics["steps_done"] == metrics["steps_total"] > 0 and math.isfinite(
        metrics["test_perplexity"]
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_lm_example_trains_on_cuda_in_bf16(tmp_path, lm):
    """The train stage on CUDA with bf16 autocast: token ids and masks on the device, norms in
    float32, the same ledger as on the CPU (steps, ε spent, σ) and a test perplexity within 25 % of
    the CPU run's (the noise draws differ: Philox on the CPU, torch's generator on CUDA)."""
    cpu = run_stage("train", lm_project(tmp_path / "cpu", lm, device="cpu"), tmp_path / "cpu")
    cuda = run_stage(
        "train",
        lm_project(tmp_path / "cuda", lm, device="cuda", precision="bf16"),
        tmp_path / "cuda",
    )
    for key in ("steps_done", "steps_total", "epsilon_spent", "noise_multiplier"):
        assert cuda[key] == cpu[key], key
    assert (
        math.isfinite(cuda["test_loss"])
        and not cuda["loss_diverged"]
        and cuda["nonfinite_examples"] == 0
    )
    assert cuda["test_perplexity"] == pytest.approx(cpu["test_perplexity"], rel=0.25)
    state = torch.load(tmp_path / "cuda/artifacts/train/model.pt")
    assert all(
        value.device.type == "cuda" and value.dtype == torch.float32
        for value in state.values()
        if value.is_floating_point()
    )


def test_causal_lm_loss_is_the_mean_over_real_next_tokens():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    ids = torch.tensor([[1, 2, 3, 4, 5], [6, 1, 2, PAD, PAD]])
    losses = Task("causal-lm").losses_from_logits(logits, ids, torch.zeros(2, dtype=torch.long))
    naive = [
        F.cross_entropy(logits[0, :4], ids[0, 1:]),
        F.cross_entropy(logits[1, :2], ids[1, 1:3]),
    ]
    torch.testing.assert_close(losses, torch.stack(naive))


def test_plugin_model_trains_on_images(tmp_path):
    params = make_project(
        tmp_path,
        epochs=1,
        train={"model": "test_byo_models:make_mlp", "model_options": {"hidden": 8}},
    )
    metrics = run_stage("train", params, tmp_path)
    assert metrics["steps_done"] == 22 and metrics["test_accuracy"] > 0.3


def _refused(root: Path, params: Path, match: str) -> None:
    with pytest.raises(ParamsError, match=match) as caught:
        run_stage("train", params, root)
    assert "\n" not in str(caught.value)
    assert not (root / "artifacts/train").exists() and not (root / "metrics").exists()


@pytest.mark.parametrize(
    "case", ["no-model-dir", "not-a-checkpoint", "no-tokenizer", "no-field", "task"]
)
def test_bad_hf_or_text_input_is_one_line_and_writes_nothing(tmp_path, lm, case):
    empty = tmp_path / "data" / "empty"
    empty.mkdir(parents=True)
    edits = {
        "no-model-dir": (
            {},
            {"model_options": {"path": str(tmp_path / "nowhere")}},
            r"train.model_options.path .*no such folder",
        ),
        "not-a-checkpoint": (
            {},
            {"model_options": {"path": str(empty)}},
            r"train.model_options.path .*not a transformers checkpoint \(no config.json",
        ),
        "no-tokenizer": (
            {"tokenizer": str(empty)},
            {},
            r"data.tokenizer .*not a transformers tokenizer",
        ),
        "no-field": (
            {"text_field": "body"},
            {},
            r"data.text_field = 'body' is invalid: record 1 .* has no such field",
        ),
        "task": ({}, {"task": "sequence-classification"}, r"data.label_field is invalid"),
    }
    data, train, match = edits[case]
    _refused(tmp_path, lm_project(tmp_path, lm, data, **train), match)


def test_labels_outside_the_model_classes_are_refused(tmp_path, lm):
    data = {
        "name": "text",
        "path": str(write_labelled(tmp_path / "labelled.jsonl", [0, 1, 2, 3] * 10)),
        "tokenizer": str(lm / "model"),
        "max_length": 16,
    }
    config = {
        "model_type": "gpt_neox",
        "num_hidden_layers": 1,
        "hidden_size": 16,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "vocab_size": 300,
        "num_labels": 3,
        "pad_token_id": 0,
    }
    params = text_project(
        tmp_path,
        train_size=32,
        data=data,
        train={
            "model": "hf",
            "task": "sequence-classification",
            "model_options": {"config": config, "init": "random"},
        },
    )
    _refused(tmp_path, params, r"labels reach 3 but .* has 3 classes")


def test_a_task_the_model_has_no_head_for_is_refused(tmp_path, lm):
    params = make_project(
        tmp_path, epochs=1, train={"model": "hf", "model_options": {"path": str(lm / "model")}}
    )
    _refused(
        tmp_path,
        params,
        r"train.task = 'classification' is invalid for the GPT2Config model .* no "
        r"image-classification head",
    )


def test_plugin_that_returns_no_module_is_refused(tmp_path):
    params = make_project(tmp_path, epochs=1, train={"model": "test_byo_models:not_a_module"})
    _refused(
        tmp_path,
        params,
        r"train.model = 'test_byo_models:not_a_module' is invalid: it returned str, not a "
        r"torch.nn.Module",
    )


def test_missing_plugin_module_uses_the_sampler_plugin_messages(tmp_path):
    params = make_project(tmp_path, epochs=1, train={"model": "no_such_module_18:build"})
    _refused(
        tmp_path,
        params,
        r"train.model = 'no_such_module_18:build' is invalid: cannot import module",
    )


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("max_length", 0, r"params: data.max_length = 0 is invalid"),
        ("max_length", -3, r"params: data.max_length = -3 is invalid"),
    ],
)
def test_non_positive_max_length_is_refused_by_the_schema(tmp_path, key, value, match):
    params = make_project(tmp_path, epochs=1)
    raw = params.read_text().replace("max_length: 128", f"{key}: {value}")
    params.write_text(raw)
    with pytest.raises(ParamsError, match=match):
        load_params(params)


def test_unknown_model_name_is_refused_by_the_schema(tmp_path):
    params = make_project(tmp_path, epochs=1, train={"model": "resnet"})
    with pytest.raises(
        ParamsError,
        match=r"train.model = 'resnet' is invalid: allowed values are mlp, cnn, transformer, hf",
    ):
        load_params(params)


@pytest.mark.slow
@pytest.mark.xfail(
    reason="known defect: the resumed LM run's ledger matches but every parameter differs from "
    "the uninterrupted run's in the last bits (1e-9) from the first resumed step on. Bisected: "
    "with train.self_check false the resume is bit-identical; with it on, running either the "
    "statelessness forward or the engine's self-check in the resumed process is enough (two clean "
    "runs are identical; MKL_CBWR=AUTO,STRICT does not help; an in-process engine run with a "
    "self-check between steps stays identical). Intermittent: it passed in CI on 2026-11-28 and "
    "in 1 of 3 local runs; killed at step 2, 3 or 4 it differs by 4e-9 to 7e-9, with "
    "MKL_DYNAMIC=FALSE too. The MLP and two-rank kill-9 tests still require bit-identity.",
    strict=False,
)
def test_kill_9_lm_run_then_rerun_ends_with_the_same_ledger(tmp_path, lm):
    """The run is killed after a checkpoint and resumed in a process pinned to one core with
    OMP_NUM_THREADS=1 (where ``taskset`` exists), yet ends bit-identical to an uninterrupted run at
    the original two threads: the ledger's thread count is taken back. Both runs are subprocesses,
    so neither inherits this process's thread settings (MKL's dynamic threading included)."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import time

    from helpers.byo_helpers import REPO

    killed, clean = tmp_path / "killed", tmp_path / "clean"
    for root in (killed, clean):
        root.mkdir()
        lm_project(root, lm)
    command = [sys.executable, "-m", "stages.train", "--params", "params.yaml", "--root", "."]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'lib'}:{REPO}", "OMP_NUM_THREADS": "2"}
    process = subprocess.Popen(command, cwd=killed, env=env, stderr=subprocess.DEVNULL)
    ledger_file = killed / "artifacts/train/checkpoint.json"  # the ledger naming its weights file
    deadline = time.time() + 600  # a loaded 2-core machine takes minutes to the second step
    while time.time() < deadline and process.poll() is None:
        if ledger_file.exists() and json.loads(ledger_file.read_text())["steps_done"] >= 2:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    partial = json.loads(ledger_file.read_text())["steps_done"]
    one_core = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    resume_env = {**env, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        one_core + command, cwd=killed, env=resume_env, check=True, stderr=subprocess.DEVNULL
    )
    subprocess.run(command, cwd=clean, env=env, check=True, stderr=subprocess.DEVNULL)
    ledgers = [
        json.loads((root / "artifacts/train/ledger.json").read_text()) for root in (killed, clean)
    ]
    assert all(ledger.pop("self_check")["passed"] for ledger in ledgers)  # timed, checked per run
    assert ledgers[0]["threads"] == 2
    assert {k: v for k, v in ledgers[0].items() if k != "fingerprint"} == {
        k: v for k, v in ledgers[1].items() if k != "fingerprint"
    }
    models = [torch.load(root / "artifacts/train/model.pt") for root in (killed, clean)]
    for name in models[1]:
        assert torch.equal(models[0][name], models[1][name]), name
    assert 0 < partial < ledgers[1]["steps_done"]
    assert json.loads((killed / "metrics/train.json").read_text())["resumed_from_step"] == partial


def test_makefile_overrides_and_the_example_params_file_agree():
    import re

    import yaml

    from helpers.byo_helpers import REPO

    base = yaml.safe_load((REPO / "params.yaml").read_text())
    example = yaml.safe_load((REPO / "examples/lm/params.yaml").read_text())
    makefile = (REPO / "Makefile").read_text()
    overrides = re.findall(
        r"-S '?([\w.-]+:)?\+?([\w.]+)=([^' \\\n]+)'?", makefile[makefile.index("LM_SET") :]
    )
    data_dir = None
    for file, key, value in overrides:  # `+key` adds a key inside a mapping (hydra)
        if file:
            assert (file, key) == ("dvc-vars.yaml:", "data_dir")
            data_dir = value
            continue
        *parents, name = key.split(".")
        node = base
        for parent in parents:
            node = node[parent]
        node[name] = yaml.safe_load(value)
    assert base == example
    assert data_dir == "examples/lm/data"  # the LM's files live in the folder its stages depend on
    for path in (
        example["data"]["path"],
        example["data"]["tokenizer"],
        example["train"]["model_options"]["path"],
    ):
        assert path.startswith(data_dir + "/")


def test_make_lm_runs_its_experiment_outside_the_workspace():
    """`dvc exp run` without --temp (or --queue) writes LM_SET's overrides into params.yaml and
    dvc-vars.yaml and leaves the experiment's dvc.lock and outputs in the workspace; --temp runs it
    in a temporary copy, so `make lm` leaves the checkout as it was (the results stay in `dvc exp
    show`)."""
    from helpers.byo_helpers import REPO

    recipe = (REPO / "Makefile").read_text().split("\nlm:", 1)[1].split("\n\n", 1)[0]
    commands = [line for line in recipe.splitlines() if "dvc exp run" in line]
    assert len(commands) == 1 and "--temp" in commands[0].split(), commands
