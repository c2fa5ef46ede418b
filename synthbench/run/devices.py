"""Which torch device a run trains on, and how parallel workers share the GPUs.

``--device`` takes any device torch names (cpu, cuda, cuda:1, mps, xpu...) if torch has that
backend and it is available here; ``auto`` takes CUDA, then MPS, then the CPU.
"""

from __future__ import annotations

import os

import torch

from synthbench.core.text import plural


def resolve_device(name: str = "auto") -> torch.device:
    """The device ``name`` stands for; a ValueError says why it cannot be used here."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        return torch.device("mps" if mps is not None and mps.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(
            f"unknown device {name!r} (auto, cpu, cuda, cuda:N, mps or another torch device)"
        ) from None
    if device.type == "cpu":
        return device
    backend = torch.backends.mps if device.type == "mps" else getattr(torch, device.type, None)
    if backend is None or not hasattr(backend, "is_available"):
        raise ValueError(f"device {name!r}: torch cannot train on '{device.type}' devices")
    if not backend.is_available():
        raise ValueError(f"--device {name} was asked for but torch sees no {device.type} device")
    count = getattr(backend, "device_count", None)
    if device.index is not None and count is not None and device.index >= count():
        raise ValueError(
            f"--device {name}: torch sees only {plural(count(), device.type + ' device')}"
        )
    return device


def device_count(device: torch.device) -> int:
    """How many devices of ``device``'s type torch sees (1 for the CPU)."""
    if device.type == "cpu":
        return 1
    count = getattr(getattr(torch, device.type, None), "device_count", None)
    return int(count()) if count is not None else 1


def cpu_cores() -> int:
    """The cores this process may run on (its affinity, where the OS tells)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def default_jobs(device: torch.device, threads: int = 1, cores: int | None = None) -> int:
    """Parallel runs by default: on the CPU one per ``threads`` cores; on accelerators one
    per device, as many more as spare cores allow, at most 4 per device (small models leave
    a GPU mostly idle, and each worker process needs a core to feed it)."""
    cores = cpu_cores() if cores is None else cores
    if device.type == "cpu":
        return max(1, cores // max(1, threads))
    devices = 1 if device.index is not None else device_count(device)
    return max(1, min(4 * devices, cores))


def worker_devices(device: torch.device, jobs: int, count: int | None = None) -> list[torch.device]:
    """The device of each of ``jobs`` workers: round-robin over the ``count`` visible devices
    when ``device`` names a type without an index (``cuda``), else ``device`` for all."""
    if device.type == "cpu" or device.index is not None:
        return [device] * jobs
    count = device_count(device) if count is None else count
    return [torch.device(device.type, i % max(1, count)) for i in range(jobs)]
