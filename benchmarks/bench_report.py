"""Report generation time against its 10 s budget, on a typical and on a heavy project.

Run ``python -m benchmarks.bench_report``. Each case fabricates the upstream outputs (the same
fixtures the report tests use), then times (1) the in-process render-and-write and (2) the DVC
entrypoint ``python -m stages.report`` as a subprocess, interpreter start and imports included.
The baseline, measured in the same run, is the I/O floor: reading every JSON input and
base64-encoding every PNG, which any self-contained report must do; the ratio is report time over
it.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from dpledger.pipeline.report import run  # noqa: E402
from helpers.report_fixtures import ALL_PROBLEMS, fabricate_project, report_params  # noqa: E402

BUDGET_S = 10.0
HEAVY_FIGURES = 40


def _heavy(root: Path) -> None:
    """Add many full-size figures and a million-entry audit detail file."""
    for index in range(HEAVY_FIGURES):
        fig, ax = plt.subplots(figsize=(8, 5), dpi=150)
        ax.plot(np.random.default_rng(index).normal(size=2000).cumsum())
        fig.savefig(root / "plots" / "train" / f"curve_{index:02d}.png")
        plt.close(fig)
    audit = json.loads((root / "artifacts/audit/audit.json").read_text())
    audit["scores"] = np.random.default_rng(0).normal(size=1_000_000).tolist()
    (root / "artifacts/audit/audit.json").write_text(json.dumps(audit))


def _io_floor(root: Path) -> float:
    started = time.perf_counter()
    for path in list(root.glob("metrics/*.json")) + list(root.glob("artifacts/*/*.json")):
        json.loads(path.read_text())
    for png in root.glob("plots/*/*.png"):
        base64.b64encode(png.read_bytes())
    return time.perf_counter() - started


def _best_of(repeats: int, action) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return min(times)


def bench(label: str, heavy: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_report_") as folder:
        return _bench_in(Path(folder), label, heavy)


def _bench_in(folder: Path, label: str, heavy: bool) -> dict:
    root = fabricate_project(folder, ALL_PROBLEMS)
    if heavy:
        _heavy(root)
    (root / "params.yaml").write_text((REPO / "params.yaml").read_text())
    params = report_params()
    floor = _best_of(3, lambda: _io_floor(root))
    in_process = _best_of(3, lambda: run(params, root))
    command = [
        sys.executable,
        "-m",
        "stages.report",
        "--params",
        str(root / "params.yaml"),
        "--root",
        str(root),
    ]
    stage = _best_of(2, lambda: subprocess.run(command, cwd=REPO, check=True, capture_output=True))
    html_mb = (root / "reports/report.html").stat().st_size / 1e6
    pngs = len(list(root.glob("plots/*/*.png")))
    return {
        "case": label,
        "figures": pngs,
        "html_mb": html_mb,
        "io_floor_s": floor,
        "render_s": in_process,
        "stage_s": stage,
    }


def main() -> None:
    heavy_label = f"heavy ({HEAVY_FIGURES} more 1200×750 figures, 10⁶-entry audit.json)"
    rows = [bench("typical (7 figures)", heavy=False), bench(heavy_label, heavy=True)]
    print(
        "| case | figures | HTML MB | I/O floor (s) | render (s) | ratio to floor "
        "| `python -m stages.report` (s) | share of 10 s budget |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['case']} | {r['figures']} | {r['html_mb']:.2f} | {r['io_floor_s']:.3f} | "
            f"{r['render_s']:.3f} | "
            f"{r['render_s'] / r['io_floor_s']:.1f}× | {r['stage_s']:.2f} | "
            f"{r['stage_s'] / BUDGET_S:.0%} |"
        )


if __name__ == "__main__":
    main()
