"""A generated sentiment set for trying text classification offline (docs/recipes.md):
templated sentences in a CSV and a small WordPiece tokenizer trained on them with ``tokenizers``,
saved as a transformers tokenizer. Deterministic for a given seed.

Each sentence says one opinion about one subject ("the soup was truly wonderful", "i found the film
dull"); its label is 1 when the opinion word is positive and 0 when negative. Words that carry no
label (subjects, templates, intensifiers) are shared by both classes, so only the opinion word
decides.
"""

from __future__ import annotations

import csv
import io as text_io
from pathlib import Path

import numpy as np

from dpledger import io

POSITIVE = (
    "good",
    "great",
    "wonderful",
    "excellent",
    "lovely",
    "superb",
    "pleasant",
    "brilliant",
    "fine",
    "charming",
)
NEGATIVE = (
    "bad",
    "awful",
    "terrible",
    "dull",
    "boring",
    "poor",
    "horrible",
    "dreadful",
    "weak",
    "unpleasant",
)
SUBJECTS = (
    "film",
    "movie",
    "soup",
    "service",
    "hotel",
    "book",
    "concert",
    "game",
    "meal",
    "show",
    "trip",
    "room",
)
INTENSIFIERS = ("", "really", "truly", "quite", "very", "rather", "so")
TEMPLATES = (
    "the {subject} was {intensifier} {opinion}",
    "i found the {subject} {intensifier} {opinion}",
    "what a {intensifier} {opinion} {subject}",
    "honestly the {subject} is {intensifier} {opinion}",
    "my friends said the {subject} was {intensifier} {opinion}",
    "overall a {intensifier} {opinion} {subject} for us",
)
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def sentences(count: int, seed: int = 0) -> list[tuple[str, int]]:
    """``count`` (sentence, label) pairs, labels balanced up to one, in a seeded random order."""
    rng = np.random.default_rng(seed)
    rows = []
    for index in range(count):
        label = index % 2
        opinion = rng.choice(POSITIVE if label else NEGATIVE)
        template = TEMPLATES[rng.integers(len(TEMPLATES))]
        filled = template.format(
            subject=rng.choice(SUBJECTS), intensifier=rng.choice(INTENSIFIERS), opinion=opinion
        )
        rows.append((" ".join(filled.split()), label))
    return [rows[i] for i in rng.permutation(count)]


def train_wordpiece(texts: list[str], vocab_size: int = 200):
    """A lower-casing WordPiece tokenizer trained on ``texts`` that adds [CLS] ... [SEP] like
    BERT's."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def write_example(folder: str | Path, *, count: int = 4000, seed: int = 0) -> None:
    """Write ``folder/sentiment.csv`` (columns ``text``, ``label``) and ``folder/tokenizer/``."""
    rows = sentences(count, seed)
    table = text_io.StringIO()
    writer = csv.writer(table, lineterminator="\n")
    writer.writerow(["text", "label"])
    writer.writerows(rows)
    tokenizer = train_wordpiece([text for text, _ in rows])
    with io.atomic_dir(Path(folder)) as tmp:
        (tmp / "sentiment.csv").write_text(table.getvalue())
        tokenizer.save_pretrained(tmp / "tokenizer")
