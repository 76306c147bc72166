"""Fixtures for the bring-your-own-model tests (no tests here): a tiny causal LM with its tokenizer
saved into a temporary ``data/`` folder, and a project with a calibration record and schedule sized
for its text."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from dpledger.data.example_lm import write_example
from dpledger.seals import seal_record
from helpers.train_project import genuine_record, poisson_schedule

REPO = Path(__file__).resolve().parents[2]


def tiny_lm(root: Path) -> Path:
    """``root/data/lm``: a small pydoc corpus, a 300-token BPE tokenizer and a 2-layer width-64
    GPT-2 (tied head, the LM example's architecture)."""
    folder = root / "data" / "lm"
    write_example(folder, architecture="gpt2", max_chars=12000, vocab_size=300, max_positions=32)
    return folder


def write_labelled(path: Path, labels: list[int], field: str = "text") -> Path:
    """A JSONL file of short texts with the given labels."""
    words = [
        "alpha beta",
        "gamma delta",
        "print the value",
        "raise an error",
        "import a module",
        "define a class",
    ]
    path.write_text(
        "".join(
            json.dumps({field: words[i % len(words)] + f" {i}", "label": y}) + "\n"
            for i, y in enumerate(labels)
        )
    )
    return path


def text_project(
    root: Path, *, train_size: int, data: dict, train: dict, epochs: int = 1, batch_size: int = 8
) -> Path:
    """params.yaml (the repo's, with ``data`` and ``train`` merged in), calibration.json and a
    Poisson schedule."""
    schedule = poisson_schedule(train_size, batch_size, epochs, seed=3)
    record = genuine_record(
        noise_multiplier=1.0,
        sampler="poisson",
        steps=schedule.num_steps,
        batch_size=batch_size,
        dataset_size=train_size,
        epochs=epochs,
    )
    folder = root / "artifacts/calibration"
    folder.mkdir(parents=True, exist_ok=True)
    seal_record(folder, record)
    schedule.save(root / "artifacts/schedule")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["batching"] = {"batch_size": batch_size, "epochs": epochs}
    params["data"] = {**params["data"], **data}
    params["train"] = {**params["train"], **train}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return root / "params.yaml"


def lm_project(
    root: Path,
    lm: Path,
    data: dict | None = None,
    *,
    lr: float = 0.003,
    optimizer: str = "adam",
    checkpoint_every: int = 1,
    **train,
) -> Path:
    """params.yaml training the tiny GPT-2 of ``tiny_lm`` on its own corpus (causal LM, texts cut at
    32 tokens, a fifth held out), with ``data`` and ``train`` merged in; the project as
    ``text_project``."""
    data = {
        "name": "text",
        "path": str(lm / "corpus.jsonl"),
        "tokenizer": str(lm / "model"),
        "max_length": 32,
        **(data or {}),
    }
    options = {
        "model": "hf",
        "task": "causal-lm",
        "model_options": {"path": str(lm / "model")},
        "lr": lr,
        "optimizer": optimizer,
        "checkpoint_every": checkpoint_every,
        **train,
    }
    size = len((lm / "corpus.jsonl").read_text().splitlines())
    return text_project(root, train_size=size - max(1, round(0.2 * size)), data=data, train=options)
