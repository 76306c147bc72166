"""The noise key is secret by default: tracked files alone cannot replay a run's noise, the key is
sealed in the checkpoint (never in a JSON file), a resume continues with it, and a key derivable
from tracked files is refused or, on explicit opt-in, warned about in the card and the report."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from dpledger.errors import ParamsError
from dpledger.ledger import PUBLIC_KEY_WARNING, load_checkpoint
from dpledger.params import load_params
from dpledger.pipeline import run_stage
from dpledger.pipeline.noise_key import (
    ENVIRONMENT_VARIABLE,
    public_seed_key,
    resolve_noise_key,
)
from helpers.train_project import make_project

KEY = "ab" * 32


def _model(root: Path) -> dict[str, torch.Tensor]:
    return torch.load(root / "artifacts/train/model.pt")


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[name], b[name]) for name in a)


def _git_repository(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(root)], check=True)


def test_the_environment_key_comes_first_and_is_not_printed(monkeypatch, tmp_path):
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, KEY)
    key = resolve_noise_key(0, None, False, tmp_path)
    assert key.value == int(KEY, 16) and key.provided and not key.public
    assert ENVIRONMENT_VARIABLE in key.source and KEY not in repr(key)


def test_without_a_provided_key_each_run_draws_a_fresh_256_bit_key(monkeypatch, tmp_path):
    monkeypatch.delenv(ENVIRONMENT_VARIABLE)
    keys = [resolve_noise_key(0, None, False, tmp_path) for _ in range(2)]
    assert keys[0].value != keys[1].value
    assert all("CSPRNG" in k.source and k.identity() == "random" for k in keys)
    assert public_seed_key(0) not in {k.value for k in keys}


@pytest.mark.parametrize("text", ["abc", "zz" * 32, ""])
def test_a_short_or_non_hex_key_is_one_line(monkeypatch, tmp_path, text):
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, text or " ")
    with pytest.raises(ParamsError, match=r"^params: the noise key in .* is invalid: it must be"):
        resolve_noise_key(0, None, False, tmp_path)


def test_a_key_file_tracked_by_git_or_not_ignored_is_refused(monkeypatch, tmp_path):
    monkeypatch.delenv(ENVIRONMENT_VARIABLE)
    repository = tmp_path / "repo"
    _git_repository(repository)
    (repository / "noise.key").write_text(KEY)
    with pytest.raises(ParamsError, match="not git-ignored, so its key would be public"):
        resolve_noise_key(0, "noise.key", False, repository)
    subprocess.run(["git", "-C", str(repository), "add", "noise.key"], check=True)
    with pytest.raises(ParamsError, match="git tracks it, so its key would be public"):
        resolve_noise_key(0, "noise.key", False, repository)
    (repository / "secret.key").write_text(KEY + "\n")
    (repository / ".gitignore").write_text("secret.key\n")
    key = resolve_noise_key(0, "secret.key", False, repository)
    assert key.value == int(KEY, 16) and key.provided
    outside = tmp_path / "outside.key"
    outside.write_text(KEY)
    assert resolve_noise_key(0, str(outside), False, repository).value == int(KEY, 16)


def test_the_public_seed_is_only_an_explicit_opt_in(tmp_path):
    key = resolve_noise_key(3, None, True, tmp_path)
    assert key.public and key.value == public_seed_key(3) and "seed = 3" in key.source


def test_tracked_files_alone_cannot_reproduce_a_default_run(monkeypatch, tmp_path):
    """Two copies of the same project (every tracked file and input equal) trained by default
    release different models: the noise is not a function of what the repository holds. With the
    opt-in the two are bit-identical, and the card and report say what that costs."""
    monkeypatch.delenv(ENVIRONMENT_VARIABLE)
    roots = [tmp_path / name for name in ("a", "b", "public_a", "public_b")]
    for root in roots:
        public = {"insecure_public_seed": True} if "public" in root.name else {}
        make_project(root, epochs=1, train=public)
    metrics = [run_stage("train", root / "params.yaml", root) for root in roots]
    models = [_model(root) for root in roots]
    assert (roots[0] / "params.yaml").read_text() == (roots[1] / "params.yaml").read_text()
    assert not _same(models[0], models[1])
    assert _same(models[2], models[3])
    assert not metrics[0]["noise_key_public"] and "CSPRNG" in metrics[0]["noise_key_source"]
    assert metrics[2]["noise_key_public"]
    card = (roots[2] / "artifacts/model/README.md").read_text()
    assert PUBLIC_KEY_WARNING in card and "color:red" in card
    assert PUBLIC_KEY_WARNING not in (roots[0] / "artifacts/model/README.md").read_text()


def test_the_key_is_sealed_in_the_checkpoint_only_and_a_resume_replays_it(monkeypatch, tmp_path):
    """A default run's random key is in the weights file and in no JSON file; a run killed after a
    checkpoint resumes with it, ending bit-identical to an uninterrupted run given that key."""
    from dpledger.pipeline import train as train_stage

    monkeypatch.delenv(ENVIRONMENT_VARIABLE)
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    for root in (killed, clean):
        make_project(root, epochs=1, train={"checkpoint_every": 1})
    real_save = train_stage.save_checkpoint

    def save_then_die(path, ledger, *args, **kwargs):
        real_save(path, ledger, *args, **kwargs)
        if ledger.steps_done == 5:
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(train_stage, "save_checkpoint", save_then_die)
        with pytest.raises(KeyboardInterrupt):
            run_stage("train", killed / "params.yaml", killed)
    ledger_file = killed / "artifacts/train/checkpoint.json"
    fingerprint = json.loads(ledger_file.read_text())["fingerprint"]
    sealed = load_checkpoint(ledger_file, fingerprint)["noise_key"]
    assert len(sealed) > 32
    assert run_stage("train", killed / "params.yaml", killed)["resumed_from_step"] == 5
    for path in [*killed.rglob("*.json"), *killed.rglob("*.md"), *killed.rglob("*.csv")]:
        assert sealed not in path.read_text(), path
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, sealed)
    run_stage("train", clean / "params.yaml", clean)
    assert _same(_model(killed), _model(clean))


def test_a_different_provided_key_starts_over(monkeypatch, tmp_path):
    params = make_project(tmp_path, epochs=1)
    run_stage("train", params, tmp_path)
    assert run_stage("train", params, tmp_path)["resumed_from_step"] > 0
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, KEY)
    assert run_stage("train", params, tmp_path)["resumed_from_step"] == 0


def test_the_params_refuse_a_key_value_in_params_yaml(tmp_path):
    params = make_project(tmp_path, epochs=1, train={"noise_key": KEY})
    with pytest.raises(ParamsError, match="noise_key"):
        load_params(params)
