"""What a stored row must be before anything uses it.

A results file is input like any other: edited by hand, copied from elsewhere, written by a
tool that is not synthbench. Its names become folder names and table cells, its numbers are
ranked, so a row is only used when every value is one a training could have produced:

- names (protocol, task, mechanism, run_id) follow the registry's name rule
  (synthbench/core/registry.py), so none can climb out of a folder or carry markup;
- numbers lie in their declared ranges (``RANGES``): accuracies and their standard errors in
  [0, 1], no negative count, step or time, a positive lr;
- the schema version is one this release knows, the status one a training ends with, the
  JSON columns JSON objects.

A null is always allowed (a failed training has no metrics). ``row_problems`` says, per row,
the first thing wrong with it; the store leaves such rows out and names each file and field.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pyarrow as pa

from synthbench.core.registry import NAME
from synthbench.core.text import short_repr
from synthbench.run.schema import (
    RESULT_METRICS,
    SCHEMA,
    SCHEMA_VERSION,
    STATUSES,
    has_curve,
)

NAME_COLUMNS = ("protocol", "task", "mechanism", "run_id")
JSON_COLUMNS = ("task_params", "mechanism_params", "config")  # JSON objects
TARGET_METRICS = frozenset({"token_acc", "exact_match", "free_token_acc"})
_UNIT = (0.0, 1.0)
# every float a training fills but its loss is an accuracy or an accuracy's standard error
_ACCURACIES = tuple(
    c for c in RESULT_METRICS if SCHEMA.field(c).type == pa.float64() and c != "final_loss"
)
# column -> (lowest, highest, whether the lowest itself is excluded); inf: no bound
RANGES: dict[str, tuple[float, float, bool]] = {
    **{name: (*_UNIT, False) for name in _ACCURACIES},
    "schema_version": (1, SCHEMA_VERSION, False),
    "suite_version": (1, math.inf, False),
    "protocol_version": (1, math.inf, False),
    "seed": (0, math.inf, False),
    "lr": (0, math.inf, True),
    "steps": (1, math.inf, False),
    "steps_done": (0, math.inf, False),
    "eval_length_mult": (0, math.inf, True),
    "final_loss": (0, math.inf, False),  # a cross-entropy; +inf where a training diverged
    "n_params": (0, math.inf, False),
    "state_size": (0, math.inf, False),
    "wall_seconds": (0, math.inf, False),
    "cpu_seconds": (0, math.inf, False),
    "threads": (1, math.inf, False),
    "lr_robustness": (1, math.inf, False),
    "lr_gap": (0.0, 1.0, False),
}
# where a value must be finite as well (+inf is a final loss's only)
_FINITE_ONLY = frozenset(RANGES) - {"final_loss"}


def _interval(low: float, high: float, open_low: bool) -> str:
    if high == math.inf:
        return f"> {low:g}" if open_low else f">= {low:g}"
    return f"in {'(' if open_low else '['}{low:g}, {high:g}]"


def _number_problems(rows: pd.DataFrame, found: pd.Series) -> None:
    for column, (low, high, open_low) in RANGES.items():
        if column not in rows:
            continue
        values = pd.to_numeric(rows[column], errors="coerce").astype(float)
        present = rows[column].notna()
        inside = (values > low if open_low else values >= low) & (values <= high)
        if column in _FINITE_ONLY:
            inside &= np.isfinite(values)
        else:  # NaN: a diverged training's loss
            inside |= values.isna() & present
        bad = present & ~inside & found.isna()
        for index in rows.index[bad]:
            value = rows.at[index, column]
            value = value.item() if isinstance(value, np.generic) else value  # 7.5, not np's
            found[index] = f"{column} {value!r} is not {_interval(low, high, open_low)}"


def _text_problems(rows: pd.DataFrame, found: pd.Series) -> None:
    def name_ok(value) -> bool:
        return isinstance(value, str) and NAME.fullmatch(value) is not None

    def json_object(value) -> bool:
        try:
            return isinstance(json.loads(value), dict)
        except (TypeError, ValueError, RecursionError):
            return False

    checks = [
        *((c, name_ok, "is not a name (letters, digits and _ . + -)") for c in NAME_COLUMNS),
        ("status", STATUSES.__contains__, f"is not one of {', '.join(STATUSES)}"),
        ("target_metric", TARGET_METRICS.__contains__,
         f"is not one of {', '.join(sorted(TARGET_METRICS))}"),
        *((c, json_object, "is not a JSON object") for c in JSON_COLUMNS),
    ]  # fmt: skip
    for column, ok, what in checks:
        if column not in rows:
            continue
        present = rows[column].dropna()
        verdict = {value: ok(value) for value in present.unique()}  # each distinct value once
        bad = present.index[~present.map(verdict).astype(bool)]
        for index in bad:
            if pd.isna(found[index]):
                found[index] = f"{column} {short_repr(rows.at[index, column], 40)} {what}"


def _curve_problems(rows: pd.DataFrame, found: pd.Series) -> None:
    if "curve_steps" not in rows or "curve_val_token_acc" not in rows:
        return
    for index, steps, accs in zip(
        rows.index, rows["curve_steps"], rows["curve_val_token_acc"], strict=True
    ):
        if not pd.isna(found[index]):
            continue
        steps = list(steps) if has_curve(steps) else []
        accs = list(accs) if has_curve(accs) else []
        if len(steps) != len(accs):
            found[index] = f"curve_steps has {len(steps)} points, curve_val_token_acc {len(accs)}"
        elif any(s is None or s < 0 for s in steps):
            found[index] = "curve_steps holds a negative or null step"
        elif any(a is None or not 0 <= a <= 1 for a in accs):
            found[index] = "curve_val_token_acc holds a value not in [0, 1]"


def row_problems(rows: pd.DataFrame) -> pd.Series:
    """Per row of ``rows`` (any subset of the results columns), the first thing wrong with
    it, as a phrase naming the field ("token_acc 7.5 is not in [0, 1]"); None for a row that
    may be used."""
    found = pd.Series(None, index=rows.index, dtype=object)
    _text_problems(rows, found)
    _number_problems(rows, found)
    _curve_problems(rows, found)
    return found.astype(object).where(found.notna(), None)
