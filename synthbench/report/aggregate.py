"""The stored rows a report is built from: variants labelled, metrics chosen, runs selected,
seeds aggregated.

A run counts by the row it selected (its best lr on the validation set, synthbench/run/
lr_selection.py): ``selected_runs`` gives one value per run, ``aggregate`` the mean and
spread over seeds per (protocol, task, mechanism). Rows that differ in a parameter are
labelled as variants (``label_variants``), never averaged together.

A task scored over its ladder (``Task.ladder``, docs/TASKS.md "Ladders") is one cell per
mechanism once its rows hold every level: each level one value, the mean over its runs,
shown under the level's first dealt seed, so that the cell's mean is the mean over levels and
its spread the spread across them (``ladder_levels``); a mechanism with only some levels has
them as variants, never as the task's score.

Raw accuracy is what the full and per-category tables show; the category averages (and the
leaderboard and heatmap built from the same runs) show the chance-normalised score
(accuracy - chance) / (1 - chance), so that a task whose best constant answer already scores
0.5 does not weigh more than one where it scores 0.01.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pandas as pd

from synthbench.core.task import TASKS
from synthbench.core.text import did_you_mean
from synthbench.run.grid import protocol_changes
from synthbench.run.lr_selection import KNIFE_EDGE
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.schema import LEAKY

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


# -- rows -> one value per run --------------------------------------------------------------


def _label_variants(rows: pd.DataFrame, column: str, sources: list[str], params) -> pd.DataFrame:
    """Rename the rows of each ``column`` value that holds several parameter sets within one
    protocol to ``name (k=v, ...)``, with the keys in which its variants differ there.
    Protocols are apart: each has its own tables, and a mechanism at each track's defaults
    (mamba2's chunk of 64 in the core, its layer's 256 in the block) is named alone in both.
    ``params(values)`` maps a row's ``sources`` values to its parameter dict and the keys to
    show even when there is a single variant; it runs once per distinct combination."""
    sources = [c for c in sources if c in rows]
    group = [column] + (["protocol"] if "protocol" in rows else [])
    keys = rows[list(dict.fromkeys([*group, *sources]))].astype(str)
    fields = list(keys.columns[1:])
    combos = keys.drop_duplicates()
    parsed = {tuple(c): params(dict(zip(fields, c[1:], strict=True))) for c in combos.values}
    labels = {}
    for (name, *_), part in combos.groupby(group):
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
    if "mechanism_params" in rows or "config" in rows:
        if "config" in rows and "protocol" in rows:
            rows[GRID_FIELDS] = _grid_fields(rows)
        sources = ["mechanism_params", "config", "protocol", GRID_FIELDS]
        rows = _label_variants(rows, "mechanism", sources, _mechanism_variant)
        rows = rows.drop(columns=GRID_FIELDS, errors="ignore")
    rows[LEVEL] = ladder_levels(rows)  # after the mechanisms: a cell is per variant
    if "task_params" in rows:
        rows = _label_tasks(rows)
    return rows


# -- ladders ---------------------------------------------------------------------------------

LEVEL = "level"  # the column of a row's ladder level ("" outside a complete ladder)


@functools.cache
def _level_of(name: str, params: str) -> str:
    """The ladder level of the registered task ``name`` at the JSON ``params``, or ""."""
    if name not in TASKS:
        return ""
    return TASKS.get(name).level_of(json.loads(params)) or ""


def ladder_levels(rows: pd.DataFrame) -> pd.Series:
    """Per row, its ladder level where the rows of its cell (protocol, version, task,
    mechanism) hold every level of the task's ladder, else "": a level's runs count towards
    the task's score only beside every other level (a row's level is read off its
    parameters, ``Task.level_of``: a level's runs are ordinary runs at its parameters)."""
    if "task_params" not in rows or rows.empty:
        return pd.Series("", index=rows.index, dtype=object)
    levels = pd.Series(
        [_level_of(str(task), params) for task, params in _task_keys(rows)],
        index=rows.index,
        dtype=object,
    )
    cells = [c for c in ("protocol", "protocol_version", "task", "mechanism") if c in rows]
    held = levels[levels != ""].groupby([rows[c] for c in cells]).agg(frozenset)
    complete = {
        key
        for key, found in held.items()
        if found == frozenset(TASKS.get(key[cells.index("task")]).ladder.names)
    }
    keys = list(zip(*(rows[c] for c in cells), strict=True))
    return levels.where([key in complete for key in keys], "")


def _label_tasks(rows: pd.DataFrame) -> pd.DataFrame:
    """Task labels: a complete ladder's rows the task's name; every other row labelled as a
    variant among the others (``_label_variants``), except that beside a complete ladder of
    the same task and protocol a row at a level's parameters is that level, ``kv_recall
    (L2)`` (a ladder short of some level), and one the variants leave the bare name gets the
    parameters it sets apart from the defaults, or ``(default)``."""
    ladder = rows[LEVEL] != ""
    if not ladder.any():
        return _label_variants(rows, "task", ["task_params", "config"], _task_variant)
    names = rows.loc[~ladder, "task"].copy()
    rest = _label_variants(rows[~ladder].copy(), "task", ["task_params", "config"], _task_variant)
    protocol = rows["protocol"] if "protocol" in rows else pd.Series("", index=rows.index)
    laddered = set(zip(protocol[ladder], rows.loc[ladder, "task"], strict=True))
    for index, name in names.items():
        if (protocol[index], name) not in laddered:
            continue
        params = json.loads(_text_or(rest.at[index, "task_params"], "{}"))
        level = _level_of(name, json.dumps(params, sort_keys=True))
        if level:
            rest.at[index, "task"] = f"{name} ({level})"
        elif rest.at[index, "task"] == name:
            defaults = TASKS.get(name)().param_dict()
            changed = ", ".join(f"{k}={v}" for k, v in params.items() if defaults.get(k) != v)
            rest.at[index, "task"] = f"{name} ({changed or 'default'})"
    rows.loc[~ladder, "task"] = rest["task"]
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
    from synthbench.integrity.audit import chance  # torch: only where a row lacks its chance

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


def check_metric(rows: pd.DataFrame, metric: str) -> pd.DataFrame:
    if metric not in METRICS:
        raise ValueError(
            f"unknown metric {metric!r}{did_you_mean(metric, METRICS)} ({', '.join(METRICS)})"
        )
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
    ``lr_edge`` (the selected lr is alone at an edge of its grid) and ``knife_edge`` (the
    selected lr beat every other by more than lr_selection.KNIFE_EDGE). Runs that differ only
    in their eval length multiplier trained the same model, so a seed counts once (the mean
    of its runs). ``rows`` must be labelled (``prepare_rows``) if they hold variants."""
    rows = fill_from_registry(check_metric(rows, metric))
    if LEVEL not in rows:  # rows not labelled: no ladder is recognised
        rows = rows.assign(**{LEVEL: ""})
    ok = rows[(rows["status"] == "ok") & rows["selected"].astype(bool)]
    keys = [*KEYS, "protocol_version", LEVEL, "seed"]
    source = metric_column(ok, metric)
    chance = ok[CHANCE_COLUMN[metric]] if metric in CHANCE_COLUMN else np.nan
    edge = ok["lr_edge"].eq(True) if "lr_edge" in ok else False  # null in older rows
    knife = ok["lr_gap"].gt(KNIFE_EDGE) if "lr_gap" in ok else False  # null before schema 8
    runs = ok[keys].assign(
        value=_per_row(ok, source),
        metric=source,
        chance=chance,
        se=_per_row(ok, source + "_se"),
        lr=ok["lr"] if "lr" in ok else np.nan,  # absent from hand-made frames
        lr_edge=edge,
        knife_edge=knife,
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
            knife_edge=("knife_edge", "any"),
        )
        .reset_index()
    )
    runs = _one_value_per_level(runs)
    normalised = metric in CHANCE_COLUMN
    runs["score"] = normalise(runs["value"], runs["chance"]) if normalised else runs["value"]
    return runs


def _one_value_per_level(runs: pd.DataFrame) -> pd.DataFrame:
    """Each ladder level's runs (``selected_runs``' rows of one level of one cell) as one
    value: their mean, its test-set standard error sqrt(sum se^2) / n, shown under the
    level's first dealt seed (``Ladder.first_seed``): a cell of L levels holds L values, so
    its mean is the mean over levels whatever each level's seeds (the seed rule may give a
    level more), and its spread is the spread across levels. Other rows as they are."""
    laddered = runs[LEVEL] != ""
    if not laddered.any():
        return runs
    keys = [*KEYS, "protocol_version", LEVEL]
    levels = (
        runs[laddered]
        .groupby(keys, sort=False)
        .agg(
            value=("value", "mean"),
            metric=("metric", "first"),
            chance=("chance", "mean"),
            se=("se", lambda se: float(np.sqrt((se**2).sum())) / len(se)),
            lr=("lr", "first"),
            lr_edge=("lr_edge", "any"),
            knife_edge=("knife_edge", "any"),
        )
        .reset_index()
    )
    levels["seed"] = [
        TASKS.get(task).ladder.first_seed(task, level)
        for task, level in zip(levels["task"], levels[LEVEL], strict=True)
    ]
    return pd.concat([runs[~laddered], levels[runs.columns]], ignore_index=True)


def aggregate(rows: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Per (protocol, category, task, mechanism): mean, std (ddof 1; 0 for one seed), number
    of successful seeds, and the number of runs that diverged, raised or leaked (``leaky``:
    not causal, synthbench/integrity/causality.py). A task or mechanism
    run with several parameter sets gives one row per set (``label_variants``)."""
    rows = check_metric(prepare_rows(rows), metric)
    return aggregate_runs(rows, selected_runs(rows, metric))


def _run_status(statuses: pd.Series) -> str:
    if (statuses == LEAKY).any():
        return LEAKY
    return "ok" if (statuses == "ok").any() else statuses.iloc[-1]


def run_outcomes(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per run (its lr sweep): KEYS, run_id, seed and status. A run failed if none
    of its rows succeeded; its status is that of its last row (a leaky row at any lr makes
    the whole run leaky: synthbench/run/lr_selection.py selects nothing)."""
    outcomes = (
        rows.groupby([*KEYS, "run_id"])
        .agg(
            seed=("seed", "first"),
            status=("status", _run_status),
            level=(LEVEL, "first") if LEVEL in rows else ("seed", lambda _: ""),
        )
        .reset_index()
    )
    # a ladder's run is counted under its level's seed, as its value is (selected_runs)
    laddered = outcomes[LEVEL] != ""
    if not laddered.any():
        return outcomes.drop(columns=LEVEL)
    outcomes.loc[laddered, "seed"] = [
        TASKS.get(task).ladder.first_seed(task, level)
        for task, level in zip(
            outcomes.loc[laddered, "task"], outcomes.loc[laddered, LEVEL], strict=True
        )
    ]
    return outcomes.drop(columns=LEVEL)


def protocol_track(rows: pd.DataFrame) -> str:
    """The track of one protocol's rows (synthbench/run/protocols.py ``Protocol.track``):
    ``block`` where they trained the published layers' arch, else ``core``. Read from the
    config the rows stored, or the registered protocol of that name for rows without one."""
    from synthbench.core.layer import LAYER_ARCHS  # torch: already imported by the protocols

    if "config" in rows and len(rows):
        try:
            arch = json.loads(rows["config"].iloc[0])["protocol"]["arch"]
            return "block" if arch in LAYER_ARCHS else "core"
        except (TypeError, ValueError, KeyError):
            pass  # a hand-made frame: fall back on the name
    name = str(rows["protocol"].iloc[0]) if len(rows) else ""
    return PROTOCOLS.get(name).track if name in PROTOCOLS else "core"


def stored_states(rows: pd.DataFrame, track: str) -> dict[str, int]:
    """Per mechanism (its label: ``label_variants``) of one protocol's rows, the state its
    runs stored (``state_size``, schema 9: what one layer carries at length 1024 with the
    run's parameters, measured as the run trained), as a board of ``track`` quotes it: per
    layer in the block track, per head in the core track (over the heads its config names).
    A mechanism none of whose rows stores one (rows before schema 9) is left out."""
    if "state_size" not in rows or rows.empty:
        return {}
    found = {}
    known = rows.dropna(subset=["state_size"])
    for mechanism, part in known.groupby("mechanism", sort=True):
        size = int(part["state_size"].max())  # the same for every row of a label
        if track != "block":
            try:
                heads = json.loads(part["config"].iloc[0])["protocol"]["n_heads"]
            except (KeyError, TypeError, ValueError):  # no config to say: no figure
                continue
            size //= int(heads)
        found[str(mechanism)] = size
    return found


def aggregate_runs(rows: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """``aggregate`` of rows already labelled and checked, given their ``selected_runs``."""
    stats = runs.groupby(KEYS)["value"].agg(["mean", "std", "count"])
    stats["std"] = stats["std"].fillna(0.0)
    outcomes = run_outcomes(rows)
    failed = (
        outcomes[outcomes["status"] != "ok"]
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


def length_metric(metric: str) -> str:
    """The trained-length metric the length figure shows for ``metric``: only token accuracy
    and exact match are measured at a longer length, so target and free_token_acc show
    token_acc."""
    return "exact_match" if metric.endswith("exact_match") else "token_acc"


def length_points(rows: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Accuracy against evaluation length, for the runs evaluated at a longer length: per
    (protocol, task, mechanism, mult) the mean, std and number (n) of seeds, mult 1 the
    trained length and the others ``long_<metric>`` (``length_metric``)."""
    base = length_metric(metric)
    rows = label_variants(rows[rows["eval_length_mult"].notna()]) if len(rows) else rows
    ok = rows[(rows["status"] == "ok") & rows["selected"].astype(bool)]
    keys = ["protocol", "task", "mechanism", "seed"]
    trained = ok[keys].assign(mult=1.0, value=ok[base])
    longer = ok[keys].assign(mult=ok["eval_length_mult"], value=ok[f"long_{base}"])
    # runs at several multipliers train the same model: one trained-length value per seed
    points = pd.concat([trained, longer]).groupby([*keys, "mult"])["value"].mean().reset_index()
    stats = points.groupby(["protocol", "task", "mechanism", "mult"])["value"]
    std = lambda v: v.std(ddof=1) if len(v) > 1 else 0.0  # noqa: E731
    return stats.agg(mean="mean", std=std, n="count").reset_index()
