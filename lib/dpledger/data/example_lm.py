"""The language-model example's data, built on any machine with nothing downloaded: a text corpus
cut from CPython's own ``pydoc_data.topics`` (the help texts that ship with Python), a byte-level
BPE tokenizer trained on it with the ``tokenizers`` library and saved as a transformers tokenizer,
and a tiny random-init causal LM saved with ``save_pretrained`` beside it. Deterministic for a given
Python.
"""

from __future__ import annotations

import json
from pathlib import Path

from dpledger import io

ARCHITECTURES = {  # a tiny causal LM of each architecture: 2 layers, width 64, 4 heads, dropout off
    "gpt2": {
        "model_type": "gpt2",
        "n_layer": 2,
        "n_embd": 64,
        "n_head": 4,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    },
    "gpt-neox": {
        "model_type": "gpt_neox",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 256,
    },
}
"""GPT-2 (the example's default) ties its LM head to the token embedding, which the engine clips as
one weight with the ghost norm's cross terms; GPT-NeoX has an untied head. Dropout is off in both:
it would make the verify battery's σ = 0 tests on this model (``verify.model: train``) random."""


WIDTH_KEYS = {"gpt2": "n_embd", "gpt-neox": "hidden_size"}

EXAMPLE = {"max_chars": 500_000, "vocab_size": 300, "width": 32}
"""The bundled example's sizes (``stages.prepare``, examples/lm): all of pydoc's topics (about 465
000 characters, 3 089 texts), a 300-token byte-level vocabulary (the 256 bytes and 43 merges) and
width 32. Measured with examples/lm/params.yaml at ε = 8 (benchmarks/RESULTS.md): test
perplexity 54.9 against a unigram 71.1 after 8 epochs; 4 epochs stayed near the unigram perplexity
with 300 tokens (69.6 against 71.1) and with 512 (202 against 199). A narrower model means less
noise in total (σ·R·√d/B)."""


def corpus_texts(max_chars: int = 120_000, chunk_chars: int = 240) -> list[str]:
    """Paragraphs of the pydoc topics (sorted by topic), whitespace-normalised, cut into pieces of
    at most ``chunk_chars`` characters at word boundaries, until ``max_chars`` characters."""
    from pydoc_data.topics import topics

    texts: list[str] = []
    total = 0
    for name in sorted(topics):
        for paragraph in topics[name].split("\n\n"):
            words = paragraph.split()
            piece: list[str] = []
            for word in words:
                if piece and len(" ".join([*piece, word])) > chunk_chars:
                    texts.append(" ".join(piece))
                    piece = []
                piece.append(word)
            if len(" ".join(piece)) > 20:
                texts.append(" ".join(piece))
            total = sum(len(t) for t in texts)
            if total >= max_chars:
                return texts
    return texts


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer trained on ``texts``, wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )


def write_example(
    folder: Path,
    *,
    architecture: str = "gpt2",
    max_chars: int = 120_000,
    vocab_size: int = 512,
    max_positions: int = 128,
    seed: int = 0,
    width: int | None = None,
) -> None:
    """Write ``folder/corpus.jsonl`` (one ``{"text": ...}`` a line) and ``folder/model/``
    (tokenizer, config and random-init weights, all with ``save_pretrained``). ``width`` (default:
    the architecture's) sets the hidden size and ``initializer_range`` = 1/√width: transformers'
    default 0.02 is sized for width 768, and at width 32–64 it shrinks the gradient at every layer,
    so under DP noise the model learns nothing (docs/models.md, "Does it learn?")."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    texts = corpus_texts(max_chars)
    tokenizer = train_tokenizer(texts, vocab_size)
    spec = {
        **ARCHITECTURES[architecture],
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    spec["n_positions" if architecture == "gpt2" else "max_position_embeddings"] = max_positions
    if width is not None:
        spec[WIDTH_KEYS[architecture]] = width
        spec["initializer_range"] = width**-0.5
        if architecture == "gpt-neox":
            spec["intermediate_size"] = 4 * width
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**spec), trust_remote_code=False)
    with io.atomic_dir(folder) as tmp:
        (tmp / "corpus.jsonl").write_text(
            "".join(json.dumps({"text": text}) + "\n" for text in texts)
        )
        tokenizer.save_pretrained(tmp / "model")
        model.save_pretrained(tmp / "model")
