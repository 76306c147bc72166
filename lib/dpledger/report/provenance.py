"""Where a report comes from: package versions and the git commit (read without importing torch)."""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("dpledger", "torch", "dp-accounting", "numpy")
UNKNOWN = "unknown"


def package_versions() -> dict[str, str]:
    """Installed versions of the packages that determine the numbers, plus Python's."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    versions["python"] = platform.python_version()
    return versions


def git_commit(root: str | Path) -> str:
    """``git rev-parse HEAD`` in ``root``, or 'unknown' outside a repository or without git."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else UNKNOWN
