"""Issue 27 Build 5: a fuzz of the surfaces added since the last probe, in the style of
test_fuzz_params_cli.py.

Model folders (missing, empty, corrupt, truncated, foreign), tokenizer/model mismatches, text and
CSV fields of every JSON type, and plugin factories returning odd things: each case loads, or stops
with one line (a :class:`DpledgerError`), within a few seconds, writing nothing into the folder it
reads."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz_params_cli import _assert_one_line, _time_limit
from torch import nn

from dpledger.data.text import _labels, _texts, load_tokenizer, read_records, token_ids
from dpledger.errors import DpledgerError
from dpledger.models.hf import load_hf_model
from helpers.byo_helpers import tiny_lm

FUZZ = settings(
    max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)

json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(10**30), 10**30),
        st.floats(allow_nan=False, allow_infinity=False),
        st.sampled_from([1e30, -1e30, 1.7, 0.0, 2.0, -1, 99_999, 100_000]),
        st.text(max_size=20),
        st.sampled_from(["", "1", "1.7", "-3", "nan", "a\nb", '"quoted"', "x,y"]),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=4), children, max_size=2)
    ),
    max_leaves=5,
)


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> Path:
    return tiny_lm(tmp_path_factory.mktemp("fuzz-surfaces")) / "model"


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def _one_line_or_ok(call):
    with _time_limit(30):
        try:
            return call()
        except DpledgerError as error:
            _assert_one_line(error)
            return None


# --- model and tokenizer folders
# ------------------------------------------------------------------------------

DAMAGES = {
    "missing": lambda f: shutil.rmtree(f),
    "empty": lambda f: [p.unlink() for p in f.iterdir()],
    "config not json": lambda f: (f / "config.json").write_text("{not json"),
    "config a list": lambda f: (f / "config.json").write_text("[1, 2]"),
    "config unknown model_type": lambda f: (f / "config.json").write_text(
        '{"model_type": "no-such-model"}'
    ),
    "config no model_type": lambda f: (f / "config.json").write_text('{"n_layer": 2}'),
    "config binary": lambda f: (f / "config.json").write_bytes(b"\xff\xfe\x00garbage"),
    "weights truncated": lambda f: (f / "model.safetensors").write_bytes(
        (f / "model.safetensors").read_bytes()[:64]
    ),
    "weights empty": lambda f: (f / "model.safetensors").write_bytes(b""),
    "weights random": lambda f: (f / "model.safetensors").write_bytes(
        np.random.default_rng(0).bytes(4096)
    ),
    "weights missing": lambda f: (f / "model.safetensors").unlink(),
    "weights a pickle": lambda f: (
        (f / "model.safetensors").unlink(),
        torch.save({"transformer.wte.weight": torch.zeros(2)}, f / "pytorch_model.bin"),
    ),
    "weights wrong shapes": lambda f: _wrong_shapes(f),
    "tokenizer json corrupt": lambda f: (f / "tokenizer.json").write_text("{"),
    "tokenizer config a number": lambda f: (f / "tokenizer_config.json").write_text("5"),
    "tokenizer files missing": lambda f: [
        (f / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")
    ],
    "foreign folder": lambda f: (
        [p.unlink() for p in f.iterdir()] and (f / "notes.txt").write_text("hello")
    ),
    "auto_map": lambda f: (f / "config.json").write_text(
        json.dumps(
            {**json.loads((f / "config.json").read_text()), "auto_map": {"AutoConfig": "x.Y"}}
        )
    ),
}


def _wrong_shapes(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    save_file({name: torch.zeros(3, 3) for name in weights}, folder / "model.safetensors")


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_model_or_tokenizer_folder_loads_or_is_one_line(lm, tmp_path, damage):
    folder = tmp_path / "model"
    shutil.copytree(lm, folder)
    DAMAGES[damage](folder)
    before = _snapshot(folder) if folder.exists() else None
    for task in ("causal-lm", "classification"):
        _one_line_or_ok(
            lambda task=task: load_hf_model({"path": str(folder)}, task, text=True, num_labels=2)
        )
    _one_line_or_ok(lambda: load_tokenizer(str(folder)))
    assert (
        _snapshot(folder) if folder.exists() else None
    ) == before  # nothing written into the folder


@FUZZ
@given(
    spec=st.dictionaries(
        st.sampled_from(
            [
                "model_type",
                "n_layer",
                "n_embd",
                "n_head",
                "vocab_size",
                "pad_token_id",
                "num_labels",
                "auto_map",
                "n_positions",
            ]
        ),
        json_values,
        max_size=5,
    )
)
def test_an_inline_model_config_builds_or_is_one_line(spec):
    spec = {"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 2, "vocab_size": 50, **spec}
    _one_line_or_ok(
        lambda: load_hf_model(
            {"config": spec, "init": "random"}, "causal-lm", text=True, num_labels=None
        )
    )


def test_a_tokenizer_larger_than_the_model_vocabulary_is_one_line(lm, tmp_path):
    from dpledger.data import Dataset
    from dpledger.models import build_task_model, task_for

    ids = token_ids(load_tokenizer(str(lm)), ["alpha beta gamma", "delta"], 16)
    data = Dataset(
        ids,
        np.zeros(2, np.int64),
        ids,
        np.zeros(2, np.int64),
        1,
        "text",
        vocab_size=300,
        has_labels=False,
    )
    config = {
        "model_type": "gpt2",
        "n_layer": 1,
        "n_embd": 8,
        "n_head": 2,
        "vocab_size": 50,
        "n_positions": 32,
    }
    with pytest.raises(DpledgerError) as refused:
        build_task_model(
            "hf", {"config": config, "init": "random"}, task_for("hf", "causal-lm", data), data
        )
    _assert_one_line(refused.value)
    assert "the tokenizer has 300" in str(refused.value)


# --- text and CSV fields of every JSON type
# -------------------------------------------------------------------


@FUZZ
@given(
    texts=st.lists(json_values, min_size=1, max_size=4),
    labels=st.lists(json_values, min_size=1, max_size=4),
)
def test_jsonl_fields_of_every_type_are_read_or_one_line(texts, labels):
    path = Path("data.jsonl")
    strings = _one_line_or_ok(lambda: _texts(texts, path, "text"))
    assert strings is None or all(isinstance(t, str) for t in strings)
    classes = _one_line_or_ok(lambda: _labels(labels, path, "label"))
    # accepted labels are exactly the integral values given, never truncated
    if classes is not None:
        assert [int(c) for c in classes] == [int(float(v)) for v in labels]
        assert all(float(v) == int(float(v)) and not isinstance(v, bool) for v in labels)


@FUZZ
@given(rows=st.lists(st.tuples(st.text(max_size=12), st.text(max_size=4)), min_size=1, max_size=4))
def test_csv_fields_round_trip_exactly(rows, tmp_path_factory):
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["text", "label"])
    writer.writerows(rows)
    path = tmp_path_factory.mktemp("csv") / "data.csv"
    path.write_text(buffer.getvalue(), encoding="utf-8", newline="")
    records = _one_line_or_ok(lambda: read_records(path))
    if records is not None:
        normalise = lambda t: t.replace("\r\n", "\n").replace("\r", "\n")  # noqa: E731 (universal newlines)
        assert [(r["text"], r["label"]) for r in records] == [
            (normalise(t), normalise(y)) for t, y in rows
        ]


# --- plugin factories returning odd things
# ----------------------------------------------------------------------


class _Returns(nn.Module):
    def __init__(self, value) -> None:
        super().__init__()
        self.linear = nn.Linear(64, 10)
        self.value = value

    def forward(self, x):
        return self.value(self.linear(x.flatten(1)), x) if callable(self.value) else self.value


def _raises(error):
    def forward(logits, x):
        raise error

    return forward


ODD = {
    "None": lambda shape, k: None,
    "an int": lambda shape, k: 5,
    "a class": lambda shape, k: nn.Linear,
    "raises": lambda shape, k: (_ for _ in ()).throw(ValueError("bad\nmulti-line")),
    "no parameters": lambda shape, k: nn.Flatten(),
    "frozen parameters": lambda shape, k: nn.Linear(64, 10).requires_grad_(False),
    "returns a tuple": lambda shape, k: _Returns(lambda logits, x: (logits, logits)),
    "returns a string": lambda shape, k: _Returns("logits"),
    "returns ints": lambda shape, k: _Returns(lambda logits, x: logits.long()),
    "reduces the batch": lambda shape, k: _Returns(lambda logits, x: logits.mean(0, keepdim=True)),
    "too few classes": lambda shape, k: _Returns(lambda logits, x: logits[:, :2]),
    "a scalar": lambda shape, k: _Returns(lambda logits, x: logits.sum()),
    "forward raises KeyError": lambda shape, k: _Returns(_raises(KeyError("k"))),
    "forward raises AttributeError": lambda shape, k: _Returns(_raises(AttributeError("a"))),
    "NaN logits": lambda shape, k: _Returns(lambda logits, x: logits * math.nan),
}


def odd_factory(input_shape, num_classes, kind):
    return ODD[kind](input_shape, num_classes)


@pytest.mark.parametrize("kind", sorted(ODD))
def test_a_plugin_factory_returning_odd_things_builds_or_is_one_line(kind):
    from dpledger.data import load_data
    from dpledger.models import build_task_model, task_for
    from dpledger.params.core import DataParams

    data = load_data(DataParams(), 0)  # digits
    name = f"{__name__}:odd_factory"
    model = _one_line_or_ok(
        lambda: build_task_model(name, {"kind": kind}, task_for(name, "classification", data), data)
    )
    assert model is None or kind == "NaN logits"  # NaN trains and is flagged as a diverged loss
