"""Keep freed heap memory for the next training step instead of returning it to the OS (glibc only).

A BK step keeps its ghost layers' activations and output gradients until the backward pass ends,
then frees them together. glibc sees that much free memory at the top of its heap (more than its
dynamic trim threshold, at most 64 MiB) and gives it back to the OS, so the next step faults the
same pages in again (the cost is measured in ``benchmarks/RESULTS.md``, "Allocator pass"). A
non-private step frees its memory piecemeal during the backward pass and never trims. Keeping the
memory costs nothing the step does not already need: the process stays at its peak, which every step
reaches anyway.
"""

from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20
"""glibc's largest dynamic mmap threshold on 64-bit systems: blocks up to this size come from the
heap, as they do once glibc's dynamic threshold has grown (setting any threshold turns the dynamic
one off)."""
TRIM_THRESHOLD = 2**31 - 1
"""The largest value ``mallopt`` takes: free memory at the top of the heap is practically never
trimmed."""


def retain_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed memory in the process (process-wide, ``mallopt``).

    Returns True when applied, False where the C library is not glibc (nothing to do there) or
    refused. Call it once, before training; the train stage and the engine benchmark do."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
