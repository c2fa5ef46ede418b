"""Frontiers: how hard a task can get before a mechanism stops solving it.

A grid of runs (``synthbench run`` with lists, ``synthbench sweep``: synthbench/run/grid.py)
varies task knobs, mechanism parameters, protocol fields or difficulty presets. For every
knob that varies within a task, the runs that differ only in that knob form a *line*: one
per mechanism and *context* (the values of the other varying knobs), the knob's values
ordered from easiest to hardest. Task knobs that move together (kv_recall's queries, half
the pairs by default, in a sweep of pairs) are one line along the first, which names the
others as following it (``co_varying``).

A line's *frontier* is the hardest value at which the mean target accuracy over seeds
(each seed at its selected lr) stays at or above the threshold (0.9): walking from the
easiest value, the last one before the first that falls below. A knob declares which
direction is harder: a task's in ``Task.harder``, a protocol field's in
``grid.PROTOCOL_HARDER``, a mechanism's in its class's own ``harder`` dict; an undeclared
one is taken as harder when larger, and the table says so. A ladder of difficulty presets
(``--difficulty easy,default,hard``) is the knob ``difficulty``, easy to hard.

The state-size view puts each point of the grid at its mechanism's declared state:
``n_layers x n_heads x Mechanism.state_size(L)`` numbers carried from one token to the next
(synthbench/core/mechanism.py, ``layer_state``; in the block track n_layers x the published
layer's whole ``state_size(L)``), L the task's input length.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from synthbench.core.mechanism import MECHANISMS, layer_state
from synthbench.core.task import TASKS
from synthbench.report.aggregate import _text_or, fill_from_registry, metric_values
from synthbench.report.tables import Grid
from synthbench.run.grid import PROTOCOL_FIELDS, PROTOCOL_HARDER

THRESHOLD = 0.9
LADDER = "difficulty"
LADDER_ORDER = ("easy", "default", "hard")  # then a task's other presets, as it lists them
SCALAR = (int, float, str, bool)


@dataclass(frozen=True)
class Knob:
    name: str
    harder: str  # "larger" or "smaller"
    declared: bool  # False: taken as harder when larger, the table says so


@dataclass
class Line:
    """One mechanism along one knob, the other varying knobs fixed at ``context``."""

    protocol: str
    protocol_version: int
    task: str
    knob: Knob
    context: str  # "d_model=64", say; "" where nothing else varies
    mechanism: str
    points: pd.DataFrame  # value, mean, std, n: easiest first
    context_order: tuple = ()  # the context's values, to sort by (d_model 32 before 128)
    # task knobs that moved with ``knob`` (one value of theirs for each of its values: a
    # default that follows it, as kv_recall's queries follows pairs): named, never a context
    follows: tuple[str, ...] = ()

    def knob_label(self, harder: str) -> str:
        """The knob with ``harder`` and the knobs that moved with it, as a table or an axis
        names it: "pairs (larger; queries follows)"."""
        follows = ""
        if self.follows:
            follows = f"; {', '.join(self.follows)} follow{'s' if len(self.follows) == 1 else ''}"
        return f"{self.knob.name} ({harder}{follows})"

    def frontier(self, threshold: float = THRESHOLD):
        """The hardest value held at or above ``threshold`` from the easiest on, and whether
        every value was (None: even the easiest fell below)."""
        held = None
        for value, mean in zip(self.points["value"], self.points["mean"], strict=True):
            if mean < threshold:
                return held, False
            held = value
        return held, True

    def back_above(self, threshold: float = THRESHOLD):
        """The first value harder than a fall below ``threshold`` where the mean is at or
        above it again (None if none is): accuracy not monotone in the knob."""
        fell = False
        for value, mean in zip(self.points["value"], self.points["mean"], strict=True):
            fell = fell or mean < threshold
            if fell and mean >= threshold:
                return value
        return None


def grid_runs(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per successful seed at its selected lr: protocol, protocol_version, task,
    mechanism (canonical names), seed, value (the target metric), state (its declared state
    size, NaN where the mechanism is not registered here), and one column per task knob,
    mechanism parameter and changed protocol field (``difficulty``: the preset its task
    parameters equal, else None)."""
    if rows.empty:
        return pd.DataFrame()
    rows = fill_from_registry(rows, chance=False)
    ok = rows[(rows["status"] == "ok") & rows["selected"].astype(bool)].copy()
    if ok.empty:
        return pd.DataFrame()
    ok["value"] = metric_values(ok, "target")
    records = []
    for r in ok.itertuples(index=False):
        task_params = json.loads(_text_or(getattr(r, "task_params", None), "{}"))
        mech_params = json.loads(_text_or(getattr(r, "mechanism_params", None), "{}"))
        config = json.loads(_text_or(getattr(r, "config", None), "{}"))
        protocol = config.get("protocol", {})
        point = {
            **_scalars(task_params),
            **_scalars(mech_params),
            # every grid field: those a grid changed vary, the rest stay out of the tables
            **{k: protocol[k] for k in PROTOCOL_FIELDS if k in protocol},
            LADDER: _preset_of(r.task, json.dumps(task_params, sort_keys=True)),
        }
        records.append(
            {
                "protocol": r.protocol,
                "protocol_version": r.protocol_version,
                "task": r.task,
                "mechanism": r.mechanism,
                "seed": r.seed,
                "value": r.value,
                "state": _state_size(
                    r.mechanism,
                    json.dumps(mech_params, sort_keys=True),
                    r.task,
                    json.dumps(task_params, sort_keys=True),
                    json.dumps(protocol, sort_keys=True),
                ),  # fmt: skip
                **point,
            }
        )
    # object columns: an int knob stays an int beside another mechanism's missing value
    found = pd.DataFrame(records, dtype=object).astype({"value": float, "state": float})
    # a seed counts once (runs that differ only in --eval-length-mult trained one model)
    keys = [c for c in found.columns if c not in ("value", "state")]
    return (
        found.groupby(keys, dropna=False, sort=False)
        .agg(value=("value", "mean"), state=("state", "first"))
        .reset_index()
    )


def _scalars(params: dict) -> dict:
    """The parameters a knob can be: numbers, flags and names (a rewa ``parts`` list is not)."""
    return {k: v for k, v in params.items() if isinstance(v, SCALAR)}


@functools.cache
def _preset_of(task: str, params: str) -> str | None:
    """The difficulty preset whose parameters ``params`` (JSON) are, or None."""
    if task not in TASKS:
        return None
    cls = TASKS.get(task)
    wanted = json.loads(params)
    for name in cls.presets():
        try:
            if cls.from_difficulty(name).param_dict() == wanted:
                return name
        except (TypeError, ValueError):  # a preset this version rejects
            continue
    return None


@functools.cache
def _state_size(mechanism: str, mech_params: str, task: str, task_params: str, protocol: str):
    """n_layers x one layer's state at L (``layer_state``: n_heads x a core's state_size, or
    a published layer's whole one) of the registered mechanism, or NaN."""
    config = json.loads(protocol)
    try:
        d_model, heads, layers = config["d_model"], config["n_heads"], config["n_layers"]
        length = TASKS.get(task)(**json.loads(task_params)).seq_len
        arch, params = config.get("arch", "attn-only"), json.loads(mech_params)
        return float(layers * layer_state(mechanism, d_model, heads, arch, params, length))
    except Exception:  # not registered here, or parameters this version rejects: no state
        return float("nan")


def knob_of(task: str, mechanism_names, name: str) -> Knob:
    """The knob ``name`` of ``task`` (or of a protocol field, or of one of the mechanisms)
    with the direction it declares."""
    if name == LADDER:
        return Knob(LADDER, "larger", True)
    if name in PROTOCOL_HARDER:
        return Knob(name, PROTOCOL_HARDER[name], True)
    owners = [TASKS.get(task)] if task in TASKS else []
    owners += [MECHANISMS.get(m) for m in mechanism_names if m in MECHANISMS]
    for owner in owners:
        direction = getattr(owner, "harder", {}).get(name)
        if direction in ("larger", "smaller"):
            return Knob(name, direction, True)
    return Knob(name, "larger", False)


def _ordered(values: list, knob: Knob, task: str) -> list:
    """``values`` from easiest to hardest."""
    if knob.name == LADDER:
        own = list(TASKS.get(task).presets()) if task in TASKS else []
        order = [*LADDER_ORDER, *(p for p in own if p not in LADDER_ORDER)]
        return sorted(values, key=lambda v: order.index(v) if v in order else len(order))
    ordered = sorted(values)  # numbers: only a knob with an order has a line (_ordinal)
    return ordered[::-1] if knob.harder == "smaller" else ordered


def _ordinal(values: pd.Series) -> bool:
    """Whether a knob's values have an order to walk: numbers (flags and names have none)."""
    present = values.dropna()
    return all(
        isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool)
        for v in present
    )


NOT_KNOBS = {"protocol", "protocol_version", "task", "mechanism", "seed", "value", "state",
             "mean", "std"}  # fmt: skip


def varying_knobs(part: pd.DataFrame) -> list[str]:
    """The knobs (columns of ``grid_runs`` or ``state_points``) of one task's rows that take
    several values within a mechanism: another mechanism's parameters are no difference."""
    knobs = [c for c in part.columns if c not in NOT_KNOBS]
    spread = part.groupby("mechanism")[knobs].agg(lambda v: v.dropna().map(repr).nunique())
    return [c for c in knobs if spread[c].max() > 1]


def task_knobs_varying(part: pd.DataFrame, task: str) -> list[str]:
    """``varying_knobs`` that are the task's own parameters (not a width or a ladder)."""
    own = set(TASKS.get(task).Params.__dataclass_fields__) if task in TASKS else set()
    return [k for k in varying_knobs(part) if k in own]


def _moves_with(part: pd.DataFrame, a: str, b: str) -> bool:
    """Whether knobs ``a`` and ``b`` move together in ``part``: each value of one comes with
    exactly one value of the other, and the other way round."""
    pairs = part[[a, b]].dropna().map(repr).drop_duplicates()
    return len(pairs) > 1 and not pairs[a].duplicated().any() and not pairs[b].duplicated().any()


def co_varying(part: pd.DataFrame, knobs: list[str], task_knobs: list[str]) -> dict[str, tuple]:
    """Of the task knobs among ``knobs``, those that move together (``_moves_with``), as
    {first: (the knobs that follow it)}, first in the task's own order of its parameters."""
    candidates = [k for k in task_knobs if k in knobs and _ordinal(part[k])]
    groups: dict[str, tuple] = {}
    taken: set[str] = set()
    for i, first in enumerate(candidates):
        if first in taken:
            continue
        followers = tuple(k for k in candidates[i + 1 :] if k not in taken
                          and _moves_with(part, first, k))  # fmt: skip
        if followers:
            groups[first] = followers
            taken.update(followers)
    return groups


def lines(runs: pd.DataFrame) -> list[Line]:
    """Every line of ``grid_runs``: per (protocol, task), each varying knob, context and
    mechanism with at least two of the knob's values. Task knobs that move together give
    one line, along the first of them (``co_varying``)."""
    found: list[Line] = []
    if runs.empty:
        return found
    for (protocol, version, task), part in runs.groupby(
        ["protocol", "protocol_version", "task"], sort=True
    ):
        part = part.dropna(axis=1, how="all")
        knobs = varying_knobs(part)
        ladder = LADDER in knobs
        task_order = list(TASKS.get(task).Params.__dataclass_fields__) if task in TASKS else []
        task_knobs = set(task_order)
        moving = co_varying(part, knobs, task_order)
        followers = {k for group in moving.values() for k in group}
        for name in knobs:
            if name in followers:
                continue  # it moved with another knob: on that one's line
            if name != LADDER and not _ordinal(part[name]):
                continue  # names without an order (an arch, say): a context, never a line
            knob = knob_of(task, part["mechanism"].unique(), name)
            if name == LADDER:
                along = part[part[LADDER].notna()]
                independent = task_knobs - followers  # a knob and its followers move as one
                moved = [k for k in independent if k in along and along[k].map(repr).nunique() > 1]
                if len(moved) < 2 and part[LADDER].isna().any():
                    continue  # a sweep of one knob that passes through presets: its own line
                # a preset sets task knobs together: the context is the other kinds of knob
                others = [k for k in knobs if k != LADDER and k not in task_knobs]
            else:
                along = part
                # the knobs that follow this one are on its line; another's are context
                others = [k for k in knobs if k not in (name, LADDER, *moving.get(name, ()))]
            for _, group in along.groupby(
                [part[k].map(repr) for k in others] or (lambda _: ""), sort=True
            ):
                if ladder and name in task_knobs and group[LADDER].notna().all():
                    continue  # only presets: the ladder's line says it
                first = group.iloc[0]
                context = " ".join(
                    f"{k}={value_text(first[k])}" for k in others if pd.notna(first[k])
                )
                context_order = tuple(sort_key(first[k]) for k in others)
                for mechanism, line in group.groupby("mechanism", sort=True):
                    stats = (
                        line.groupby(line[name].map(repr))
                        .agg(
                            value=(name, "first"),
                            mean=("value", "mean"),
                            std=("value", "std"),
                            n=("value", "count"),
                        )
                        .reset_index(drop=True)
                    )
                    if len(stats) < 2:
                        continue
                    stats["std"] = stats["std"].fillna(0.0)
                    order = _ordered(list(stats["value"]), knob, task)
                    stats = stats.set_index(stats["value"].map(repr)).loc[list(map(repr, order))]
                    found.append(
                        Line(protocol, int(version), task, knob, context, mechanism,
                             stats.reset_index(drop=True), context_order, moving.get(name, ()))
                    )  # fmt: skip
    return sorted(
        found,
        key=lambda line: (line.protocol, line.protocol_version, line.task, line.knob.name,
                          line.context_order, line.mechanism),
    )  # fmt: skip


def sort_key(value) -> tuple:
    """Numbers in numeric order, before names (and a missing value last)."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return (2, "")
    if isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool):
        return (0, float(value))
    return (1, str(value))


def value_text(value) -> str:
    """A knob's value as a reader wants it: 16 (not 16.0, as a column shared with another
    task's missing values stores it), 0.5, easy, True."""
    if isinstance(value, float | np.floating):
        return f"{value:g}"
    return str(value)


def frontier_grid(
    found: list[Line], protocol: str, version: int, threshold: float = THRESHOLD
) -> Grid:
    """The frontier table of one protocol version: a row per line."""
    mine = [line for line in found if (line.protocol, line.protocol_version) == (protocol, version)]
    rows, cells = [], []
    undeclared = sorted({line.knob.name for line in mine if not line.knob.declared})
    seeds = max((int(line.points["n"].max()) for line in mine), default=0)
    not_monotone = False
    for line in mine:
        held, everywhere = line.frontier(threshold)
        if held is None:
            frontier = "none"
        else:
            frontier = value_text(held) + (" (all)" if everywhere else "")
        again = line.back_above(threshold)
        if again is not None:
            frontier += f" (back above at {value_text(again)})"
            not_monotone = True
        ladder = ", ".join(
            f"{value_text(v)}: {m:.2f}" + ("" if n >= seeds else f" (n={n})")
            for v, m, n in zip(
                line.points["value"], line.points["mean"], line.points["n"], strict=True
            )
        )
        mark = "" if line.knob.declared else "*"
        rows.append(
            (line.task, line.knob_label(line.knob.harder) + mark, line.context or "-",
             line.mechanism)
        )  # fmt: skip
        cells.append([frontier, ladder])
    notes = [
        f"Frontier: the hardest value at which the mean target accuracy over seeds stays at or "
        f"above {threshold:g}, walking from the easiest; (all): at every value tried; none: "
        f"below at the easiest. Each seed at its selected lr; {seeds} seed"
        f"{'' if seeds == 1 else 's'} a point (n: fewer).",
    ]
    if not_monotone:
        notes.append(
            "back above at V: a harder value V holds the threshold again, so accuracy is not "
            "monotone in the knob there: the frontier understates what the mechanism holds, "
            "and the knob is not all that makes the task hard at this budget."
        )
    if undeclared:
        notes.append(
            f"* {', '.join(undeclared)}: no declared direction, taken as harder when larger."
        )
    if any(line.follows for line in mine):
        notes.append(
            "K follows: task knob K took one value for each of the line's (a default that "
            "follows it, say), so the line is along both and K is no context."
        )
    return Grid(
        title=f"Frontiers at accuracy {threshold:g}, protocol {protocol} v{version}",
        row_headers=["task", "knob (harder when)", "where", "mechanism"],
        rows=rows,
        columns=["frontier", "mean accuracy, easiest to hardest"],
        cells=cells,
        n_seeds=seeds,
        best=None,
        notes=notes,
    )


def state_points(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (protocol, version, task, mechanism, grid point): declared state size and the
    mean, std and number (n_seeds) of seeds of the target accuracy; rows without a state
    left out."""
    if runs.empty:
        return pd.DataFrame()
    runs = runs[np.isfinite(runs["state"].astype(float))]
    keys = [c for c in runs.columns if c not in ("seed", "value", "state")]
    stats = (
        runs.groupby(keys, dropna=False, sort=False)
        .agg(
            state=("state", "first"),
            mean=("value", "mean"),
            std=("value", "std"),
            n_seeds=("value", "count"),  # not "n": a task knob may be named so
        )
        .reset_index()
    )
    stats["std"] = stats["std"].fillna(0.0)
    return stats
