"""What every step of the GPU validation shares: the device, the result files with their named
checks, and the stage runner (``validate.py``, ``gpt2_bench.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def device_for(dry_run: bool) -> torch.device:
    if dry_run:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        sys.exit("validate: no CUDA device (use --dry-run on a CPU)")
    return torch.device("cuda")


def about(device: torch.device) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda}


def write(out: Path, name: str, result: dict) -> None:
    """Merge ``result`` into out/name.json (bench runs once per method and precision)."""
    path = out / f"{name}.json"
    merged = json.loads(path.read_text()) if path.exists() else {}
    merged.update(result)
    path.write_text(json.dumps(merged, indent=1, default=str))
    print(json.dumps(result, default=str)[:2000])


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def finish(out: Path, name: str, result: dict, checks: dict[str, bool]) -> None:
    """Write the step's result with its named checks; exit 1 (run.sh counts a failed step) when
    one does not hold."""
    path = out / f"{name}.json"
    earlier = json.loads(path.read_text()).get("checks", {}) if path.exists() else {}
    merged = {**earlier, **checks}
    write(
        out, name, {**result, "checks": merged, "failed": [c for c, ok in merged.items() if not ok]}
    )
    failed = [check for check, held in checks.items() if not held]
    if failed:
        sys.exit(f"validate: {name} failed: {', '.join(failed)}")


FAILING_STAGE = "import sys; sys.exit('injected: this stage fails')"
"""What ``--inject`` runs in place of a stage (pipeline, distributed, defaults)."""


def stage(name: str, params: Path, root: Path, env: dict, inject: bool = False) -> float:
    """Run ``python -m stages.NAME`` as run.sh documents it (``inject``: a stage that exits 1
    instead); its wall time. A failed stage raises, so the step fails."""
    command = [sys.executable, "-m", f"stages.{name}", "--params", str(params), "--root", str(root)]
    if inject:
        command = [sys.executable, "-c", FAILING_STAGE]
    started = time.perf_counter()
    subprocess.run(command, cwd=REPO, env=env, check=True)
    return time.perf_counter() - started


COMPARISON_NOISE_KEY = "d9" * 16
"""A public noise key for the steps that compare two runs (kill-and-resume, torchrun against one
process): with the default fresh CSPRNG key, two runs never draw the same noise."""


def stage_env(compared: bool = False) -> dict:
    """The environment of a stage's process: this tree's library first; ``compared``: every run
    draws its noise from :data:`COMPARISON_NOISE_KEY`."""
    key = {"DPLEDGER_NOISE_KEY": COMPARISON_NOISE_KEY} if compared else {}
    return {
        **os.environ,
        **key,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "lib"), str(REPO), os.environ.get("PYTHONPATH", "")]
        ),
    }
