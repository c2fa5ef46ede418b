"""The results store: one Parquet file per run in a Hive-style tree.

    <root>/protocol=<protocol>/task=<task>/mechanism=<mechanism>/<run_id>.parquet

Following the Hive convention the partition columns (synthbench/run/schema.py) live in the
path, not in the file, so pandas, pyarrow datasets, DuckDB and Polars read the whole tree as
one table (with ``DATASET_SCHEMA``, or their options for files of older schema versions:
docs/RESULTS.md), and a query grouped by task and mechanism cannot mix protocols unseen.
Files are written to a hidden temporary name and renamed, so a killed run leaves either a
complete file or none. A file that cannot be read or does not carry this schema is reported
by path and skipped, never dropped.

Trees written before schema 6 have no protocol level (``<root>/task=.../mechanism=...``,
the protocol in the file): they are read as they are, a run of theirs moves to its new
place when it is written again, and ``migrate`` moves all of them at once (a rename: the
file itself is unchanged), after which DuckDB and Polars read the tree too.

Nothing stored is lost by a write (``ResultStore.save``): a stored result is never replaced
by a failed training at the same lr, a file at the run's path that this version cannot read
is moved aside to a hidden name first, and one of a newer schema version is never touched.
"""

from __future__ import annotations

import json
import os
import re
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from synthbench.core.atomic import TMP_PREFIX, atomic_output, process_alive
from synthbench.core.paths import OutsideRoot, path_under
from synthbench.core.registry import NAME
from synthbench.core.text import short_repr
from synthbench.run.row_checks import row_problems
from synthbench.run.schema import (
    ADDED_IN,
    COLUMNS,
    LEAKY,
    LEGACY_PARTITIONS,
    PARTITIONS,
    RESULT_STATUSES,
    SCHEMA,
    SCHEMA_VERSION,
    check_row,
    lr_key,
    schema_of,
)

if TYPE_CHECKING:  # pandas loads only where rows are read (workers only write)
    import pandas as pd

# <root>/bench/: where `synthbench bench` stored its rows (another schema) before they got
# their own tree (synthbench/bench/common.py); a tree that still holds them is read without
# them (and `bench plot` still finds them there)
BENCH_DIR = "bench"
# <run file>.unreadable-<UTC time>-<id>, hidden: what stood at a run's path and could not be
# read, moved aside before the run's new file is written (readers skip hidden names)
_UNREADABLE = ".unreadable-"
_PARTITION_DIR = re.compile(r"^(protocol|task|mechanism)=(.+)$")


def write_table(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` as Parquet, atomically (synthbench/core/atomic.py)."""
    with atomic_output(path) as handle:
        pq.write_table(table, handle)


class CorruptResultWarning(UserWarning):
    """A file in the results tree that is unreadable or not a synthbench results file."""


class NewerSchemaError(ValueError):
    """A results file of a schema version newer than this synthbench reads: it is skipped
    when reading and never overwritten (a newer synthbench reads and extends it)."""


class StoreNotice(UserWarning):
    """What ``ResultStore.write`` did instead of what it was asked, so as to lose nothing: a
    stored result kept in place of a failed row, an unreadable file moved aside."""


@dataclass
class Saved:
    """What ``ResultStore.save`` stored, and what it left or moved."""

    path: Path
    rows: list[dict[str, Any]]  # the run's rows as stored now, in lr order
    # (stored result, failed row not stored) at the same lr
    kept: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    # (where it stood, where it went, why): an unreadable file at the run's path, or at
    # its place in an older tree's layout, moved aside
    moved: tuple[Path, Path, str] | None = None
    written: bool = True  # False: settle held the write back

    def notices(self) -> list[str]:
        """One line for each thing the writer should be told."""
        lines = []
        if self.moved is not None:
            where, aside, reason = self.moved
            lines.append(f"{where} could not be read ({reason}); moved it to {aside}")
        for stored, failed in self.kept:
            error = f": {failed['error']}" if failed.get("error") else ""
            lines.append(
                f"kept the stored {stored['status']} row at lr {stored['lr']:g} in {self.path}; "
                f"the new training at that lr failed ({failed['status']}{error}) and is not stored"
            )
        return lines


@dataclass
class LoadReport:
    rows: pd.DataFrame
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # (path, reason)
    legacy: list[Path] = field(default_factory=list)  # read files of the layout before schema 6
    # (path, rows left out, rows in the file, the first one's problem): rows that fail
    # synthbench/run/row_checks.py, never used
    rows_left_out: list[tuple[Path, int, int, str]] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)  # every file looked at, read or not

    def warnings(self) -> list[str]:
        """One line per file skipped or holding rows left out, naming it and why."""
        lines = [f"skipping {path}: {reason}" for path, reason in self.skipped]
        return lines + [_left_out_line(*left_out) for left_out in self.rows_left_out]


def _left_out_line(path: Path, n: int, total: int, problem: str) -> str:
    which = f"{n} of the {total} rows" if total > 1 else "the row"
    return f"skipping {which} of {path}: {problem}"


class ResultStore:
    def __init__(self, root: str | Path = "results") -> None:
        self.root = Path(root)

    def path_for(self, protocol: str, task: str, mechanism: str, run_id: str) -> Path:
        """Where the run's file goes; OutsideRoot (a ValueError) for a value that is not a
        name (synthbench/core/paths.py: a stored value never builds a path out of the tree)."""
        names = _names(self.root, protocol=protocol, task=task, mechanism=mechanism)
        return path_under(self.root, *names, f"{_name(self.root, 'run_id', run_id)}.parquet")

    def legacy_path_for(self, task: str, mechanism: str, run_id: str) -> Path:
        """Where a tree of schema < 6 kept the run's file (no protocol level); as ``path_for``."""
        names = _names(self.root, task=task, mechanism=mechanism)
        return path_under(self.root, *names, f"{_name(self.root, 'run_id', run_id)}.parquet")

    def file_of(self, protocol: str, task: str, mechanism: str, run_id: str) -> Path:
        """The run's file: at its path, or where an older tree left it, or (neither there)
        its path (``path_for``)."""
        path = self.path_for(protocol, task, mechanism, run_id)
        legacy = self.legacy_path_for(task, mechanism, run_id)
        return legacy if not os.path.lexists(path) and os.path.lexists(legacy) else path

    def write(
        self,
        rows: list[dict[str, Any]],
        *,
        replace: bool = False,
        settle: Callable[[list[dict[str, Any]]], object] | None = None,
    ) -> Path:
        """Store the rows of one run as ``save`` does; what it kept or moved aside instead is
        reported as a ``StoreNotice`` warning."""
        saved = self.save(rows, replace=replace, settle=settle)
        for line in saved.notices():
            warnings.warn(line, StoreNotice, stacklevel=2)
        return saved.path

    def save(
        self,
        rows: list[dict[str, Any]],
        *,
        replace: bool = False,
        settle: Callable[[list[dict[str, Any]]], object] | None = None,
    ) -> Saved:
        """Store the rows of one run (same run_id, protocol, task, mechanism) atomically,
        merged with what is stored for it so that nothing stored is lost:

        - a stored result (``RESULT_STATUSES``) stays where the new row at its lr failed,
          unless that row is ``LEAKY``;
        - stored results at lrs the new rows lack stay too, unless ``replace`` (a ``--force``
          rerun that completed replaces the run);
        - a file at the run's path that this version cannot read is moved aside to a hidden
          name (``Saved.moved``); one of a newer schema raises NewerSchemaError, untouched;
        - the run's file in an older tree's layout moves to the run's path first.

        ``settle(rows)`` is applied to the merged rows (lr order) before they are written, and
        returning False holds the write back (``Saved.written``): the runner marks the
        selected lr there, and holds a ``--force`` rerun back until it is complete. A row must
        hold exactly ``ROW_COLUMNS``."""
        for row in rows:
            check_row(row)
        key = _run_key(rows[0])
        if any(_run_key(r) != key for r in rows):
            raise ValueError("one results file holds the rows of exactly one run")
        path = self.path_for(*key)
        path.parent.mkdir(parents=True, exist_ok=True)
        found = self.file_of(*key)
        moved = None
        if found != path:  # an older tree's file: this run's rows live at its path from now
            _, unreadable = self._stored(found)  # a newer schema's file raises, left as it is
            if unreadable is None:
                os.rename(found, path)
            else:  # moved aside where it is, and named there (it never stood at path)
                moved = (found, self._move_aside(found), unreadable)
        stored, unreadable = self._stored(path)
        before = sorted((dict(r) for r in stored), key=lambda r: r["lr"])
        merged, kept = _merge(stored, rows, replace)
        if settle is not None and settle(merged) is False:
            return Saved(path, merged, kept, moved, written=False)
        if unreadable is None and merged == before:
            return Saved(path, merged, kept, moved)  # nothing new to store: the file stays as it is
        table = pa.Table.from_pylist(
            [{**r, "schema_version": SCHEMA_VERSION} for r in merged], schema=SCHEMA
        )
        if unreadable is not None:
            moved = (path, self._move_aside(path), unreadable)
        write_table(table, path)
        return Saved(path, merged, kept, moved)

    def refusal(self, protocol: str, task: str, mechanism: str, run_id: str) -> str | None:
        """Why the run's file may not be written (one of a newer schema version), or None."""
        try:
            self._stored(self.file_of(protocol, task, mechanism, run_id))
        except NewerSchemaError as exc:
            return str(exc)
        return None

    def read_run(self, protocol: str, task: str, mechanism: str, run_id: str) -> list[dict]:
        """Every stored row of one run, all columns (nothing if it has no readable file)."""
        path = self.file_of(protocol, task, mechanism, run_id)
        if not path.is_file():
            return []
        try:
            table = self._read(path, schema_of(COLUMNS))
        except ValueError:
            return []
        import pandas as pd  # only where rows are read

        rows = table.to_pylist()
        problems = row_problems(pd.DataFrame(rows))  # a row that fails is not this run's
        return _without_version([r for r, p in zip(rows, problems, strict=True) if p is None])

    def _stored(self, path: Path) -> tuple[list[dict[str, Any]], str | None]:
        """The rows stored at ``path``, or none and why what stands there cannot be read;
        NewerSchemaError for a file of a newer schema version."""
        if not os.path.lexists(path):
            return [], None
        if not path.is_file():
            return [], "not a file"
        try:
            table = self._read(path, schema_of(COLUMNS))
        except NewerSchemaError as exc:
            raise NewerSchemaError(
                f"{path} holds results of {exc}: upgrade synthbench to use or extend them "
                "(the file is left as it is)"
            ) from None
        except ValueError as exc:
            return [], str(exc)
        return _rows_of(table), None

    def _move_aside(self, path: Path) -> Path:
        """Rename ``path`` to a hidden name of its own beside it: kept, and out of the readers'
        way (the store, pyarrow, and the DuckDB and Polars globs skip it)."""
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        aside = path.with_name(f".{path.name}{_UNREADABLE}{stamp}-{uuid.uuid4().hex[:6]}")
        os.rename(path, aside)
        return aside

    # -- reading ------------------------------------------------------------------------

    def files(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return sorted(
            p
            for p in self.root.rglob("*")
            if p.is_file()
            and not any(part.startswith(".") for part in p.relative_to(self.root).parts)
            and p.relative_to(self.root).parts[0] != BENCH_DIR
        )

    def _read(self, path: Path, wanted: pa.Schema) -> pa.Table:
        """One file as an Arrow table of the ``wanted`` columns (partition columns from the
        path, the protocol from the file in an older tree's layout, columns added by a later
        schema version null); raises ValueError if foreign."""
        if path.suffix != ".parquet":
            raise ValueError("not a Parquet file")
        partitions = _partitions(path.relative_to(self.root))
        if partitions is None:
            raise ValueError("not under protocol=<protocol>/task=<task>/mechanism=<mechanism>/")
        try:
            parquet = pq.ParquetFile(path)  # lighter than pq.read_table's dataset per file
            schema = parquet.schema_arrow
        except Exception as exc:
            raise ValueError(f"unreadable Parquet ({type(exc).__name__}: {exc})") from exc
        version = (schema.metadata or {}).get(b"synthbench_schema_version")
        if version is None:
            raise ValueError("not a synthbench results file (no schema version)")
        version = int(version)
        if not 1 <= version <= SCHEMA_VERSION:
            error = NewerSchemaError if version > SCHEMA_VERSION else ValueError
            raise error(f"schema version {version}, this synthbench reads 1..{SCHEMA_VERSION}")
        added_later = {c for v, cols in ADDED_IN.items() if v > version for c in cols}
        missing = set(SCHEMA.names) - set(schema.names) - added_later
        missing |= set(PARTITIONS) - set(partitions) - set(schema.names)
        if missing:
            raise ValueError(f"missing columns {', '.join(sorted(missing))}")
        # the file's own protocol (schema < 6) is read to be checked against its folder's
        stored = [c for c in wanted.names if c in schema.names and c not in partitions]
        checked = [c for c in partitions if c in schema.names]
        try:
            table = parquet.read(columns=list(dict.fromkeys([*stored, *checked, "run_id"])))
        except Exception as exc:
            raise ValueError(f"unreadable Parquet ({type(exc).__name__}: {exc})") from exc
        if table.num_rows == 0 or not pc.all(pc.equal(table["run_id"], path.stem)).as_py():
            raise ValueError("its rows do not belong to the run its name gives")
        for name in checked:
            if not pc.all(pc.equal(table[name], partitions[name])).as_py():
                folder = f"{name}={partitions[name]}"
                raise ValueError(f"its rows' {name} is not its folder's ({folder})")
        table = table.select(stored)
        for name in wanted.names:
            if name in partitions:
                column = pa.array([partitions[name]] * table.num_rows, pa.string())
                table = table.append_column(name, column)
            elif name not in stored:  # a column added by a later schema version
                table = table.append_column(name, pa.nulls(table.num_rows, wanted.field(name).type))
        try:
            return table.select(wanted.names).cast(wanted)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ValueError(f"columns of the wrong type ({exc})") from exc

    def load(self, columns: list[str] | None = None, warn: bool = True) -> LoadReport:
        """All readable rows; every skipped file is reported (as a warning) with its reason."""
        names = [*PARTITIONS, *(c for c in (columns or SCHEMA.names) if c not in PARTITIONS)]
        # every file is checked against its name, so run_id is read even when not asked for,
        # and every row against the versions this release knows
        read = [*names, *(c for c in ("run_id", "schema_version") if c not in names)]
        wanted = schema_of(read)
        tables, skipped = [], []
        kept: dict[str, int] = {}  # run_id -> its file's index: a run copied by hand loads once
        paths = []
        every = self.files()
        for path in every:
            try:
                table = self._read(path, wanted)
                if path.stem in kept:  # keep the copy in its own run's folders
                    i = kept[path.stem]
                    if self._in_place(path) and not self._in_place(paths[i]):
                        tables[i], paths[i], path = table, path, paths[i]
                    raise ValueError(f"run {path.stem} is also stored at {paths[i]} (kept)")
                kept[path.stem] = len(tables)
                tables.append(table)
                paths.append(path)
            except ValueError as exc:
                skipped.append((path, str(exc)))
                if warn:
                    warnings.warn(f"skipping {path}: {exc}", CorruptResultWarning, stacklevel=2)
        # one conversion to pandas for the whole tree: per file, it would dominate the load
        import pandas as pd

        rows = pa.concat_tables(tables).to_pandas() if tables else pd.DataFrame(columns=read)
        problems = row_problems(rows)
        bad = problems.notna()
        left_out = []
        if bad.any():  # rare: a file edited by hand, or not written by synthbench
            file_of_row = pd.Series(
                [i for i, t in enumerate(tables) for _ in range(t.num_rows)], index=rows.index
            )
            for i, part in problems[bad].groupby(file_of_row[bad], sort=True):
                left_out.append((paths[i], len(part), tables[i].num_rows, part.iloc[0]))
                if warn:
                    line = _left_out_line(*left_out[-1])
                    warnings.warn(line, CorruptResultWarning, stacklevel=2)
            rows = rows[~bad].reset_index(drop=True)
        # what `migrate` would move: not a file whose rows fail the checks (it leaves them)
        failing = {path for path, *_ in left_out}
        legacy = [p for p in paths if _is_legacy(p.relative_to(self.root)) and p not in failing]
        return LoadReport(rows[names], skipped, legacy, left_out, every)

    def remove_stale_temporaries(self) -> int:
        """Delete temporary files left behind by processes that no longer exist."""
        removed = 0
        if not self.root.is_dir():
            return removed
        for tmp in self.root.rglob(f"{TMP_PREFIX}*"):
            pid = tmp.name[len(TMP_PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and not process_alive(int(pid)):
                tmp.unlink(missing_ok=True)
                removed += 1
        return removed

    def _in_place(self, path: Path) -> bool:
        """Whether the run in ``path`` is of the protocol, task and mechanism its folders name
        (its config says which), so that of two copies of a run the one in its own place is
        kept: in an older tree's layout, the task and mechanism."""
        try:
            config = json.loads(pq.read_table(path, columns=["config"])["config"][0].as_py())
            place = {
                "protocol": config["protocol"]["name"],
                "task": config["task"],
                "mechanism": config["mechanism"],
            }
        except Exception:  # unreadable, or no config to tell: not known to be in place
            return False
        partitions = _partitions(path.relative_to(self.root)) or {}
        return all(place[name] == value for name, value in partitions.items())

    def legacy_files(self) -> list[Path]:
        """The files laid out as trees before schema 6 kept them (no protocol level)."""
        return [path for path in self.files() if _is_legacy(path.relative_to(self.root))]

    def migrate(self) -> Migration:
        """Move every file of an older tree's layout to its run's path, under the protocol
        its rows name: a rename, the file unchanged. A file that cannot be read, or whose
        place is taken, stays where it is (``Migration.left``, with the reason)."""
        import pandas as pd  # only where rows are read

        done = Migration()
        for path in self.legacy_files():
            try:
                table = self._read(path, schema_of(COLUMNS))
            except ValueError as exc:
                done.left.append((path, str(exc)))
                continue
            # the checks every reader applies (row_checks.py): a row no training could have
            # written names no folder
            problems = [p for p in row_problems(pd.DataFrame(table.to_pylist())) if p]
            if problems:
                done.left.append((path, problems[0]))
                continue
            protocols = set(table["protocol"].to_pylist())
            if len(protocols) != 1:
                done.left.append((path, f"its rows name {len(protocols)} protocols"))
                continue
            task, mechanism = (table[name][0].as_py() for name in ("task", "mechanism"))
            try:
                target = self.path_for(protocols.pop(), task, mechanism, path.stem)
            except OutsideRoot as exc:  # the checks above let no such name through
                done.left.append((path, str(exc)))
                continue
            if os.path.lexists(target):
                done.left.append((path, f"{target} exists (the run is stored twice)"))
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(path, target)
            done.moved.append((path, target))
            done.protocols.add(target.relative_to(self.root).parts[0])
        for folder in sorted({p.parent for p, _ in done.moved}, reverse=True):
            for empty in (folder, folder.parent):  # mechanism=, then task=, once emptied
                if empty != self.root and not any(empty.iterdir()):
                    empty.rmdir()
        return done


@dataclass
class Migration:
    """What ``ResultStore.migrate`` did: (from, to) of each file moved, (path, why) of each
    left where it was."""

    moved: list[tuple[Path, Path]] = field(default_factory=list)
    left: list[tuple[Path, str]] = field(default_factory=list)
    protocols: set[str] = field(default_factory=set)  # the protocol= folders moved into


def _name(root: Path, column: str, value: object) -> str:
    """``value`` if it follows the registry's name rule (row_checks.py applies it to every
    stored row), else OutsideRoot: no folder or file of the tree is named by it."""
    if not (isinstance(value, str) and NAME.fullmatch(value)):
        raise OutsideRoot(
            f"{column} {short_repr(value, 40)} is not a name (letters, digits and _ . + -): "
            f"no path under {root} is built from it"
        )
    return value


def _names(root: Path, **values: object) -> list[str]:
    """The partition folders ``column=value`` of a run's path, each value checked."""
    return [f"{column}={_name(root, column, value)}" for column, value in values.items()]


def _partitions(relative: Path) -> dict[str, str] | None:
    """The partition values a file's path (relative to the root) gives, in either layout,
    or None where its folders are not a run's."""
    found = [m.groups() for part in relative.parent.parts if (m := _PARTITION_DIR.match(part))]
    names = tuple(name for name, _ in found)
    return dict(found) if names in (PARTITIONS, LEGACY_PARTITIONS) else None


def _is_legacy(relative: Path) -> bool:
    """Whether a file's path (relative to the root) is a run's in the layout before schema 6."""
    partitions = _partitions(relative)
    return partitions is not None and "protocol" not in partitions


def _run_key(row: dict[str, Any]) -> tuple[str, str, str, str]:
    """What places a run's file: (protocol, task, mechanism, run_id)."""
    return row["protocol"], row["task"], row["mechanism"], row["run_id"]


def _rows_of(table: pa.Table) -> list[dict[str, Any]]:
    """A run's rows as ``write`` takes them (without the version, which the store adds)."""
    return _without_version(table.to_pylist())


def _without_version(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "schema_version"} for r in rows]


def _merge(
    stored: list[dict[str, Any]], new: list[dict[str, Any]], replace: bool
) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], dict[str, Any]]]]:
    """The rows to store for a run (lr order), and the (stored, new) pairs where a stored
    result was kept over a failed new row."""
    results = {lr_key(r["lr"]): r for r in stored if r["status"] in RESULT_STATUSES}
    merged = {} if replace else dict(results)
    kept = []
    for row in new:
        lr = lr_key(row["lr"])
        if row["status"] not in RESULT_STATUSES and row["status"] != LEAKY and lr in results:
            merged[lr] = results[lr]
            kept.append((results[lr], row))
        else:
            merged[lr] = row
    return [merged[lr] for lr in sorted(merged)], kept
