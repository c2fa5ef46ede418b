"""How glibc's malloc treats torch's large CPU tensors: one setting for training, one for
measuring memory (``mallopt``; elsewhere than glibc both do nothing and return False).

By default glibc maps every block above a threshold (128 KiB, floating up to 32 MiB) with
mmap and unmaps it when freed. Training frees and allocates the same large tensors every
step, so each one above 32 MiB is mapped and page-faulted in afresh: SLAY's (L x L) scores
at L 256 (batch 32, 4 heads) spent more time in page faults than in arithmetic.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameter numbers (malloc.h)
MEASURE_MMAP_THRESHOLD = 64 * 1024  # bytes


def mallopt(param: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(param, value))
    except (OSError, AttributeError):
        return False


def reuse_freed_memory() -> bool:
    """For a training process: keep freed blocks of up to 1 GiB for reuse instead of
    unmapping them (the process holds on to its peak). Forward and backward of SLAY at L 256
    become 1.5-2.5x faster; nothing a training computes changes."""
    return mallopt(M_MMAP_THRESHOLD, 1 << 30) and mallopt(M_TRIM_THRESHOLD, 1 << 31)


def map_large_blocks() -> bool:
    """For a process that measures peak memory: mmap every block of 64 KiB or more (fixed,
    not floating), so that freed tensors leave the resident set at once."""
    return mallopt(M_MMAP_THRESHOLD, MEASURE_MMAP_THRESHOLD)
