"""retain_freed_memory: after it, memory freed at the end of a step is reused without page
faults."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from dpledger.engine import retain_freed_memory

CYCLES = """
import ctypes, resource, sys
from dpledger.engine import retain_freed_memory
# the malloc torch's CPU allocator uses, called directly: nothing else interleaves
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
applied = retain_freed_memory() if sys.argv[1] == "retain" else None
SIZE = 4 << 20

def cycle():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    # 160 MiB, written, then freed together like a BK step's keep
    blocks = [libc.malloc(SIZE) for _ in range(40)]
    for block in blocks:
        ctypes.memset(block, 1, SIZE)
    for block in blocks:
        libc.free(block)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

print(applied, *[cycle() for _ in range(5)])
"""

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's"
)


def _faults_per_cycle(mode: str) -> tuple[str, list[int]]:
    out = subprocess.run(
        [sys.executable, "-c", CYCLES, mode], capture_output=True, text=True, check=True
    ).stdout
    applied, *faults = out.split()
    return applied, [int(f) for f in faults]


@glibc_only
def test_freed_memory_is_reused_without_page_faults():
    applied, retained = _faults_per_cycle("retain")
    _, default = _faults_per_cycle("default")
    assert applied == "True"
    # glibc trims the 160 MiB and faults its 40 960 pages in every cycle
    assert min(default[2:]) > 30_000
    # after the first cycle the same blocks come back from the kept heap
    assert max(retained[1:]) < 256


def test_returns_false_off_glibc(monkeypatch):
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", "1.2"))
    assert retain_freed_memory() is False
