"""How much each task tells mechanisms apart: per task and track, the pairs of mechanisms it
separates, and whether it sits at the ceiling or the floor (``synthbench audit
--informative``; issue 70's calibration, and benchmarks/recipe_panel.py's panel).

The rule, one place for both: a cell is a (task, mechanism) with at least ``MIN_SEEDS`` seeds;
its score per seed is the test value of the task's target metric at the selected lr. Its
interval is a 95% one around the seed mean, ``Z95`` standard errors of a mean over the n seeds
whose variance holds both the seeds' spread and each run's finite test set:

    half-width = 1.96 sqrt((var_seeds + mean(se_run^2)) / n)

(``se_run``: the row's ``<target_metric>_se``; where older rows lack it, 0). Two cells are
*separated* when their means differ by at least ``MIN_DIFFERENCE`` (0.05, as the reports'
separation rule) and by more than their two half-widths added. Unlike the reports' rule
(synthbench/report/separation.py) it needs no common seeds and no lr off the grid's edge: it
asks only whether the two means are told apart, with all the noise counted.

A task sits at the *ceiling* (or the *floor*) of a track when ``BOUND_COUNT`` (10) or more of
its mechanisms have a mean within ``BOUND_MARGIN`` (0.02) of 1.0 (or of the task's chance, or
below it): it says nothing about them there. A task scored over its ladder (docs/TASKS.md,
"Ladders") is one cell per mechanism whose values are its levels (report/aggregate.py), so
its interval holds the spread across levels; ``top_ceiling`` counts the mechanisms at the
ceiling of its hardest level alone (issue 70: fewer than 10 of 12 there). The floor
mechanism ``none`` is a control: it is in no pair and no count. A control task (registered
``control=True``: bigram needs no token mixing) is listed but left out of a track's share of
pairs separated.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from itertools import combinations
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import pyarrow.parquet as pq

from synthbench.report import reference
from synthbench.report.aggregate import LEVEL, prepare_rows, protocol_track, selected_runs
from synthbench.report.separation import MIN_DIFFERENCE, TOLERANCE

Z95 = 1.96
MIN_SEEDS = 2
BOUND_MARGIN, BOUND_COUNT = 0.02, 10
CONTROLS = ("none",)  # no token mixing: the floor of every task, compared with nothing


class Interval(NamedTuple):
    mean: float
    half_width: float


def interval(values: pd.Series, ses: pd.Series) -> Interval:
    """A cell's seed mean and the half-width of its 95% interval (module docstring): the
    values of its seeds and each one's test-set standard error."""
    n = len(values)
    spread = float(values.var(ddof=1)) if n > 1 else 0.0
    test_noise = float((ses.fillna(0.0) ** 2).mean())
    return Interval(float(values.mean()), Z95 * math.sqrt((spread + test_noise) / n))


def separated(a: Interval, b: Interval) -> bool:
    """Whether two cells' means differ by at least MIN_DIFFERENCE and by more than their
    two half-widths added."""
    gap = abs(a.mean - b.mean)
    return gap >= MIN_DIFFERENCE - TOLERANCE and gap > a.half_width + b.half_width


def cell_intervals(runs: pd.DataFrame, value: str = "value") -> dict[str, Interval]:
    """Mechanism -> its interval, over the runs of one task (one row per seed: ``value``
    and ``se``), for the mechanisms with at least MIN_SEEDS seeds."""
    return {
        mech: interval(cell[value], cell["se"])
        for mech, cell in runs.groupby("mechanism", sort=True)
        if len(cell) >= MIN_SEEDS
    }


def separated_pairs(runs: pd.DataFrame, value: str = "value") -> dict[str, int]:
    """Per task: how many pairs of its cells are separated. ``runs``: one row per (task,
    mechanism, seed) with ``value`` and ``se``."""
    return {
        task: sum(separated(a, b) for a, b in combinations(cell_intervals(part, value).values(), 2))
        for task, part in runs.groupby("task", sort=True)
    }


def informativeness(rows: pd.DataFrame, tasks: Iterable[str] | None = None) -> pd.DataFrame:
    """One row per (protocol, version, task) of stored ``rows`` (every lr row, as stored):
    protocol, version, track, task, mechanisms (cells of MIN_SEEDS or more seeds, controls
    aside), pairs, separated, ceiling and floor (how many of those cells are there), bound
    ("ceiling", "floor" or ""), control (a control task), levels (a laddered task's, else 0)
    and top_ceiling (of those cells, the mechanisms within BOUND_MARGIN of 1.0 on the
    ladder's hardest level; the cell's ceiling count where it has no ladder). ``tasks``:
    only those (canonical names; variants of them too). Raises ValueError (one line) where
    no task has two such cells."""
    runs = selected_runs(prepare_rows(rows), "target")
    runs = runs[~runs["mechanism"].isin(CONTROLS)]
    if tasks is not None:
        wanted = set(tasks)
        runs = runs[runs["task"].map(lambda t: t.split(" (")[0] in wanted)]
    records = []
    for (protocol, version, task), part in runs.groupby(
        ["protocol", "protocol_version", "task"], sort=True
    ):
        cells = cell_intervals(part)
        if len(cells) < 2:
            continue
        chance = float(part["chance"].mean())
        means = [c.mean for c in cells.values()]
        ceiling = sum(m >= 1.0 - BOUND_MARGIN for m in means)
        floor = sum(m <= chance + BOUND_MARGIN for m in means) if chance == chance else 0
        bound = "ceiling" if ceiling >= BOUND_COUNT else "floor" if floor >= BOUND_COUNT else ""
        levels = sorted(set(part[LEVEL]) - {""})
        top = part[part[LEVEL] == max(levels, key=_level_number)] if levels else part
        top_means = top[top["mechanism"].isin(cells)].groupby("mechanism")["value"].mean()
        records.append(
            {
                "protocol": str(protocol),
                "version": int(version),
                "track": protocol_track(rows[rows["protocol"] == protocol]),
                "task": str(task),
                "mechanisms": len(cells),
                "pairs": math.comb(len(cells), 2),
                "separated": sum(separated(a, b) for a, b in combinations(cells.values(), 2)),
                "ceiling": ceiling,
                "floor": floor,
                "bound": bound,
                "control": _control_task(str(task)),
                "levels": len(levels),
                "top_ceiling": int((top_means >= 1.0 - BOUND_MARGIN).sum()),
            }
        )
    if not records:
        raise ValueError(
            f"no task holds 2 or more mechanisms (besides {', '.join(CONTROLS)}) with "
            f"{MIN_SEEDS} or more successful seeds each: nothing to count"
        )
    return pd.DataFrame(records)


def _level_number(level: str) -> int:
    """L3 -> 3: ladder levels in order of difficulty (``Ladder.levels``)."""
    return int(level.removeprefix("L"))


def _control_task(task: str) -> bool:
    """Whether ``task`` (a name, or a variant ``name (k=v)``) is a registered control task."""
    from synthbench.core.task import TASKS

    name = task.split(" (")[0]
    return name in TASKS and bool(TASKS.entry(name).metadata.get("control"))


def summary(table: pd.DataFrame) -> list[str]:
    """One line per (protocol, version): the share of pairs separated over its tasks
    (control tasks aside), the tasks that separate none, and those at the ceiling or the
    floor."""
    lines = []
    for (protocol, version, track), every in table.groupby(
        ["protocol", "version", "track"], sort=True
    ):
        part = every[~every["control"]]
        share = part["separated"].sum() / part["pairs"].sum() if len(part) else math.nan
        silent = part.loc[part["separated"] == 0, "task"].tolist()
        controls = every.loc[every["control"], "task"].tolist()
        aside = f" ({', '.join(controls)}, control, aside)" if controls else ""
        line = (
            f"{protocol} v{version} ({track} track): {part['separated'].sum()} of "
            f"{part['pairs'].sum()} pairs separated ({share:.0%}) over {len(part)} tasks{aside}"
        )
        line += f"; separating none: {', '.join(silent) or 'no task'}"
        for bound in ("ceiling", "floor"):
            at = part.loc[part["bound"] == bound, "task"].tolist()
            line += f"; at the {bound}: {', '.join(at) or 'no task'}"
        lines.append(line)
    return lines


def markdown(table: pd.DataFrame) -> str:
    """The table, one row per (protocol, version, task)."""
    head = (
        "| protocol | track | task | mechanisms | pairs separated | at ceiling | at floor | "
        "bound | levels | top level at ceiling |\n"
        "|---|---|---|---:|---:|---:|---:|---|---:|---:|\n"
    )
    body = "".join(
        f"| {r.protocol} v{r.version} | {r.track} | {r.task}{' (control)' if r.control else ''} | "
        f"{r.mechanisms} | "
        f"{r.separated} of {r.pairs} | {r.ceiling} | {r.floor} | {r.bound or '-'} | "
        f"{r.levels or '-'} | {r.top_ceiling if r.levels else '-'} |\n"
        for r in table.itertuples()
    )
    return head + body


def reference_rows(path: str | Path | None = None) -> tuple[pd.DataFrame, str]:
    """Every row of the reference file (``path``, else the file ``reference.load`` reads:
    $SYNTHBENCH_REFERENCE or the shipped one) as it is stored, whatever its suite and protocol
    versions: the audit counts an outdated reference too, saying which versions
    (``versions_note``), where a report would not show it. ValueError (one line) where the
    file is absent or unreadable."""
    if path is None and os.environ.get(reference.ENV):
        path = os.environ[reference.ENV]
    source = reference.shipped_file() if path is None else Path(path)
    if not source.is_file():
        raise ValueError(f"no reference file at {source}")
    try:
        with source.open("rb") as handle:
            rows = pq.read_table(handle).to_pandas()
    except Exception as exc:  # anything pyarrow raises on a file that is not Parquet
        raise ValueError(f"cannot read the reference {source}: {exc}") from exc
    missing = [c for c in ("protocol", "protocol_version", "task", "mechanism") if c not in rows]
    if missing:
        raise ValueError(f"the reference {source} lacks the columns {', '.join(missing)}")
    return rows, str(source)


def versions_note(rows: pd.DataFrame) -> str:
    """Which protocol versions the rows hold, and whether this synthbench runs others, e.g.
    ``quick v5, quick-block v3 (this synthbench runs quick v6, quick-block v4)``."""
    from synthbench.run.protocols import PROTOCOLS

    held = (
        rows[["protocol", "protocol_version"]]
        .drop_duplicates()
        .sort_values(["protocol", "protocol_version"])
    )
    pairs = [(str(p), int(v)) for p, v in held.itertuples(index=False)]
    text = ", ".join(f"{p} v{v}" for p, v in pairs)
    here = [
        f"{p} v{PROTOCOLS.get(p).version}"
        for p in dict.fromkeys(p for p, _ in pairs)
        if p in PROTOCOLS and (p, PROTOCOLS.get(p).version) not in pairs
    ]
    return f"{text} (this synthbench runs {', '.join(here)})" if here else text
