"""The runner: from a selection of runs to stored rows, through an executor.

    plan      the RunSpecs of a selection, every name and parameter resolved once
    execute   drop what is already stored, train the rest through an executor (this process,
              a local pool of worker processes, or Ray: synthbench/run/executors.py), write
              each finished row to the store as it comes in, and hand each run's rows to its
              learning-rate sweep, which says what it still needs and which lr it selects
              (synthbench/run/lr_selection.py); with ``more_seeds``, a cell whose seeds
              disagree gets more seeds (synthbench/run/seeds.py): the plan grows by runs

The unit of work is one training: a run at one learning rate, so the lrs of a run can train
on different workers. Only this process writes to the store; a worker returns its row.
Every write replaces the run's file atomically with all its rows so far (``selected`` set
once the sweep is complete), so a kill at any moment keeps every finished training and
leaves no half-written file, and the same command resumes with what is missing. The store
merges each write with what it holds (``ResultStore.save``): a stored result is never
replaced by a failed training. Before it hands out a run's first training this process
claims the run (synthbench/run/claims.py): a run claimed by another live command is left to it.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter, deque
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synthbench.core.interrupts import raise_pending
from synthbench.core.text import plural
from synthbench.run import checkpoint
from synthbench.run.claims import Claims
from synthbench.run.lr_selection import (
    SWEEP_COLUMNS,
    Budget,
    Sweep,
    SweepState,
    mark_selected,
    run_status,
    sweep_state,
)
from synthbench.run.packed import pack_key
from synthbench.run.phases import phase
from synthbench.run.planning import plan, plan_size  # noqa: F401 (runner.plan: its API)
from synthbench.run.protocols import Protocol
from synthbench.run.schema import LEAKY, lr_key
from synthbench.run.seeds import SCORE_COLUMNS, Cells, Growth
from synthbench.run.spec import RunSpec
from synthbench.run.store import NewerSchemaError, ResultStore
from synthbench.run.work import Pack


@dataclass(frozen=True)
class Unit:
    """One training: a run at one learning rate."""

    spec: RunSpec
    lr: float
    budget: Budget = Budget()  # limits short of the whole schedule (lr_selection.Budget)
    # where the training keeps its checkpoint (synthbench/run/checkpoint.py); None: none
    checkpoint: str | None = None

    @property
    def key(self) -> tuple[str, float]:
        return (self.spec.run_id, lr_key(self.lr))

    def label(self) -> str:
        return f"{self.spec.label()} / lr {self.lr:g}"


class Events:
    """What ``execute`` reports as it goes (the command line draws its progress from it).
    Every method does nothing here; override the ones you need."""

    def skipped(self, line: str) -> None:
        """A file in the results tree that could not be read, or rows of one that fail
        synthbench/run/row_checks.py: one line naming it and why (it is left as it is)."""

    def planned(self, runs: int, stored: int, units: list[Unit], capacity: int) -> None:
        """``stored`` of the ``runs`` need nothing; ``units`` are the trainings to do,
        ``capacity`` of them at a time (0 when there is nothing to do)."""

    def started(self, unit: Unit) -> None:
        """A training was handed to a worker."""

    def finished(self, unit: Unit, row: dict[str, Any]) -> None:
        """A training's row came back and is stored."""

    def grew(self, units: list[Unit]) -> None:
        """A sweep needs more trainings than planned (its best lr sat at the grid's edge)."""

    def seeded(self, growth: Growth, units: list[Unit]) -> None:
        """A cell's seeds disagree, or a ladder's levels are out of order (``growth``,
        synthbench/run/seeds.py): the runs ``growth.added`` join the plan, with ``units``
        their trainings to do. Said before ``planned`` for a cell the store holds complete
        (those trainings are among the planned ones then), after it for one completed now."""

    def run_done(self, spec: RunSpec, rows: list[dict[str, Any]]) -> None:
        """A run's sweep is complete; its rows are stored with the selected lr marked."""

    def notice(self, spec: RunSpec, message: str) -> None:
        """One line the user must read about a run: a stored result kept over a failed
        training, an unreadable file moved aside, a run refused or left to another command."""

    def unplanned(self, units: list[Unit]) -> None:
        """Planned trainings this command will not do: their run is claimed by another
        command, was stored by one meanwhile, or is refused."""


@dataclass
class Outcome:
    runs: int = 0  # in the selection, and the seeds added where a cell's seeds disagree
    stored: int = 0  # of which already complete in the store
    statuses: Counter = field(default_factory=Counter)  # runs completed now, by status
    trainings: int = 0  # rows trained now
    claimed: int = 0  # runs left to another command that holds their claim
    kept: int = 0  # failed trainings not stored: a result stored at their lr was kept
    refused: int = 0  # runs whose file is of a newer schema version (never overwritten)
    stored_leaky: int = 0  # of the stored runs, those not causal after training

    def failure(self) -> str | None:
        """The command's one-line failure for kept and refused runs (an error status
        aside), or None."""
        parts = []
        if self.kept:
            parts.append(f"{plural(self.kept, 'training')} failed where a stored result was kept")
        if self.refused:
            parts.append(
                f"{plural(self.refused, 'run')} refused: their files are of a newer schema "
                "version (upgrade synthbench)"
            )
        return "; ".join(parts) + " (see the warnings above)" if parts else None


class _Run:
    """One run while it executes: its learning-rate sweep, and where this command stands
    with it."""

    def __init__(
        self, spec: RunSpec, rows: Iterable[dict[str, Any]], hold: bool, root: Path | None
    ) -> None:
        self.spec = spec
        self.root = root  # the results tree, whose .checkpoints folder its trainings use
        self.sweep = Sweep(spec.protocol, rows, hold)
        self.claimed = False  # this command holds the run's claim
        self.dropped = False  # left to another command, or refused: its rows are not stored
        self.done = False  # complete and counted

    @property
    def hold(self) -> bool:
        return self.sweep.hold

    @property
    def rows(self) -> dict[float, dict[str, Any]]:
        return self.sweep.rows

    def add(self, *rows: dict[str, Any]) -> tuple[bool, list[Unit]]:
        """Take finished rows; return (complete, trainings still to do)."""
        return self._next(self.sweep.add(*rows))

    def adopt(self, rows: Iterable[dict[str, Any]]) -> tuple[bool, list[Unit]]:
        """Take ``rows`` as the run's rows (what the store holds); as ``add``."""
        return self._next(self.sweep.adopt(rows))

    def _next(self, state: SweepState) -> tuple[bool, list[Unit]]:
        return state.complete, _units(self.spec, state, self.root)


def dry_run(
    specs: Sequence[RunSpec],
    store: ResultStore,
    capacity: Callable[[int], int],
    *,
    force: bool = False,
    events: Events | None = None,
    more_seeds: bool = False,
) -> Outcome:
    """What ``execute`` would train, said through ``events.planned`` in the order it would
    hand the trainings out; nothing is trained, claimed or written. ``capacity(n)``: how
    many of ``n`` trainings would run at once. Runs another command holds count as to run.
    With ``more_seeds``, the seeds added to cells the store holds complete are planned; the
    seeds of cells not yet complete cannot be known before they train."""
    events = events or Events()
    outcome = Outcome()
    planned, _, units, _ = _pending(specs, store, force, events, outcome, False, more_seeds)
    outcome.runs = len(planned)
    at_once = capacity(len(units)) if units else 0
    if len(units) > 1 and at_once > 1:
        units = longest_first(units)
    events.planned(len(planned), outcome.stored, units, at_once)
    return outcome


def execute(
    specs: Sequence[RunSpec],
    store: ResultStore,
    make_executor: Callable[[int], Any],
    *,
    force: bool = False,
    events: Events | None = None,
    pack: int = 1,
    more_seeds: bool = False,
) -> Outcome:
    """Train every training of ``specs`` not already stored. ``make_executor(n)`` gives the
    executor for ``n`` trainings (synthbench/run/executors.py); it is called only if there is
    something to train, and the executor is closed on the way out, Ctrl-C included.
    Each run is claimed before its first training is handed out (a run another command
    holds is left to it) and released when it completes or this returns.

    ``pack`` > 1: up to that many queued trainings of runs that differ at most in their
    seed (every lr and seed of a task, mechanism and grid point) go to the executor as one
    ``work.Pack``, trained as one batched model (synthbench/run/packed.py).

    ``more_seeds``: a cell whose seeds disagree gets more seeds, up to its protocol's
    ``max_seeds`` (synthbench/run/seeds.py): at start-up for a cell the store holds complete,
    else once its last planned run completes; the added runs train next and count in the
    Outcome. For a command that plans whole cells (``run``); one that plans chosen seeds
    (``reproduce``, ``facts run``) leaves it off."""
    events = events or Events()
    outcome = Outcome()
    planned, active, units, cells = _pending(
        specs, store, force, events, outcome, more_seeds=more_seeds
    )
    outcome.runs = len(planned)
    executor = make_executor(len(units)) if units else None
    capacity = executor.capacity if executor is not None else 0
    if len(units) > 1 and capacity > 1:
        units = longest_first(units)
    events.planned(len(planned), outcome.stored, units, capacity)
    if executor is None:
        return outcome
    claims = Claims(store.root)

    pack_keys: dict[str, str] = {}  # run_id -> pack_key: a hash of the config, once each

    def packs_with(unit: Unit) -> Callable[[Unit], bool]:
        """Whether a training can be packed with ``unit`` (runs that differ at most in
        their seed)."""

        def key(u: Unit) -> str:
            if u.spec.run_id not in pack_keys:
                pack_keys[u.spec.run_id] = pack_key(u.spec)
            return pack_keys[u.spec.run_id]

        wanted = key(unit)
        return lambda u: key(u) == wanted

    def ready(unit: Unit) -> bool:
        """Whether ``unit`` (out of the queue) is to train now: its run claimed."""
        run = active[unit.spec.run_id]
        if run.done or run.dropped:
            return False
        if run.claimed:
            return True
        taken = _claim(run, unit, queue, claims, store, force, events, outcome)
        if run.done:  # another command stored it meanwhile
            completed(run)
        return taken

    def completed(run: _Run) -> None:
        """``run`` is complete: if it was the last of its cell (or ladder) and the cell's
        seeds disagree (or the ladder's levels are out of order), the seeds the rules add join
        the plan, their trainings first (so the cell completes soon)."""
        cells.complete(run.spec, run.rows.values())

        def take(growth: Growth) -> None:
            outcome.runs += len(growth.added)
            todo: list[Unit] = []
            for spec in growth.added:  # a seed may be stored already, by an earlier command
                kept = [] if force else _finished(store.read_run(*_place(spec)))
                new, more = _admit(spec, kept, store, force, events, outcome, cells)
                if new is not None:
                    active[spec.run_id] = new
                    todo += more
            queue.extendleft(reversed(todo))
            events.seeded(growth, todo)

        cells.grow_until_settled([run.spec], take)

    try:
        queue = deque(units)
        in_flight: dict[tuple[str, float], int] = {}  # training -> its submission
        out: Counter[int] = Counter()  # submission -> its trainings not yet back
        submissions = itertools.count()
        while queue or in_flight:
            raise_pending()  # a Ctrl-C Python dropped (synthbench/core/interrupts.py)
            while queue and len(out) < capacity:
                unit = queue.popleft()
                if not ready(unit):
                    continue
                packable = _take(queue, packs_with(unit), pack - 1) if pack > 1 else []
                members = [unit] + [u for u in packable if ready(u)]
                executor.submit(Pack(tuple(members)) if len(members) > 1 else unit)
                number = next(submissions)
                for member in members:
                    in_flight[member.key] = number
                    events.started(member)
                out[number] = len(members)
            if not in_flight:
                continue  # what was queued is another command's
            unit, row = executor.wait()
            number = in_flight.pop(unit.key)
            out[number] -= 1
            if not out[number]:
                del out[number]
            run = active[unit.spec.run_id]
            complete, pending = run.add(row)
            if not run.dropped and (complete or not run.hold):
                saved = _save(run, store, force, events, outcome)
                if saved is None:  # refused: its file is of a newer schema now
                    run.dropped = True
                    claims.release(run.spec.run_id)
                    events.unplanned(_drop(queue, run.spec.run_id))
                else:
                    complete, pending = saved
                    for lr in run.rows:  # stored: their checkpoints are done with
                        checkpoint.discard(checkpoint.path_for(store.root, run.spec.run_id, lr))
            outcome.trainings += 1
            events.finished(unit, row)
            if run.dropped or run.done:
                continue
            if complete:
                run.done = True
                claims.release(run.spec.run_id)
                outcome.statuses[run_status(run.rows.values())["status"]] += 1
                events.run_done(run.spec, run.sweep.sorted_rows())
                completed(run)
                continue
            queued = {u.key for u in queue}
            more = [u for u in pending if u.key not in in_flight and u.key not in queued]
            if more:  # the sweep grew: train its new lrs next, so the run completes soon
                queue.extendleft(reversed(more))
                events.grew(more)
    finally:
        try:
            executor.close()
        finally:
            claims.close()
    return outcome


def _claim(
    run: _Run,
    unit: Unit,
    queue: deque,
    claims: Claims,
    store: ResultStore,
    force: bool,
    events: Events,
    outcome: Outcome,
) -> bool:
    """Claim the run of ``unit`` before its first training is handed out. False when the
    run is another command's (its trainings leave the plan), or when another command stored
    some of it since the plan was made (what is left to train goes back to the queue)."""
    spec = run.spec
    holder = claims.take(spec.run_id)
    if holder is not None:
        run.dropped = True
        outcome.claimed += 1
        events.notice(spec, f"skipped: claimed by {holder}, another command computing it")
        events.unplanned([unit, *_drop(queue, spec.run_id)])
        return False
    run.claimed = True
    if force:
        return True
    rows = _finished(store.read_run(*_place(spec)))
    if {lr_key(r["lr"]) for r in rows} == set(run.rows):
        return True  # as planned
    complete, pending = run.adopt(rows)
    planned = [unit, *_drop(queue, spec.run_id)]
    events.unplanned([u for u in planned if u not in pending])
    more = [u for u in pending if u not in planned]
    if more:
        events.grew(more)
    queue.extendleft(reversed(pending))
    if complete:
        run.done = True
        claims.release(spec.run_id)
        outcome.stored += 1
        events.notice(spec, "stored by another command meanwhile")
    return False


def _save(
    run: _Run, store: ResultStore, force: bool, events: Events, outcome: Outcome
) -> tuple[bool, list[Unit]] | None:
    """Store a run's rows so far, merged with what the store holds (a stored result is
    never replaced by a failure); the run's state after that, or None if it is refused."""
    spec = run.spec
    try:
        with phase("writing"):
            saved = store.save(run.sweep.sorted_rows(), replace=force, settle=run.sweep.settle)
    except NewerSchemaError as exc:  # such a file appeared at the run's path since the plan
        outcome.refused += 1
        events.notice(spec, f"refused: {exc}")
        return None
    for line in saved.notices():
        events.notice(spec, line)
    outcome.kept += len(saved.kept)
    return run.adopt(saved.rows)


def _take(queue: deque, wanted: Callable[[Unit], bool], most: int | None = None) -> list[Unit]:
    """Take the trainings ``wanted`` picks (the first ``most`` of them) out of ``queue``;
    return them, in queue order."""
    taken = [u for u in queue if wanted(u)][:most]
    if taken:
        chosen = {u.key for u in taken}
        rest = [u for u in queue if u.key not in chosen]
        queue.clear()
        queue.extend(rest)
    return taken


def _drop(queue: deque, run_id: str) -> list[Unit]:
    """Take the trainings of ``run_id`` out of ``queue``; return them."""
    return _take(queue, lambda u: u.spec.run_id == run_id)


def _finished(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stored rows a run keeps: an lr stored as an error trains again; ok and diverged
    are results; leaky is kept too (it would leak again; a plugin's new code is a new run)."""
    return [r for r in rows if r["status"] != "error"]


def stored_done(protocol: Protocol, rows: Iterable[dict[str, Any]]) -> bool:
    """Whether ``run`` leaves this stored run alone: its sweep is complete over the rows it
    keeps (``_finished``) and stored with its selection."""
    kept = _finished(rows)
    state = sweep_state(protocol, kept)
    return state.complete and state.marked(kept)


def _pending(
    specs: Sequence[RunSpec],
    store: ResultStore,
    force: bool,
    events: Events,
    outcome: Outcome,
    write: bool = True,
    more_seeds: bool = False,
) -> tuple[list[RunSpec], dict[str, _Run], list[Unit], Cells]:
    """The plan (``specs``, and with ``more_seeds`` the seeds added to the cells the store
    holds complete whose seeds disagree), its runs with work left (by run_id), their
    trainings to do, and its cells. ``write`` False (a dry run): the store is left as it is,
    a complete run not yet marked counts as stored. Counts the stored and refused runs."""
    if write:
        store.remove_stale_temporaries()
    loaded = None
    if not force:
        columns = SWEEP_COLUMNS + (SCORE_COLUMNS if more_seeds else [])
        loaded = store.load(columns=columns, warn=False)
        for line in loaded.warnings():
            events.skipped(line)
    # the runs with a file in the tree (under any name of theirs): only such a file can
    # refuse a run (``_admit``), and asking the store of each planned run costs syscalls
    on_disk = {p.stem for p in (store.files() if loaded is None else loaded.files)}
    cells = Cells(more_seeds)
    cells.plan(specs)
    planned: list[RunSpec] = []
    active: dict[str, _Run] = {}
    units: list[Unit] = []

    def admit(batch: Sequence[RunSpec]) -> list[Unit]:
        stored = _stored(loaded, batch)
        todo: list[Unit] = []
        for spec in batch:
            kept = _finished(stored.get(spec.run_id, []))
            run, more = _admit(spec, kept, store, force, events, outcome, cells, write, on_disk)
            if run is not None:
                active[spec.run_id] = run
                todo += more
        planned.extend(batch)
        units.extend(todo)
        return todo

    admit(specs)
    # the cells and ladders the store holds complete
    cells.grow_until_settled(specs, lambda growth: events.seeded(growth, admit(growth.added)))
    return planned, active, units, cells


def _stored(loaded: Any, specs: Sequence[RunSpec]) -> dict[str, list[dict[str, Any]]]:
    """The loaded rows of ``specs``, by run_id ({} when nothing was loaded: ``force``)."""
    if loaded is None:
        return {}
    rows = loaded.rows[loaded.rows["run_id"].isin({s.run_id for s in specs})]
    found: dict[str, list[dict[str, Any]]] = {}
    for record in rows.to_dict("records"):
        found.setdefault(record["run_id"], []).append(record)
    return found


def _admit(
    spec: RunSpec,
    kept: list[dict[str, Any]],
    store: ResultStore,
    force: bool,
    events: Events,
    outcome: Outcome,
    cells: Cells,
    write: bool = True,
    on_disk: Container[str] | None = None,
) -> tuple[_Run | None, list[Unit]]:
    """A run joining the plan, given the stored rows it keeps (``_finished``): its ``_Run``
    and trainings to do; (None, []) when it is stored complete (counted, and told to
    ``cells``) or refused (counted and said). ``on_disk``: the run ids with a file in the
    tree, where known (a run without one is refused by none)."""
    state = sweep_state(spec.protocol, kept)
    may_be_refused = not state.complete and (on_disk is None or spec.run_id in on_disk)
    refusal = store.refusal(*_place(spec)) if may_be_refused else None
    if refusal is not None:  # before anything trains: its file would never be written
        outcome.refused += 1
        events.notice(spec, f"refused: {refusal}")
        return None, []
    if state.complete and any(r["status"] == LEAKY for r in kept):
        outcome.stored_leaky += 1  # it would leak again: never retrained, always said
    if state.complete and (state.marked(kept) or not write):
        outcome.stored += 1  # complete, and stored with its selection (a dry run: or not)
        cells.complete(spec, kept)
        return None, []
    full = _finished(store.read_run(*_place(spec))) if kept else []
    if state.complete:  # stored complete but not marked (an interrupted write): mark now
        mark_selected(spec.protocol, full)
        store.write(sorted(full, key=lambda r: r["lr"]))
        outcome.stored += 1
        cells.complete(spec, full)
        return None, []
    return _Run(spec, full, hold=force, root=store.root), _units(spec, state, store.root)


def _place(spec: RunSpec) -> tuple[str, str, str, str]:
    """What the store finds a run's file by."""
    return spec.protocol.name, spec.task, spec.mechanism, spec.run_id


def _units(spec: RunSpec, state: SweepState, root: Path | None = None) -> list[Unit]:
    """The trainings a sweep still needs, each with its budget (and its checkpoint's path
    under ``root``)."""
    return [
        Unit(
            spec,
            lr,
            state.budgets.get(lr, Budget()),
            None if root is None else checkpoint.file_for(root, spec.run_id, lr),
        )
        for lr in state.pending
    ]


def longest_first(units: list[Unit]) -> list[Unit]:
    """Longest trainings first (steps x batch x sequence length, a proxy for cost), so
    that no worker is left with a long one at the end while the others wait."""

    lengths: dict[tuple[str, str], int] = {}  # a task's length, once per parameter set

    def cost(unit: Unit) -> int:
        spec = unit.spec
        key = (spec.task, json.dumps(spec.task_params, sort_keys=True, default=str))
        if key not in lengths:
            lengths[key] = spec.make_task().seq_len
        return spec.protocol.steps * spec.protocol.batch_size * lengths[key]

    costs = {u.key: cost(u) for u in units}
    return sorted(units, key=lambda u: -costs[u.key])


def run_sweep(spec: RunSpec, device) -> list[dict[str, Any]]:
    """Every training of one run in this process, without storing: its rows (lr order),
    ``selected`` marked. For tests and notebooks; ``execute`` is what the CLI uses."""
    from synthbench.run.executors import InProcess

    rows: list[dict[str, Any]] = []
    executor = InProcess(device)
    pending = _units(spec, sweep_state(spec.protocol, rows))
    while pending:
        for unit in pending:
            executor.submit(unit)
            rows.append(executor.wait()[1])
        pending = _units(spec, sweep_state(spec.protocol, rows))
    mark_selected(spec.protocol, rows)
    return sorted(rows, key=lambda r: r["lr"])
