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

import numpy as np
import pandas as pd

from synthbench.report.aggregate import KEYS, prepare_rows, selected_runs
from synthbench.report.curves import run_curves
from synthbench.report.formats import RAGGED
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
    SEEDS: ("few seeds", f"fewer than {MIN_SEEDS} seeds in common"),
    NO_CURVE: ("no curve", "a run without a learning curve"),
}
MEASURES = {"target": "value", "area": "area"}
# why a pair could not be called either way: the rules need 2 seeds, an lr inside its grid
# and, on the target metric, a stored value and standard error
UNTESTED = (SEEDS, EDGE, NO_SE, NO_VALUE, NO_CURVE)  # measure -> the runs' column compared


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


def _count_note(count) -> str:
    silent = ", ".join(count.silent) if count.silent else "none"
    return (
        f"Informative tasks (at least one pair separates): {count.informative} of "
        f"{count.tasks}. Separating nothing: {silent}."
    )


def head_to_head(pairs: pd.DataFrame, mechanisms: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The pairs' records of one measure as two mechanism x mechanism arrays: ``ahead[i, j]``
    the tasks on which mechanisms[i] is ahead of mechanisms[j] and the pair separates,
    ``tested[i, j]`` the tasks both ran on which the rules could call the pair either way
    (not ``UNTESTED``; 0 on the diagonal)."""
    index = {m: i for i, m in enumerate(mechanisms)}
    ahead = np.zeros((len(mechanisms), len(mechanisms)), dtype=int)
    tested = np.zeros_like(ahead)
    for pair in pairs.itertuples():
        if pair.a not in index or pair.b not in index or pair.reason in UNTESTED:
            continue
        a, b = index[pair.a], index[pair.b]
        tested[a, b] += 1
        tested[b, a] += 1
        if pair.separated:
            winner, loser = (a, b) if pair.ahead == pair.a else (b, a)
            ahead[winner, loser] += 1
    return ahead, tested


LISTED = 6  # task names a cell lists before it counts the rest


def _task_names(tasks: list[str]) -> str:
    if not tasks:
        return "none"
    shown = ", ".join(tasks[:LISTED])
    return shown + (f" (+{len(tasks) - LISTED} more)" if len(tasks) > LISTED else "")


def decisive_grid(pairs: pd.DataFrame, ranked: list[str], title: str, notes: list[str]) -> Grid:
    """The pairs that decide the board's order, of one measure: each ranked mechanism
    (``ranked``, in rank order) against the next, with the tasks that separate them each
    way."""
    rows, cells = [], []
    for rank, (upper, lower) in enumerate(zip(ranked, ranked[1:], strict=False), start=1):
        first, second = sorted((upper, lower))  # a pair is stored once, its names in order
        both = pairs[(pairs["a"] == first) & (pairs["b"] == second)]
        apart = both[both["separated"]]
        rows.append((f"{upper} vs {lower}",))
        untested = int(both["reason"].isin(UNTESTED).sum())
        cells.append(
            [
                f"{rank}-{rank + 1}",
                _apart(both) + (f" ({untested} untested)" if untested else ""),
                _task_names(apart.loc[apart["ahead"] == upper, "task"].tolist()),
                _task_names(apart.loc[apart["ahead"] == lower, "task"].tolist()),
            ]
        )
    if len(ranked) < 2:
        notes = [*notes, "Fewer than 2 ranked mechanisms: no pair of neighbours to show."]
    return Grid(
        title,
        ["pair"],
        rows,
        ["ranks", PAIRS_APART, "upper ahead on", "lower ahead on"],
        cells,
        0,
        best=None,
        notes=notes,
        latex_columns="cc" + f"{RAGGED}p{{4.2cm}}" * 2,  # the task lists wrap: a page holds it
    )


PAIRS_APART = "tasks apart"  # how many tasks separate a pair, of those both ran


def _apart(pairs: pd.DataFrame) -> str:
    """How many of ``pairs`` (records) separate, of how many: "3/22"."""
    return f"{int(pairs['separated'].sum())}/{len(pairs)}" if len(pairs) else MISSING


def grids(
    result: Separation,
    protocol: str,
    version: int,
    track: str = "core",
    ranked: list[str] | None = None,
) -> list[Grid]:
    """The tables of one protocol, on the target metric, then on the learning-curve area:
    the decisive pairs (``decisive_grid``: each of ``ranked``, the board's ranked mechanisms
    in order, against the next; default: every mechanism by name), with the informative
    count and the pairs told apart below. Every pair on every task is in ``csv_text``."""
    pairs = result.pairs[result.pairs["protocol"] == protocol]
    runs = result.runs[result.runs["protocol"] == protocol]
    mechanisms = sorted(runs["mechanism"].unique())
    ranked = mechanisms if ranked is None else ranked
    compared = {"target": "the target metric", "area": "the learning-curve area"}
    shows = track_text(protocol, version, track)
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
        (count,) = result.counts[
            (result.counts["protocol"] == protocol) & (result.counts["measure"] == measure)
        ].itertuples()
        ahead, _ = head_to_head(mine, mechanisms)
        n_pairs = len(mechanisms) * (len(mechanisms) - 1) // 2
        told = int(((ahead + ahead.T) > 0).sum()) // 2
        notes = [
            "Each ranked mechanism against the next one on the board (the leaderboard on the "
            f"target metric); upper: the higher-ranked. {PAIRS_APART}: the tasks on which the "
            "pair separates, of those both ran (untested: the rules could not call them: "
            f"fewer than {MIN_SEEDS} seeds in common, an lr alone at its grid's edge, or no "
            "value or standard error stored); then the tasks on which each is ahead.",
            rules[measure],
            _count_note(count),
            f"Pairs of mechanisms told apart by at least one task: {told} of {n_pairs}. Every "
            "pair on every task, and why a pair does not separate: separation.csv; every pair "
            "head to head: separation.png.",
        ]
        if measure == "target":
            notes.insert(2, target_note(runs))
        title = f"Decisive pairs on {compared[measure]}, {shows}"
        result_grids.append(decisive_grid(mine, ranked, title, notes))
    return result_grids


CSV_COLUMNS = ["category", "task", "a", "b", "measure", "seeds", "difference", "separated",
               "ahead", "reason"]  # fmt: skip


def csv_text(result: Separation, protocol: str) -> str:
    """Every pair on every task of one protocol, both measures, as CSV: the full data the
    Markdown's short table is drawn from (``reason``: why a pair does not separate, empty
    where it does)."""
    pairs = result.pairs[result.pairs["protocol"] == protocol][CSV_COLUMNS]
    return pairs.to_csv(index=False, float_format="%.6g", lineterminator="\n")
