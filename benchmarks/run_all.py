"""Run every benchmark in this folder, one after another (``make bench``).

Each ``bench_*.py`` measures its own baseline in the same run and prints ratios; results are
recorded by hand in benchmarks/RESULTS.md together with the machine they ran on.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def main() -> int:
    failures = 0
    for script in sorted(Path(__file__).parent.glob("bench_*.py")):
        module = f"benchmarks.{script.stem}"
        print(f"=== {module}", flush=True)
        failures += subprocess.run([sys.executable, "-m", module]).returncode != 0
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
