"""Stage runners: each module's ``run(params, root)`` computes one stage and writes its outputs
under ``root``.

The DVC entrypoints in ``stages/`` and ``dpledger stage NAME`` both call :func:`run_stage`, so the
pipeline and the console script cannot drift apart. Runners are handed the validated params and the
root they write to; they know nothing of DVC. Their wall times are moved out of the tracked
metrics into the git-ignored ``timing/`` (:mod:`dpledger.pipeline.timing`).
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any

from dpledger.params import STAGES, load_params
from dpledger.pipeline.timing import split_timing
from dpledger.quiet import quiet_third_party


def run_stage(
    name: str, params_path: str | Path = "params.yaml", root: str | Path = "."
) -> dict[str, Any]:
    """Validate the whole params file, then run stage ``name``; returns the stage's metrics."""
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; stages are {', '.join(STAGES)}")
    params = load_params(params_path)
    module = importlib.import_module(f"dpledger.pipeline.{name}")
    started = time.perf_counter()
    with quiet_third_party(name):
        metrics = module.run(params, Path(root))
    metrics = dict(metrics or {})
    metrics.setdefault("stage_wall_time_s", round(time.perf_counter() - started, 3))
    split_timing(Path(root), name, metrics)
    return metrics
