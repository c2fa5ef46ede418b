"""The progress of ``synthbench run``: its header line, one line per finished run, and a bar
over the trainings with an ETA that works when several run at once and each takes minutes
(rich's own ETA divides by the speed of its last 30 seconds: blank whenever no training
finished in that window).

The estimate: each mechanism's cost per trained token (steps x batch x sequence length),
learnt from its finished trainings; until one of its own finishes, what the plan's estimate
said a training of it takes (synthbench/run/cost.py: ``prior``), scaled by how the
finished trainings compared with what it said of them (else any mechanism's cost per
token). The work left is the estimated cost of the waiting trainings plus what remains of
the running ones, shared by the workers, and never less than what remains of the longest
running one.

Without a terminal (stdout piped, or CI's log) there is no bar: each finished training is
one plain line, flushed, with the count, the wall time and the ETA, so that a log shows
progress as it comes. Every time shown is wall seconds: a training's is its row's
``wall_seconds`` (``synthbench results``: wall_s), a run's the sum of its trainings'.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
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
from synthbench.run.lr_selection import grown_past_an_edge, run_status
from synthbench.run.runner import Unit
from synthbench.run.seeds import Cells, Growth
from synthbench.run.spec import RunSpec

Prior = Callable[[Unit], "float | None"]  # what the plan's estimate says a training takes


class Eta:
    """Seconds left, estimated from the trainings finished so far and, before those say
    anything of a mechanism, from the plan's estimate (``prior``)."""

    def __init__(
        self,
        capacity: int,
        clock: Callable[[], float] = time.monotonic,
        prior: Prior | None = None,
    ) -> None:
        self.capacity = max(1, capacity)
        self.clock = clock
        self.prior = prior
        self.waiting: dict[Any, Unit] = {}
        self.running: dict[Any, tuple[Unit, float]] = {}
        self.seconds: dict[str, float] = {}  # per mechanism: trained seconds, tokens
        self.tokens: dict[str, float] = {}
        self._lengths: dict[str, int] = {}
        self._priors: dict[Any, float | None] = {}
        # the finished trainings the prior priced: their seconds, and what it said of them
        self._measured = self._said = 0.0

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
        said = self._prior(unit)
        if said:
            self._measured += seconds
            self._said += said

    def _prior(self, unit: Unit) -> float | None:
        if self.prior is None:
            return None
        if unit.key not in self._priors:
            self._priors[unit.key] = self.prior(unit)
        return self._priors[unit.key]

    def _tokens(self, unit: Unit) -> float:
        spec = unit.spec
        if spec.run_id not in self._lengths:
            self._lengths[spec.run_id] = spec.make_task().seq_len
        return spec.protocol.steps * spec.protocol.batch_size * self._lengths[spec.run_id]

    def _cost(self, unit: Unit) -> float | None:
        mech = unit.spec.mechanism
        if mech in self.tokens:
            return self.seconds[mech] / self.tokens[mech] * self._tokens(unit)
        said = self._prior(unit)
        if said is not None:  # as far off as it was on the trainings finished so far
            return said * (self._measured / self._said if self._said else 1.0)
        if self.tokens:
            rate = sum(self.seconds.values()) / sum(self.tokens.values())
            return rate * self._tokens(unit)
        return None

    def remaining(self) -> float | None:
        """Estimated seconds until every known training is done; None while a training's
        cost is not known (no estimate of it, and none finished to learn from)."""
        now = self.clock()
        waiting = [self._cost(u) for u in self.waiting.values()]
        costs = [(self._cost(u), start) for u, start in self.running.values()]
        if None in waiting or any(c is None for c, _ in costs):
            return None
        running = [max(0.0, cost - (now - start)) for cost, start in costs]
        return max((sum(waiting) + sum(running)) / self.capacity, max(running, default=0.0))


def clock_text(seconds: float | None) -> str:
    if seconds is None:
        return "-:--:--"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def shorten(name: str, width: int) -> str:
    """``name`` in at most ``width`` characters (at least 2): cut with an ellipsis."""
    width = max(2, width)
    return name if len(name) <= width else name[: width - 1] + "…"


def running_text(task: str, mechanism: str, seed: int, lr: float, more: int, width: int) -> str:
    """``now copy softmax seed 0 lr 0.001 (+1 more)``, in ``width`` characters where the
    names can be shortened enough: the task's and the mechanism's (the longer one first),
    never the seed, the lr or the count."""
    tail = f" seed {seed} lr {lr:g}" + (f" (+{more} more)" if more else "")
    room = width - len("now ") - len(tail) - 1  # the space between the two names
    if len(task) + len(mechanism) > room:
        half = room // 2
        if len(task) <= half:
            mechanism = shorten(mechanism, room - len(task))
        elif len(mechanism) <= half:
            task = shorten(task, room - len(mechanism))
        else:
            task, mechanism = shorten(task, room - half), shorten(mechanism, half)
    return f"now {task} {mechanism}{tail}"


class RunningLine:
    """What is training now, from the first second, on its own line under the bar: ``now
    copy softmax seed 0 lr 0.001``, the earliest started first, and how many more run
    beside it; fitted to the console's width (``running_text``)."""

    def __init__(self, eta: Eta, console: Console | None = None) -> None:
        self.eta = eta
        self.console = console

    def text(self, width: int | None = None) -> Text:
        running = [unit for unit, _ in sorted(self.eta.running.values(), key=lambda r: r[1])]
        if not running:
            return Text("")
        if width is None:
            width = self.console.width if self.console is not None else 10**6
        first = running[0]
        spec = first.spec
        line = running_text(spec.task, spec.mechanism, spec.seed, first.lr, len(running) - 1,
                            width)  # fmt: skip
        return Text(line, style="progress.description", no_wrap=True, overflow="ellipsis")

    def __rich__(self) -> Text:
        return self.text()


class RunProgress(Progress):
    """rich's Progress with what trains on a line of its own below the bar (``RunningLine``),
    where the whole width names it."""

    def __init__(self, *columns, running: RunningLine, **kwargs) -> None:
        self.running = running  # rich's __init__ renders once already
        super().__init__(*columns, **kwargs)

    def get_renderables(self):
        yield self.make_tasks_table(self.tasks)
        yield self.running.text()


def bar_width(console_width: int) -> int:
    """The bar's width: 40 cells where the terminal is wide, less where it is not, so that
    the bar's line fits (its other columns take up to 42 cells)."""
    return max(10, min(40, console_width - 42))


class EtaColumn(ProgressColumn):
    """``eta H:MM:SS`` from an :class:`Eta`."""

    max_refresh = 1.0

    def __init__(self, eta: Eta) -> None:
        super().__init__()
        self.eta = eta

    def render(self, task: Task) -> Text:
        return Text(f"eta {clock_text(self.eta.remaining())}", style="progress.remaining")


class RunView(runner.Events):
    """The header line, the progress (only when there is something to train) and one line
    per finished run. In a terminal the progress is a bar with its ETA and what trains now;
    without one (piped, CI), a plain line per finished training, flushed (``plain``)."""

    def __init__(
        self,
        specs: list[RunSpec],
        results: Path,
        where: str,
        show_pos: bool,
        estimate: Callable[[list[Unit], int], tuple[list[str], Prior | None]] | None = None,
        dry_run: bool = False,
        more_seeds: bool = False,
        plain: bool | None = None,
    ):
        self.specs, self.results, self.where, self.show_pos = specs, results, where, show_pos
        # the lines saying what the trainings will cost, and what one is expected to take
        self.estimate = estimate
        self.dry_run = dry_run  # the plan and its estimate only: no bar
        self.more_seeds = more_seeds  # cells whose seeds disagree get more (run/seeds.py)
        self.plain = not out.is_terminal if plain is None else plain
        self.points = _one_per_point(specs)
        self.varying = grid.varying_keys(self.points)  # what tells the points of a grid apart
        self.progress: Progress | None = None
        self.eta: Eta | None = None
        self.bar = None
        self.started_at = 0.0
        self.total = self.done = 0  # trainings, for the plain lines
        # plain: a run's only training's line, held for the run's line that follows at once
        # and says it all (said after all if another line comes first)
        self._pending: tuple[Unit, str] | None = None

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
        if self.varying and n_points == tasks * mechs * per_cell:
            parts.append(plural(per_cell, "grid point"))
        elif self.varying:  # tasks at different numbers of settings (the suite's ladders)
            settings = len({(task, label) for task, _, label in labels})
            parts[0] = f"{plural(tasks, 'task')} at {plural(settings, 'setting')}"
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
        lines, prior = self.estimate(units, capacity) if self.estimate else ([], None)
        for line in lines:
            out.print(line, highlight=False, markup=False)
        if self.dry_run:
            return
        self.eta = Eta(capacity, prior=prior)  # an ETA from the first second
        self.eta.add(units)
        self.total, self.started_at = len(units), time.monotonic()
        if self.plain:
            _flush()
            return
        self.progress = RunProgress(
            TextColumn("trainings"),
            BarColumn(bar_width=bar_width(out.width)),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            EtaColumn(self.eta),
            running=RunningLine(self.eta, out),
            console=out,
        )
        self.progress.start()
        self.bar = self.progress.add_task("trainings", total=len(units))

    def _say(self, line: str, markup: bool = True) -> None:
        """A line above the bar, or in the plain log (flushed, after any pending line)."""
        if self.progress is not None:
            self.progress.console.print(line, highlight=False, markup=markup)
            return
        self._said_pending()
        out.print(line, highlight=False, markup=markup)
        _flush()

    def _said_pending(self) -> None:
        if self._pending is not None:
            _, line = self._pending
            self._pending = None
            out.print(line, highlight=False, markup=False)

    def _count(self) -> str:
        """``3/8 trainings, 0:00:14 wall, eta 0:00:12``: the plain lines' progress."""
        elapsed = clock_text(time.monotonic() - self.started_at)
        return (
            f"{self.done}/{self.total} trainings, {elapsed} wall, "
            f"eta {clock_text(self.eta.remaining())}"
        )

    def _grow(self, n: int) -> None:
        self.total += n
        if self.progress is not None:
            self.progress.update(self.bar, total=self.total)

    def started(self, unit: Unit) -> None:
        self.eta.started(unit)

    def finished(self, unit: Unit, row: dict[str, Any]) -> None:
        self.eta.finished(unit, row["wall_seconds"])
        self.done += 1
        if self.progress is not None:
            self.progress.advance(self.bar)
            return
        self._said_pending()
        spec = unit.spec
        line = (
            f"   trained {spec.task} {spec.mechanism} seed {spec.seed} lr {unit.lr:g}: "
            f"{row['status']} ({row['wall_seconds']:.1f} s wall); {self._count()}"
        )
        p = spec.protocol
        if len(p.lrs) == 1 and not p.lr_extend:  # the run's only training: its line follows
            self._pending = (unit, line)
            return
        out.print(line, highlight=False, markup=False)
        _flush()

    def grew(self, units: list[Unit]) -> None:
        self.eta.add(units)
        self._grow(len(units))
        for unit in units:
            why = (
                "best lr at the grid's edge"
                if grown_past_an_edge(unit.spec.protocol, unit.lr)
                else "a knife-edge (best lr far ahead of a neighbour), refined"
            )
            self._say(f"   {unit.spec.label()}: {why}, adding lr {unit.lr:g}", markup=True)

    def _growth_note(self) -> str:
        """A dry run's word on the seeds it cannot foresee: those of cells not yet complete
        whose seeds will disagree, or of ladders whose levels will be out of order
        (synthbench/run/seeds.py). A cell of one planned seed has no spread: only a ladder's
        level (at the suite's default seeds, each level is one) may get a second, and the
        note says which are which rather than promise seeds to every one."""
        if not (self.dry_run and self.more_seeds):
            return ""
        cells = Cells(enabled=True)
        cells.plan(self.specs)  # the cells under a protocol whose rule is on
        seeds = [list(runs.values()) for runs in cells.runs.values()]
        rules = {(c[0].protocol.max_seeds, c[0].protocol.seed_spread) for c in seeds if len(c) > 1}
        note = ""
        if rules:
            most = max(most for most, _ in rules)
            spreads = {spread for _, spread in rules}
            apart = f" (scores more than {spreads.pop():g} apart)" if len(spreads) == 1 else ""
            note = f"; cells whose seeds disagree{apart} may get up to {plural(most, 'seed')}"
        laddered = {
            key
            for levels in cells.ladders.values()
            if len(levels) > 1
            for key in levels.values()
            if len(cells.runs[key]) == 1
        }
        if laddered:
            spreads = {cells.runs[k][min(cells.runs[k])].protocol.seed_spread for k in laddered}
            above = f"more than {spreads.pop():g} " if len(spreads) == 1 else ""
            note += (
                f"; {plural(len(laddered), 'ladder level')} of one seed may get a second, "
                f"where a harder level of their ladder scores {above}above an easier one"
            )
        single = sum(len(runs) == 1 for key, runs in cells.runs.items() if key not in laddered)
        if single:
            note += f"; {plural(single, 'cell')} of one seed cannot disagree and never get more"
        return note

    def seeded(self, growth: Growth, units: list[Unit]) -> None:
        added, scores = growth.added, growth.scores
        first = added[0]
        # a ladder's line is about all its levels: not the task parameters of one of them
        keys = tuple(k for k in self.varying if not (growth.ladder and k in first.task_params))
        point = f" {grid.point_label(first, keys)}" if keys else ""
        if growth.ladder:
            levels = ", ".join(f"{level} {score:.2f}" for level, score in scores.items())
            why = f"levels out of order ({levels}): a second seed at {len(added)} of them"
        else:
            why = (
                f"seeds disagree ({min(scores.values()):.2f} .. {max(scores.values()):.2f}): "
                f"{plural(len(added), 'more seed')}, up to {first.protocol.max_seeds}"
            )
        line = f"   {first.task} / {first.mechanism}{point}: {why}"
        self.specs = [*self.specs, *added]  # the header, when said after this, counts them
        if self.eta is None:  # before the plan's line: the store held the cell complete
            if units:  # else grown by an earlier command, its seeds stored: nothing new
                out.print(line, highlight=False)
            return
        self.eta.add(units)
        self._grow(len(units))
        self._say(line)

    def run_done(self, spec: RunSpec, rows: list[dict[str, Any]]) -> None:
        line = run_line(spec, rows, self.varying)
        if self.progress is None and self.eta is not None:
            # the run's line says what its last training's would, with the progress
            if self._pending is not None and self._pending[0].spec.run_id == spec.run_id:
                self._pending = None
            line += escape(f"; {self._count()}")
        self._say(line)

    def notice(self, spec: RunSpec, message: str) -> None:
        self._said_pending()
        warn(f"{spec.label()}: {message}")

    def unplanned(self, units: list[Unit]) -> None:
        if units and self.eta is not None:
            self.eta.drop(units)
            self._grow(-len(units))

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
        self._said_pending()
        _flush()


def _flush() -> None:
    """What was printed, out now: a log piped to a file or CI shows it as it comes."""
    try:
        out.file.flush()
    except (OSError, ValueError):  # closed, or a pipe gone: the next print says so
        pass


def _one_per_point(specs: list[RunSpec]) -> list[RunSpec]:
    """The specs less the other seeds of a grid point, where they share its parameter
    objects (``RunSpec.with_seeds``): what tells the points apart is worked out per point,
    not per run (a grid may hold 500,000 runs)."""
    found: dict[tuple, RunSpec] = {}
    for spec in specs:
        shared = (id(spec.task_params), id(spec.mechanism_params), id(spec.protocol))
        found.setdefault((spec.task, spec.mechanism, *shared), spec)
    return list(found.values())


def wall_text(rows: list[dict[str, Any]]) -> str:
    """A run's time as its rows store it: its trainings' wall seconds, summed where it has
    several (``4.1 s wall``, ``3 trainings: 12.3 s wall summed``)."""
    seconds = sum(r["wall_seconds"] for r in rows)
    if len(rows) == 1:
        return f"{seconds:.1f} s wall"
    return f"{len(rows)} trainings: {seconds:.1f} s wall summed"


def run_line(spec: RunSpec, rows: list[dict[str, Any]], varying: tuple[str, ...] = ()) -> str:
    best = run_status(rows)
    seconds = wall_text(rows)
    head = f"{spec.task:<16} {spec.mechanism:<12} seed {spec.seed}"
    if varying:  # a grid: which point
        head += f"  {grid.point_label(spec, varying)}"
    if best["status"] != "ok":
        # one line however many the error has (a compiler's, a plugin's); the row keeps them all
        reason = escape(" ".join(str(best.get("error")).split()))
        return f"[red]x[/] {head}  {best['status']}: {reason}  ({seconds})"
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
        f"{best['token_acc']:.3f}{free}  exact {best['exact_match']:.3f}{long}  ({seconds})"
    )
