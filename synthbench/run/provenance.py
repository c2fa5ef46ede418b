"""What produced a result: the one stamp that task rows and bench rows both carry."""

from __future__ import annotations

import functools
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

import synthbench

# the columns ``stamp`` fills, in the order the row schemas list them
COLUMNS = (
    "device", "cpu_isa", "cpu_model", "torch_version", "synthbench_version", "git_commit",
    "created_at",
)  # fmt: skip
CPUINFO = Path("/proc/cpuinfo")


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


@functools.cache
def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's vendor, family, model and stepping, and its name: two CPUs with the same
    vector instruction set can still round a float32 sum differently (the math libraries
    pick their kernels and blocking by microarchitecture and cache sizes; seen: two AVX512
    machines whose trainings differed in the last bits), so a CPU run is reproduced bit for
    bit only on the same model. "unknown" where the system does not say (no /proc/cpuinfo)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return platform.processor() or "unknown"
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields:  # the first processor's block is enough
                break
            continue
        fields.setdefault(key.strip(), value.strip())
    family = "/".join(fields[k] for k in ("cpu family", "model", "stepping") if k in fields)
    parts = [fields.get("vendor_id", ""), family, fields.get("model name", "")]
    # ARM's /proc/cpuinfo names its implementer and part instead
    parts += [fields[k] for k in ("CPU implementer", "CPU part", "CPU variant") if k in fields]
    described = " ".join(p for p in parts if p)
    return described or platform.processor() or "unknown"


def stamp(device: torch.device) -> dict[str, Any]:
    """Device, the CPU's instruction set and model, versions, commit and the time now (UTC)."""
    return {
        "device": device_name(device),
        "cpu_isa": cpu_isa(),
        "cpu_model": cpu_model(),
        "torch_version": torch.__version__,
        "synthbench_version": synthbench.__version__,
        "git_commit": git_commit(),
        "created_at": datetime.now(timezone.utc),
    }
