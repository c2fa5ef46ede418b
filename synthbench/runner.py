"""The runner: from a selection of runs to stored rows, through an executor.

    plan      the RunSpecs of a selection, every name and parameter resolved once
    execute   drop what is already stored, train the rest through an executor (this process,
              a local pool of worker processes, or Ray: synthbench/executors.py), write each
              finished row to the store as it comes in, and grow or close each run's
              learning-rate sweep as its rows arrive (synthbench/sweep.py)

The unit of work is one training: a run at one learning rate, so the lrs of a run can train
on different workers. Only this process writes to the store; a worker returns its row.
Every write replaces the run's file atomically with all its rows so far (``selected`` set
once the sweep is complete), so a kill at any moment keeps every finished training and
leaves no half-written file, and the same command resumes with what is missing.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synthbench.protocols import Protocol
from synthbench.spec import RunSpec
from synthbench.store import ResultStore
from synthbench.sweep import lr_key, mark_selected, sweep_state


@dataclass(frozen=True)
class Unit:
    """One training: a run at one learning rate."""

    spec: RunSpec
    lr: float

    @property
    def key(self) -> tuple[str, float]:
        return (self.spec.run_id, lr_key(self.lr))

    def label(self) -> str:
        return f"{self.spec.label()} / lr {self.lr:g}"


def plan(
    tasks: Sequence[str],
    mechanisms: Sequence[str],
    protocol: Protocol,
    seeds: int,
    *,
    task_params: dict[str, Any] | None = None,
    mechanism_params: dict[str, Any] | None = None,
    eval_length_mult: float | None = None,
    pos: str | None = None,
    pos_params: dict[str, Any] | None = None,
    threads: int = 1,
) -> list[RunSpec]:
    """Every (task, mechanism, seed 0..seeds-1), resolved and checked before anything runs;
    names that resolve to the same run (an alias and its name) give it once."""
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"the number of seeds must be an integer >= 1, got {seeds!r}")
    specs: dict[str, RunSpec] = {}
    for task in tasks:
        for mechanism in mechanisms:
            first = RunSpec.resolve(
                task, mechanism, protocol, 0, task_params, mechanism_params,
                eval_length_mult, pos, pos_params, threads,
            )  # fmt: skip
            for seed in range(seeds):
                spec = first.with_seed(seed) if seed else first
                specs.setdefault(spec.run_id, spec)
    return list(specs.values())


class Events:
    """What ``execute`` reports as it goes (the command line draws its progress from it).
    Every method does nothing here; override the ones you need."""

    def skipped_file(self, path: Path, reason: str) -> None:
        """A file in the results tree that could not be read (it is left as it is)."""

    def planned(self, runs: int, stored: int, units: list[Unit], capacity: int) -> None:
        """``stored`` of the ``runs`` need nothing; ``units`` are the trainings to do,
        ``capacity`` of them at a time (0 when there is nothing to do)."""

    def started(self, unit: Unit) -> None:
        """A training was handed to a worker."""

    def finished(self, unit: Unit, row: dict[str, Any]) -> None:
        """A training's row came back and is stored."""

    def grew(self, units: list[Unit]) -> None:
        """A sweep needs more trainings than planned (its best lr sat at the grid's edge)."""

    def run_done(self, spec: RunSpec, rows: list[dict[str, Any]]) -> None:
        """A run's sweep is complete; its rows are stored with the selected lr marked."""


@dataclass
class Outcome:
    runs: int = 0  # in the selection
    stored: int = 0  # of which already complete in the store
    statuses: Counter = field(default_factory=Counter)  # runs completed now, by status
    trainings: int = 0  # rows trained now


def run_status(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The row that speaks for a run: its selected one, else its last by lr."""
    rows = sorted(rows, key=lambda r: r["lr"])
    return next((r for r in rows if r["selected"]), rows[-1])


class _Sweep:
    """One run's rows (by lr) while it executes."""

    def __init__(self, spec: RunSpec, rows: Iterable[dict[str, Any]], hold: bool) -> None:
        self.spec = spec
        self.rows = {lr_key(r["lr"]): r for r in rows}
        # hold: write only once complete (a --force rerun keeps the stored result until then)
        self.hold = hold

    def add(self, row: dict[str, Any]) -> tuple[bool, tuple[float, ...]]:
        """Take a finished row; return (complete, lrs still to train)."""
        self.rows[lr_key(row["lr"])] = row
        state = sweep_state(self.spec.protocol, self.rows.values())
        mark_selected(self.spec.protocol, self.sorted_rows())
        return state.complete, state.pending

    def sorted_rows(self) -> list[dict[str, Any]]:
        return [self.rows[lr] for lr in sorted(self.rows)]


SWEEP_COLUMNS = [
    "run_id", "lr", "status", "selected", "lr_edge", "steps_done", "val_token_acc",
    "val_exact_match",
]  # fmt: skip


def execute(
    specs: Sequence[RunSpec],
    store: ResultStore,
    make_executor: Callable[[int], Any],
    *,
    force: bool = False,
    events: Events | None = None,
) -> Outcome:
    """Train every training of ``specs`` not already stored. ``make_executor(n)`` gives the
    executor for ``n`` trainings (synthbench/executors.py); it is called only if there is
    something to train, and the executor is closed on the way out, Ctrl-C included."""
    events = events or Events()
    outcome = Outcome(runs=len(specs))
    sweeps, units = _pending(specs, store, force, events)
    outcome.stored = len(specs) - len(sweeps)
    executor = make_executor(len(units)) if units else None
    capacity = executor.capacity if executor is not None else 0
    if len(units) > 1 and capacity > 1:
        units = longest_first(units)
    events.planned(len(specs), outcome.stored, units, capacity)
    if executor is None:
        return outcome
    try:
        queue, in_flight = deque(units), set()
        while queue or in_flight:
            while queue and len(in_flight) < capacity:
                unit = queue.popleft()
                executor.submit(unit)
                in_flight.add(unit.key)
                events.started(unit)
            unit, row = executor.wait()
            in_flight.discard(unit.key)
            sweep = sweeps[unit.spec.run_id]
            complete, pending = sweep.add(row)
            if complete or not sweep.hold:
                store.write(sweep.sorted_rows())
            outcome.trainings += 1
            events.finished(unit, row)
            if complete:
                outcome.statuses[run_status(sweep.rows.values())["status"]] += 1
                events.run_done(sweep.spec, sweep.sorted_rows())
                continue
            queued = {u.key for u in queue}
            more = [Unit(unit.spec, lr) for lr in pending]
            more = [u for u in more if u.key not in in_flight and u.key not in queued]
            if more:  # the sweep grew: train its new lrs next, so the run completes soon
                queue.extendleft(reversed(more))
                events.grew(more)
    finally:
        executor.close()
    return outcome


def _pending(
    specs: Sequence[RunSpec], store: ResultStore, force: bool, events: Events
) -> tuple[dict[str, _Sweep], list[Unit]]:
    """The runs with work left (by run_id) and their trainings to do."""
    store.remove_stale_temporaries()
    stored: dict[str, list[dict[str, Any]]] = {}
    if not force:
        loaded = store.load(columns=SWEEP_COLUMNS, warn=False)
        for path, reason in loaded.skipped:
            events.skipped_file(path, reason)
        wanted = {s.run_id for s in specs}
        rows = loaded.rows[loaded.rows["run_id"].isin(wanted)]
        for record in rows.to_dict("records"):
            stored.setdefault(record["run_id"], []).append(record)
    sweeps, units = {}, []
    for spec in specs:
        # an lr stored as an error trains again; ok and diverged are results
        kept = [r for r in stored.get(spec.run_id, []) if r["status"] != "error"]
        state = sweep_state(spec.protocol, kept)
        if state.complete and all(
            bool(r["selected"]) == (lr_key(r["lr"]) == state.selected)
            # null in files of schema < 5, which are left as they are
            and (r["lr_edge"] is None or r["lr_edge"] != r["lr_edge"] or r["lr_edge"] == state.edge)
            for r in kept
        ):
            continue  # complete, and stored with its selection
        full = [r for r in store.read_run(spec.task, spec.mechanism, spec.run_id)
                if r["status"] != "error"] if kept else []  # fmt: skip
        sweeps[spec.run_id] = _Sweep(spec, full, hold=force)
        if state.complete:  # stored complete but not marked (an interrupted write): mark now
            mark_selected(spec.protocol, full)
            store.write(sorted(full, key=lambda r: r["lr"]))
            del sweeps[spec.run_id]
            continue
        units += [Unit(spec, lr) for lr in state.pending]
    return sweeps, units


def longest_first(units: list[Unit]) -> list[Unit]:
    """Longest trainings first (steps x batch x sequence length, a proxy for cost), so
    that no worker is left with a long one at the end while the others wait."""

    def cost(unit: Unit) -> int:
        p = unit.spec.protocol
        return p.steps * p.batch_size * unit.spec.make_task().seq_len

    costs = {u.key: cost(u) for u in units}
    return sorted(units, key=lambda u: -costs[u.key])


def run_sweep(spec: RunSpec, device) -> list[dict[str, Any]]:
    """Every training of one run in this process, without storing: its rows (lr order),
    ``selected`` marked. For tests and notebooks; ``execute`` is what the CLI uses."""
    from synthbench.executors import InProcess

    rows: list[dict[str, Any]] = []
    executor = InProcess(device)
    pending = sweep_state(spec.protocol, rows).pending
    while pending:
        for lr in pending:
            executor.submit(Unit(spec, lr))
            rows.append(executor.wait()[1])
        pending = sweep_state(spec.protocol, rows).pending
    mark_selected(spec.protocol, rows)
    return sorted(rows, key=lambda r: r["lr"])
