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

The rule is a pure function of the rows; ``Cells`` follows the planned runs of each cell
for the runner (synthbench/run/runner.py), which applies the rule when a cell's last run
completes and, at start-up, to the cells the store holds complete.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from typing import Any

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
    lacking = itertools.filterfalse(selected.__contains__, itertools.count())
    return list(itertools.islice(lacking, protocol.max_seeds - len(selected)))


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

    def plan(self, specs: Iterable[RunSpec]) -> None:
        for spec in specs:
            if self.enabled and spec.protocol.max_seeds:
                key = self.keys[spec.run_id] = pack_key(spec)
                self.runs.setdefault(key, {})[spec.seed] = spec

    def complete(self, spec: RunSpec, rows: Iterable[dict[str, Any]]) -> None:
        """``spec`` is complete, its rows ``rows`` (its selection marked or not)."""
        if spec.run_id in self.keys:
            self.selected[spec.run_id] = selected_row(spec.protocol, list(rows))

    def grow(self, specs: Iterable[RunSpec]) -> list[tuple[list[RunSpec], dict[int, float]]]:
        """For each cell of ``specs`` whose planned runs are all complete and whose seeds
        disagree: the runs the rule adds (planned into the cell: it grows once) and its
        scores (seed -> score)."""
        found = []
        for key in dict.fromkeys(self.keys[s.run_id] for s in specs if s.run_id in self.keys):
            runs = self.runs[key]
            if any(spec.run_id not in self.selected for spec in runs.values()):
                continue  # not complete yet
            selected = {seed: self.selected[spec.run_id] for seed, spec in runs.items()}
            first = runs[min(runs)]
            added = [first.with_seed(seed) for seed in seeds_to_add(first.protocol, selected)]
            if added:
                self.plan(added)
                found.append((added, scores(selected)))
        return found


def selected_row(protocol: Protocol, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The row of a complete run's selected lr (None: it has none), whether or not the rows
    carry the mark yet."""
    chosen = sweep_state(protocol, rows).selected
    return next((r for r in rows if lr_key(r["lr"]) == chosen), None)
