"""What produced a result: the one stamp that task rows and bench rows both carry."""

from __future__ import annotations

import functools
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

import synthbench

# the columns ``stamp`` fills, in the order the row schemas list them
COLUMNS = (
    "device", "cpu_isa", "torch_version", "synthbench_version", "git_commit", "created_at",
)  # fmt: skip


def device_name(device: torch.device) -> str:
    """What a row calls its device: the GPU's model name, else the device type."""
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return device.type


@functools.cache
def git_commit() -> str:
    """The commit of the synthbench checkout (with '-dirty' for local changes), if any."""
    root = Path(synthbench.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
        if commit.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return commit.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@functools.cache
def cpu_isa() -> str:
    """The vector instruction set torch's CPU kernels dispatch to here (DEFAULT, AVX2,
    AVX512, SVE256, ...): two CPUs that differ in it may round a float32 sum differently,
    so a CPU run is reproduced bit for bit only on the same one."""
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # an older or exotic build without the query: unknown, not a failure
        return "unknown"


def stamp(device: torch.device) -> dict[str, Any]:
    """Device, the CPU's instruction set, versions, commit and the time now (UTC)."""
    return {
        "device": device_name(device),
        "cpu_isa": cpu_isa(),
        "torch_version": torch.__version__,
        "synthbench_version": synthbench.__version__,
        "git_commit": git_commit(),
        "created_at": datetime.now(timezone.utc),
    }
