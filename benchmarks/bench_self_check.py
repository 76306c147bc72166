"""The engine self-check's cost (issue 26) against the train stage's, on the default pipeline
(digits MLP) and on the LM example (examples/lm; prepare it first: ``python -m stages.prepare --out
examples/lm/data``).

Run ``python -m benchmarks.bench_self_check [--params examples/lm/params.yaml] [--repeats 2]`` from
the repository root. calibrate and schedule run once into a temporary root; then the train stage
runs ``repeats`` times with ``train.self_check`` on and off, interleaved, each from step 0, in this
process. Printed: the check's own seconds (``self_check_seconds``), the stage's wall time with the
check and without it, and the ratios check / stage. The baseline is measured in the same run, so
load affects both.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from dpledger.pipeline import run_stage


def _params_with(source: Path, folder: Path, self_check: bool) -> Path:
    raw = yaml.safe_load(source.read_text())
    raw["train"]["self_check"] = self_check
    path = folder / f"params-{'on' if self_check else 'off'}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def measure(source: Path, repeats: int) -> dict[str, float]:
    """Median seconds of the check, the stage with it and the stage without it."""
    with tempfile.TemporaryDirectory() as name:
        root = Path(name)
        for stage in ("calibrate", "schedule"):
            run_stage(stage, source, root)
        stages: dict[bool, list[float]] = {True: [], False: []}
        checks = []
        for _ in range(repeats):
            for self_check in (False, True):
                shutil.rmtree(root / "artifacts" / "train", ignore_errors=True)
                started = time.perf_counter()
                metrics = run_stage("train", _params_with(source, root, self_check), root)
                stages[self_check].append(time.perf_counter() - started)
                if self_check:
                    checks.append(metrics["self_check_seconds"])
                    ledger = json.loads((root / "artifacts/train/ledger.json").read_text())
                    record = ledger["self_check"]
        return {
            "check_s": statistics.median(checks),
            "stage_with_check_s": statistics.median(stages[True]),
            "stage_without_check_s": statistics.median(stages[False]),
            "max_relative_error": record["max_relative_error"],
            "parameters_checked": record["parameters_checked"],
            "dtype": record["dtype"],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    result = measure(args.params, args.repeats)
    print(json.dumps(result, indent=2))
    print(
        f"check / stage without it: {result['check_s'] / result['stage_without_check_s']:.2%}; "
        "stage with / without: "
        f"{result['stage_with_check_s'] / result['stage_without_check_s']:.3f}"
    )


if __name__ == "__main__":
    main()
