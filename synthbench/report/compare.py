"""Published results shipped with synthbench, and our results beside them.

Each entry names a data file under synthbench/data/ (its header cites the source) and the
protocol whose rows are comparable with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import pandas as pd

from synthbench.core.task import TASKS
from synthbench.core.text import did_you_mean, plural
from synthbench.report.tables import MISSING, Grid, ReportTables, Stat


@dataclass(frozen=True)
class Published:
    name: str
    data_file: str
    protocol: str  # our protocol that mirrors the published setup
    source: str
    n_seeds: int
    metric: str = "token_acc"  # ours is compared on this metric, whatever the report's


PUBLISHED = {
    "slay-paper": Published(
        "slay-paper",
        "slay_paper_table8.csv",
        "slay-paper",
        "SLAY paper (seeds/001, long version), Appendix Table 8",
        3,
    )
}


# not a table of ours beside theirs: rank correlations with published language-model quality
# (synthbench/report/published_lm.py), one file per protocol under --out
PUBLISHED_LM = "published-lm"
COMPARISONS = (*PUBLISHED, PUBLISHED_LM)  # every name `report --compare` takes


def check_comparison(name: str | None) -> None:
    """Refuse (ValueError, one line) a name ``--compare`` does not know, with the close
    matches where there are any."""
    if name is None or name in COMPARISONS:
        return
    raise ValueError(
        f"unknown comparison '{name}'{did_you_mean(name, COMPARISONS)} "
        f"(known: {', '.join(COMPARISONS)})"
    )


def published(name: str) -> pd.DataFrame:
    """The published values: task, mechanism (our name), paper_label, mean, std."""
    if name not in PUBLISHED:
        raise ValueError(
            f"unknown published results {name!r}{did_you_mean(name, PUBLISHED)} "
            f"({', '.join(PUBLISHED)})"
        )
    with resources.files("synthbench.data").joinpath(PUBLISHED[name].data_file).open() as f:
        return pd.read_csv(f, comment="#")


def comparison_grid(tables: ReportTables, name: str) -> Grid:
    """Rows: the tasks of both, by category; per published mechanism three columns: ours
    (mean ± std), the published value and the difference ours - published. ``tables`` must
    be of the published metric (``PUBLISHED[name].metric``)."""
    info, paper = PUBLISHED[name], published(name)
    mechanisms = list(dict.fromkeys(paper["mechanism"]))
    ours = {
        (task, m): v
        for (category, task), row in zip(tables.full.rows, tables.full.cells, strict=True)
        for m, v in zip(tables.full.columns, row, strict=True)
    }
    theirs = {
        (r.task, r.mechanism): Stat(float(r.mean), float(r.std), info.n_seeds)
        for r in paper.itertuples()
    }
    category = {task: cat for cat, task in tables.full.rows}
    for task in paper["task"]:
        category.setdefault(task, TASKS.entry(task).metadata["category"])
    order = {c: i for i, c in enumerate(dict.fromkeys(c for c, _ in tables.full.rows))}
    rows = sorted(
        {(category[t], t) for t in {t for t, _ in ours} | set(paper["task"])},
        key=lambda ct: (order.get(ct[0], len(order)), ct[1]),
    )
    columns, cells = [], [[] for _ in rows]
    for m in mechanisms:
        columns += [f"{m} ours", f"{m} paper", f"{m} Δ"]
        for i, (_, task) in enumerate(rows):
            mine, published_value = ours.get((task, m)), theirs.get((task, m))
            difference = (
                f"{mine.mean - published_value.mean:+.2f}"
                if isinstance(mine, Stat) and published_value is not None
                else MISSING
            )
            cells[i] += [mine, published_value, difference]
    notes = [
        f"ours: protocol {tables.protocol} v{tables.protocol_version}, {tables.metric}, mean ± "
        f"std over {plural(tables.n_seeds, 'seed')}; paper: {info.source}, mean ± std over "
        f"{info.n_seeds} seeds as printed (two decimals); Δ = ours - paper.",
        f"{MISSING}: not run by us, or no value in the paper (bigram failed for every "
        "mechanism there). Our tasks are posed so that every answer follows from its causal "
        "prefix (docs/TASKS.md); several of the paper's are not, so differences are expected.",
    ]
    return Grid(
        f"Ours beside {info.source}",
        ["category", "task"],
        rows,
        columns,
        cells,
        tables.n_seeds,
        best=None,
        notes=notes,
        digits=2,
    )
