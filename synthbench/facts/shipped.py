"""The facts' runs that ship with synthbench: measured rows, so that ``facts report`` shows
verdicts on a fresh clone and ``facts run`` trains only what is not measured yet.

One Parquet file (synthbench/data/facts_runs.parquet) in the shipped reference's format
(synthbench/report/reference.py: every stored column, checked against this synthbench's
suite and protocol versions on load), written by benchmarks/ship_facts.py from results
trees. A user's own rows of the same run take precedence; ``--no-shipped`` leaves the file
out. A file made by another version of the code holds other run ids, or is refused whole on
load (its problem is said in one line): a fact is then judged on the user's rows alone.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pandas as pd

from synthbench.facts.evaluate import fact_specs
from synthbench.facts.fact import Fact
from synthbench.report import reference
from synthbench.run.schema import LEAKY, lr_key

SHIPPED = "facts_runs.parquet"


def shipped_path() -> Path:
    return Path(str(resources.files("synthbench.data").joinpath(SHIPPED)))


def load() -> reference.Reference:
    """The shipped facts rows (empty, without a problem, where the file is absent)."""
    path = shipped_path()
    if not path.is_file():
        return reference.Reference(reference._empty(), str(path))
    found = reference.load(path)
    if found.problem:  # the reference's wording names it "the reference"
        found.problem = found.problem.replace("the reference", "the shipped facts runs", 1)
    return found


def with_shipped(rows: pd.DataFrame, shipped: pd.DataFrame) -> pd.DataFrame:
    """``rows`` and the ``shipped`` rows of the (run, lr) pairs ``rows`` lack."""
    if shipped.empty:
        return rows
    if rows.empty:
        return shipped
    have = set(zip(rows["run_id"], rows["lr"].map(lr_key), strict=True))
    keys = zip(shipped["run_id"], shipped["lr"].map(lr_key), strict=True)
    extra = shipped[[key not in have for key in keys]]
    return pd.concat([rows, extra[rows.columns.intersection(extra.columns)]], ignore_index=True)


def complete_runs(rows: pd.DataFrame) -> set[str]:
    """The run ids whose lr sweep is settled: a row marked selected, or a run that diverged
    or leaked at every lr (a run that raised is not: it trains again, as ``run`` does)."""
    if rows.empty:
        return set()
    selected = set(rows.loc[rows["selected"].fillna(False).astype(bool), "run_id"])
    ended = rows.groupby("run_id")["status"].agg(lambda s: s.isin(("diverged", LEAKY)).all())
    return selected | set(ended[ended].index)


def arms_not_shipped(
    fact: Fact, shipped: pd.DataFrame, rows: pd.DataFrame, first_seed: int = 0
) -> list[str]:
    """The arms of ``fact`` of which neither ``rows`` (the user's and the shipped ones) nor
    the ``shipped`` file holds a run, where the file holds runs of its other arms: arms
    declared or changed since the file was measured (their run ids are new). Empty where
    the file holds none of the fact (then nothing of it predates the change)."""
    if shipped.empty:
        return []
    in_file, anywhere = set(shipped["run_id"]), set(rows["run_id"]) if len(rows) else set()
    specs = fact_specs(fact, first_seed)
    held = {label: {s.run_id for s in arm} for label, arm in specs.items()}
    if not any(ids & in_file for ids in held.values()):
        return []
    return [label for label, ids in held.items() if not ids & (in_file | anywhere)]
