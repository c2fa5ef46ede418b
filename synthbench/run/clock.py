"""A training's time on two clocks: what one waits for, and what the machine spends.

A row stores both (docs/RESULTS.md): ``wall_seconds``, the wall clock from building the model
to the test metrics, and ``cpu_seconds``, the CPU time its process spent meanwhile (every
thread: torch's intra-op threads, and the few of the process's own, such as a Ray worker's,
too). On a shared machine the two part: another job, a second worker on the same cores or a
stopped process stretches the wall clock, not the CPU time. So a cost summed from rows
(CPU-hours of a panel or a rebuild) reads ``cpu_seconds``, and an estimate of how long a
command takes reads ``wall_seconds``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# the row's columns of a training's time: two trainings of one run differ in them alone
COLUMNS = ("wall_seconds", "cpu_seconds")


@dataclass(frozen=True)
class Seconds:
    """Wall and CPU seconds; ``cpu`` None where part of the time went unmeasured (a training
    resumed from a checkpoint that did not keep its CPU time): a sum with it stays None."""

    wall: float = 0.0
    cpu: float | None = 0.0

    def __add__(self, other: Seconds) -> Seconds:
        cpu = None if self.cpu is None or other.cpu is None else self.cpu + other.cpu
        return Seconds(self.wall + other.wall, cpu)

    def __truediv__(self, parts: int) -> Seconds:
        return Seconds(self.wall / parts, None if self.cpu is None else self.cpu / parts)

    def row_fields(self) -> dict[str, float | None]:
        return {"wall_seconds": self.wall, "cpu_seconds": self.cpu}


class Stopwatch:
    """Started when made; ``elapsed()`` is the time since, on both clocks."""

    def __init__(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def elapsed(self) -> Seconds:
        return Seconds(time.perf_counter() - self._wall, time.process_time() - self._cpu)
