"""Where a command's time goes, phase by phase, when somebody asks.

With ``SYNTHBENCH_PHASES=DIR`` in the environment, every process of a ``synthbench`` command
that works (the CLI and each worker it starts) adds up the seconds spent in each named
``phase`` and the times each was entered, and writes them to ``DIR/<pid>.json`` as it
ends. benchmarks/cost_breakdown.py reads them. Without it, ``phase`` costs one dictionary
lookup.

Phases do not nest: each second is counted once, so the phases of a process add up to at
most its lifetime, and the rest of that lifetime is untimed (process start and imports,
for the most part).
"""

from __future__ import annotations

import atexit
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ENV = "SYNTHBENCH_PHASES"

_seconds: dict[str, float] = {}
_counts: dict[str, int] = {}
_started = time.perf_counter()  # this module's import: about when the process began its work


def enabled() -> bool:
    return bool(os.environ.get(ENV))


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the block as ``name`` (when enabled)."""
    if not enabled():
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        _seconds[name] = _seconds.get(name, 0.0) + time.perf_counter() - start
        _counts[name] = _counts.get(name, 0) + 1


def write() -> None:
    """This process's totals to ``$SYNTHBENCH_PHASES/<pid>.json`` (when enabled); called at
    exit, and by a worker before it returns (a worker's exit skips atexit). A process that
    timed nothing writes nothing: the fork server that forks the workers (core/children.py)."""
    folder = os.environ.get(ENV)
    if not folder or not _counts:
        return
    record = {
        "pid": os.getpid(),
        "seconds": _seconds,
        "counts": _counts,
        "timed_from_import": time.perf_counter() - _started,
    }
    path = Path(folder) / f"{os.getpid()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def _start_afresh() -> None:
    global _started
    _seconds.clear()
    _counts.clear()
    _started = time.perf_counter()


atexit.register(write)
if hasattr(os, "register_at_fork"):  # a forked process (a worker) counts from its own start
    os.register_at_fork(after_in_child=_start_afresh)
