"""Text datasets: a JSONL or CSV file with a text field (and, for classification, integer labels),
tokenized by the model's own tokenizer loaded from a local folder
(``AutoTokenizer.from_pretrained(path, local_files_only=True)``: nothing is downloaded).

Every text is truncated to ``max_length`` tokens; shorter ones are right-padded with :data:`PAD`, so
the padding is explicit in the ids and the models and losses mask it (``attention_mask = ids !=
PAD``).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from dpledger.data.dataset import Dataset, split_dataset
from dpledger.errors import DpledgerError, ParamsError
from dpledger.local_folders import TRUST_REMOTE_CODE, refuse_remote_code
from dpledger.params.core import DataParams

PAD = -1
"""Token id marking padding in a text dataset's ``x`` (never a real id)."""
FORMATS = (".jsonl", ".csv")
MAX_CLASSES = 100_000
"""The most classes a text label may name: a label of 1e30 would otherwise ask for a head of 1e30
outputs."""


def load_tokenizer(path: str | None, key: str = "data.tokenizer") -> Any:
    """A transformers tokenizer saved with ``save_pretrained`` in the local folder ``path`` (no hub
    access)."""
    if path is None:
        raise ParamsError(
            f"params: {key} is missing: "
            "data.name = 'text' is tokenized by the model's own tokenizer folder"
        )
    if not Path(path).is_dir():
        raise ParamsError(
            f"params: {key} = {path!r} is invalid: no such folder "
            "(a tokenizer saved with save_pretrained)"
        )
    from transformers import AutoTokenizer

    refuse_remote_code(path, key)
    try:
        return AutoTokenizer.from_pretrained(
            path, local_files_only=True, trust_remote_code=TRUST_REMOTE_CODE
        )
    except (
        Exception
    ) as error:  # a foreign folder: transformers fails in many ways (AttributeError on a number)
        first = (
            str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
        )
        raise ParamsError(
            f"params: {key} = {path!r} is invalid: it is not a transformers tokenizer folder "
            f"({first})"
        ) from None


def read_records(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``.jsonl`` (one JSON object a line) or ``.csv`` (a header row) file."""
    if path.suffix not in FORMATS:
        raise ParamsError(
            f"params: data.path = {str(path)!r} is invalid: "
            f"a text dataset is a {' or '.join(FORMATS)} file"
        )
    try:
        content = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise DpledgerError(f"{path}: cannot be read as UTF-8 text ({error})") from None
    if path.suffix == ".csv":  # read as one stream: a quoted field keeps its newlines
        return list(csv.DictReader(io.StringIO(content)))
    records = []
    for number, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DpledgerError(f"{path}: line {number} is not JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise DpledgerError(f"{path}: line {number} is not a JSON object")
        records.append(record)
    return records


def _column(records: list[dict[str, Any]], field: str, key: str, path: Path) -> list[Any]:
    for number, record in enumerate(records, start=1):
        if field not in record:
            raise ParamsError(
                f"params: {key} = {field!r} is invalid: "
                f"record {number} of {path} has no such field "
                f"(it has {', '.join(map(str, record)) or 'none'})"
            )
    return [record[field] for record in records]


def _texts(values: list[Any], path: Path, field: str) -> list[str]:
    """The text of every record: a string, never a null, number or list turned into one ("None",
    "[1, 2]")."""
    for number, value in enumerate(values, start=1):
        if not isinstance(value, str):
            raise DpledgerError(
                f"{path}: record {number} has {field!r} = {json.dumps(value)[:40]} "
                f"({type(value).__name__}); "
                "text fields must be strings"
            )
    return values


def _label(value: Any) -> int:
    """An integer class label: an int, an integral float (2.0) or a decimal string ("2"); ValueError
    otherwise (a bool, 1.7, "1.7", null): a label is never truncated."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if not isinstance(value, int):
        raise ValueError(value)
    return value


def _labels(values: list[Any], path: Path, field: str) -> np.ndarray:
    for number, value in enumerate(values, start=1):
        try:
            label = _label(value)
        except ValueError:
            raise DpledgerError(
                f"{path}: record {number} has {field!r} = {json.dumps(value)[:40]}; "
                "class labels are integers 0..K-1"
            ) from None
        if not 0 <= label < MAX_CLASSES:
            raise DpledgerError(
                f"{path}: record {number} has {field!r} = {label:.6g}; "
                f"class labels are integers 0..K-1 with K at most {MAX_CLASSES}"
            )
    return np.asarray([_label(value) for value in values], dtype=np.int64)


def token_ids(tokenizer: Any, texts: list[str], max_length: int) -> np.ndarray:
    """(N, T) int64 ids, T the longest tokenized text (at most ``max_length``), right-padded with
    PAD."""
    encoded = tokenizer([str(text) for text in texts], truncation=True, max_length=max_length)[
        "input_ids"
    ]
    width = max(1, max(len(ids) for ids in encoded))
    ids = np.full((len(encoded), width), PAD, dtype=np.int64)
    for row, tokens in enumerate(encoded):
        ids[row, : len(tokens)] = tokens
    return ids


def load_text(data: DataParams, seed: int) -> Dataset:
    """The tokenized dataset of ``data.path`` (a set path); labelled when the first record has
    ``data.label_field``."""
    source = Path(data.path)
    records = read_records(source)
    if not records:
        raise DpledgerError(f"{source}: holds no records")
    tok = load_tokenizer(data.tokenizer)
    texts = _texts(
        _column(records, data.text_field, "data.text_field", source), source, data.text_field
    )
    has_labels = data.label_field in records[0]
    labels = (
        _labels(
            _column(records, data.label_field, "data.label_field", source), source, data.label_field
        )
        if has_labels
        else np.zeros(len(records), dtype=np.int64)
    )
    split = split_dataset(
        token_ids(tok, texts, data.max_length), labels, data.test_fraction, seed, "text"
    )
    return Dataset(
        split.x_train,
        split.y_train,
        split.x_test,
        split.y_test,
        split.num_classes,
        "text",
        vocab_size=len(tok),
        has_labels=has_labels,
    )
