"""retain_freed_memory: after it, memory freed at the end of a step is reused without page faults."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from dpledger.engine import retain_freed_memory

CYCLES = """
import resource, sys, torch
from dpledger.engine import retain_freed_memory
applied = retain_freed_memory() if sys.argv[1] == "retain" else None
faults = []
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [torch.ones(2**20) for _ in range(40)]   # 40 x 4 MiB, freed together like a BK step's keep
    del blocks
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(applied, max(faults[2:]))   # cycles 3-5: the heap has settled
"""

glibc_only = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="mallopt is glibc's")


def _most_faults_once_settled(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", CYCLES, mode], capture_output=True, text=True, check=True).stdout
    applied, faults = out.split()
    return applied, int(faults)


@glibc_only
def test_freed_memory_is_reused_without_page_faults():
    applied, retained = _most_faults_once_settled("retain")
    _, default = _most_faults_once_settled("default")
    assert applied == "True"
    assert default >= 1_000          # glibc trims part or all (40 960 pages) of the 160 MiB every cycle
    assert retained < 256            # the same blocks come back from the kept heap


def test_returns_false_off_glibc(monkeypatch):
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", "1.2"))
    assert retain_freed_memory() is False
