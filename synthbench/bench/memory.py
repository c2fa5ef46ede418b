"""Peak memory of one piece of work, measured for real, and a real memory limit.

CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, above what was
allocated before the work (the tensors' peak as torch's allocator sees it).

CPU: torch keeps no allocator statistics, so the work runs in a fresh process and we read how
far the process's resident set size peaks above its level just before the work. On Linux the
kernel's peak (VmHWM in /proc/self/status) is reset by writing "5" to /proc/self/clear_refs;
elsewhere ``resource.getrusage(...).ru_maxrss`` stands in, which also counts earlier peaks
(then the figure is a lower bound). ``synthbench.run.allocator.map_large_blocks`` makes glibc
map every allocation of 64 KiB or more with mmap and unmap it when freed, so that the RSS
follows the live tensors instead of memory that malloc keeps for reuse.

The limit: ``limit_data`` caps the process's data segment (RLIMIT_DATA, which on Linux >= 4.7
counts every private writable mapping, so every tensor) at its current size plus the
allowance; an allocation past it fails with torch's "can't allocate memory" error, which
``is_out_of_memory`` recognises (as it does CUDA's OutOfMemoryError).
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable
from pathlib import Path

import torch


def proc_status_bytes(key: str) -> int:
    """A size from /proc/self/status (VmRSS, VmHWM, VmData) in bytes; OSError elsewhere."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024  # kB
    raise OSError(f"no {key} in /proc/self/status")


def reset_peak_rss() -> int:
    """Reset the peak resident set size where Linux allows it; return the current one."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (Linux >= 4.0)
        return proc_status_bytes("VmRSS")
    except OSError:
        return peak_rss()  # elsewhere the peak since the process started


def peak_rss() -> int:
    try:
        return proc_status_bytes("VmHWM")
    except OSError:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss if sys.platform == "darwin" else rss * 1024  # Linux reports KiB


def cpu_method() -> str:
    """How ``peak_bytes`` measures on this machine's CPU (stored with every row)."""
    return "vmhwm" if Path("/proc/self/clear_refs").exists() else "ru_maxrss"


def peak_bytes(work: Callable[[], object], device: torch.device) -> int:
    """Bytes above the level before ``work()`` at its peak (see the module docstring)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        work()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    before = reset_peak_rss()
    work()
    return peak_rss() - before


def limit_data(allowance: int) -> bool:
    """Let this process's data segment grow by at most ``allowance`` bytes from now on."""
    try:
        current = proc_status_bytes("VmData")
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        soft = current + allowance
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
        return True
    except (OSError, ValueError):
        return False


def limit_cuda(allowance: int, device: torch.device) -> None:
    """Let torch's allocator on ``device`` hold at most ``allowance`` bytes more than now."""
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = (torch.cuda.memory_allocated(device) + allowance) / total
    torch.cuda.set_per_process_memory_fraction(min(1.0, fraction), device)


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError | torch.cuda.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "can't allocate memory" in text or "out of memory" in text.lower()
    )


def available_memory() -> int | None:
    """Bytes the kernel says can be allocated without swapping (MemAvailable), if known."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
