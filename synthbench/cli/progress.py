"""The progress of ``synthbench run``: its header line, one line per finished run, and a bar
over the trainings with an ETA that works when several run at once and each takes minutes
(rich's own ETA divides by the speed of its last 30 seconds: blank whenever no training
finished in that window).

The estimate: each mechanism's cost per trained token (steps x batch x sequence length),
learnt from its finished trainings (any mechanism's, until one of its own finishes); the
work left is the estimated cost of the waiting trainings plus what remains of the running
ones, shared by the workers, and never less than what remains of the longest running one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from synthbench.cli.common import out, warn
from synthbench.core.text import plural
from synthbench.run import grid, runner
from synthbench.run.lr_selection import run_status
from synthbench.run.runner import Unit
from synthbench.run.spec import RunSpec


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


class RunView(runner.Events):
    """The header line, the progress bar (only when there is something to train) and one
    line per finished run."""

    def __init__(
        self,
        specs: list[RunSpec],
        results: Path,
        where: str,
        show_pos: bool,
        estimate: Callable[[list[Unit], int], list[str]] | None = None,
        dry_run: bool = False,
        more_seeds: bool = False,
    ):
        self.specs, self.results, self.where, self.show_pos = specs, results, where, show_pos
        self.estimate = estimate  # the lines saying what the trainings will cost
        self.dry_run = dry_run  # the plan and its estimate only: no bar
        self.more_seeds = more_seeds  # cells whose seeds disagree get more (run/seeds.py)
        self.points = _one_per_point(specs)
        self.varying = grid.varying_keys(self.points)  # what tells the points of a grid apart
        self.progress: Progress | None = None
        self.eta: Eta | None = None
        self.bar = None

    def skipped(self, line: str) -> None:
        warn(line)

    def planned(self, runs: int, stored: int, units: list[Unit], capacity: int) -> None:
        specs = self.specs
        tasks = len({s.task for s in specs})
        mechs = len({s.mechanism for s in specs})
        seeds = len({s.seed for s in specs})
        first = specs[0]
        pos_note = ""
        if self.show_pos:  # say which positions the user asked for
            params = ", ".join(f"{k}={v}" for k, v in first.pos_params.items())
            pos_note = f", pos {first.protocol.pos}" + (f" ({params})" if params else "")
        workers = f", {capacity} at once" if capacity > 1 else ""
        labels = {(s.task, s.mechanism, grid.point_label(s, self.varying)) for s in self.points}
        n_points = len(labels)
        per_cell = n_points // (tasks * mechs)
        parts = [plural(tasks, "task"), plural(mechs, "mechanism")]
        parts += [plural(per_cell, "grid point")] if self.varying else []
        parts.append(plural(seeds, "seed"))
        if tasks * mechs * per_cell * seeds == runs and n_points == tasks * mechs * per_cell:
            shape = " x ".join(parts)  # every combination: the counts multiply to the runs
        else:  # a sample (reproduce), or grids of other sizes: what the runs span
            shape = "over " + ", ".join(parts)
        # a sample (reproduce) can span both tracks' protocols
        names = list(dict.fromkeys(s.protocol.name for s in specs))
        protocols = f"protocol{'s' if len(names) > 1 else ''} {', '.join(names)}"
        out.print(
            f"{plural(runs, 'run')} ({shape}, {protocols}{pos_note}, {self.where}, "
            f"{plural(first.threads, 'thread')} per training{workers}); {stored} already "
            f"stored, {runs - stored} to run ({plural(len(units), 'training')}) -> "
            f"{self.results}/{self._growth_note()}",
            highlight=False,
        )
        if not units:
            return
        for line in self.estimate(units, capacity) if self.estimate else []:
            out.print(line, highlight=False, markup=False)
        if self.dry_run:
            return
        self.eta = Eta(capacity)
        self.eta.add(units)
        self.progress = Progress(
            TextColumn("trainings"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            EtaColumn(self.eta),
            RunningColumn(self.eta),
            console=out,
        )
        self.progress.start()
        self.bar = self.progress.add_task("trainings", total=len(units))

    def started(self, unit: Unit) -> None:
        self.eta.started(unit)

    def finished(self, unit: Unit, row: dict[str, Any]) -> None:
        self.eta.finished(unit, row["wall_seconds"])
        self.progress.advance(self.bar)

    def grew(self, units: list[Unit]) -> None:
        self.eta.add(units)
        self.progress.update(self.bar, total=self.progress.tasks[0].total + len(units))
        for unit in units:
            self.progress.console.print(
                f"   {unit.spec.label()}: best lr at the grid's edge, adding lr {unit.lr:g}",
                highlight=False,
            )

    def _growth_note(self) -> str:
        """A dry run's word on the seeds it cannot foresee: those of cells not yet complete
        whose seeds will disagree (synthbench/run/seeds.py)."""
        rules = {(s.protocol.max_seeds, s.protocol.seed_spread) for s in self.specs}
        rules = {rule for rule in rules if rule[0]}
        if not (self.dry_run and self.more_seeds and rules):
            return ""
        most = max(most for most, _ in rules)
        spreads = {spread for _, spread in rules}
        apart = f" (scores more than {spreads.pop():g} apart)" if len(spreads) == 1 else ""
        return f"; cells whose seeds disagree{apart} may get up to {plural(most, 'seed')}"

    def seeded(self, added: list[RunSpec], scores: dict[int, float], units: list[Unit]) -> None:
        first = added[0]
        point = f" {grid.point_label(first, self.varying)}" if self.varying else ""
        line = (
            f"   {first.task} / {first.mechanism}{point}: seeds disagree "
            f"({min(scores.values()):.2f} .. {max(scores.values()):.2f}): "
            f"{plural(len(added), 'more seed')}, up to {first.protocol.max_seeds}"
        )
        self.specs = [*self.specs, *added]  # the header, when said after this, counts them
        if self.progress is None:  # before the plan's line: the store held the cell complete
            if units:  # else grown by an earlier command, its seeds stored: nothing new
                out.print(line, highlight=False)
            return
        self.eta.add(units)
        self.progress.update(self.bar, total=self.progress.tasks[0].total + len(units))
        self.progress.console.print(line, highlight=False)

    def run_done(self, spec: RunSpec, rows: list[dict[str, Any]]) -> None:
        self.progress.console.print(run_line(spec, rows, self.varying), highlight=False)

    def notice(self, spec: RunSpec, message: str) -> None:
        warn(f"{spec.label()}: {message}")

    def unplanned(self, units: list[Unit]) -> None:
        if units and self.progress is not None:
            self.eta.drop(units)
            self.progress.update(self.bar, total=self.progress.tasks[0].total - len(units))

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def _one_per_point(specs: list[RunSpec]) -> list[RunSpec]:
    """The specs less the other seeds of a grid point, where they share its parameter
    objects (``RunSpec.with_seeds``): what tells the points apart is worked out per point,
    not per run (a grid may hold 500,000 runs)."""
    found: dict[tuple, RunSpec] = {}
    for spec in specs:
        shared = (id(spec.task_params), id(spec.mechanism_params), id(spec.protocol))
        found.setdefault((spec.task, spec.mechanism, *shared), spec)
    return list(found.values())


def run_line(spec: RunSpec, rows: list[dict[str, Any]], varying: tuple[str, ...] = ()) -> str:
    best = run_status(rows)
    seconds = sum(r["wall_seconds"] for r in rows)
    head = f"{spec.task:<16} {spec.mechanism:<12} seed {spec.seed}"
    if varying:  # a grid: which point
        head += f"  {grid.point_label(spec, varying)}"
    if best["status"] != "ok":
        reason = escape(str(best.get("error")))
        return f"[red]x[/] {head}  {best['status']}: {reason}  ({seconds:.1f}s)"
    long = ""
    if best.get("long_token_acc") is not None:
        long = f"  at {spec.eval_length_mult:g}x length {best['long_token_acc']:.3f}"
    target = best.get("target_metric") or "token_acc"
    free = f"  free-running {best['free_token_acc']:.3f}" if target == "free_token_acc" else ""
    # the best lr alone at the grid's edge: its optimum may lie beyond the grid
    edge = " (edge)" if best.get("lr_edge") and len(rows) > 1 else ""
    stopped = f" at step {best['steps_done']}" if best["steps_done"] < spec.protocol.steps else ""
    return (
        f"[green]ok[/] {head}  lr {best['lr']:g}{edge}{stopped}  token_acc "
        f"{best['token_acc']:.3f}{free}  exact {best['exact_match']:.3f}{long}  ({seconds:.1f}s)"
    )
