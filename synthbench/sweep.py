"""The learning rates of one run, and the one it reports.

A run trains once per learning rate; each training gives one row. Once every lr of the
protocol's grid has a row, the sweep either grows or ends:

- it grows when ``protocol.lr_extend`` allows and the best lr on the validation set sits
  alone at an edge of the grid: the lr one grid step past that edge is added (the step is
  the ratio of the two outermost lrs on that side), since the optimum may lie beyond;
- a run with a ``leaky`` training (synthbench/check.py) ends there with no lr selected: the
  mechanism saw later positions, so none of its scores is a result;
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
selected (``SweepState.stop_after``): it must solve in fewer steps than the edge, or in as
many when it is the lower lr (equal steps go to the lower). So one added below trains at
most the edge's steps, one added above at most the curve point before them (a training
stops only at curve points). One that has not solved by then leaves the selection and the
grid as a full training would: the edge stays the fastest solver, and a later solve would
only tie it, which changes neither.

These are pure functions of the rows, so the runner calls them whenever a row comes in
(the lrs of one run may train on different workers, and the plan grows while it runs) and
at start-up on the stored rows (a killed sweep resumes where it stopped).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from synthbench.protocols import Protocol, curve_points
from synthbench.store import LEAKY


def lr_key(lr: float) -> float:
    """An lr rounded to 6 significant digits: grid steps computed by division compare equal
    to the same lr read back from a file."""
    return float(f"{lr:.6g}")


@dataclass(frozen=True)
class SweepState:
    pending: tuple[float, ...]  # lrs still to train (no row yet)
    complete: bool  # every lr the sweep needs has a row
    selected: float | None  # when complete: the reported lr (None if no lr succeeded)
    edge: bool = False  # when complete: the best lr is alone at an edge of the grid
    # a pending lr's step budget, for one added past an edge that solved the task
    stop_after: dict[float, int] = field(default_factory=dict)


def score(protocol: Protocol, row: dict[str, Any]) -> float:
    """A successful training's validation metric, every score at or above ``stop_at``
    counting as the same: solved."""
    value = row[f"val_{protocol.select_metric}"]
    return min(value, protocol.stop_at) if protocol.stop_at else value


def sweep_state(protocol: Protocol, rows: Iterable[dict[str, Any]]) -> SweepState:
    """Where the sweep of one run stands, given its finished rows (any status)."""
    by_lr = {lr_key(r["lr"]): r for r in rows}
    grid = sorted(lr_key(lr) for lr in protocol.lrs)
    extensions = 0
    stop_after: dict[float, int] = {}
    while True:
        missing = tuple(lr for lr in grid if lr not in by_lr)
        if missing:
            budgets = {lr: steps for lr, steps in stop_after.items() if lr in missing}
            return SweepState(missing, False, None, stop_after=budgets)
        if any(r["status"] == LEAKY for r in by_lr.values()):
            return SweepState((), True, None)  # a leak at any lr: the run has no result
        scores = {lr: score(protocol, by_lr[lr]) for lr in grid if by_lr[lr]["status"] == "ok"}
        best = max(scores.values(), default=None)
        winners = [lr for lr in grid if lr in scores and scores[lr] == best]
        alone_at = winners[0] if len(winners) == 1 else None
        if extensions < protocol.lr_extend and alone_at in (grid[0], grid[-1]):
            if alone_at == grid[-1]:
                added = lr_key(grid[-1] * grid[-1] / grid[-2])
                grid.append(added)
            else:
                added = lr_key(grid[0] * grid[0] / grid[1])
                grid.insert(0, added)
            extensions += 1
            if protocol.stop_at and best >= protocol.stop_at:
                stop_after[added] = _budget(
                    protocol, int(by_lr[alone_at]["steps_done"]), added > alone_at
                )
            continue
        edge = alone_at is not None and alone_at in (grid[0], grid[-1])
        # among equal scores: the fewest steps (an early stop), then the lowest lr
        selected = min(winners, key=lambda lr: by_lr[lr].get("steps_done", 0), default=None)
        return SweepState((), True, selected, edge)


def _budget(protocol: Protocol, edge_steps: int, above: bool) -> int:
    """The steps an lr added past an edge that solved in ``edge_steps`` can use and still be
    selected: as many (added below: a tie goes to the lower lr), or up to the last curve
    point before them (added above). At least the first point: a training has one."""
    if not above:
        return edge_steps
    earlier = [step for step in curve_points(protocol.steps) if step < edge_steps]
    return earlier[-1] if earlier else edge_steps


def mark_selected(protocol: Protocol, rows: list[dict[str, Any]]) -> bool:
    """Set every row's ``selected`` and ``lr_edge`` (all False while the sweep is
    incomplete); return whether the sweep is complete."""
    state = sweep_state(protocol, rows)
    for row in rows:
        row["selected"] = state.complete and lr_key(row["lr"]) == state.selected
        row["lr_edge"] = state.complete and state.edge
    return state.complete
