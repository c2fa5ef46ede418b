"""The report's tables, whatever their output format: one ``Grid`` per table.

For one protocol and one metric, three kinds of table (the layouts of the SLAY paper):

- the full table: tasks grouped by category as rows, mechanisms as columns (001 Table 8);
- one table per category: mechanisms as rows, the category's tasks as columns (000 Tables 3-9);
- the category averages, split into core capabilities and higher-level behaviour (001 Table 3).

Only the row each run selected (its best lr on the validation set) counts
(synthbench/report/aggregate.py). A cell with no successful run is shown as ``--`` and
counted in a footnote, never as 0. One table holds one protocol, always: rows of several
protocols are split, one set of tables each. synthbench/report/formats.py writes a Grid as
Markdown or LaTeX.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from synthbench.core.task import CATEGORIES
from synthbench.core.text import plural
from synthbench.report.aggregate import (
    CHANCE_COLUMN,
    DEFAULT_METRIC,
    aggregate_runs,
    check_metric,
    prepare_rows,
    protocol_track,
    run_outcomes,
    selected_runs,
    stored_states,
)
from synthbench.report.reference import SUFFIX as REFERENCE_SUFFIX
from synthbench.run.lr_selection import KNIFE_EDGE
from synthbench.run.schema import LEAKY

MISSING = "--"
# the clause of a note that says the best is bold ("; best in bold ..."): printed only where
# a cell is bold (``Grid.shown_notes``), never under a table of one mechanism
BEST_IN_BOLD = "best in bold (of the cells with 2 seeds or more)"
CORE = ("Basic", "Arithmetic", "Long-Range", "Memory")
HIGHER_LEVEL = ("Patterns", "Reasoning", "Robustness")
CATEGORY_ORDER = {c: i for i, c in enumerate(CATEGORIES)}


@dataclass(frozen=True)
class Stat:
    """A mean and standard deviation over ``n`` seeds."""

    mean: float
    std: float
    n: int


Cell = Stat | str | None  # None: no successful run; str: shown as it is (e.g. a difference)


@dataclass
class Grid:
    """One table, whatever its output format. ``best`` bolds the highest mean per
    ``"column"`` or per ``"row"`` (or ``None``) of the cells with 2 seeds or more (one seed
    is never bold: it has no spread to be best beyond); ``n_seeds`` is the number a full cell
    has (a cell with fewer says how many)."""

    title: str
    row_headers: list[str]  # the label columns, e.g. ["category", "task"]
    rows: list[tuple[str, ...]]
    columns: list[str]
    cells: list[list[Cell]]
    n_seeds: int
    best: str | None = "column"
    notes: list[str] = field(default_factory=list)
    digits: int = 3
    # the LaTeX column types of the value columns (default: each centred, "c"); a "p{4cm}"
    # wraps a long text cell at that width
    latex_columns: str | None = None

    def best_cells(self) -> set[tuple[int, int]]:
        def top(positions):
            means = {
                p: round(self.cells[p[0]][p[1]].mean, self.digits)
                for p in positions
                if isinstance(self.cells[p[0]][p[1]], Stat) and self.cells[p[0]][p[1]].n > 1
            }
            high = max(means.values(), default=None)
            return {p for p, m in means.items() if m == high} if len(positions) > 1 else set()

        n_rows, n_cols = len(self.rows), len(self.columns)
        if self.best == "column":
            return set().union(*(top([(i, j) for i in range(n_rows)]) for j in range(n_cols)))
        if self.best == "row":
            return set().union(*(top([(i, j) for j in range(n_cols)]) for i in range(n_rows)))
        return set()

    def shown_notes(self) -> list[str]:
        """The notes as printed: without the clause that says the best is bold
        (``BEST_IN_BOLD``) where no cell is (a single mechanism, or no value at all)."""
        if self.best_cells():
            return list(self.notes)
        return [note.replace(f"; {BEST_IN_BOLD}", "") for note in self.notes]


@dataclass
class ReportTables:
    """Every table of one protocol version and one metric."""

    protocol: str
    protocol_version: int
    metric: str
    n_seeds: int
    full: Grid
    categories: dict[str, Grid]
    summary: list[Grid]  # core capabilities, higher-level behaviour: chance-normalised
    runs: pd.DataFrame  # one row per successful run (``selected_runs``), variants labelled
    heat: Grid  # the full table's layout, of the score (chance-normalised): the heatmap's
    # per mechanism, the tasks it was refused on as leaky (it sees later positions:
    # synthbench/integrity/causality.py); a leaderboard says so beside its task count
    leaky_tasks: dict[str, int] = field(default_factory=dict)
    track: str = "core"  # synthbench/run/protocols.py: the rule alone, or published layers
    # the runs that diverged at every lr (category, task, mechanism, seed): the leaderboard
    # scores them as no right answer and ranks their mechanism last
    diverged: pd.DataFrame | None = None
    # per mechanism, the state its runs stored (``aggregate.stored_states``): the board's
    # state column, where rows before schema 9 leave it to the registry's declared state
    states: dict[str, int] = field(default_factory=dict)


def _cell(r) -> Stat | None:
    return Stat(float(r.mean), float(r.std), int(r.count)) if r.count > 0 else None


def _missing_note(agg: pd.DataFrame, cells_missing: int) -> list[str]:
    """Footnotes counting the failed runs left out of a table built from ``agg`` and what
    its ``--`` cells stand for."""
    notes = []
    diverged, raised = int(agg["diverged"].sum()), int(agg["error"].sum())
    leaky = int(agg[LEAKY].sum())
    failed = [
        f"{n} {what}"
        for n, what in ((diverged, "diverged"), (raised, "raised"), (leaky, "leaky: not causal"))
        if n
    ]
    if failed:
        notes.append(f"Failed runs left out: {', '.join(failed)}.")
    if cells_missing:
        not_run = cells_missing - int((agg["count"] == 0).sum())
        detail = f", {not_run} of them not run" if not_run else ""
        if not_run and cells_missing == 1:
            detail = ", not run"
        notes.append(
            f"{MISSING}: no successful run ({plural(cells_missing, 'cell')}{detail}); never "
            "counted as 0."
        )
    return notes


def sort_tasks(agg: pd.DataFrame) -> list[tuple[str, str]]:
    """The (category, task) pairs of ``agg``, categories in the suite's order, then by name."""
    pairs = set(zip(agg["category"], agg["task"], strict=True))
    return sorted(pairs, key=lambda ct: (CATEGORY_ORDER.get(ct[0], len(CATEGORIES)), ct[1]))


def track_text(protocol: str, version: int, track: str) -> str:
    """How a table names what it shows: ``protocol quick-block v1 (block track)``."""
    return f"protocol {protocol} v{version} ({track} track)"


def _head_note(
    protocol: str, version: int, track: str, metric: str, n_seeds: int, last: str
) -> str:
    shows = track_text(protocol, version, track)
    if not n_seeds:  # every run of the protocol failed: its tables are all --
        return f"{metric} on the test set: no successful run; {shows}."
    if n_seeds == 1:
        return f"{metric} on the test set, one seed (no spread to show); {shows}; {last}."
    return (
        f"{metric} on the test set, mean ± std over {plural(n_seeds, 'seed')} (a cell with "
        f"fewer says n=, and one with a single seed shows no ± std); {shows}; {last}."
    )


def score_note(metric: str) -> str:
    """What the score of ``metric`` is (category averages, leaderboard, heatmap): one
    sentence, the same in every output."""
    if metric in CHANCE_COLUMN:
        return (
            f"Chance-normalised: (accuracy - chance) / (1 - chance), chance the best constant "
            f"answer per position (synthbench audit; {CHANCE_COLUMN[metric]}): 0 is chance, 1 "
            "perfect, below 0 worse than chance."
        )
    return f"Raw {metric}, not chance-normalised: no chance is known at the longer length."


def seeds_text(counts: pd.DataFrame, what: str = "mean") -> str:
    """The seeds a figure's values are taken over, for its title: ``counts`` holds a row per
    value shown (mechanism, seeds). "mean over 3 seeds", "mean over 1 to 3 seeds", or, with
    the reference's runs beside yours, "mean over 1 seed (yours), 2 to 3 seeds (reference)":
    a title never claims more seeds than a value has."""

    def span(seeds: pd.Series) -> str:
        low, high = int(seeds.min()), int(seeds.max())
        return plural(high, "seed") if low == high else f"{low} to {high} seeds"

    if counts.empty:
        return f"{what} over no seed"
    reference = counts["mechanism"].astype(str).str.endswith(REFERENCE_SUFFIX)
    if reference.all() or not reference.any():
        return f"{what} over {span(counts['seeds'])}"
    yours, theirs = span(counts["seeds"][~reference]), span(counts["seeds"][reference])
    return f"{what} over {yours} (yours), {theirs} (reference)"


def target_note(runs: pd.DataFrame) -> str:
    """Which metric ``target`` is on which tasks of ``runs`` (``selected_runs``)."""
    by_metric = runs.groupby("metric")["task"].unique()
    if len(by_metric) == 1:
        return f"target: {by_metric.index[0]} on every task."
    parts = [f"{m} on {', '.join(sorted(t))}" for m, t in by_metric.items() if m != "token_acc"]
    return f"target: {'; '.join(parts)}; token_acc on the others."


def full_grid(agg: pd.DataFrame, head: list[str], n_seeds: int) -> Grid:
    mechanisms = sorted(agg["mechanism"].unique())
    tasks = sort_tasks(agg)
    lookup = {(r.category, r.task, r.mechanism): _cell(r) for r in agg.itertuples()}
    cells = [[lookup.get((c, t, m)) for m in mechanisms] for c, t in tasks]
    missing = sum(v is None for row in cells for v in row)
    return Grid(
        "All tasks",
        ["category", "task"],
        tasks,
        mechanisms,
        cells,
        n_seeds,
        best="row",
        notes=[*head, *_missing_note(agg, missing)],
    )


def lr_text(lr: float, edge: bool, knife_edge: bool = False) -> str:
    if pd.isna(lr):
        return "?"
    return f"{lr:.2g}{'*' if edge else ''}{'!' if knife_edge else ''}"


def lr_grid(runs: pd.DataFrame, protocol: str, version: int, track: str = "core") -> Grid:
    """The lr each seed selected (``runs``: ``selected_runs`` of one protocol), tasks by
    category as rows, mechanisms as columns: what each score in the other tables was
    trained at."""
    tasks = sort_tasks(runs)
    mechanisms = sorted(runs["mechanism"].unique())
    chosen = {
        (c, t, m): ", ".join(lr_text(r.lr, r.lr_edge, r.knife_edge) for r in part.itertuples())
        for (c, t, m), part in runs.sort_values("seed").groupby(["category", "task", "mechanism"])
    }
    return Grid(
        f"Selected learning rates ({track_text(protocol, version, track)})",
        ["category", "task"],
        tasks,
        mechanisms,
        [[chosen.get((c, t, m)) for m in mechanisms] for c, t in tasks],
        0,
        best=None,
        notes=[
            "The lr each seed's run selected on the validation set (seeds in increasing "
            "order); *: alone at an edge of its grid, so the optimum may lie beyond; !: a "
            f"knife-edge, it beat every other lr it tried by more than {KNIFE_EDGE:g}, so the "
            "verdict hangs on that one lr.",
            "--: no successful run.",
        ],
    )


def category_grid(agg: pd.DataFrame, category: str, head: list[str], n_seeds: int) -> Grid:
    part = agg[agg["category"] == category]
    mechanisms = sorted(agg["mechanism"].unique())  # every mechanism of the report
    tasks = [t for _, t in sort_tasks(part)]
    lookup = {(r.task, r.mechanism): _cell(r) for r in part.itertuples()}
    cells = [[lookup.get((t, m)) for t in tasks] for m in mechanisms]
    missing = sum(v is None for row in cells for v in row)
    return Grid(
        category,
        ["mechanism"],
        [(m,) for m in mechanisms],
        tasks,
        cells,
        n_seeds,
        notes=[*head, *_missing_note(part, missing)],
    )


def category_scores(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (mechanism, category, seed): the mean ``score`` over the category's tasks, for the
    seeds that have a score (a successful run, and a known chance) on every task of the
    category (in the report)."""
    tasks_in = runs.groupby("category")["task"].nunique()
    per_seed = runs.groupby(["mechanism", "category", "seed"])["score"].agg(["mean", "count"])
    complete = per_seed["count"] == per_seed.index.get_level_values("category").map(tasks_in)
    return per_seed[complete]["mean"].rename("score").reset_index()


def stat_over_seeds(values: pd.Series) -> Stat:
    """mean, std (ddof 1; 0 for one value) and count of ``values``."""
    std = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    return Stat(float(values.mean()), std, len(values))


def summary_grids(
    runs: pd.DataFrame,
    mechanisms: list[str],
    n_seeds: int,
    head: list[str],
    categories: list[str] | None = None,
):
    """The category averages of 001 Table 3, (a) core and (b) higher-level, each with the
    average over its categories; mean ± std over seeds of the per-seed averages of the
    score (chance-normalised, ``selected_runs``). ``categories``: those of the report (a
    category without a successful run has ``--``; default: those of ``runs``)."""
    scores = category_scores(runs)
    categories = set(runs["category"]) | set(categories or ())
    grids = []
    for title, group in (
        ("Core capabilities", CORE),
        ("Higher-level behaviour", HIGHER_LEVEL),
    ):
        present = [c for c in group if c in categories]
        if not present:
            continue
        part = scores[scores["category"].isin(present)]
        # the group average, per seed, where the seed has every category of the group
        wide = part.pivot_table(index=["mechanism", "seed"], columns="category", values="score")
        average = wide.dropna().mean(axis=1).rename("score").reset_index()
        columns = [*present, "average"]
        stats = {
            (m, c): stat_over_seeds(v)
            for (m, c), v in part.groupby(["mechanism", "category"])["score"]
        }
        stats |= {
            (m, "average"): stat_over_seeds(v) for m, v in average.groupby("mechanism")["score"]
        }
        cells = [[stats.get((m, c)) for c in columns] for m in mechanisms]
        notes = list(head)
        if any(v is None for row in cells for v in row):
            notes.append(
                f"{MISSING}: some task of the category has no successful run (or no known "
                "chance), so it has no average."
            )
        grids.append(
            Grid(
                title,
                ["mechanism"],
                [(m,) for m in mechanisms],
                columns,
                cells,
                n_seeds,
                notes=notes,
            )
        )
    return grids


def build_tables(rows: pd.DataFrame, metric: str = DEFAULT_METRIC) -> list[ReportTables]:
    """Every table, one set per protocol. ``rows`` must hold one version per protocol
    (see ``latest_versions``)."""
    versions = rows.groupby("protocol")["protocol_version"].unique()
    mixed = [name for name, found in versions.items() if len(found) > 1]
    if mixed:
        raise ValueError(f"rows mix several versions of protocol {', '.join(mixed)}; keep one")
    labelled = check_metric(prepare_rows(rows), metric)
    runs_all = selected_runs(labelled, metric)
    agg_all = aggregate_runs(labelled, runs_all)
    # the same layout of the score (chance-normalised), for the heatmap
    scores_all = aggregate_runs(labelled, runs_all.assign(value=runs_all["score"]))
    result = []
    outcomes = run_outcomes(labelled)
    for protocol, agg in agg_all.groupby("protocol", sort=True):
        version = int(versions[protocol][0])
        track = protocol_track(labelled[labelled["protocol"] == protocol])
        n_seeds = int(agg["count"].max())
        runs = runs_all[runs_all["protocol"] == protocol]
        target = [target_note(runs)] if metric == "target" and len(runs) else []
        raw = (
            "Raw accuracy, not chance-normalised (the category averages, the heatmap and the "
            "leaderboard are)."
            if metric in CHANCE_COLUMN
            else score_note(metric)
        )
        head = [
            _head_note(str(protocol), version, track, metric, n_seeds, BEST_IN_BOLD),
            raw,
            *target,
        ]
        averages_head = [
            _head_note(
                str(protocol),
                version,
                track,
                metric,
                n_seeds,
                "category mean over its tasks, per seed",
            ),
            score_note(metric),
            *target,
        ]
        mechanisms = sorted(agg["mechanism"].unique())
        present = [c for c in CATEGORIES if c in set(agg["category"])]
        present += sorted(set(agg["category"]) - set(present))  # a plugin's own category
        scores = scores_all[scores_all["protocol"] == protocol]
        result.append(
            ReportTables(
                str(protocol),
                version,
                metric,
                n_seeds,
                full_grid(agg, head, n_seeds),
                {c: category_grid(agg, c, head, n_seeds) for c in present},
                summary_grids(runs, mechanisms, n_seeds, averages_head, present),
                runs,
                full_grid(scores, [score_note(metric), *target], n_seeds),
                {
                    str(m): int(n)
                    for m, n in (agg[LEAKY] > 0).groupby(agg["mechanism"]).sum().items()
                    if n
                },
                track,
                outcomes[(outcomes["protocol"] == protocol) & (outcomes["status"] == "diverged")],
                stored_states(labelled[labelled["protocol"] == protocol], track),
            )
        )
    return result
