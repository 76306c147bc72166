"""A public base model and a private corpus for the LoRA recipe, built on any machine with
nothing downloaded (docs/recipes.md, "GPT-2 + LoRA on text, offline"). Practitioners fine-tune a
model pretrained on PUBLIC data with DP on PRIVATE data; no pretrained GPT-2 exists offline, so this
module makes both halves:

* ``write_public_base``: the LM example's tokenizer and tiny GPT-2 (``example_lm.write_example``,
  pydoc's topics as the public corpus), pretrained on that corpus WITHOUT privacy, saved with
  ``save_pretrained``;
* ``write_private_corpus``: a different text set, standard-library docstrings, as JSONL.

Deterministic for a given Python and torch.
"""

from __future__ import annotations

import importlib
import inspect
import json
import shutil
import warnings
from pathlib import Path

from dpledger import io
from dpledger.data.example_lm import EXAMPLE, write_example
from dpledger.local_folders import TRUST_REMOTE_CODE

PRIVATE_MODULES = (
    "argparse", "ast", "base64", "bisect", "calendar", "cmd", "codecs", "collections", "colorsys",
    "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib",
    "dis", "doctest", "email", "enum", "filecmp", "fnmatch", "fractions", "functools", "gettext",
    "glob", "graphlib", "gzip", "hashlib", "heapq", "hmac", "html", "importlib", "inspect", "io",
    "ipaddress", "itertools", "json", "keyword", "linecache", "logging", "mailbox", "math",
    "mimetypes", "numbers", "operator", "os", "pathlib", "pickle", "pprint", "queue", "random",
    "re",
    "reprlib", "runpy", "sched", "secrets", "shlex", "shutil", "smtplib", "statistics", "string",
    "struct", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize",
    "trace", "traceback", "types", "typing", "unittest", "uuid", "warnings", "weakref", "zipfile",
)  # fmt: skip
"""Pure-Python standard-library modules whose classes' and functions' docstrings make the private
set: API documentation, a style apart from pydoc's language-reference topics (the public corpus)."""

PRETRAIN = {"steps": 300, "batch_size": 64, "lr": 3e-3, "warmup_steps": 20, "max_length": 32}
"""Non-private pretraining of the public base: AdamW, linear warm-up then linear decay to 0, random
batches of the public texts cut to ``max_length`` tokens (the LM example's ``data.max_length``).
300 steps: 10 s on the shared 2-core machine at load ~1, 267 s under a heavier load; train loss
2.87 (perplexity 17.6 on the public text)."""


def text_pieces(paragraphs: list[str], chunk_chars: int = 240) -> list[str]:
    """Each paragraph whitespace-normalised and cut at word boundaries into pieces of at most
    ``chunk_chars`` characters; pieces of 20 characters or fewer are dropped."""
    pieces: list[str] = []
    for paragraph in paragraphs:
        piece: list[str] = []
        for word in paragraph.split():
            if piece and len(" ".join([*piece, word])) > chunk_chars:
                pieces.append(" ".join(piece))
                piece = []
            piece.append(word)
        if len(" ".join(piece)) > 20:
            pieces.append(" ".join(piece))
    return pieces


def private_texts(modules: tuple[str, ...] = PRIVATE_MODULES) -> list[str]:
    """The paragraphs of the docstrings of the classes and functions each module defines (in name
    order), cut into pieces by ``text_pieces``."""
    paragraphs: list[str] = []
    with warnings.catch_warnings():  # reading typing's deprecated typing.io / typing.re warns
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in modules:
            module = importlib.import_module(name)
            for _, obj in sorted(vars(module).items()):
                defined_here = getattr(obj, "__module__", None) == module.__name__
                if defined_here and (inspect.isclass(obj) or inspect.isroutine(obj)):
                    paragraphs.extend((inspect.getdoc(obj) or "").split("\n\n"))
    return text_pieces(paragraphs)


def write_private_corpus(path: Path | str) -> int:
    """Write ``private_texts()`` to ``path`` as JSONL (one ``{"text": ...}`` a line), atomically;
    returns the number of texts."""
    texts = private_texts()
    io.write_text(path, "".join(json.dumps({"text": text}) + "\n" for text in texts))
    return len(texts)


def pretrain(
    model, tokenizer, texts: list[str], *, steps, batch_size, lr, warmup_steps, max_length, seed=0
):
    """Train ``model`` (a causal LM) in place on ``texts`` without privacy: mean next-token
    cross-entropy over real tokens, AdamW, linear warm-up then linear decay. Returns each step's
    loss."""
    import torch

    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    batch = tokenizer(
        texts, max_length=max_length, truncation=True, padding="max_length", return_tensors="pt"
    )
    ids, mask = batch["input_ids"], batch["attention_mask"]
    labels = ids.masked_fill(mask == 0, -100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    scale = lambda step: min(1.0, (step + 1) / warmup_steps) * max(0.0, 1.0 - step / steps)  # noqa: E731
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, scale)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    for _ in range(steps):
        rows = torch.randint(len(ids), (batch_size,), generator=generator)
        loss = model(input_ids=ids[rows], attention_mask=mask[rows], labels=labels[rows]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def write_public_base(
    folder: Path | str, *, example: dict | None = None, **pretraining
) -> list[float]:
    """Write ``folder/corpus.jsonl`` (the public corpus) and ``folder/model/`` (tokenizer and the
    tiny GPT-2 pretrained on that corpus, ``save_pretrained``), atomically. ``example`` overrides
    the LM example's sizes (``EXAMPLE``), ``pretraining`` the keys of ``PRETRAIN``. Returns the
    pretraining losses."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    unknown = set(pretraining) - set(PRETRAIN)
    if unknown:
        raise TypeError(
            f"write_public_base: unknown pretraining keys {sorted(unknown)}; allowed: "
            f"{list(PRETRAIN)}"
        )
    folder = Path(folder)
    with io.atomic_dir(folder) as tmp:
        write_example(tmp / "public", **{**EXAMPLE, **(example or {})})
        built = tmp / "public/model"
        model = AutoModelForCausalLM.from_pretrained(built, trust_remote_code=TRUST_REMOTE_CODE)
        tokenizer = AutoTokenizer.from_pretrained(built, trust_remote_code=TRUST_REMOTE_CODE)
        texts = [
            json.loads(line)["text"]
            for line in (tmp / "public/corpus.jsonl").read_text().splitlines()
        ]
        losses = pretrain(model, tokenizer, texts, **{**PRETRAIN, **pretraining})
        model.save_pretrained(tmp / "model")
        tokenizer.save_pretrained(tmp / "model")
        (tmp / "public/corpus.jsonl").replace(tmp / "corpus.jsonl")
        shutil.rmtree(tmp / "public")
    return losses
