"""The reference baselines shipped with synthbench, and how a report and ``reproduce`` use them.

    synthbench/data/reference/quick.parquet   written by benchmarks/build_reference.py

The file is to hold every lr row of the runs of both tracks of ``quick``
(``REFERENCE_PROTOCOLS``: ``quick`` and its block twin ``quick-block``) of the
``REFERENCE_MECHANISMS`` that ``synthbench run --task extended`` plans (each laddered task at
the levels of its ladder, the protocol's seeds dealt to them) with the seeds recipe v2's seed
rule adds, for the suite version and protocol versions of this synthbench
(benchmarks/build_reference.py says which runs exactly); the file's own metadata says
what it holds and what it lacks (a file built before a layout change is stale, never shown,
until it is rebuilt).
``SYNTHBENCH_REFERENCE=PATH`` reads another file instead (tests do).

- ``load`` reads and validates it: rows of another suite or protocol version are never
  shown (``Reference.problem`` says why, in one line).
- ``with_reference`` adds to a user's rows the reference runs of their protocols (at the
  same versions) and tasks, the user's own run winning where both hold the same run id,
  each reference run *marked*: its mechanism becomes ``softmax (reference)`` in every
  table, figure and leaderboard (``mark``), so it is never taken for the user's own.

Whether a run made again reproduces the reference: synthbench/report/reproduction.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from synthbench.core.text import plural
from synthbench.run.schema import COLUMNS, DATASET_SCHEMA, SCHEMA_VERSION

ENV = "SYNTHBENCH_REFERENCE"  # another reference file (a path) instead of the shipped one
SHIPPED = "reference/quick.parquet"  # under the synthbench.data package
SUFFIX = " (reference)"  # what marks a reference run's mechanism in every output
# both tracks of quick (synthbench/run/protocols.py): the core track, then its block twin
REFERENCE_PROTOCOLS = ("quick", "quick-block")
REFERENCE_MECHANISMS = (
    "softmax", "linear", "performer", "cosformer", "slay", "none", "sliding-window", "retnet",
    "gla", "deltanet", "gated-deltanet", "mamba2", "based",
)  # fmt: skip
METADATA_KEY = b"synthbench_reference"  # the file's summary: what it holds and lacks (JSON)
# what `synthbench report` adds to its error when there is nothing of the user's to report
FIRST_RUN_HINT = (
    "(run something first, e.g. `synthbench run --task copy`; the shipped reference is shown "
    "beside it)"
)


@dataclass
class Reference:
    rows: pd.DataFrame  # every lr row (the store's COLUMNS); empty when unusable
    where: str = ""  # the file read
    problem: str | None = None  # why its rows are not shown (one line), or None
    protocols: frozenset[str] = frozenset()  # the protocols the file holds, even unusable
    info: dict[str, Any] = field(default_factory=dict)  # the file's summary (METADATA_KEY)
    # made by an earlier synthbench (an older suite or protocol version): the state between
    # a change of the suite or the recipe and the one rebuild that follows it
    outdated: bool = False

    @property
    def usable(self) -> bool:
        return self.problem is None and not self.rows.empty


def shipped_file():
    """The shipped reference file (an importlib.resources Traversable)."""
    return resources.files("synthbench.data").joinpath(SHIPPED)


# what a reference file must hold to be checked at all
REQUIRED = (
    "run_id", "task", "mechanism", "protocol", "protocol_version", "suite_version",
    "schema_version", "seed", "lr", "selected", "status",
)  # fmt: skip


def _empty() -> pd.DataFrame:
    return DATASET_SCHEMA.empty_table().to_pandas()


def load(path: str | Path | None = None) -> Reference:
    """The reference rows of ``path``, else of ``$SYNTHBENCH_REFERENCE``, else the shipped
    file. A file that is absent holds nothing (no problem: a source tree may lack it); one
    that cannot be read, or is of another suite, protocol or newer schema version, has its
    ``problem`` and no rows."""
    if path is None and os.environ.get(ENV):
        path = os.environ[ENV]
    source = shipped_file() if path is None else Path(path)
    where = str(source)
    if not source.is_file():
        problem = None if path is None else f"reference file {where} does not exist"
        return Reference(_empty(), where, problem)
    try:
        with source.open("rb") as handle:
            table = pq.read_table(handle)
    except Exception as exc:  # anything pyarrow raises on a file that is not Parquet
        return Reference(_empty(), where, f"cannot read the reference {where}: {exc}")
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    try:
        info = json.loads(raw) if raw else {}
    except ValueError:
        info = {}
    names = set(table.column_names)
    protocols = frozenset()
    if "protocol" in names:
        protocols = frozenset(str(p) for p in table["protocol"].to_pylist())

    def unusable(problem: str, outdated: bool = False) -> Reference:
        problem = f"the reference {where} {problem}"
        return Reference(_empty(), where, problem, protocols, info, outdated)

    missing = set(REQUIRED) - names
    if missing:
        return unusable(f"lacks columns {', '.join(sorted(missing))}")
    # columns a later schema added are null, as the store reads an older file
    for name in DATASET_SCHEMA.names:
        if name not in names:
            nulls = pa.nulls(table.num_rows, DATASET_SCHEMA.field(name).type)
            table = table.append_column(name, nulls)
    try:
        rows = table.select(DATASET_SCHEMA.names).cast(DATASET_SCHEMA).to_pandas()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        return unusable(f"has columns of the wrong type ({exc})")
    problem = validate(rows)
    if problem is not None:
        return unusable(problem, predates(rows))
    return Reference(rows[COLUMNS], where, None, protocols, info)


def write(rows: pd.DataFrame, path: str | Path, info: dict[str, Any] | None = None) -> None:
    """Write reference ``rows`` (the store's columns) to ``path``: one zstd-compressed
    Parquet file of every stored column (``DATASET_SCHEMA``), with ``info`` (what it holds)
    in its metadata; atomically, and the same rows give the same bytes."""
    table = pa.Table.from_pandas(
        rows[DATASET_SCHEMA.names], schema=DATASET_SCHEMA, preserve_index=False
    )
    metadata = dict(DATASET_SCHEMA.metadata or {})
    metadata[METADATA_KEY] = json.dumps(info or {}, sort_keys=True).encode()
    table = table.replace_schema_metadata(metadata)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        pq.write_table(table, tmp, compression="zstd", compression_level=19)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def validate(rows: pd.DataFrame) -> str | None:
    """Why these reference rows cannot be shown beside today's (the end of a sentence
    beginning "the reference ..."), or None: they must be of this synthbench's suite
    version, each protocol at its version here, and a schema this version reads."""
    from synthbench.run.protocols import PROTOCOLS
    from synthbench.run.spec import SUITE_VERSION

    if rows.empty:
        return None
    suites = sorted({int(v) for v in rows["suite_version"]})
    if suites != [SUITE_VERSION]:
        found = ", ".join(f"v{v}" for v in suites)
        return f"is for suite {found}; this synthbench runs suite v{SUITE_VERSION}"
    for (name, version), _ in rows.groupby(["protocol", "protocol_version"]):
        if name not in PROTOCOLS:
            return f"holds protocol {name}, unknown to this synthbench"
        here = PROTOCOLS.get(name).version
        if int(version) != here:
            return f"is for protocol {name} v{version}; this synthbench's is v{here}"
    newest = int(rows["schema_version"].max())
    if newest > SCHEMA_VERSION:
        return f"is of schema version {newest}; this synthbench reads 1..{SCHEMA_VERSION}"
    return None


def predates(rows: pd.DataFrame) -> bool:
    """Whether reference ``rows`` were made by an earlier synthbench: of an older suite, or
    of an older version of a protocol it knows, and of nothing newer."""
    from synthbench.run.protocols import PROTOCOLS
    from synthbench.run.spec import SUITE_VERSION

    suites = {int(v) for v in rows["suite_version"]}
    versions = {
        (str(name), int(version))
        for name, version in rows[["protocol", "protocol_version"]].drop_duplicates().values
    }
    if any(name not in PROTOCOLS or version > PROTOCOLS.get(name).version
           for name, version in versions) or max(suites) > SUITE_VERSION:  # fmt: skip
        return False
    older = any(version < PROTOCOLS.get(name).version for name, version in versions)
    return older or min(suites) < SUITE_VERSION


# -- beside the user's rows -----------------------------------------------------------------


def mark(rows: pd.DataFrame) -> pd.DataFrame:
    """Reference rows with their mechanism named ``<name> (reference)``: every table, the
    leaderboard and the figures take the mechanism's name from this column, so the mark is
    in each of them (and no registered name has a space: none can clash)."""
    return rows.assign(mechanism=rows["mechanism"].astype(str) + SUFFIX)


def _beside(
    user_rows: pd.DataFrame,
    reference: pd.DataFrame,
    tasks: Iterable[str] | None,
    mechanisms: Iterable[str] | None,
) -> pd.DataFrame:
    """The reference rows that belong beside ``user_rows`` (``with_reference``), the user's
    own run ids not yet left out."""
    from synthbench.core.mechanism import MECHANISMS
    from synthbench.core.task import TASKS

    versions = _versions(user_rows)
    ref = reference[_versions(reference).isin(set(versions))]
    keep_tasks = set(user_rows["task"])
    if tasks is not None:
        keep_tasks &= set(tasks)
    ref = ref[ref["task"].isin(keep_tasks)]
    if mechanisms is not None:
        ref = ref[ref["mechanism"].isin(set(mechanisms))]
    # a name this install does not know (a mechanism removed since) is left out, cleanly
    known = ref["mechanism"].isin(MECHANISMS.names()) & ref["task"].isin(TASKS.names())
    return ref[known]


def with_reference(
    user_rows: pd.DataFrame,
    reference: pd.DataFrame,
    tasks: Iterable[str] | None = None,
    mechanisms: Iterable[str] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``user_rows`` with the reference rows that belong beside them, marked (``mark``), and
    those reference rows (unmarked). A reference run is added when its protocol at its
    version, and its task, are among the user's rows; when its task and mechanism pass the
    report's filters (``tasks``, ``mechanisms``: canonical names, None for every one); when
    its task and mechanism are registered here; and when the user has no run of the same
    run id (their own row wins: ``replaced_runs``)."""
    if reference.empty or user_rows.empty:
        return user_rows, reference.iloc[:0]
    ref = _beside(user_rows, reference, tasks, mechanisms)
    ref = ref[~ref["run_id"].isin(set(user_rows["run_id"]))]
    if ref.empty:
        return user_rows, ref
    combined = pd.concat([user_rows, mark(ref)[user_rows.columns]], ignore_index=True)
    return combined, ref


REPLACED_COLUMNS = ["protocol", "protocol_version", "task", "mechanism", "seed"]


def replaced_runs(
    user_rows: pd.DataFrame,
    reference: pd.DataFrame,
    tasks: Iterable[str] | None = None,
    mechanisms: Iterable[str] | None = None,
) -> pd.DataFrame:
    """The reference runs ``with_reference`` leaves out because the user has a run of the
    same run id (the same configuration: theirs is shown), one row each: protocol,
    protocol_version, task, mechanism and seed. The leaderboard says so
    (``leaderboard.replaced_note``)."""
    if reference.empty or user_rows.empty:
        return pd.DataFrame(columns=REPLACED_COLUMNS)
    ref = _beside(user_rows, reference, tasks, mechanisms)
    ref = ref[ref["run_id"].isin(set(user_rows["run_id"]))].drop_duplicates("run_id")
    return ref[REPLACED_COLUMNS].reset_index(drop=True)


def _versions(rows: pd.DataFrame) -> pd.Series:
    """Per row, ``protocol vN``."""
    return rows["protocol"].astype(str) + " v" + rows["protocol_version"].astype(int).astype(str)


def describe(
    added: pd.DataFrame, user_rows: pd.DataFrame, replaced: pd.DataFrame | None = None
) -> str:
    """The report's one line about the reference runs it adds (and those of the user's
    ``replaced``, which the leaderboard names)."""
    mechs = [m for m in REFERENCE_MECHANISMS if m in set(added["mechanism"])]
    mechs += sorted(set(added["mechanism"]) - set(mechs))
    protocols = ", ".join(sorted(set(_versions(added))))

    def made_with(column: str) -> str:
        return ", ".join(sorted({str(v) for v in added[column].dropna()})) or "?"

    return (
        f"{plural(user_rows['run_id'].nunique(), 'run')} of yours beside "
        f"{plural(added['run_id'].nunique(), 'reference run')} of {', '.join(mechs)} (protocol "
        f"{protocols}, {plural(added['task'].nunique(), 'task')}; shipped with synthbench "
        f"{made_with('synthbench_version')}, torch {made_with('torch_version')}), marked "
        f"'{SUFFIX.strip()}'; --no-reference leaves them out"
        + (
            f"; {plural(len(replaced), 'run')} of yours "
            f"{'replaces' if len(replaced) == 1 else 'replace'} the reference's of the same "
            "configuration (the leaderboard names them)"
            if replaced is not None and len(replaced)
            else ""
        )
    )


class ForReport(NamedTuple):
    """What ``synthbench report`` shows of the reference (``for_report``)."""

    rows: pd.DataFrame  # the user's rows with the reference's beside them, marked
    added: str | None  # the line saying what was added, or why nothing was; None: neither
    problem: str | None  # a warning (the reference is unusable); None: none
    replaced: pd.DataFrame  # the reference runs the user's replaced (``replaced_runs``)


def for_report(
    user_rows: pd.DataFrame,
    tasks: Sequence[str] | None = None,
    mechanisms: Sequence[str] | None = None,
    path: str | Path | None = None,
) -> ForReport:
    """What ``synthbench report`` shows: the rows (``with_reference``), the line saying
    what was added, or why nothing was where the user's rows are all of protocols the
    reference does not hold (None: neither), a warning (None: none), and the reference runs
    the user's replaced. The warning is given only where the reference would have been
    shown: the user has rows of a protocol it holds."""
    reference = load(path)
    none = pd.DataFrame(columns=REPLACED_COLUMNS)
    if reference.problem is not None:
        wanted = set(user_rows["protocol"]) & reference.protocols
        if wanted or not reference.protocols:
            warning = f"{reference.problem}: reference runs not shown"
            return ForReport(user_rows, None, warning, none)
        return ForReport(user_rows, None, None, none)
    rows, added = with_reference(user_rows, reference.rows, tasks, mechanisms)
    replaced = replaced_runs(user_rows, reference.rows, tasks, mechanisms)
    if len(added):
        return ForReport(rows, describe(added, user_rows, replaced), None, replaced)
    held = sorted(set(_versions(reference.rows)))
    if held and not set(_versions(user_rows)) & set(held):  # say why there is none
        yours = ", ".join(sorted(set(_versions(user_rows))))
        names = sorted(set(reference.rows["protocol"]))
        return ForReport(
            rows,
            f"no shipped reference runs beside protocol {yours}: the reference holds "
            f"{', '.join(held)} (`synthbench run --protocol {names[0]}` makes runs it is "
            "shown beside)",
            None,
            replaced,
        )
    return ForReport(rows, None, None, replaced)
