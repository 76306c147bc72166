"""The LoRA recipe's data (dpledger.data.public_base): a base pretrained without privacy on the
public pydoc corpus, and a private corpus of standard-library docstrings the public one lacks."""

from __future__ import annotations

import json

import pytest
import torch

from dpledger.data.example_lm import corpus_texts
from dpledger.data.public_base import (
    private_texts,
    text_pieces,
    write_private_corpus,
    write_public_base,
)

SMALL = {"max_chars": 20_000, "vocab_size": 300, "width": 32}


def test_text_pieces_cut_at_words_within_the_limit_and_drop_short_ones():
    pieces = text_pieces(["a " * 10, "word " * 100, "  x  y  "], chunk_chars=50)
    assert all(len(p) <= 50 for p in pieces) and all(len(p) > 20 for p in pieces)
    # nothing lost from the long paragraph, order kept
    assert " ".join(pieces).split() == ["word"] * 100


def test_private_corpus_is_docstrings_disjoint_from_the_public_corpus(tmp_path):
    count = write_private_corpus(tmp_path / "data/private.jsonl")
    texts = [
        json.loads(line)["text"]
        for line in (tmp_path / "data/private.jsonl").read_text().splitlines()
    ]
    assert count == len(texts) > 2000 and texts == private_texts()
    # json.dumps
    assert any(t.startswith("Serialize ``obj`` to a JSON formatted ``str``") for t in texts)
    public = set(corpus_texts(500_000))
    assert len(set(texts) & public) / len(texts) < 0.01


def _mean_loss(folder, texts):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.pad_token = tokenizer.eos_token
    batch = tokenizer(
        texts, max_length=32, truncation=True, padding="max_length", return_tensors="pt"
    )
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    with torch.no_grad():
        return float(model(**batch, labels=labels).loss)


def test_public_pretraining_lowers_the_loss_on_held_out_public_and_on_private_text(tmp_path):
    from dpledger.data.example_lm import write_example

    # the same tokenizer and initial weights, not trained
    write_example(tmp_path / "random", **SMALL)
    losses = write_public_base(tmp_path / "base", example=SMALL, steps=60, batch_size=32, lr=3e-3)
    assert len(losses) == 60 and sum(losses[-10:]) < sum(losses[:10])
    corpus = (tmp_path / "base/corpus.jsonl").read_text()
    assert corpus == (tmp_path / "random/corpus.jsonl").read_text()
    unseen = corpus_texts(40_000)[-60:]  # public text past the 20 000 characters it trained on
    private = private_texts()[:200]
    for texts in (unseen, private):
        assert (
            _mean_loss(tmp_path / "base/model", texts)
            < _mean_loss(tmp_path / "random/model", texts) - 0.3
        )


def test_unknown_pretraining_keys_are_refused(tmp_path):
    with pytest.raises(TypeError, match="unknown pretraining keys"):
        write_public_base(tmp_path / "base", step=3)
    assert not (tmp_path / "base").exists()
