"""Which pairs of mechanisms each task tells apart: a task none of whose pairs separate says
nothing about the mechanisms compared on it.

Per task and pair of mechanisms (a, b), over the seeds both have (seed s is the same data
and initialisation for both), on the task's target metric at each run's selected lr, the
pair *separates* when

- the mean difference a - b is at least ``MIN_DIFFERENCE`` (0.05) in absolute value,
- every seed's difference has the same sign, and
- every seed's difference exceeds ``NOISE_SES`` (2) standard errors of the difference,
  sqrt(se_a^2 + se_b^2), from the rows' ``<metric>_se`` (the test set is finite: a
  difference within that noise could be the draw of test examples);

and neither cell has a seed whose selected lr is alone at an edge of its grid (``lr_edge``:
the optimum may lie beyond, so the run does not show how well the mechanism can do). At
least ``MIN_SEEDS`` common seeds are needed. The same comparison on the learning-curve area
(synthbench/report/curves.py), which has no standard error, asks only the first two conditions.
"""

from __future__ import annotations

import math
from itertools import combinations
from typing import NamedTuple

import pandas as pd

from synthbench.report.aggregate import KEYS, prepare_rows, selected_runs
from synthbench.report.curves import run_curves
from synthbench.report.tables import MISSING, Grid, sort_tasks, target_note, track_text

MIN_DIFFERENCE = 0.05
NOISE_SES = 2
MIN_SEEDS = 2
# a difference of exactly 0.05 (0.75 - 0.70) must not fail for its last binary digit
TOLERANCE = 1e-9

# Why a pair does not separate, and how a cell shows it
EDGE, SEEDS, CLOSE, FLIP, NOISE, NO_SE, NO_VALUE, NO_CURVE = (
    "lr at edge",
    "too few seeds",
    "too close",
    "sign flips",
    "within noise",
    "no SE",
    "no value",
    "no curve",
)
# reason -> (what a cell says, what that means)
SHORT = {
    CLOSE: ("close", f"the mean difference is below {MIN_DIFFERENCE:g}"),
    FLIP: ("flip", "the seeds' differences disagree in sign"),
    NOISE: ("noise", f"a seed's difference is within {NOISE_SES} standard errors"),
    NO_SE: ("no SE", "a standard error is not stored (older rows)"),
    NO_VALUE: ("no value", "a run lacks the metric (older rows)"),
    EDGE: ("edge", "a seed's selected lr is alone at an edge of its grid"),
    SEEDS: ("n<2", f"fewer than {MIN_SEEDS} seeds in common"),
    NO_CURVE: ("no curve", "a run without a learning curve"),
}
MEASURES = {"target": "value", "area": "area"}  # measure -> the runs' column compared


_PAIR_COLUMNS = [
    "protocol",
    "category",
    "task",
    "a",
    "b",
    "measure",
    "seeds",
    "difference",
    "separated",
    "ahead",
    "reason",
]
_COUNT_COLUMNS = ["protocol", "measure", "tasks", "informative", "silent"]


class Separation(NamedTuple):
    # one row per (protocol, task, pair, measure): protocol, category, task, a, b (a < b),
    # measure (target or area), seeds (common seeds), difference (mean a - b over them),
    # separated, ahead (a or b when separated, else None), reason (None when separated)
    pairs: pd.DataFrame
    # one row per (protocol, measure): tasks (the tasks present), informative (the number
    # where at least one pair separates) and silent (the names of the others, a list)
    counts: pd.DataFrame
    # the runs compared (``report.selected_runs`` on target, with the curves' area)
    runs: pd.DataFrame


def compare_pair(a: pd.DataFrame, b: pd.DataFrame, measure: str) -> tuple[float, int, str | None]:
    """Two cells' runs (indexed by seed, with lr_edge, the measure's column and, for target,
    se): the mean difference a - b over their common seeds, the number of those seeds, and
    why they do not separate (None when they do)."""
    column = MEASURES[measure]
    common = a.index.intersection(b.index)
    differences = a.loc[common, column] - b.loc[common, column]
    mean = float(differences.mean()) if len(common) else math.nan
    if a["lr_edge"].any() or b["lr_edge"].any():  # any seed of either cell, common or not
        return mean, len(common), EDGE
    if len(common) < MIN_SEEDS:
        return mean, len(common), SEEDS
    if differences.isna().any():
        return mean, len(common), NO_CURVE if measure == "area" else NO_VALUE
    if abs(mean) < MIN_DIFFERENCE - TOLERANCE:
        return mean, len(common), CLOSE
    if (differences > 0).any() and (differences < 0).any():
        return mean, len(common), FLIP
    if measure == "target":
        noise = NOISE_SES * (a.loc[common, "se"] ** 2 + b.loc[common, "se"] ** 2) ** 0.5
        if noise.isna().any():
            return mean, len(common), NO_SE
        if not (differences.abs() > noise).all():
            return mean, len(common), NOISE
    return mean, len(common), None


def separation(rows: pd.DataFrame) -> Separation:
    """Every pair of mechanisms on every task of ``rows`` (stored rows, any number of
    protocols, one version each), on the target metric and on the learning-curve area."""
    rows = prepare_rows(rows)
    runs = selected_runs(rows, "target")
    areas = run_curves(rows)[[*KEYS, "seed", "area"]]
    runs = runs.merge(areas, on=[*KEYS, "seed"], how="left")
    records, counts = [], []
    for protocol, mine in runs.groupby("protocol", sort=True):
        separated = {measure: set() for measure in MEASURES}
        for category, task in sort_tasks(mine):
            part = mine[mine["task"] == task]
            cells = {m: c.set_index("seed") for m, c in part.groupby("mechanism")}
            for a, b in combinations(sorted(cells), 2):
                for measure in MEASURES:
                    mean, seeds, reason = compare_pair(cells[a], cells[b], measure)
                    if reason is None:
                        separated[measure].add(task)
                    records.append(
                        {
                            "protocol": protocol,
                            "category": category,
                            "task": task,
                            "a": a,
                            "b": b,
                            "measure": measure,
                            "seeds": seeds,
                            "difference": mean,
                            "separated": reason is None,
                            "ahead": (a if mean > 0 else b) if reason is None else None,
                            "reason": reason,
                        }
                    )
        tasks = [t for _, t in sort_tasks(mine)]
        for measure in MEASURES:
            counts.append(
                {
                    "protocol": protocol,
                    "measure": measure,
                    "tasks": len(tasks),
                    "informative": len(separated[measure]),
                    "silent": [t for t in tasks if t not in separated[measure]],
                }
            )
    pairs = pd.DataFrame(records, columns=_PAIR_COLUMNS)
    return Separation(pairs, pd.DataFrame(counts, columns=_COUNT_COLUMNS), runs)


def _cell(pair) -> str:
    if pair.separated:
        return f"{pair.ahead} +{abs(pair.difference):.2f}"
    return SHORT[pair.reason][0]


def _count_note(count) -> str:
    silent = ", ".join(count.silent) if count.silent else "none"
    return (
        f"Informative tasks (at least one pair separates): {count.informative} of "
        f"{count.tasks}. Separating nothing: {silent}."
    )


PAIRS_APART = "pairs apart"  # the detail table's first column: separated pairs of those run


def _apart(pairs: pd.DataFrame) -> str:
    """How many of ``pairs`` (records) separate, of how many: "3/28"."""
    return f"{int(pairs['separated'].sum())}/{len(pairs)}" if len(pairs) else MISSING


def head_to_head(pairs: pd.DataFrame, mechanisms: list[str], title: str) -> Grid:
    """The pairs' records of one measure as a mechanism x mechanism table: in row a, column
    b, on how many tasks a is ahead of b and the pair separates, of the tasks both ran.
    With many mechanisms this is the table to read first: the per-task one has a column
    per pair (28 for 8 mechanisms)."""
    cells = []
    for a in mechanisms:
        line = []
        for b in mechanisms:
            first, second = sorted((a, b))  # a pair is stored once, its names in order
            both = pairs[(pairs["a"] == first) & (pairs["b"] == second)]
            ahead = int((both["separated"] & (both["ahead"] == a)).sum())
            line.append(f"{ahead}/{len(both)}" if a != b and len(both) else MISSING)
        cells.append(line)
    ever = {(p.a, p.b) for p in pairs.itertuples() if p.separated}
    never = [f"{a} vs {b}" for a, b in combinations(mechanisms, 2) if (a, b) not in ever]
    n_pairs = len(mechanisms) * (len(mechanisms) - 1) // 2
    notes = [
        "Cell (row a, column b): on how many tasks a is ahead of b and the pair separates "
        "(the rules below), of the tasks both ran.",
        f"Pairs told apart by at least one task: {n_pairs - len(never)} of {n_pairs}. "
        f"By none: {', '.join(never) if never else 'none'}.",
    ]
    return Grid(
        title,
        ["mechanism"],
        [(m,) for m in mechanisms],
        mechanisms,
        cells,
        0,
        best=None,
        notes=notes,
    )


def grids(result: Separation, protocol: str, version: int, track: str = "core") -> list[Grid]:
    """The tables of one protocol, on the target metric, then on the learning-curve area:
    for each, the head-to-head counts (``head_to_head``), then a row per task and a column
    per pair (after how many pairs the task separates), with the informative count below."""
    pairs = result.pairs[result.pairs["protocol"] == protocol]
    runs = result.runs[result.runs["protocol"] == protocol]
    tasks = sort_tasks(runs)
    mechanisms = sorted(runs["mechanism"].unique())
    columns = [f"{a} vs {b}" for a, b in combinations(mechanisms, 2)]
    # the reasons each measure can give: the area has no standard error, the target a value
    reasons = {
        "target": (CLOSE, FLIP, NOISE, NO_SE, EDGE, SEEDS, NO_VALUE),
        "area": (CLOSE, FLIP, EDGE, SEEDS, NO_CURVE),
    }
    compared = {"target": "the target metric", "area": "the learning-curve area"}
    shows = track_text(protocol, version, track)
    titles = {m: f"on {on} ({shows})" for m, on in compared.items()}
    rules = {
        "target": (
            "Each task's target metric on the test set at each run's selected lr, over the "
            f"seeds both mechanisms have. A pair separates when the mean difference is at "
            f"least {MIN_DIFFERENCE:g}, every seed's difference has the same sign and exceeds "
            f"{NOISE_SES} standard errors, sqrt(se_a^2 + se_b^2), and neither has a seed whose "
            "selected lr is alone at an edge of its grid (the optimum may lie beyond)."
        ),
        "area": (
            "The learning-curve area (curves.md) at each run's selected lr, over the seeds "
            f"both mechanisms have. A pair separates when the mean difference is at least "
            f"{MIN_DIFFERENCE:g} and every seed's difference has the same sign, neither having "
            "a seed whose selected lr is alone at an edge of its grid."
        ),
    }
    result_grids = []
    for measure in MEASURES:
        mine = pairs[pairs["measure"] == measure]
        found = {(p.task, f"{p.a} vs {p.b}"): _cell(p) for p in mine.itertuples()}
        cells = [
            [_apart(mine[mine["task"] == t]), *(found.get((t, c), MISSING) for c in columns)]
            for _, t in tasks
        ]
        (count,) = result.counts[
            (result.counts["protocol"] == protocol) & (result.counts["measure"] == measure)
        ].itertuples()
        notes = [
            rules[measure],
            "Cell: the mechanism ahead and the mean difference; else why the pair does not "
            "separate: "
            + "; ".join(f"{SHORT[r][0]}: {SHORT[r][1]}" for r in reasons[measure])
            + f"; {MISSING}: one of the two did not run the task. {PAIRS_APART}: how many "
            "pairs of mechanisms the task separates, of those that both ran it.",
            _count_note(count),
        ]
        if measure == "target":
            notes.insert(1, target_note(runs))
        result_grids.append(head_to_head(mine, mechanisms, f"Head to head {titles[measure]}"))
        result_grids.append(
            Grid(
                f"Separation {titles[measure]}",
                ["category", "task"],
                tasks,
                [PAIRS_APART, *columns],
                cells,
                0,
                best=None,
                notes=notes,
            )
        )
    return result_grids
