"""Typed schema of params.yaml: one section per stage plus the shared keys ``seed``, ``data`` and
``batching``.

Every stage validates the whole file before it writes anything, so a bad value anywhere stops the
stage with a single line (:class:`dpledger.errors.ParamsError`) naming the key, the value and the
allowed range.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError

from dpledger.errors import ParamsError
from dpledger.params.audit import AuditParams
from dpledger.params.bounds import MAX_TRAIN_STEPS, refuse_beyond, refuse_beyond_memory
from dpledger.params.calibrate import CalibrateParams
from dpledger.params.core import (
    BatchingParams,
    DataParams,
    Section,
    validation_error_to_params_error,
)
from dpledger.params.report import ReportParams
from dpledger.params.schedule import ScheduleParams
from dpledger.params.train import TrainParams
from dpledger.params.verify import VerifyParams

__all__ = [
    "Params",
    "DataParams",
    "BatchingParams",
    "CalibrateParams",
    "ScheduleParams",
    "TrainParams",
    "VerifyParams",
    "AuditParams",
    "ReportParams",
    "load_params",
    "parse_params",
    "check_dataset_size",
]

STAGES = ("calibrate", "schedule", "train", "verify", "audit", "report")
# an int64 index, its padding flag and the copies made while the schedule is built
SCHEDULE_BYTES_PER_ROW = 16


class Params(Section):
    """The whole params.yaml. Every key is required, so a deleted key is reported, not defaulted."""

    # torch.manual_seed and numpy take at most 64 bits; 32 for safety
    seed: int = Field(ge=0, le=2**32 - 1)
    data: DataParams
    batching: BatchingParams
    calibrate: CalibrateParams
    schedule: ScheduleParams
    train: TrainParams
    verify: VerifyParams
    audit: AuditParams
    report: ReportParams


def parse_params(raw: Any) -> Params:
    """Validate a parsed params mapping; raise :class:`ParamsError` with one line on the first
    problem."""
    if not isinstance(raw, dict):
        raise ParamsError(
            "params: the file must be a mapping of sections (calibrate:, schedule:, ...)"
        )
    try:
        return Params.model_validate(raw)
    except ValidationError as error:
        raise validation_error_to_params_error(error) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML would silently keep the
    last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            # `<<: *anchor` may be overridden by design
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue  # SafeLoader reports the unhashable key itself
            if key in seen:
                raise ParamsError(
                    f"params: key {key!r} is given twice (line {key_node.start_mark.line + 1}); "
                    "keep one"
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate params.yaml."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"params: {path} does not exist")
    if not path.is_file():
        raise ParamsError(f"params: {path} is not a file")
    try:
        raw = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as error:
        raise ParamsError(f"params: {path} is not valid YAML: {error}".splitlines()[0]) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ParamsError(f"params: {path} cannot be read: {error}") from None
    return parse_params(raw)


def check_dataset_size(params: Params, dataset_size: int) -> None:
    """Refuse a batch size the dataset cannot fill, and a run whose step count or schedule (epochs ×
    dataset size indices) is beyond the bounds, before anything is computed (both known only once
    the data is loaded)."""
    batching = params.batching
    if batching.batch_size > dataset_size:
        raise ParamsError(
            f"params: batching.batch_size = {batching.batch_size} is invalid: "
            f"it must be at most the training-set size, {dataset_size}"
        )
    steps = batching.epochs * -(-dataset_size // batching.batch_size)
    refuse_beyond(
        f"batching.epochs = {batching.epochs} with {dataset_size} examples in batches of {batching.batch_size}",  # noqa: E501
        steps,
        MAX_TRAIN_STEPS,
        "training steps",
        "lower batching.epochs or raise batching.batch_size",
    )
    refuse_beyond_memory(
        f"the schedule of batching.epochs = {batching.epochs} over {dataset_size} examples",
        SCHEDULE_BYTES_PER_ROW * batching.epochs * dataset_size,
        "lower batching.epochs",
    )
