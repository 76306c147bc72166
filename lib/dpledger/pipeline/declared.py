"""What each stage reads, declared once: the params keys, the non-code files, and the outputs.

``dvc.yaml`` is generated from this table (:mod:`dpledger.pipeline.dvc_yaml`; ``make dvc-yaml``),
its code deps from each stage's import closure, so a stage's declared inputs have one home. A test
runs every stage against :class:`RecordingParams` and fails on any key a stage reads that its row
does not declare: a params change must rerun every stage it affects, and only those.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from dpledger.params import Params

DATA_DIR = "${data_dir}"
"""dvc-vars.yaml's folder of the files data.path, data.tokenizer and model_options.path name."""


@dataclass(frozen=True)
class StageInputs:
    """One stage's row: params keys (a section or a dotted key), non-code deps and outputs."""

    params: tuple[str, ...]
    files: tuple[str, ...]
    outs: tuple[str, ...]
    persist: tuple[str, ...] = ()
    unpushed: tuple[str, ...] = ()
    """Outputs never sent to a DVC remote (``push: false``): the train checkpoint holds the secret
    noise key (:mod:`dpledger.pipeline.noise_key`)."""
    cached: bool = True
    """False: the outputs are git-tracked (cache: false), as the report's are."""
    checked: tuple[str, ...] = ()
    """Keys read only to fail fast on a mistake (the output never depends on them): not DVC params,
    so changing them does not rerun the stage."""
    notes: dict[str, str] = field(default_factory=dict)
    """A comment shown beside a dep or param in dvc.yaml (why a stage reads it)."""


_UPSTREAM = ("artifacts/calibration", "artifacts/schedule")

STAGE_INPUTS: dict[str, StageInputs] = {
    "calibrate": StageInputs(
        params=("seed", "data", "batching", "calibrate"),
        files=(DATA_DIR,),
        outs=("artifacts/calibration",),
        checked=("train.model", "train.model_options", "train.task"),  # pipeline/preflight.py
        notes={"data": "the training-set size sets the sampling rate"},
    ),
    "schedule": StageInputs(
        params=("seed", "data", "batching", "schedule"),
        files=(DATA_DIR,),
        outs=("artifacts/schedule",),
        notes={"data": "the schedule indexes the training split"},
    ),
    "train": StageInputs(
        params=("seed", "data", "train", "audit.one_run.enabled", "audit.one_run.canaries"),
        files=(DATA_DIR, *_UPSTREAM),
        outs=("artifacts/train", "artifacts/model"),
        persist=("artifacts/train",),
        unpushed=("artifacts/train",),
        checked=("calibrate.mechanism",),  # pipeline/sharding.py: refuses correlated noise early
        notes={
            "data": "the split it trains and tests on, and the resume fingerprint",
            "artifacts/model": "the model to publish and its card",
        },
    ),
    "verify": StageInputs(
        params=(
            "seed",
            "verify",
            "data",
            "train.model",
            "train.model_options",
            "train.task",
            "train.lora",
        ),
        files=(DATA_DIR,),
        outs=("artifacts/verify",),
        notes={"train.lora": "verify.model: train builds the model with its adapter"},
    ),
    "audit": StageInputs(
        params=(
            "seed",
            "audit",
            "data",
            "train.model",
            "train.model_options",
            "train.task",
            "train.clip_norm",
            "train.lr",
            "train.secure_noise",
        ),
        files=(*_UPSTREAM, "artifacts/train"),
        outs=("artifacts/audit",),
        notes={
            "artifacts/train": "audit.one_run: the canary coordinates recorded by train",
            "train.secure_noise": "the noise path whose tail the one-run audit states",
        },
    ),
    "report": StageInputs(
        params=(
            "seed",
            "data",
            "batching",
            "calibrate",
            "schedule",
            "train",
            "verify",
            "audit",
            "report",
        ),
        files=(
            *_UPSTREAM,
            "artifacts/train",
            "artifacts/verify",
            "artifacts/audit",
            *(f"metrics/{stage}.json" for stage in ("calibrate", "schedule", "train")),
            *(f"metrics/{stage}.json" for stage in ("verify", "audit")),
            *(f"plots/{stage}" for stage in ("calibrate", "schedule", "train", "verify", "audit")),
        ),
        outs=("reports/report.md", "reports/report.html", "reports/figures"),
        cached=False,
        notes={"params": "every section: the report prints the exact, validated params"},
    ),
}


ALL = "<all>"
"""The read recorded when a stage uses the whole params (the report prints them all)."""


def is_declared(read: str, declared: tuple[str, ...]) -> bool:
    """Whether a dotted read (``data.test_fraction``) is covered by a declared key: the key itself
    or a section above it. A whole-section read (``train``) needs the whole section declared, and
    :data:`ALL` every section of params.yaml."""
    if read == ALL:
        return all(section in declared for section in Params.model_fields)
    return any(read == key or read.startswith(key + ".") for key in declared)


class RecordingParams:
    """A read-only view of a params model that records the dotted path of every value read.

    Nested sections come back as views too, so ``params.data.test_fraction`` records
    ``data.test_fraction``; a whole-section use (``model_dump``, iteration, equality) records the
    section itself. ``isinstance`` still sees the wrapped class.
    """

    def __init__(self, model: BaseModel, reads: set[str] | None = None, prefix: str = "") -> None:
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_reads", set() if reads is None else reads)
        object.__setattr__(self, "_prefix", prefix)

    @property
    def reads(self) -> set[str]:
        """Every dotted path read so far (shared by all views of one params object)."""
        return self._reads

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # noqa: D105 (isinstance sees the wrapped model)
        return type(self._model)

    def _whole(self) -> BaseModel:
        self._reads.add(self._prefix or ALL)
        return self._model

    def __getattr__(self, name: str) -> Any:
        model = self._model
        if name not in type(model).model_fields:
            return getattr(self._whole(), name)  # model_dump, model_copy, ...: the whole section
        value = getattr(model, name)
        path = f"{self._prefix}.{name}" if self._prefix else name
        if isinstance(value, BaseModel):
            return RecordingParams(value, self._reads, path)
        self._reads.add(path)
        return value

    def model_dump(self, *args: Any, include: Any = None, **kwargs: Any) -> dict[str, Any]:
        """The section as a dict; ``include`` records only the keys it names."""
        if include is None:
            return self._whole().model_dump(*args, **kwargs)
        for name in include:
            self._reads.add(f"{self._prefix}.{name}" if self._prefix else name)
        return self._model.model_dump(*args, include=include, **kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("params are read-only")

    def __iter__(self):
        return iter(self._whole())

    def __eq__(self, other: object) -> bool:
        other = other._whole() if isinstance(other, RecordingParams) else other
        return self._whole() == other

    def __hash__(self) -> int:
        return hash(self._whole())

    def __repr__(self) -> str:
        return f"RecordingParams({self._model!r})"
