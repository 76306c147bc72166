"""The published model (artifacts/model/): it loads back with from_pretrained (PeftModel for an
adapter) and generates; its weights are the trained ones; its model card states what §5.3 of "How to
DP-fy ML" asks."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from dpledger.accounting.accountants import get_accountant
from dpledger.accounting.pld import PldRun, pld_epsilon
from dpledger.accounting.record import CalibrationRecord
from dpledger.errors import ParamsError
from dpledger.ledger import Ledger
from dpledger.models.model_card import CardFacts, model_card
from dpledger.params.train import TrainParams
from dpledger.pipeline import run_stage
from dpledger.sampling.guard import SamplerCheck
from helpers.byo_helpers import lm_project, tiny_lm
from helpers.train_project import genuine_record, make_project

PUBLISHED = "artifacts/model"


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> Path:
    return tiny_lm(tmp_path_factory.mktemp("publish"))


def _lm_run(root: Path, lm: Path, **train) -> Path:
    """Train the tiny GPT-2 on its corpus through the train stage (``lm_project``); returns
    ``root``."""
    run_stage("train", lm_project(root, lm, **train), root)
    return root


@pytest.fixture(scope="module")
def lora_run(lm, tmp_path_factory) -> Path:
    lora = {"rank": 4, "alpha": 8}
    settings = {"optimizer": "adamw", "lr": 0.01, "lr_schedule": "linear", "warmup_steps": 2}
    root = tmp_path_factory.mktemp("lora_run")
    return _lm_run(root, lm, lora=lora, export_merged=True, **settings)


def _card(folder: Path) -> tuple[dict, str]:
    """The card's front matter (parsed) and its body."""
    _, header, body = (folder / "README.md").read_text().split("---\n", 2)
    return yaml.safe_load(header), body


def _generates(model: torch.nn.Module, tokenizer_folder: Path) -> torch.Tensor:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder, local_files_only=True)
    prompt = tokenizer("def main", return_tensors="pt")
    greedy = {"max_new_tokens": 4, "min_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
    out = model.generate(**prompt, **greedy)
    assert out.shape == (1, prompt["input_ids"].shape[1] + 4)
    return out


def test_a_lora_run_publishes_an_adapter_that_peft_loads_onto_its_base_and_generates(lm, lora_run):
    folder = lora_run / PUBLISHED
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md", "merged"} <= set(
        p.name for p in folder.iterdir()
    )
    assert not (folder / "model.safetensors").exists()  # adapter only
    base = AutoModelForCausalLM.from_pretrained(lm / "model", local_files_only=True)
    published = PeftModel.from_pretrained(base, folder).eval()
    _generates(published, folder)
    # base + published adapter == the trained model, key for key: the adapter is the trained one and
    # the base weights never moved
    trained = torch.load(lora_run / "artifacts/train/model.pt", weights_only=True)
    loaded = published.state_dict()
    assert trained.keys() == loaded.keys()
    for name, value in trained.items():
        assert torch.equal(loaded[name], value), name
    lora_b = [value for name, value in trained.items() if "lora_B" in name]
    assert lora_b and any(value.abs().sum() > 0 for value in lora_b)  # it trained (starts at 0)


def test_the_merged_export_is_a_plain_checkpoint_with_the_adapters_outputs(lm, lora_run):
    folder = lora_run / PUBLISHED
    merged = AutoModelForCausalLM.from_pretrained(folder / "merged", local_files_only=True).eval()
    base = AutoModelForCausalLM.from_pretrained(lm / "model", local_files_only=True)
    adapted = PeftModel.from_pretrained(base, folder).eval()
    tokens = torch.randint(1, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = adapted(tokens).logits
        torch.testing.assert_close(merged(tokens).logits, expected, rtol=1e-4, atol=1e-5)
    _generates(merged, folder / "merged")


def _copy_adapter(lora_run: Path, tmp_path: Path) -> Path:
    """The README's continuation recipe: the published adapter copied out of artifacts/model."""
    adapter = tmp_path / "adapter"
    shutil.copytree(lora_run / PUBLISHED, adapter, ignore=shutil.ignore_patterns("merged"))
    return adapter


def test_a_published_adapter_given_as_model_path_continues_from_its_weights(lm, lora_run, tmp_path):
    adapter = _copy_adapter(lora_run, tmp_path)
    options = {"model_options": {"path": str(adapter)}, "prior_data": "overlapping"}
    root = _lm_run(tmp_path / "again", lm, lr=1e-12, **options)
    before = torch.load(lora_run / "artifacts/train/model.pt", weights_only=True)
    after = torch.load(root / "artifacts/train/model.pt", weights_only=True)
    for name in (n for n in before if "lora_B" in n):  # a fresh adapter would start from lora_B = 0
        torch.testing.assert_close(after[name], before[name], rtol=0, atol=1e-6)
    front, _ = _card(root / PUBLISHED)
    assert front["library_name"] == "peft"


def test_continuing_on_the_same_data_publishes_the_composed_epsilon(lm, lora_run, tmp_path):
    """Issue 40, item 3: the README's recipe run twice on the same corpus releases a function of
    both runs' noise: the claim is their composition (here two equal runs: one of twice the
    steps), in the metrics, the card and the privacy record the next run reads."""
    adapter = _copy_adapter(lora_run, tmp_path)
    options = {"model_options": {"path": str(adapter)}, "prior_data": "overlapping"}
    root = _lm_run(tmp_path / "again", lm, **options)
    metrics = json.loads((root / "metrics/train.json").read_text())
    record = CalibrationRecord.load(root / "artifacts/calibration/calibration.json")
    assert record.accountant == "pld" and metrics["prior_runs_composed"] == 1
    doubled = pld_epsilon(PldRun.of(record.description.with_steps(2 * record.steps)), record.delta)
    assert metrics["epsilon_composed"] == pytest.approx(doubled, rel=1e-3)
    assert metrics["epsilon_composed"] > 1.2 * metrics["epsilon_spent"]
    _, body = _card(root / PUBLISHED)
    assert f"**(ε, δ) of this model across runs**: ε = {metrics['epsilon_composed']:.4g}" in body
    assert "protects the fine-tuning data of this run only" not in body
    privacy = json.loads((root / PUBLISHED / "privacy.json").read_text())
    assert (
        len(privacy["runs"]) == 2 and privacy["composed"]["epsilon"] == metrics["epsilon_composed"]
    )


def test_continuing_without_saying_how_the_data_relate_is_refused(lm, lora_run, tmp_path):
    adapter = _copy_adapter(lora_run, tmp_path)
    root = tmp_path / "again"
    root.mkdir()
    params = lm_project(root, lm, model_options={"path": str(adapter)})
    with pytest.raises(
        ParamsError, match=r"train.prior_data is unset, but .* trained privately"
    ) as caught:
        run_stage("train", params, root)
    assert "\n" not in str(caught.value) and not (root / "artifacts/train").exists()
    params = lm_project(root, lm, model_options={"path": str(adapter)}, prior_data="disjoint")
    with pytest.raises(ParamsError, match=r"train.prior_data = 'disjoint' is contradicted"):
        run_stage("train", params, root)  # the same corpus: the same training rows
    (adapter / "privacy.json").unlink()  # a card without the record (an older publication)
    params = lm_project(root, lm, model_options={"path": str(adapter)}, prior_data="overlapping")
    with pytest.raises(
        ParamsError, match=r"was trained privately by dpledger but holds no privacy"
    ):
        run_stage("train", params, root)


def test_a_declared_disjoint_corpus_is_named_in_the_card_not_composed(lm, lora_run, tmp_path):
    adapter = _copy_adapter(lora_run, tmp_path)
    corpus = tmp_path / "other.jsonl"
    lines = (lm / "corpus.jsonl").read_text().splitlines()
    corpus.write_text("\n".join(reversed(lines)) + "\n")  # other rows, the same count
    options = {"model_options": {"path": str(adapter)}, "prior_data": "disjoint"}
    root = _lm_run(tmp_path / "again", lm, data={"path": str(corpus)}, **options)
    metrics = json.loads((root / "metrics/train.json").read_text())
    assert metrics["prior_runs_declared_disjoint"] == 1 and metrics["prior_runs_composed"] == 0
    assert metrics["epsilon_composed"] == metrics["epsilon_spent"]
    _, body = _card(root / PUBLISHED)
    assert "declared disjoint from this run's (`train.prior_data: disjoint`)" in body


def test_full_fine_tuning_publishes_a_transformers_checkpoint_with_its_tokenizer(lm, tmp_path):
    root = _lm_run(tmp_path, lm)
    folder = root / PUBLISHED
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    trained = torch.load(root / "artifacts/train/model.pt", weights_only=True)
    loaded = model.state_dict()
    assert trained.keys() == loaded.keys()
    for name, value in trained.items():
        assert torch.equal(loaded[name], value), name
    _generates(model, folder)
    front, body = _card(folder)
    assert front["library_name"] == "transformers"
    assert f"pretrained base model ({lm / 'model'}) is not covered" in body


def test_a_zoo_model_publishes_its_state_dict_and_the_card(tmp_path):
    params = make_project(tmp_path, epochs=1)
    metrics = run_stage("train", params, tmp_path)
    folder = tmp_path / PUBLISHED
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "model.pt", "privacy.json"]
    published = torch.load(folder / "model.pt", weights_only=True)
    trained = torch.load(tmp_path / "artifacts/train/model.pt", weights_only=True)
    assert all(torch.equal(published[name], value) for name, value in trained.items())
    front, body = _card(folder)
    assert front["library_name"] == "pytorch"
    assert f"ε = {metrics['epsilon_spent']:.4g} at δ = 1e-05 after 22 of 22 logical steps" in body


def _facts(check: SamplerCheck, **train) -> CardFacts:
    record = genuine_record(
        noise_multiplier=1.1, sampler="poisson", steps=40, batch_size=32, dataset_size=640, epochs=2
    )
    stated = get_accountant("pld").epsilon(record.description, record.delta)
    record = dataclasses.replace(record, assumptions=stated.assumptions)
    ledger = Ledger(40, 40, record.epsilon, record.delta, 1.1, "key")
    return CardFacts(
        train=TrainParams(**train),
        data_name="npz",
        record=record,
        ledger=ledger,
        check=check,
        metrics={"test_accuracy": 0.75, "epsilon_spent": record.epsilon},
        parameters=(100, 1000),
    )


def test_the_card_states_each_item_of_the_dp_fy_ml_checklist_from_the_record():
    facts = _facts(SamplerCheck("poisson", "poisson", allowed_mismatch=False))
    front, body = (part for part in model_card(facts).split("---\n", 2)[1:])
    assert {"differential_privacy", "dp-sgd"} <= set(yaml.safe_load(front)["tags"])
    record = facts.record
    stated = "; ".join(record.assumptions)
    expected = [
        "**Unit of privacy**: one training example (example-level DP)",
        "i.e. one row of the training set (640 rows)",
        "**Adjacency**: add or remove one example",
        "**What is released**: every iterate",
        f"ε = {record.epsilon:.4g} at δ = 1e-05 after 40 of 40 logical steps",
        "**Accountant**: pld. Its assumptions, as recorded by calibrate: " + stated,
        "**Sampler used**: 'poisson'; accounted as 'poisson' (Poisson sampling",
        "the two match",
        "σ = 1.1",
        "**Hyperparameter tuning**: not accounted",
        "**Empirical audit**: not part of this card",
        "100 trainable of 1,000 parameters",
        "test_accuracy: 0.75",
    ]
    for sentence in expected:
        assert sentence in body, sentence
    assert "Warning" not in body and "Public data" not in body


def test_the_card_of_a_run_whose_sampler_differs_from_the_accounted_one_says_so():
    check = SamplerCheck("poisson", "shuffle", allowed_mismatch=True)
    body = model_card(_facts(check))
    assert f"**Warning: {check.warning()}**" in body and "the two match" not in body


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_model_trained_on_cuda_is_published_from_cpu_copies(lm, tmp_path):
    """artifacts/train/model.pt keeps the device's tensors; the published files hold CPU tensors, so
    they load on a machine without the training device."""
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    run_stage("train", make_project(zoo, epochs=1, train={"device": "cuda"}), zoo)
    state = torch.load(zoo / PUBLISHED / "model.pt", weights_only=True)
    assert state and all(value.device.type == "cpu" for value in state.values())
    root = _lm_run(tmp_path / "lora", lm, device="cuda", lora={"rank": 4}, export_merged=True)
    base = AutoModelForCausalLM.from_pretrained(lm / "model", local_files_only=True)
    _generates(PeftModel.from_pretrained(base, root / PUBLISHED).eval(), root / PUBLISHED)
