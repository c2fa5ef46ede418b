"""Learning-rate selection: the learning rates of one run, and the one it reports.

This module owns the whole of it: which lrs a run trains, how long each may train, when the
sweep is complete, and which row is selected. The runner (synthbench/run/runner.py) hands
out what ``Sweep`` asks for and stores what it marks.

A run trains once per learning rate; each training gives one row. Once every lr of the
protocol's grid has a row, the sweep either grows or ends:

- it grows when ``protocol.lr_extend`` allows and the best lr on the validation set sits
  alone at an edge of the grid: the lr one grid step past that edge is added (the step is
  the ratio of the two outermost lrs on that side), since the optimum may lie beyond. With
  ``protocol.lr_signal`` (recipe v2) only a lead above noise grows the grid: the edge lr
  must have learned (its score at least ``lr_signal`` above the task's chance) and beat
  every other lr by at least ``lr_signal``. An lr that learned nothing never decides a
  direction, and a lead within noise leaves the grid as it is (and is no edge: the
  optimum beyond would be within noise of it too);
- it is refined when ``protocol.lr_refine`` allows and the best lr beats a neighbour in the
  grid by more than ``KNIFE_EDGE`` (a knife-edge): the geometric midpoint between the two is
  added, on each side where that holds, and trains the whole schedule. Between two lrs a
  grid step apart the verdict was read at one point; the midpoint shows whether the band
  in which the mechanism learns is that narrow, or the grid too coarse to see it (recipe
  v2: docs/PROTOCOLS.md). Each round halves the step (in log lr) around the best;
- a run with a ``leaky`` training (synthbench/integrity/causality.py) ends there with no lr
  selected: the mechanism saw later positions, so none of its scores is a result;
- otherwise it ends, and the best lr is *selected* (the lowest of equal bests): the test
  metrics of that row are the run's result. A best lr still alone at an edge is marked
  ``lr_edge``: the optimum may lie beyond the grid, so the run cannot show a mechanism
  worse than another (the report never counts such a cell as separated).

"Best" is the validation ``select_metric``. With ``protocol.stop_at``, a training stops
once that metric reaches ``stop_at``; every lr that got there solved the task, equally (a
plateau: the grid grows only for a score that one edge lr alone reaches), and the one of
them that got there in the fewest steps is selected (so learning curves are compared at
each mechanism's fastest lr).

An lr added past an edge lr that solved the task trains only as long as it could still be
selected (``Budget.steps``): it must solve in fewer steps than the edge, or in as
many when it is the lower lr (equal steps go to the lower). So one added below trains at
most the edge's steps, one added above at most the curve point before them (a training
stops only at curve points). One that has not solved by then leaves the selection and the
grid as a full training would: the edge stays the fastest solver, and a later solve would
only tie it, which changes neither.

With ``protocol.pace_margin``, an lr added past an edge also stops once, from half the
schedule on, its validation token accuracy trails the edge's at the same step by more than
the margin (``Budget.pace``): it would have to gain that much on the edge in what is left to
be selected. Unlike the step budget this is a bet, not a proof; docs/PROTOCOLS.md gives the
sweeps that justify it.

Once complete, every row of the run records how robust its verdict is to the lr:
``lr_robustness``, how many trained lrs came within ``ROBUST_MARGIN`` of the best score
(1: only the selected one did), and ``lr_gap``, the best score minus the best of the other
lrs (a diverged lr scores 0). A run whose ``lr_gap`` exceeds ``KNIFE_EDGE`` is a
knife-edge: its verdict hangs on one lr (reports flag it).

These are pure functions of the rows, so the runner calls them whenever a row comes in
(the lrs of one run may train on different workers, and the plan grows while it runs) and
at start-up on the stored rows (a killed sweep resumes where it stopped).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from synthbench.run.protocols import Protocol, curve_points
from synthbench.run.schema import LEAKY, RESULT_STATUSES, has_curve, lr_key

# The columns a sweep's state is computed from (what the runner loads to resume)
SWEEP_COLUMNS = [
    "run_id", "lr", "status", "selected", "lr_edge", "lr_robustness", "lr_gap", "steps_done",
    "val_token_acc", "val_exact_match", "chance_token_acc", "chance_exact_match",
]  # fmt: skip
# What the sweep marks on every row of a run (set once it is complete), and a new row's
ROW_MARKS = {"selected": False, "lr_edge": False, "lr_robustness": None, "lr_gap": None}
ROBUST_MARGIN = 0.05  # an lr within this of the best score counts toward lr_robustness
KNIFE_EDGE = 0.3  # an lr_gap above this: the verdict hangs on one lr


@dataclass(frozen=True)
class Budget:
    """How long one training may run, short of the protocol's whole schedule. Both limits are
    for an lr grown past an edge of the grid, which trained first: ``steps``, past an edge
    that solved the task, the steps in which this lr could still be selected; ``pace``, the
    edge's learning curve ((step, validation token accuracy), ...), which this lr must keep
    up with from half the schedule on (``Protocol.pace_margin``)."""

    steps: int | None = None
    pace: tuple[tuple[int, float], ...] = ()

    def falls_behind(self, protocol: Protocol, step: int, accuracy: float) -> bool:
        """Whether a training with validation token ``accuracy`` at ``step`` trails the
        edge's curve (held at its last point past its end) by more than the margin."""
        if not self.pace or not protocol.pace_margin or 2 * step < protocol.steps:
            return False
        measured = [value for at, value in self.pace if at <= step]
        return bool(measured) and measured[-1] - accuracy > protocol.pace_margin


@dataclass(frozen=True)
class SweepState:
    pending: tuple[float, ...]  # lrs still to train (no row yet)
    complete: bool  # every lr the sweep needs has a row
    selected: float | None  # when complete: the reported lr (None if no lr succeeded)
    edge: bool = False  # when complete: the best lr is alone at an edge of the grid
    robustness: int | None = None  # when complete: lrs within ROBUST_MARGIN of the best
    gap: float | None = None  # when complete: the best score over the best other lr's
    # the limits of a pending lr added past an edge (absent: the whole schedule)
    budgets: dict[float, Budget] = field(default_factory=dict)

    def marked(self, rows: Iterable[dict[str, Any]]) -> bool:
        """Whether ``rows`` (stored) carry this state's selection: ``selected`` on the
        selected lr alone, its ``lr_edge`` and ``lr_robustness`` (null in files of schemas
        before them: left as they are)."""
        return all(
            bool(r["selected"]) == (lr_key(r["lr"]) == self.selected)
            and _null_or(r.get("lr_edge"), self.edge)
            and _null_or(r.get("lr_robustness"), self.robustness)
            for r in rows
        )


def _null_or(stored: Any, value: Any) -> bool:
    """A stored mark is either absent (null, or NaN as pandas reads it) or ``value``."""
    return stored is None or stored != stored or stored == value


def score(protocol: Protocol, row: dict[str, Any]) -> float:
    """A successful training's validation metric, every score at or above ``stop_at``
    counting as the same: solved."""
    value = row[f"val_{protocol.select_metric}"]
    return min(value, protocol.stop_at) if protocol.stop_at else value


def learned(protocol: Protocol, row: dict[str, Any]) -> bool:
    """Whether a successful training scored at least ``lr_signal`` above the task's chance
    (a row without its chance, of schema < 5, counts as learned)."""
    chance = row.get(f"chance_{protocol.select_metric}")
    if chance is None or chance != chance:
        return True
    return score(protocol, row) >= chance + protocol.lr_signal


def _signal(protocol: Protocol, rows: dict[float, dict[str, Any]], lr: float, scores) -> bool:
    """Whether the lead of ``lr`` (alone best) is a signal that may grow the grid: any lead
    without ``lr_signal``; with it, the lr learned and beats every other by the margin."""
    if not protocol.lr_signal:
        return True
    others = [value for other, value in scores.items() if other != lr]
    ahead = not others or scores[lr] - max(others) >= protocol.lr_signal
    return ahead and learned(protocol, rows[lr])


def sweep_state(protocol: Protocol, rows: Iterable[dict[str, Any]]) -> SweepState:
    """Where the sweep of one run stands, given its finished rows (any status)."""
    by_lr = {lr_key(r["lr"]): r for r in rows}
    grid = sorted(lr_key(lr) for lr in protocol.lrs)
    extensions = refinements = 0
    budgets: dict[float, Budget] = {}
    while True:
        missing = tuple(lr for lr in grid if lr not in by_lr)
        if missing:
            pending = {lr: budget for lr, budget in budgets.items() if lr in missing}
            return SweepState(missing, False, None, budgets=pending)
        if any(r["status"] == LEAKY for r in by_lr.values()):
            return SweepState((), True, None)  # a leak at any lr: the run has no result
        scores = {lr: score(protocol, by_lr[lr]) for lr in grid if by_lr[lr]["status"] == "ok"}
        best = max(scores.values(), default=None)
        winners = [lr for lr in grid if lr in scores and scores[lr] == best]
        alone_at = winners[0] if len(winners) == 1 else None
        if alone_at is not None and not _signal(protocol, by_lr, alone_at, scores):
            alone_at = None  # a lead within noise, or an lr that learned nothing
        if extensions < protocol.lr_extend and alone_at in (grid[0], grid[-1]):
            if alone_at == grid[-1]:
                added = _step_past(grid[-1], grid[-2])
                grid.append(added)
            else:
                added = _step_past(grid[0], grid[1])
                grid.insert(0, added)
            extensions += 1
            budget = _budget(protocol, by_lr[alone_at], best, added > alone_at)
            if budget != Budget():
                budgets[added] = budget
            continue
        if refinements < protocol.lr_refine and len(winners) == 1:
            added = _midpoints(grid, by_lr, scores, winners[0])
            if added:
                grid = sorted({*grid, *added})
                refinements += 1
                continue
        edge = alone_at is not None and alone_at in (grid[0], grid[-1])
        # among equal scores: the fewest steps (an early stop), then the lowest lr
        selected = min(winners, key=lambda lr: by_lr[lr].get("steps_done", 0), default=None)
        robustness, gap = _robustness(by_lr, scores)
        return SweepState((), True, selected, edge, robustness, gap)


def _step_past(edge: float, inner: float) -> float:
    """The lr one grid step past ``edge``, away from its neighbour ``inner``."""
    return lr_key(edge * edge / inner)


def grown_past_an_edge(protocol: Protocol, lr: float) -> bool:
    """Whether ``lr``, added to a sweep, is one its grid grows by past an edge (``lr_extend``
    steps up or down, as ``sweep_state`` takes them; growth comes before any refinement, so
    from the protocol's grid); else a knife-edge's midpoint."""
    grid = sorted(lr_key(x) for x in protocol.lrs)
    up, down = grid[-2:], grid[1::-1]  # each side: its two outermost lrs, the edge last
    for _ in range(protocol.lr_extend if len(grid) > 1 else 0):
        up.append(_step_past(up[-1], up[-2]))
        down.append(_step_past(down[-1], down[-2]))
    return lr_key(lr) in {*up[2:], *down[2:]}


def _midpoints(
    grid: list[float], rows: dict[float, dict[str, Any]], scores: dict[float, float], best: float
) -> list[float]:
    """The geometric midpoints between ``best`` and each grid neighbour that trained (a
    diverged one scoring 0, as in ``lr_gap``) and that it beats by more than KNIFE_EDGE,
    rounded as stored lrs are."""
    at = grid.index(best)
    neighbours = [grid[i] for i in (at - 1, at + 1) if 0 <= i < len(grid)]
    return [
        lr_key(math.sqrt(best * lr))
        for lr in neighbours
        if rows[lr]["status"] in RESULT_STATUSES and scores[best] - scores.get(lr, 0.0) > KNIFE_EDGE
    ]


def _robustness(
    rows: dict[float, dict[str, Any]], scores: dict[float, float]
) -> tuple[int | None, float | None]:
    """(lr_robustness, lr_gap) of a complete sweep: the trained lrs within ROBUST_MARGIN of
    the best score, and the best score minus the best of the other lrs (a diverged lr scoring
    0; None with one lr). (None, None) when no lr succeeded."""
    if not scores:
        return None, None
    best = max(scores.values())
    robustness = sum(value >= best - ROBUST_MARGIN for value in scores.values())
    tried = {lr: scores.get(lr, 0.0) for lr, r in rows.items() if r["status"] in RESULT_STATUSES}
    others = sorted(tried.values(), reverse=True)[1:]
    return robustness, (best - others[0] if others else None)


def _budget(protocol: Protocol, edge: dict[str, Any], best: float, above: bool) -> Budget:
    """The budget of an lr added past the edge whose row is ``edge`` (its score ``best``).

    Past an edge that solved, the steps in which the new lr can still be selected: as many
    as the edge's when added below (a tie in steps goes to the lower lr), up to the last
    curve point before them when added above (at least the first point: a training has
    one). And with ``pace_margin``, the edge's curve to keep up with."""
    steps = None
    if protocol.stop_at and best >= protocol.stop_at:
        steps = int(edge["steps_done"])
        earlier = [s for s in curve_points(protocol.steps, horizon=steps) if s < steps]
        if above and earlier:
            steps = earlier[-1]
    pace = _curve(edge) if protocol.pace_margin else ()
    return Budget(steps, pace)


def _curve(row: dict[str, Any]) -> tuple[tuple[int, float], ...]:
    """A row's learning curve as (step, validation token accuracy) pairs; () without one
    (a row of schema < 4 has none)."""
    steps, values = row.get("curve_steps"), row.get("curve_val_token_acc")
    if not has_curve(steps) or values is None:
        return ()
    return tuple((int(at), float(value)) for at, value in zip(steps, values, strict=True))


def mark_selected(protocol: Protocol, rows: list[dict[str, Any]]) -> bool:
    """Set every row's ``selected`` and ``lr_edge`` (all False while the sweep is
    incomplete); return whether the sweep is complete."""
    state = sweep_state(protocol, rows)
    _mark(state, rows)
    return state.complete


def _mark(state: SweepState, rows: Iterable[dict[str, Any]]) -> None:
    for row in rows:
        row["selected"] = state.complete and lr_key(row["lr"]) == state.selected
        row["lr_edge"] = state.complete and state.edge
        row["lr_robustness"] = state.robustness if state.complete else None
        row["lr_gap"] = state.gap if state.complete else None


def run_status(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The row that speaks for a run: a leaky one (the run has no result), else its
    selected one, else its last by lr."""
    rows = sorted(rows, key=lambda r: r["lr"])
    leaky = (r for r in rows if r["status"] == LEAKY)
    return next(leaky, None) or next((r for r in rows if r["selected"]), rows[-1])


class Sweep:
    """One run's rows (by lr) while it executes: what it still needs, and its selection.
    ``hold``: the rows are written only once complete (a ``--force`` rerun keeps the stored
    result until then)."""

    def __init__(self, protocol: Protocol, rows: Iterable[dict[str, Any]], hold: bool) -> None:
        self.protocol = protocol
        self.rows = {lr_key(r["lr"]): r for r in rows}
        self.hold = hold

    def add(self, *rows: dict[str, Any]) -> SweepState:
        """Take finished rows; the sweep's state after them (``selected`` marked)."""
        for row in rows:
            self.rows[lr_key(row["lr"])] = row
        state = sweep_state(self.protocol, self.rows.values())
        _mark(state, self.rows.values())
        return state

    def adopt(self, rows: Iterable[dict[str, Any]]) -> SweepState:
        """Take ``rows`` as the run's rows (what the store holds); as ``add``."""
        self.rows = {}
        return self.add(*rows)

    def settle(self, rows: list[dict[str, Any]]) -> bool:
        """Mark the selected lr of ``rows`` (the rows about to be stored); False holds the
        write back while the sweep is incomplete and ``hold`` is set."""
        return mark_selected(self.protocol, rows) or not self.hold

    def sorted_rows(self) -> list[dict[str, Any]]:
        return [self.rows[lr] for lr in sorted(self.rows)]
