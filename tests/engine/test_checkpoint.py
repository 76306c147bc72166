"""Checkpoints: a kill at any point of a save leaves a ledger that names an intact weights file."""

from __future__ import annotations

import json

import pytest
import torch

from dpledger import ledger as ckpt


def _state(steps: int):
    torch.manual_seed(steps)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ledger = ckpt.Ledger(steps, 10, 0.1 * steps, 1e-5, 1.0, "key", history={"loss": [1.0] * steps})
    return ledger, model, optimizer


class _Killed(BaseException):
    """Stands for SIGKILL: nothing after the raising call runs."""


def test_a_kill_between_the_weights_and_the_ledger_resumes_from_the_previous_checkpoint(
    tmp_path, monkeypatch
):
    ledger_file = tmp_path / "checkpoint.json"
    ledger3, model3, optimizer3 = _state(3)
    ckpt.save_checkpoint(ledger_file, ledger3, model3, optimizer3)
    ledger4, model4, optimizer4 = _state(4)

    def killed(*args, **kwargs):
        raise _Killed

    monkeypatch.setattr(ckpt.io, "write_json", killed)
    with pytest.raises(_Killed):
        ckpt.save_checkpoint(ledger_file, ledger4, model4, optimizer4)
    assert (
        tmp_path / "checkpoint-step4.pt"
    ).exists()  # the new weights were written, the ledger was not
    saved = ckpt.load_checkpoint(ledger_file, "key")
    assert saved["ledger"] == ledger3
    for name, value in model3.state_dict().items():
        assert torch.equal(saved["model"][name], value), name


def test_a_completed_save_keeps_one_weights_file_named_by_the_ledger(tmp_path):
    ledger_file = tmp_path / "checkpoint.json"
    for steps in (2, 5):
        ckpt.save_checkpoint(ledger_file, *_state(steps))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-step5.pt", "checkpoint.json"]
    assert json.loads(ledger_file.read_text())["weights_file"] == "checkpoint-step5.pt"
    assert ckpt.load_checkpoint(ledger_file, "key")["ledger"].steps_done == 5


def test_other_inputs_or_an_edited_weights_file_start_over(tmp_path, capsys):
    ledger_file = tmp_path / "checkpoint.json"
    ckpt.save_checkpoint(ledger_file, *_state(2))
    assert ckpt.load_checkpoint(ledger_file, "another key") is None
    weights = tmp_path / "checkpoint-step2.pt"
    weights.write_bytes(weights.read_bytes() + b"\0")
    assert ckpt.load_checkpoint(ledger_file, "key") is None
    assert "does not match its ledger" in capsys.readouterr().err
    assert ckpt.load_checkpoint(tmp_path / "absent.json", "key") is None
