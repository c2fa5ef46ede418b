"""Reports from stored rows: the paper's tables as Markdown and LaTeX.

For one protocol and one metric, three kinds of table (the layouts of the SLAY paper):

- the full table: tasks grouped by category as rows, mechanisms as columns (001 Table 8);
- one table per category: mechanisms as rows, the category's tasks as columns (000 Tables 3-9);
- the category averages, split into core capabilities and higher-level behaviour (001 Table 3).

Only the row each run selected (its best lr on the validation set) counts. A cell with no
successful run is shown as ``--`` and counted in a footnote, never as 0. One table holds
one protocol, always: rows of several protocols are split, one set of tables each.

The full and per-category tables show raw accuracy; the category averages (and the
leaderboard and heatmap built from the same runs) show the chance-normalised score
(accuracy - chance) / (1 - chance), so that a task whose best constant answer already scores
0.5 does not weigh more than one where it scores 0.01.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from tabulate import tabulate

from synthbench.grid import protocol_changes
from synthbench.protocols import PROTOCOLS
from synthbench.store import LEAKY
from synthbench.task import CATEGORIES, TASKS
from synthbench.text import plural

# target: per row, the metric its task is scored by (token_acc, or free_token_acc for a chain
# of steps); long_*: the test set at --eval-length-mult times the trained length
METRICS = (
    "target",
    "token_acc",
    "exact_match",
    "free_token_acc",
    "long_token_acc",
    "long_exact_match",
)
DEFAULT_METRIC = "target"
# The stored chance each metric is normalised by. The audit measures chance at the trained
# length only, so the long_* metrics have none and stay raw.
CHANCE_COLUMN = {
    "target": "chance_token_acc",
    "token_acc": "chance_token_acc",
    "free_token_acc": "chance_token_acc",
    "exact_match": "chance_exact_match",
}
MISSING = "--"
# the clause of a note that says the best is bold ("; best in bold"): printed only where a
# cell is bold (``Grid.shown_notes``), never under a table of one mechanism
BEST_IN_BOLD = "best in bold"
CORE = ("Basic", "Arithmetic", "Long-Range", "Memory")
HIGHER_LEVEL = ("Patterns", "Reasoning", "Robustness")
CATEGORY_ORDER = {c: i for i, c in enumerate(CATEGORIES)}


# -- rows -> one value per run --------------------------------------------------------------


def _label_variants(rows: pd.DataFrame, column: str, sources: list[str], params) -> pd.DataFrame:
    """Rename the rows of each ``column`` value that holds several parameter sets to
    ``name (k=v, ...)``, with the keys in which its variants differ. ``params(values)`` maps a
    row's ``sources`` values to its parameter dict and the keys to show even when there is a
    single variant; it runs once per distinct combination, not per row."""
    sources = [c for c in sources if c in rows]
    keys = rows[[column, *sources]].astype(str)
    combos = keys.drop_duplicates()
    parsed = {tuple(c): params(dict(zip(sources, c[1:], strict=True))) for c in combos.values}
    labels = {}
    for name, part in combos.groupby(column):
        found = {tuple(c): parsed[tuple(c)] for c in part.values}
        distinct = {json.dumps(p, sort_keys=True, default=str): p for p, _ in found.values()}
        names = sorted(set().union(*distinct.values()))
        # a key differs when the variants that have it disagree on it (a rotation's
        # rotate_fraction, say, is absent from a learned-position variant: not a difference)
        differing = {k for k in names if len({repr(p[k]) for p in distinct.values() if k in p}) > 1}
        for combo, (variant, shown) in found.items():
            label = ", ".join(
                f"{k}={variant[k]}" for k in names if k in variant and k in differing | shown
            )
            labels[combo] = f"{name} ({label})" if label else name
    rows[column] = [labels[tuple(c)] for c in keys.values]
    return rows


def _task_variant(values: dict) -> tuple[dict, set]:
    params = json.loads(_text_or(values.get("task_params"), "{}"))
    return params | _plugin_code(json.loads(_text_or(values.get("config"), "{}")), "task"), set()


def _plugin_code(config: dict, kind: str) -> dict:
    """{"code": hash} of a plugin task or mechanism (spec.RunSpec.plugin_code): runs of its
    code before and after an edit are separate variants, never seeds of one."""
    code = config.get("plugin_code", {}).get(kind)
    return {} if code is None else {"code": code}


def _text_or(value: str | None, default: str) -> str:
    """``value``, or ``default`` for a null one (None, NaN, or that as text)."""
    return default if not isinstance(value, str) or value in ("None", "nan", "") else value


JSON_COLUMNS = ("task_params", "mechanism_params", "config")  # JSON objects, or null


def malformed_json(rows: pd.DataFrame) -> pd.Series:
    """Per row, the first of its ``JSON_COLUMNS`` that is not a JSON object (None where
    every one is): the reports parse them, so such a row (a file edited by hand) is left out
    by the caller, which knows the file."""
    found = pd.Series(None, index=rows.index, dtype=object)
    for column in (c for c in JSON_COLUMNS if c in rows):
        bad = set()
        for value in rows[column].dropna().unique():
            try:
                if not isinstance(json.loads(_text_or(value, "{}")), dict):
                    bad.add(value)
            except (TypeError, ValueError):
                bad.add(value)
        found[found.isna() & rows[column].isin(bad)] = column
    return found


def _preset_pos(protocol: str) -> str | None:
    return PROTOCOLS.get(protocol).pos if protocol in PROTOCOLS else None


def _mechanism_variant(values: dict) -> tuple[dict, set]:
    """Mechanism parameters plus the positional encoding, which is always shown when it is
    not the protocol's own (``run --pos``)."""
    params = json.loads(_text_or(values.get("mechanism_params"), "{}"))
    config = json.loads(_text_or(values.get("config"), "{}"))
    params |= _plugin_code(config, "mechanism")
    # the protocol fields a grid set (run --protocol-param d_model=32,64), in every row of
    # that protocol (label_variants): always shown
    changed = json.loads(_text_or(values.get(GRID_FIELDS), "{}"))
    params |= changed
    pos = config.get("protocol", {}).get("pos")
    if pos is None:
        return params, set(changed)
    params["pos"] = pos
    params |= config.get("pos_params", {})  # a rotation's own (rotate_fraction, base, ...)
    return params, set(changed) | ({"pos"} if pos != _preset_pos(values["protocol"]) else set())


def prepare_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows as every report reads them: what older schemas lack filled from the registry
    (under the tasks' registered names, so before labelling), then variants labelled."""
    return label_variants(fill_from_registry(rows)) if len(rows) else rows


GRID_FIELDS = "_grid_fields"  # a column of label_variants' own


def _grid_fields(rows: pd.DataFrame) -> pd.Series:
    """Per row, as JSON, its values of the protocol fields that a grid changed in any row of
    the same protocol and version: d_model=64 beside the d_model=32 of a width sweep."""
    configs = [json.loads(_text_or(c, "{}")).get("protocol", {}) for c in rows["config"]]
    names = list(rows["protocol"])
    changed: dict[tuple, set] = {}
    for name, config in zip(names, configs, strict=True):
        key = (name, config.get("version"))
        changed.setdefault(key, set()).update(protocol_changes(name, config))
    return pd.Series(
        [
            json.dumps({f: c[f] for f in sorted(changed[(n, c.get("version"))]) if f in c})
            for n, c in zip(names, configs, strict=True)
        ],
        index=rows.index,
    )


def label_variants(rows: pd.DataFrame) -> pd.DataFrame:
    """A task or mechanism run with several parameter sets (or positional encodings, or
    widths of a grid) becomes separate table rows, e.g. ``multihop (hops=1)``,
    ``softmax (pos=rope)`` or ``softmax (d_model=32)``."""
    if rows.empty:
        return rows
    rows = rows.copy()
    if "task_params" in rows:
        rows = _label_variants(rows, "task", ["task_params", "config"], _task_variant)
    if "mechanism_params" in rows or "config" in rows:
        if "config" in rows and "protocol" in rows:
            rows[GRID_FIELDS] = _grid_fields(rows)
        sources = ["mechanism_params", "config", "protocol", GRID_FIELDS]
        rows = _label_variants(rows, "mechanism", sources, _mechanism_variant)
        rows = rows.drop(columns=GRID_FIELDS, errors="ignore")
    return rows


# -- what older rows lack, from the registered task ------------------------------------------


@functools.cache
def _registered_task(name: str, params: str):
    """The registered task ``name`` with the JSON ``params``, or None (not registered here,
    or parameters its current version rejects)."""
    if name not in TASKS:
        return None
    try:
        return TASKS.get(name)(**json.loads(params))
    except (TypeError, ValueError):
        return None


@functools.cache
def _registered_chance(name: str, params: str):
    """audit.chance of a registered task (a fraction of a second each: cached per task and
    parameters), or None."""
    from synthbench.audit import chance  # torch: only where a row lacks its chance

    task = _registered_task(name, params)
    return None if task is None else chance(task)


_CHANCES = {"chance_token_acc": "token_acc", "chance_exact_match": "exact_match"}


def _task_keys(rows: pd.DataFrame) -> pd.Series:
    """(task, canonical JSON of its parameters) per row."""
    params = rows["task_params"] if "task_params" in rows else pd.Series(None, index=rows.index)
    canonical = [json.dumps(json.loads(_text_or(p, "{}")), sort_keys=True) for p in params]
    return pd.Series(list(zip(rows["task"], canonical, strict=True)), index=rows.index)


def fill_from_registry(rows: pd.DataFrame, chance: bool = True) -> pd.DataFrame:
    """``target_metric`` and (with ``chance``) ``chance_token_acc`` and
    ``chance_exact_match`` as stored or, where a row of an older schema has them null, from
    its registered task: its ``target_metric`` and ``audit.chance``. A task not registered
    here gets token_acc and no chance (NaN)."""
    rows = rows.copy()
    columns = ["target_metric", *(_CHANCES if chance else ())]
    for column in columns:
        if column not in rows:
            rows[column] = None
    for column in columns[1:]:
        rows[column] = pd.to_numeric(rows[column]).astype(float)
    lacking = rows[columns].isna()
    if not lacking.any().any():
        return rows
    keys = _task_keys(rows)
    need = lacking["target_metric"]
    tasks = [_registered_task(*key) for key in keys[need]]
    rows["target_metric"] = rows["target_metric"].astype(object)
    rows.loc[need, "target_metric"] = [t.target_metric if t else "token_acc" for t in tasks]
    for column in columns[1:]:
        need = lacking[column]
        chances = [_registered_chance(*key) for key in keys[need]]
        rows.loc[need, column] = [getattr(c, _CHANCES[column]) if c else np.nan for c in chances]
    return rows


def metric_column(rows: pd.DataFrame, metric: str) -> pd.Series:
    """Per row, the column its ``metric`` is read from: the row's ``target_metric`` for
    target (rows filled by ``fill_from_registry``), else the metric itself."""
    if metric == "target":
        return rows["target_metric"].astype(str)
    return pd.Series(metric, index=rows.index)


def metric_values(rows: pd.DataFrame, metric: str) -> pd.Series:
    """Per row, the value of ``metric``: for target, that of the row's task's target metric."""
    rows = fill_from_registry(rows, chance=False)
    return _per_row(rows, metric_column(rows, metric))


def _per_row(rows: pd.DataFrame, columns: pd.Series) -> pd.Series:
    """Per row, the value of the column ``columns`` names for it (NaN where absent)."""
    values = pd.Series(np.nan, index=rows.index)
    for name in columns.unique():
        if name in rows:
            here = columns == name
            values[here] = rows.loc[here, name].astype(float)
    return values


def normalise(value, chance):
    """(value - chance) / (1 - chance): 0 at chance, 1 perfect; NaN without a chance (or
    with a chance of 1, where nothing can be learnt)."""
    value, chance = np.asarray(value, float), np.asarray(chance, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(chance < 1, (value - chance) / (1 - chance), np.nan)


def _check_metric(rows: pd.DataFrame, metric: str) -> pd.DataFrame:
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} ({', '.join(METRICS)})")
    if metric.startswith("long_"):  # only the runs evaluated at a longer length count
        rows = rows[rows["eval_length_mult"].notna()]
        mults = sorted(rows["eval_length_mult"].unique())
        if len(mults) > 1:
            raise ValueError(
                f"rows hold several eval length multipliers ({', '.join(f'{m:g}' for m in mults)})"
                "; a table shows one"
            )
    return rows


KEYS = ["protocol", "category", "task", "mechanism"]


def selected_runs(rows: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """One row per successful (cell, seed) at its selected lr: ``value`` (the ``metric``),
    ``metric`` (the column it came from: for target, the task's target metric), ``chance``,
    ``score`` (``value`` chance-normalised; ``value`` itself for the long_* metrics, which
    have no chance), ``se`` (the test-set standard error of ``value``; NaN where not stored)
    and ``lr_edge`` (the selected lr is alone at an edge of its grid). Runs that differ only
    in their eval length multiplier trained the same model, so a seed counts once (the mean
    of its runs). ``rows`` must be labelled (``prepare_rows``) if they hold variants."""
    rows = fill_from_registry(_check_metric(rows, metric))
    ok = rows[(rows["status"] == "ok") & rows["selected"].astype(bool)]
    keys = [*KEYS, "protocol_version", "seed"]
    source = metric_column(ok, metric)
    chance = ok[CHANCE_COLUMN[metric]] if metric in CHANCE_COLUMN else np.nan
    edge = ok["lr_edge"].eq(True) if "lr_edge" in ok else False  # null in older rows
    runs = ok[keys].assign(
        value=_per_row(ok, source),
        metric=source,
        chance=chance,
        se=_per_row(ok, source + "_se"),
        lr=ok["lr"] if "lr" in ok else np.nan,  # absent from hand-made frames
        lr_edge=edge,
    )
    runs = (
        runs.groupby(keys, sort=False)
        .agg(
            value=("value", "mean"),
            metric=("metric", "first"),
            chance=("chance", "mean"),
            se=("se", "mean"),
            lr=("lr", "first"),  # the runs of a seed trained one model
            lr_edge=("lr_edge", "any"),
        )
        .reset_index()
    )
    normalised = metric in CHANCE_COLUMN
    runs["score"] = normalise(runs["value"], runs["chance"]) if normalised else runs["value"]
    return runs


def aggregate(rows: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Per (protocol, category, task, mechanism): mean, std (ddof 1; 0 for one seed), number
    of successful seeds, and the number of runs that diverged, raised or leaked (``leaky``:
    not causal, synthbench/check.py). A task or mechanism
    run with several parameter sets gives one row per set (``label_variants``)."""
    rows = _check_metric(prepare_rows(rows), metric)
    return _aggregate(rows, selected_runs(rows, metric))


def _aggregate(rows: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """``aggregate`` of rows already labelled and checked, given their ``selected_runs``."""
    stats = runs.groupby(KEYS)["value"].agg(["mean", "std", "count"])
    stats["std"] = stats["std"].fillna(0.0)
    # a run failed if none of its rows succeeded; its status is that of its last row (a
    # leaky row at any lr makes the whole run leaky: synthbench/sweep.py selects nothing)
    per_run = rows.groupby([*KEYS, "run_id"])["status"].agg(
        lambda s: LEAKY if (s == LEAKY).any() else "ok" if (s == "ok").any() else s.iloc[-1]
    )
    failed = (
        per_run[per_run != "ok"]
        .reset_index()
        .groupby(KEYS)["status"]
        .agg(
            diverged=lambda s: int((s == "diverged").sum()),
            error=lambda s: int((s == "error").sum()),
            leaky=lambda s: int((s == LEAKY).sum()),
        )
        .astype(int)  # an empty aggregation would otherwise come back with object columns
    )
    table = stats.join(failed, how="outer")
    counts = ["count", "diverged", "error", LEAKY]
    table[counts] = table[counts].fillna(0).astype(int)
    return table.reset_index()


def latest_versions(rows: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, list[int]]]:
    """Keep, for each protocol, the rows of its newest version; also return the older
    versions left out, so that a table never mixes two versions of a protocol."""
    newest = rows.groupby("protocol")["protocol_version"].transform("max")
    older = rows[rows["protocol_version"] != newest]
    left_out = {
        str(name): sorted(int(v) for v in part["protocol_version"].unique())
        for name, part in older.groupby("protocol")
    }
    return rows[rows["protocol_version"] == newest], left_out


# -- tables ---------------------------------------------------------------------------------


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
    ``"column"`` or per ``"row"`` (or ``None``); ``n_seeds`` is the number a full cell has
    (a cell with fewer says how many)."""

    title: str
    row_headers: list[str]  # the label columns, e.g. ["category", "task"]
    rows: list[tuple[str, ...]]
    columns: list[str]
    cells: list[list[Cell]]
    n_seeds: int
    best: str | None = "column"
    notes: list[str] = field(default_factory=list)
    digits: int = 3

    def best_cells(self) -> set[tuple[int, int]]:
        def top(positions):
            means = {
                p: round(self.cells[p[0]][p[1]].mean, self.digits)
                for p in positions
                if isinstance(self.cells[p[0]][p[1]], Stat)
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


def _head_note(protocol: str, version: int, metric: str, n_seeds: int, last: str) -> str:
    if not n_seeds:  # every run of the protocol failed: its tables are all --
        return f"{metric} on the test set: no successful run; protocol {protocol} v{version}."
    return (
        f"{metric} on the test set, mean ± std over {plural(n_seeds, 'seed')} (a cell with "
        f"fewer says n=); protocol {protocol} v{version}; {last}."
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


def lr_text(lr: float, edge: bool) -> str:
    return "?" if pd.isna(lr) else f"{lr:.2g}{'*' if edge else ''}"


def lr_grid(runs: pd.DataFrame, protocol: str, version: int) -> Grid:
    """The lr each seed selected (``runs``: ``selected_runs`` of one protocol), tasks by
    category as rows, mechanisms as columns: what each score in the other tables was
    trained at."""
    tasks = sort_tasks(runs)
    mechanisms = sorted(runs["mechanism"].unique())
    chosen = {
        (c, t, m): ", ".join(lr_text(r.lr, r.lr_edge) for r in part.itertuples())
        for (c, t, m), part in runs.sort_values("seed").groupby(["category", "task", "mechanism"])
    }
    return Grid(
        f"Selected learning rates (protocol {protocol} v{version})",
        ["category", "task"],
        tasks,
        mechanisms,
        [[chosen.get((c, t, m)) for m in mechanisms] for c, t in tasks],
        0,
        best=None,
        notes=[
            "The lr each seed's run selected on the validation set (seeds in increasing "
            "order); *: alone at an edge of its grid, so the optimum may lie beyond.",
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
    labelled = _check_metric(prepare_rows(rows), metric)
    runs_all = selected_runs(labelled, metric)
    agg_all = _aggregate(labelled, runs_all)
    # the same layout of the score (chance-normalised), for the heatmap
    scores_all = _aggregate(labelled, runs_all.assign(value=runs_all["score"]))
    result = []
    for protocol, agg in agg_all.groupby("protocol", sort=True):
        version = int(versions[protocol][0])
        n_seeds = int(agg["count"].max())
        runs = runs_all[runs_all["protocol"] == protocol]
        target = [target_note(runs)] if metric == "target" and len(runs) else []
        raw = (
            "Raw accuracy, not chance-normalised (the category averages, the heatmap and the "
            "leaderboard are)."
            if metric in CHANCE_COLUMN
            else score_note(metric)
        )
        head = [_head_note(str(protocol), version, metric, n_seeds, BEST_IN_BOLD), raw, *target]
        averages_head = [
            _head_note(
                str(protocol), version, metric, n_seeds, "category mean over its tasks, per seed"
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
            )
        )
    return result


# -- rendering ------------------------------------------------------------------------------


def _text(value: Cell, grid: Grid, pm: str) -> str:
    if value is None:
        return MISSING
    if isinstance(value, str):
        return value
    text = f"{value.mean:.{grid.digits}f} {pm} {value.std:.{grid.digits}f}"
    return text if value.n >= grid.n_seeds else f"{text} (n={value.n})"


def markdown_cell(text) -> str:
    """``text`` safe in a Markdown table cell: names come from the results tree, and a | would
    end the cell, a line break the row."""
    return " ".join(str(text).splitlines()).replace("|", "\\|")


def markdown_table(body: list[list], headers: list) -> str:
    """A pipe table with every cell and header escaped (``markdown_cell``)."""
    return tabulate(
        [[markdown_cell(c) for c in row] for row in body],
        headers=[markdown_cell(h) for h in headers],
        tablefmt="pipe",
        disable_numparse=True,
    )


def to_markdown(grid: Grid) -> str:
    best = grid.best_cells()
    body = []
    for i, labels in enumerate(grid.rows):
        texts = [_text(v, grid, "±") for v in grid.cells[i]]
        body.append([*labels, *(f"**{t}**" if (i, j) in best else t for j, t in enumerate(texts))])
    table = markdown_table(body, [*grid.row_headers, *grid.columns])
    notes = "".join(f"\n{note}" for note in grid.shown_notes())
    return f"**{grid.title}**\n\n{table}\n{notes}\n"


def latex_escape(text: str) -> str:
    replacements = {
        "\\": r"\textbackslash{}",
        "&": r"\&",
        "%": r"\%",
        "$": r"\$",
        "#": r"\#",
        "_": r"\_",
        "{": r"\{",
        "}": r"\}",
        "~": r"\textasciitilde{}",
        # names from the results tree: in the default font encoding these print as other glyphs
        "<": r"\textless{}",
        ">": r"\textgreater{}",
        "|": r"\textbar{}",
        "^": r"\textasciicircum{}",
        "±": r"$\pm$",
        "≈": r"$\approx$",
        "Δ": r"$\Delta$",
    }
    return "".join(replacements.get(ch, ch) for ch in str(text))


def to_latex(grid: Grid) -> str:
    """A booktabs tabular (needs ``\\usepackage{booktabs}``); repeated group labels in the
    first column are printed once, with a rule between groups."""
    best = grid.best_cells()
    width = len(grid.row_headers) + len(grid.columns)
    lines = [
        f"% {latex_escape(grid.title)}; needs \\usepackage{{booktabs}}",
        r"\begin{tabular}{" + "l" * len(grid.row_headers) + "c" * len(grid.columns) + "}",
        r"\toprule",
        " & ".join(latex_escape(h) for h in [*grid.row_headers, *grid.columns]) + r" \\",
        r"\midrule",
    ]
    previous = None
    for i, labels in enumerate(grid.rows):
        labels = list(labels)
        if len(labels) > 1:
            if previous is not None and labels[0] != previous:
                lines.append(r"\midrule")
            previous, labels[0] = labels[0], "" if labels[0] == previous else labels[0]
        texts = [latex_escape(_text(v, grid, "±")) for v in grid.cells[i]]
        texts = [rf"\textbf{{{t}}}" if (i, j) in best else t for j, t in enumerate(texts)]
        lines.append(" & ".join([*map(latex_escape, labels), *texts]) + r" \\")
    lines.append(r"\bottomrule")
    lines += [
        rf"\multicolumn{{{width}}}{{l}}{{\footnotesize {latex_escape(note)}}} \\"
        for note in grid.shown_notes()
    ]
    lines.append(r"\end{tabular}")
    return "\n".join(lines) + "\n"


def latex_document(fragments: list[str]) -> str:
    """A standalone document around tabulars (what the compile test and a quick look use)."""
    body = "\n\\bigskip\n\n".join(fragments)
    return (
        "\\documentclass{article}\n\\usepackage[margin=1cm,landscape]{geometry}\n"
        "\\usepackage{booktabs}\n\\begin{document}\n\\small\n"
        f"{body}\n\\end{{document}}\n"
    )


def length_metric(metric: str) -> str:
    """The trained-length metric the length figure shows for ``metric``: only token accuracy
    and exact match are measured at a longer length, so target and free_token_acc show
    token_acc."""
    return "exact_match" if metric.endswith("exact_match") else "token_acc"


def length_points(rows: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Accuracy against evaluation length, for the runs evaluated at a longer length: per
    (protocol, task, mechanism, mult) the mean and std over seeds, mult 1 being the trained
    length and the others ``long_<metric>`` (``length_metric``)."""
    base = length_metric(metric)
    rows = label_variants(rows[rows["eval_length_mult"].notna()]) if len(rows) else rows
    ok = rows[(rows["status"] == "ok") & rows["selected"].astype(bool)]
    keys = ["protocol", "task", "mechanism", "seed"]
    trained = ok[keys].assign(mult=1.0, value=ok[base])
    longer = ok[keys].assign(mult=ok["eval_length_mult"], value=ok[f"long_{base}"])
    # runs at several multipliers train the same model: one trained-length value per seed
    points = pd.concat([trained, longer]).groupby([*keys, "mult"])["value"].mean().reset_index()
    stats = points.groupby(["protocol", "task", "mechanism", "mult"])["value"]
    return stats.agg(mean="mean", std=lambda v: v.std(ddof=1) if len(v) > 1 else 0.0).reset_index()
