"""The train stage across devices and torch versions (issue 30): what a resume must not mix, and one
line where torchrun asks for more GPUs than the machine has. No GPU needed: devices are resolved or
guarded."""

from __future__ import annotations

import pytest
import torch

from dpledger.errors import ParamsError
from dpledger.pipeline import distributed, run_stage
from helpers.train_project import make_project


def test_the_fingerprint_holds_the_resolved_device_and_torch_version(tmp_path, monkeypatch):
    """device: auto resolved to the CPU resumes a cpu run (same device), and another torch version
    restarts: correlated noise replays its history, and the draws depend on the device type and
    torch's generators."""
    params = make_project(tmp_path, epochs=1, train={"device": "cpu"})
    run_stage("train", params, tmp_path)
    params = make_project(tmp_path, epochs=1, train={"device": "auto"})
    assert not torch.cuda.is_available()
    assert run_stage("train", params, tmp_path)["resumed_from_step"] == 22
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    assert run_stage("train", params, tmp_path)["resumed_from_step"] == 0


def test_the_fingerprint_differs_between_device_types(tmp_path):
    from dpledger.params import load_params
    from dpledger.pipeline import train_prepare

    params = load_params(make_project(tmp_path, epochs=1))
    data = train_prepare.load_inputs(params, tmp_path)[2]
    noise, code = train_prepare.noise_key(params, tmp_path), train_prepare.training_code()
    keys = {
        train_prepare.input_fingerprint(params, tmp_path, data, torch.device(d), noise, code)
        for d in ("cpu", "cuda")
    }
    assert len(keys) == 2


def test_torchrun_with_more_local_ranks_than_gpus_is_one_line(monkeypatch):
    torchrun = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "x",
        "MASTER_PORT": "1",
    }
    for name, value in torchrun.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(
        distributed, "join_group", lambda *a: pytest.fail("joined a group for a rank with no GPU")
    )
    with pytest.raises(ParamsError) as error:
        distributed.run_ranks(lambda *a: {}, None, None, 1, torch.device("cuda"))
    assert (
        "\n" not in str(error.value)
        and "local rank 1" in str(error.value)
        and "1 CUDA" in str(error.value)
    )
