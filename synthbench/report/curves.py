"""Learning curves: how fast each mechanism learns, from the validation curve of each run.

Every training measures validation token accuracy at the protocol's curve points
(``protocols.curve_points``: 10 evenly spaced steps, the last one the end of training); the row
stores them as ``curve_steps`` and ``curve_val_token_acc``. Per run, at its selected lr:

- **steps to 0.9**: the first curve step whose accuracy is at or above 0.9, or never;
- **area**: the area under the curve normalised to [0, 1], the mean of the curve over the
  protocol's curve points. A run stopped early (``stop_at``) stopped because it had reached
  that level, so its curve is held at its last measured value up to ``steps``.

A training still rising at the end of its schedule may go on past ``steps`` (recipe v2,
``max_steps``: synthbench/run/train.py), its curve too, at the same spacing. The curve of a
cell's runs then spans its longest run, each run held at its last value (it stopped because
it had settled, solved, or hit the cap), and steps to 0.9 may lie past ``steps``; the area
stays the mean over the protocol's own points, where every run trained on the same schedule
(an extension changes nothing before ``steps``), so areas compare as before.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from synthbench.core.text import plural
from synthbench.report.aggregate import KEYS, prepare_rows
from synthbench.report.tables import BEST_IN_BOLD, MISSING, Grid, sort_tasks, stat_over_seeds
from synthbench.run.protocols import curve_points
from synthbench.run.schema import has_curve

THRESHOLD = 0.9  # validation token accuracy that counts as learnt, for steps-to
NEVER = "never"


def curve_end(curve_steps, steps: int) -> int:
    """The last step of a run's curve: ``steps``, or later for a training extended past it."""
    return max(int(steps), int(curve_steps[-1]))


def held_curve(curve_steps, curve_values, steps: int, end: int | None = None) -> np.ndarray:
    """The curve at every curve point of a ``steps``-step training (and past it at the same
    spacing up to ``end``, for trainings extended past ``steps``): each point takes the last
    value measured at or before it (an early-stopped run's last value held to the end); NaN
    before the first measurement."""
    points = np.asarray(curve_points(int(steps), horizon=end))
    measured, values = np.asarray(curve_steps), np.asarray(curve_values, float)
    last = np.searchsorted(measured, points, side="right") - 1
    return np.where(last >= 0, values[np.maximum(last, 0)], np.nan)


def steps_to(curve_steps, curve_values, threshold: float = THRESHOLD) -> float:
    """The first measured step at or above ``threshold``; NaN if the curve never gets there."""
    reached = [s for s, v in zip(curve_steps, curve_values, strict=True) if v >= threshold]
    return float(reached[0]) if reached else np.nan


def run_curves(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per successful (cell, seed) at its selected lr that has a learning curve:
    ``points`` and ``curve`` (the held curve over the protocol's curve points, and past them
    up to the cell's longest curve; lists), ``steps_to`` (NaN: never) and ``area`` (over the
    protocol's curve points). Variants are labelled (``prepare_rows``)."""
    columns = [*KEYS, "seed", "points", "curve", "steps_to", "area"]
    if "curve_steps" not in rows:
        return pd.DataFrame(columns=columns)
    rows = prepare_rows(rows)
    ok = rows[(rows["status"] == "ok") & rows["selected"].astype(bool)]
    # runs that differ only in their eval length multiplier trained the same model
    ok = ok.drop_duplicates([*KEYS, "seed"])
    ok = ok[ok["curve_steps"].map(has_curve).astype(bool)]
    cell_end: dict[tuple, int] = {}  # the longest curve of each cell (extended trainings)
    for r in ok.itertuples():
        cell = tuple(getattr(r, k) for k in KEYS)
        cell_end[cell] = max(cell_end.get(cell, 0), curve_end(r.curve_steps, r.steps))
    records = []
    for r in ok.itertuples():
        end = cell_end[tuple(getattr(r, k) for k in KEYS)]
        curve = held_curve(r.curve_steps, r.curve_val_token_acc, r.steps, end)
        scheduled = len(curve_points(int(r.steps)))  # the protocol's own points come first
        records.append(
            {
                **{k: getattr(r, k) for k in KEYS},
                "seed": r.seed,
                "points": curve_points(int(r.steps), horizon=end),
                "curve": curve.tolist(),
                "steps_to": steps_to(r.curve_steps, r.curve_val_token_acc),
                # the mean over the points: [0, 1] like the accuracies
                "area": float(curve[:scheduled].mean()),
            }
        )
    return pd.DataFrame(records, columns=columns)


def mean_curves(curves: pd.DataFrame) -> pd.DataFrame:
    """Per (protocol, category, task, mechanism, step): the mean over seeds of the held
    curves of ``run_curves``, for the figure."""
    long = curves.explode(["points", "curve"]).rename(columns={"points": "step"})
    long = long.astype({"step": int, "curve": float})
    return long.groupby([*KEYS, "step"])["curve"].mean().rename("mean").reset_index()


def _steps_text(values: pd.Series, n_seeds: int) -> str:
    """mean ± std over the seeds that reached the threshold (the mean alone for one), and
    how many never did."""
    reached = values.dropna()
    never = len(values) - len(reached)
    if len(reached):
        stat = stat_over_seeds(reached)
        spread = f" ± {stat.std:.0f}" if stat.n > 1 else ""  # one seed: no spread to show
        text = f"{stat.mean:.0f}{spread}" + (f" ({never} {NEVER})" if never else "")
    else:
        text = NEVER
    return text if len(values) >= n_seeds else f"{text} (n={len(values)})"


def curve_grids(curves: pd.DataFrame, protocol: str, version: int) -> list[Grid]:
    """The two tables of one protocol's ``run_curves``: steps to 0.9 and the area, tasks by
    category as rows, mechanisms as columns."""
    n_seeds = int(curves.groupby(["task", "mechanism"]).size().max()) if len(curves) else 0
    mechanisms = sorted(curves["mechanism"].unique())
    tasks = sort_tasks(curves)
    cells = {
        (c, t, m): part for (c, t, m), part in curves.groupby(["category", "task", "mechanism"])
    }
    head = (
        f"Validation token accuracy at the curve points of each run's selected lr, over "
        f"{plural(n_seeds, 'seed')} (a cell with fewer says n=); protocol {protocol} v{version}."
    )
    steps = [
        [
            _steps_text(cells[c, t, m]["steps_to"], n_seeds) if (c, t, m) in cells else MISSING
            for m in mechanisms
        ]
        for c, t in tasks
    ]
    never = sum(int(part["steps_to"].isna().sum()) for part in cells.values())
    area = [
        [
            stat_over_seeds(cells[c, t, m]["area"]) if (c, t, m) in cells else None
            for m in mechanisms
        ]
        for c, t in tasks
    ]
    return [
        Grid(
            f"Steps to {THRESHOLD:g} validation accuracy",
            ["category", "task"],
            tasks,
            mechanisms,
            steps,
            n_seeds,
            best=None,
            notes=[
                head,
                f"The first curve point at or above {THRESHOLD:g}; mean ± std over the seeds "
                f"that reached it; '(k {NEVER})': k seeds never did "
                f"({plural(never, 'run')} in all); fewer is faster.",
            ],
        ),
        Grid(
            "Learning-curve area",
            ["category", "task"],
            tasks,
            mechanisms,
            area,
            n_seeds,
            best="row",
            notes=[
                head,
                "Area under the validation curve normalised to [0, 1]: its mean over the "
                "protocol's curve points, a run stopped early held at its last value up to "
                f"the last step; mean ± std over seeds; {BEST_IN_BOLD}. "
                f"{MISSING}: no run with a curve.",
            ],
        ),
    ]
