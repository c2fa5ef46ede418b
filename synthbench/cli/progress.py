"""The progress of ``synthbench run``: a bar over the trainings, with an ETA that works when
several run at once and each takes minutes (rich's own ETA divides by the speed of its last
30 seconds: blank whenever no training finished in that window).

The estimate: each mechanism's cost per trained token (steps x batch x sequence length),
learnt from its finished trainings (any mechanism's, until one of its own finishes); the
work left is the estimated cost of the waiting trainings plus what remains of the running
ones, shared by the workers, and never less than what remains of the longest running one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.progress import ProgressColumn, Task
from rich.text import Text

from synthbench.run.runner import Unit


class Eta:
    """Seconds left, estimated from the trainings finished so far."""

    def __init__(self, capacity: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = max(1, capacity)
        self.clock = clock
        self.waiting: dict[Any, Unit] = {}
        self.running: dict[Any, tuple[Unit, float]] = {}
        self.seconds: dict[str, float] = {}  # per mechanism: trained seconds, tokens
        self.tokens: dict[str, float] = {}
        self._lengths: dict[str, int] = {}

    def add(self, units: list[Unit]) -> None:
        for unit in units:
            self.waiting[unit.key] = unit

    def drop(self, units: list[Unit]) -> None:
        """Trainings that will not run here after all (another command's)."""
        for unit in units:
            self.waiting.pop(unit.key, None)

    def started(self, unit: Unit) -> None:
        self.waiting.pop(unit.key, None)
        self.running[unit.key] = (unit, self.clock())

    def finished(self, unit: Unit, seconds: float) -> None:
        self.running.pop(unit.key, None)
        self.waiting.pop(unit.key, None)
        mech = unit.spec.mechanism
        self.seconds[mech] = self.seconds.get(mech, 0.0) + seconds
        self.tokens[mech] = self.tokens.get(mech, 0.0) + self._tokens(unit)

    def _tokens(self, unit: Unit) -> float:
        spec = unit.spec
        if spec.run_id not in self._lengths:
            self._lengths[spec.run_id] = spec.make_task().seq_len
        return spec.protocol.steps * spec.protocol.batch_size * self._lengths[spec.run_id]

    def _cost(self, unit: Unit) -> float | None:
        mech = unit.spec.mechanism
        if mech in self.tokens:
            rate = self.seconds[mech] / self.tokens[mech]
        elif self.tokens:
            rate = sum(self.seconds.values()) / sum(self.tokens.values())
        else:
            return None
        return rate * self._tokens(unit)

    def remaining(self) -> float | None:
        """Estimated seconds until every known training is done; None before the first
        training finishes (nothing to estimate from)."""
        if not self.tokens:
            return None
        now = self.clock()
        waiting = sum(self._cost(u) for u in self.waiting.values())
        running = [max(0.0, self._cost(u) - (now - start)) for u, start in self.running.values()]
        return max((waiting + sum(running)) / self.capacity, max(running, default=0.0))


def clock_text(seconds: float | None) -> str:
    if seconds is None:
        return "-:--:--"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class RunningColumn(ProgressColumn):
    """What is training now, from the first second: ``now copy softmax seed 0 lr 0.001``,
    the earliest started first, and how many more run beside it."""

    def __init__(self, eta: Eta) -> None:
        super().__init__()
        self.eta = eta

    def render(self, task: Task) -> Text:
        running = [unit for unit, _ in sorted(self.eta.running.values(), key=lambda r: r[1])]
        if not running:
            return Text("")
        first = running[0]
        spec = first.spec
        more = f" (+{len(running) - 1} more)" if len(running) > 1 else ""
        text = f"now {spec.task} {spec.mechanism} seed {spec.seed} lr {first.lr:g}{more}"
        return Text(text, style="progress.description", no_wrap=True, overflow="ellipsis")


class EtaColumn(ProgressColumn):
    """``eta H:MM:SS`` from an :class:`Eta`."""

    max_refresh = 1.0

    def __init__(self, eta: Eta) -> None:
        super().__init__()
        self.eta = eta

    def render(self, task: Task) -> Text:
        return Text(f"eta {clock_text(self.eta.remaining())}", style="progress.remaining")
