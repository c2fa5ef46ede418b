"""Seeds where they disagree (recipe v2): the rule that gives a cell more seeds.

A cell is the set of runs that differ only in their seed (``packed.pack_key``). Once every
planned run of a cell is complete, its runs' reported scores (``run_score``) are compared:
when they lie more than ``protocol.seed_spread`` apart (max minus min), the cell's verdict
would hinge on which seeds were drawn, so the cell gets seeds up to ``protocol.max_seeds``,
all at once: the lowest seeds it lacks (seeds n .. max_seeds - 1 for a cell of seeds
0 .. n - 1). A cell then holds max_seeds seeds, so it grows once.

A run with no selected row (every lr failed, or it leaked) has no score: it does not count
towards the spread, though its seed is the cell's. ``max_seeds`` 0 turns the rule off, and
a cell with fewer than two scores has no spread.

**A ladder's levels out of order.** At the suite's default seeds each level of a laddered
task (docs/TASKS.md, "Ladders") is a cell of one seed, which the rule above cannot judge. But
a ladder has an order of its own: each level is harder than the one before, so a harder
level scoring more than ``seed_spread`` above an easier one (both levels' mean scores, of
one task, mechanism and protocol) says that a seed fell on the wrong side of a transition
at one of them. Once every level of such a ladder is complete, each level of each pair out
of order that holds fewer than two seeds gets one more (the lowest it lacks), once per
ladder; the rule above then judges those cells as any other, and grows those whose two
seeds disagree to ``max_seeds``. A ladder whose levels agree with their order costs nothing.

The rule is a pure function of the rows; ``Cells`` follows the planned runs of each cell
for the runner (synthbench/run/runner.py), which applies the rule when a cell's last run
completes and, at start-up, to the cells the store holds complete.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from synthbench.core.task import TASKS
from synthbench.run.lr_selection import sweep_state
from synthbench.run.packed import pack_key
from synthbench.run.protocols import Protocol
from synthbench.run.schema import lr_key
from synthbench.run.spec import RunSpec

# What a run's score is read from (what the runner loads, beside the sweep's columns)
SCORE_COLUMNS = ["target_metric", "token_acc", "exact_match", "free_token_acc"]


def run_score(selected: Mapping[str, Any] | None) -> float | None:
    """The reported score of a run: the test metric its selected row's ``target_metric``
    names (token_acc where null: rows of schema < 5); None without a selected row or a
    value."""
    if selected is None:
        return None
    metric = selected.get("target_metric")
    if not isinstance(metric, str):  # null: None, or NaN out of a data frame
        metric = "token_acc"
    value = selected.get(metric)
    if value is None or math.isnan(float(value)):
        return None
    return float(value)


def scores(selected: Mapping[int, Mapping[str, Any] | None]) -> dict[int, float]:
    """Seed -> score of the runs that count (those with a score), from seed -> selected row
    (None: the run has none)."""
    found = {seed: run_score(row) for seed, row in selected.items()}
    return {seed: value for seed, value in sorted(found.items()) if value is not None}


def seeds_to_add(protocol: Protocol, selected: Mapping[int, Mapping[str, Any] | None]) -> list[int]:
    """The seeds a complete cell gets, given seed -> its run's selected row (None: none):
    none unless its scores are more than ``seed_spread`` apart; else the lowest seeds it
    lacks, up to ``max_seeds`` seeds in all."""
    if not protocol.max_seeds or len(selected) >= protocol.max_seeds:
        return []
    values = scores(selected).values()
    if len(values) < 2 or max(values) - min(values) <= protocol.seed_spread:
        return []
    return lacking_seeds(selected, protocol.max_seeds - len(selected))


def lacking_seeds(held: Iterable[int], n: int) -> list[int]:
    """The ``n`` lowest seeds not in ``held``: the seeds a cell grows by."""
    held = set(held)
    return list(itertools.islice(itertools.filterfalse(held.__contains__, itertools.count()), n))


def levels_out_of_order(
    protocol: Protocol, levels: Sequence[tuple[str, Mapping[int, Mapping[str, Any] | None]]]
) -> dict[str, float]:
    """Of a complete ladder's levels, easiest first, each (name, seed -> its run's selected
    row): level -> mean score of every level in a pair out of order (a harder level's mean
    more than ``seed_spread`` above an easier one's), easiest first; {} where none is, or
    where the rule is off. A level without a score takes part in no pair."""
    if not protocol.max_seeds:
        return {}
    means = {}
    for name, selected in levels:
        values = list(scores(selected).values())
        if values:
            means[name] = sum(values) / len(values)
    order = list(means)
    involved = {
        name
        for i, easier in enumerate(order)
        for harder in order[i + 1 :]
        if means[harder] - means[easier] > protocol.seed_spread
        for name in (easier, harder)
    }
    return {name: means[name] for name in order if name in involved}


def ladder_key(spec: RunSpec) -> tuple[str, str] | None:
    """(the key a ladder's runs share, the run's level) for a run at exactly a level of its
    task's ladder (``Task.level_of``), else None. Runs of one ladder differ only in their
    level and seed: their config without those."""
    level = TASKS.get(spec.task).level_of(spec.task_params)
    if level is None:
        return None
    config = {k: v for k, v in spec.config().items() if k not in ("seed", "task_params")}
    return json.dumps(config, sort_keys=True, default=str), level


class Growth(NamedTuple):
    """The runs one rule adds to the plan, and why: ``scores`` is seed -> score for a cell
    whose seeds disagree, level -> mean score for a ladder whose levels are out of order
    (``ladder`` True)."""

    added: list[RunSpec]
    scores: dict
    ladder: bool = False


class Cells:
    """The planned runs of each cell that can grow (runs that differ only in their seed,
    ``packed.pack_key``, under a protocol with ``max_seeds``) and the selected row of each
    complete one: what the seed rule (synthbench/run/seeds.py) is applied to once a cell's
    last run completes. ``enabled`` False: no cell is followed, none grows."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.keys: dict[str, str] = {}  # run_id -> its cell's key
        self.runs: dict[str, dict[int, RunSpec]] = {}  # cell key -> seed -> run
        # run_id -> its selected row (None: none), once the run is complete
        self.selected: dict[str, dict[str, Any] | None] = {}
        self.ladder_of: dict[str, str] = {}  # cell key -> its ladder's key (laddered cells)
        self.ladders: dict[str, dict[str, str]] = {}  # ladder key -> level -> its cell key
        self.judged: set[str] = set()  # the ladders judged once (levels out of order or not)

    def plan(self, specs: Iterable[RunSpec]) -> None:
        for spec in specs:
            if self.enabled and spec.protocol.max_seeds:
                key = self.keys[spec.run_id] = pack_key(spec)
                new_cell = key not in self.runs  # a cell's seeds share its ladder: once a cell
                self.runs.setdefault(key, {})[spec.seed] = spec
                if new_cell and (found := ladder_key(spec)) is not None:
                    ladder, level = found
                    self.ladder_of[key] = ladder
                    self.ladders.setdefault(ladder, {})[level] = key

    def complete(self, spec: RunSpec, rows: Iterable[dict[str, Any]]) -> None:
        """``spec`` is complete, its rows ``rows`` (its selection marked or not)."""
        if spec.run_id in self.keys:
            self.selected[spec.run_id] = selected_row(spec.protocol, list(rows))

    def _complete(self, key: str) -> dict[int, dict[str, Any] | None] | None:
        """Seed -> selected row of the cell ``key``, or None while a run of it is not complete."""
        runs = self.runs[key]
        if any(spec.run_id not in self.selected for spec in runs.values()):
            return None
        return {seed: self.selected[spec.run_id] for seed, spec in runs.items()}

    def grow(self, specs: Iterable[RunSpec]) -> list[Growth]:
        """What the rules add for the cells of ``specs``: each ladder (of two levels or
        more) whose levels are all complete is judged once, and each level of a pair out of
        order that holds one seed gets a second; then each complete cell whose seeds
        disagree gets seeds up to ``max_seeds`` (planned into the cell: it grows once)."""
        keys = dict.fromkeys(self.keys[s.run_id] for s in specs if s.run_id in self.keys)
        found = []
        for ladder in dict.fromkeys(self.ladder_of[k] for k in keys if k in self.ladder_of):
            if ladder in self.judged or len(self.ladders[ladder]) < 2:
                continue
            cells = self.ladders[ladder]
            some = next(iter(self.runs[next(iter(cells.values()))].values()))  # any of its runs
            order = TASKS.get(some.task).ladder.names
            levels = sorted(cells.items(), key=lambda item: order.index(item[0]))  # easiest first
            complete = [(name, self._complete(key)) for name, key in levels]
            if any(selected is None for _, selected in complete):
                continue  # a level not complete yet
            self.judged.add(ladder)
            out_of_order = levels_out_of_order(some.protocol, complete)
            added = []
            for name, key in levels:
                runs = self.runs[key]
                if name in out_of_order and len(runs) < 2:
                    (lacking,) = lacking_seeds(runs, 1)
                    added.append(runs[min(runs)].with_seed(lacking))
            if added:
                self.plan(added)
                found.append(Growth(added, out_of_order, ladder=True))
        for key in keys:
            selected = self._complete(key)
            if selected is None:
                continue  # not complete yet (or grown by the ladder just now)
            first = self.runs[key][min(selected)]
            added = [first.with_seed(seed) for seed in seeds_to_add(first.protocol, selected)]
            if added:
                self.plan(added)
                found.append(Growth(added, scores(selected)))
        return found

    def grow_until_settled(self, specs: Iterable[RunSpec], take: Callable[[Growth], None]) -> None:
        """``grow`` for ``specs``, handing each growth to ``take`` (which plans its runs and
        completes those already held: a seed may be stored by an earlier command), then
        judging the runs it added in turn, until the rules add nothing: a ladder's added
        seeds, once complete, may disagree in their cells."""
        grown = self.grow(specs)
        while grown:
            more = []
            for growth in grown:
                take(growth)
                more += self.grow(growth.added)
            grown = more


def selected_row(protocol: Protocol, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The row of a complete run's selected lr (None: it has none), whether or not the rows
    carry the mark yet."""
    chosen = sweep_state(protocol, rows).selected
    return next((r for r in rows if lr_key(r["lr"]) == chosen), None)
