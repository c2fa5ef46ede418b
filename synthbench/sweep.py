"""The learning rates of one run, and the one it reports.

A run trains once per learning rate; each training gives one row. Once every lr of the
protocol's grid has a row, the sweep either grows or ends:

- it grows when ``protocol.lr_extend`` allows and the best lr on the validation set sits
  alone at an edge of the grid: the lr one grid step past that edge is added (the step is
  the ratio of the two outermost lrs on that side), since the optimum may lie beyond;
- otherwise it ends, and the best lr is *selected* (the lowest of equal bests): the test
  metrics of that row are the run's result.

These are pure functions of the rows, so the runner calls them whenever a row comes in
(the lrs of one run may train on different workers, and the plan grows while it runs) and
at start-up on the stored rows (a killed sweep resumes where it stopped).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from synthbench.protocols import Protocol


def lr_key(lr: float) -> float:
    """An lr rounded to 6 significant digits: grid steps computed by division compare equal
    to the same lr read back from a file."""
    return float(f"{lr:.6g}")


@dataclass(frozen=True)
class SweepState:
    pending: tuple[float, ...]  # lrs still to train (no row yet)
    complete: bool  # every lr the sweep needs has a row
    selected: float | None  # when complete: the reported lr (None if no lr succeeded)


def sweep_state(protocol: Protocol, rows: Iterable[dict[str, Any]]) -> SweepState:
    """Where the sweep of one run stands, given its finished rows (any status)."""
    metric = f"val_{protocol.select_metric}"
    by_lr = {lr_key(r["lr"]): r for r in rows}
    grid = sorted(lr_key(lr) for lr in protocol.lrs)
    extensions = 0
    while True:
        missing = tuple(lr for lr in grid if lr not in by_lr)
        if missing:
            return SweepState(missing, False, None)
        scores = {lr: by_lr[lr][metric] for lr in grid if by_lr[lr]["status"] == "ok"}
        best = max(scores.values(), default=None)
        winners = [lr for lr in grid if lr in scores and scores[lr] == best]
        if extensions < protocol.lr_extend and len(winners) == 1:
            if winners[0] == grid[-1]:
                grid.append(lr_key(grid[-1] * grid[-1] / grid[-2]))
                extensions += 1
                continue
            if winners[0] == grid[0]:
                grid.insert(0, lr_key(grid[0] * grid[0] / grid[1]))
                extensions += 1
                continue
        return SweepState((), True, winners[0] if winners else None)


def mark_selected(protocol: Protocol, rows: list[dict[str, Any]]) -> bool:
    """Set every row's ``selected`` (all False while the sweep is incomplete); return
    whether the sweep is complete."""
    state = sweep_state(protocol, rows)
    for row in rows:
        row["selected"] = state.complete and lr_key(row["lr"]) == state.selected
    return state.complete
