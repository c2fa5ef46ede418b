"""The results store: one Parquet file per run in a Hive-style tree.

    <root>/task=<task>/mechanism=<mechanism>/<run_id>.parquet

Following the Hive convention the partition columns (task, mechanism) live in the path,
not in the file, so pandas, pyarrow datasets, DuckDB and Polars read the whole tree as one
table (with ``DATASET_SCHEMA``, or their options for files of older schema versions: the
README). Files are written to a hidden temporary name and renamed, so a killed run leaves
either a complete file or none. A file that cannot be read or does not carry this schema is
reported by path and skipped, never dropped.

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

if TYPE_CHECKING:  # pandas loads only where rows are read (workers only write)
    import pandas as pd

SCHEMA_VERSION = 5
# Columns each schema version added; a file of an older version is read with them null.
ADDED_IN = {
    2: ("eval_length_mult", "long_token_acc", "long_exact_match"),
    3: ("threads",),
    4: ("free_token_acc", "curve_steps", "curve_val_token_acc"),
    5: (
        "lr_edge",
        "target_metric",
        "chance_token_acc",
        "chance_exact_match",
        "token_acc_se",
        "exact_match_se",
        "free_token_acc_se",
    ),
}
PARTITIONS = ("task", "mechanism")
_TMP_PREFIX = ".tmp-"
# <root>/bench/: where `synthbench bench` stored its rows (another schema) before they got
# their own tree (synthbench/bench/common.py); a tree that still holds them is read without
# them (and `bench plot` still finds them there)
BENCH_DIR = "bench"
# Statuses that are a training's result; any other (error, ...) is a failure, which never
# replaces a stored result (ResultStore.save)
RESULT_STATUSES = frozenset({"ok", "diverged"})
# leaky (synthbench/check.py): the mechanism sees later positions. A failure that does
# replace a stored result, which it shows was never one.
LEAKY = "leaky"
# <run file>.unreadable-<UTC time>-<id>, hidden: what stood at a run's path and could not be
# read, moved aside before the run's new file is written (readers skip hidden names)
_UNREADABLE = ".unreadable-"

# Columns stored in each file (the partition columns are added back from the path).
SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("schema_version", pa.int32()),
        ("suite_version", pa.int32()),
        ("category", pa.string()),
        ("task_params", pa.string()),  # JSON
        ("mechanism_params", pa.string()),  # JSON
        ("protocol", pa.string()),
        ("protocol_version", pa.int32()),
        ("config", pa.string()),  # JSON of the whole resolved config that run_id hashes
        ("seed", pa.int64()),
        ("lr", pa.float64()),
        ("selected", pa.bool_()),  # the lr the validation set picked
        # the picked lr is alone at an edge of the grid: the optimum may lie beyond it
        ("lr_edge", pa.bool_()),
        ("steps", pa.int64()),
        ("steps_done", pa.int64()),
        ("status", pa.string()),  # ok | diverged | error | leaky (synthbench/check.py)
        ("error", pa.string()),
        ("token_acc", pa.float64()),
        ("exact_match", pa.float64()),
        ("val_token_acc", pa.float64()),
        ("val_exact_match", pa.float64()),
        # the test answers generated free-running: each answer fed back as the model made it
        ("free_token_acc", pa.float64()),
        # the metric the task is scored by (free_token_acc for a chain of steps)
        ("target_metric", pa.string()),
        # the best constant answer per position (synthbench/audit.py): what learning nothing
        # scores; reports normalise by it
        ("chance_token_acc", pa.float64()),
        ("chance_exact_match", pa.float64()),
        # standard errors of the test metrics over the test examples
        ("token_acc_se", pa.float64()),
        ("exact_match_se", pa.float64()),
        ("free_token_acc_se", pa.float64()),
        # learning curve: validation token accuracy after these optimizer steps
        ("curve_steps", pa.list_(pa.int64())),
        ("curve_val_token_acc", pa.list_(pa.float64())),
        # length generalisation: the test set of the task with its length knob scaled
        ("eval_length_mult", pa.float64()),
        ("long_token_acc", pa.float64()),
        ("long_exact_match", pa.float64()),
        ("final_loss", pa.float64()),
        ("n_params", pa.int64()),
        ("wall_seconds", pa.float64()),
        ("threads", pa.int64()),  # torch's intra-op threads of the training (in the run id)
        # provenance (synthbench/provenance.py)
        ("device", pa.string()),
        ("torch_version", pa.string()),
        ("synthbench_version", pa.string()),
        ("git_commit", pa.string()),
        ("created_at", pa.timestamp("us", tz="UTC")),
    ],
    metadata={"synthbench_schema_version": str(SCHEMA_VERSION)},
)
COLUMNS = [*PARTITIONS, *SCHEMA.names]
# The whole tree as one table: every column of every schema version (a file of an older one
# lacks some), the partition columns first. What pandas, pyarrow and Polars read it with.
DATASET_SCHEMA = pa.schema(
    [*(pa.field(p, pa.string()) for p in PARTITIONS), *SCHEMA],
    metadata=SCHEMA.metadata,
)
# What a row handed to ``write`` holds: every column but the version, which the store adds.
ROW_COLUMNS = frozenset(COLUMNS) - {"schema_version"}
# The columns a training fills with its results; null when it fails.
RESULT_METRICS = (
    "token_acc",
    "exact_match",
    "val_token_acc",
    "val_exact_match",
    "free_token_acc",
    "chance_token_acc",
    "chance_exact_match",
    "token_acc_se",
    "exact_match_se",
    "free_token_acc_se",
    "curve_steps",
    "curve_val_token_acc",
    "long_token_acc",
    "long_exact_match",
    "final_loss",
    "n_params",
)
_PARTITION_DIR = re.compile(r"^(task|mechanism)=(.+)$")


def has_curve(curve_steps) -> bool:
    """Whether a row stores a learning curve (rows of schema < 4 have none: null, or NaN in a
    built frame)."""
    return curve_steps is not None and not isinstance(curve_steps, float) and len(curve_steps) > 0


def write_atomically(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` through a hidden temporary file (named with this process's
    id, so a later run can tell a stale one) and a rename: readers see the old file or the
    new one, never half of one."""
    tmp = path.parent / f"{_TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}-{path.name}"
    try:
        with open(tmp, "wb") as handle:
            pq.write_table(table, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class SchemaError(ValueError):
    """A row that does not hold exactly the columns of the schema (a programming error)."""


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
    moved: tuple[Path, str] | None = None  # (where, why): what stood at path, unreadable
    written: bool = True  # False: settle held the write back

    def notices(self) -> list[str]:
        """One line for each thing the writer should be told."""
        lines = []
        if self.moved is not None:
            aside, reason = self.moved
            lines.append(f"{self.path} could not be read ({reason}); moved it to {aside}")
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


class ResultStore:
    def __init__(self, root: str | Path = "results") -> None:
        self.root = Path(root)

    def path_for(self, task: str, mechanism: str, run_id: str) -> Path:
        return self.root / f"task={task}" / f"mechanism={mechanism}" / f"{run_id}.parquet"

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
        """Store the rows of one run (same run_id, task, mechanism) atomically, merged with
        what is stored for it so that nothing stored is lost:

        - a stored result (``RESULT_STATUSES``) stays where the new row at its lr failed,
          unless that row is ``LEAKY``;
        - stored results at lrs the new rows lack stay too, unless ``replace`` (a ``--force``
          rerun that completed replaces the run);
        - a file at the run's path that this version cannot read is moved aside to a hidden
          name (``Saved.moved``); one of a newer schema raises NewerSchemaError, untouched.

        ``settle(rows)`` is applied to the merged rows (lr order) before they are written, and
        returning False holds the write back (``Saved.written``): the runner marks the
        selected lr there, and holds a ``--force`` rerun back until it is complete. A row must
        hold exactly ``ROW_COLUMNS``."""
        for row in rows:
            check_row(row)
        first = rows[0]
        if any(
            (r["run_id"], r["task"], r["mechanism"])
            != (first["run_id"], first["task"], first["mechanism"])
            for r in rows
        ):
            raise ValueError("one results file holds the rows of exactly one run")
        path = self.path_for(first["task"], first["mechanism"], first["run_id"])
        path.parent.mkdir(parents=True, exist_ok=True)
        stored, unreadable = self._stored(path)
        before = sorted((dict(r) for r in stored), key=lambda r: r["lr"])
        merged, kept = _merge(stored, rows, replace)
        if settle is not None and settle(merged) is False:
            return Saved(path, merged, kept, written=False)
        if unreadable is None and merged == before:
            return Saved(path, merged, kept)  # nothing new to store: the file stays as it is
        table = pa.Table.from_pylist(
            [{**r, "schema_version": SCHEMA_VERSION} for r in merged], schema=SCHEMA
        )
        moved = None
        if unreadable is not None:
            moved = (self._move_aside(path), unreadable)
        write_atomically(table, path)
        return Saved(path, merged, kept, moved)

    def refusal(self, task: str, mechanism: str, run_id: str) -> str | None:
        """Why the run's file may not be written (one of a newer schema version), or None."""
        try:
            self._stored(self.path_for(task, mechanism, run_id))
        except NewerSchemaError as exc:
            return str(exc)
        return None

    def read_run(self, task: str, mechanism: str, run_id: str) -> list[dict[str, Any]]:
        """Every stored row of one run, all columns (nothing if it has no readable file)."""
        path = self.path_for(task, mechanism, run_id)
        if not path.is_file():
            return []
        try:
            table = self._read(path, _schema_of(COLUMNS))
        except ValueError:
            return []
        return _rows_of(table)

    def _stored(self, path: Path) -> tuple[list[dict[str, Any]], str | None]:
        """The rows stored at ``path``, or none and why what stands there cannot be read;
        NewerSchemaError for a file of a newer schema version."""
        if not os.path.lexists(path):
            return [], None
        if not path.is_file():
            return [], "not a file"
        try:
            table = self._read(path, _schema_of(COLUMNS))
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
        path, columns added by a later schema version null); raises ValueError if foreign."""
        if path.suffix != ".parquet":
            raise ValueError("not a Parquet file")
        partitions = dict(
            m.groups()
            for part in path.relative_to(self.root).parent.parts
            if (m := _PARTITION_DIR.match(part))
        )
        if set(partitions) != set(PARTITIONS):
            raise ValueError("not under task=<task>/mechanism=<mechanism>/")
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
        if missing:
            raise ValueError(f"missing columns {', '.join(sorted(missing))}")
        stored = [c for c in wanted.names if c in schema.names]
        try:
            table = parquet.read(columns=stored)
        except Exception as exc:
            raise ValueError(f"unreadable Parquet ({type(exc).__name__}: {exc})") from exc
        if table.num_rows == 0 or not pc.all(pc.equal(table["run_id"], path.stem)).as_py():
            raise ValueError("its rows do not belong to the run its name gives")
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
        # every file is checked against its name, so run_id is read even when not asked for
        read = names if "run_id" in names else [*names, "run_id"]
        wanted = _schema_of(read)
        tables, skipped = [], []
        kept: dict[str, int] = {}  # run_id -> its file's index: a run copied by hand loads once
        paths = []
        for path in self.files():
            try:
                table = self._read(path, wanted)
                if path.stem in kept:  # keep the copy in its own task's and mechanism's folder
                    i = kept[path.stem]
                    if _in_place(path) and not _in_place(paths[i]):
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
        return LoadReport(rows[names], skipped)

    def remove_stale_temporaries(self) -> int:
        """Delete temporary files left behind by processes that no longer exist."""
        removed = 0
        if not self.root.is_dir():
            return removed
        for tmp in self.root.rglob(f"{_TMP_PREFIX}*"):
            pid = tmp.name[len(_TMP_PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and not _process_alive(int(pid)):
                tmp.unlink(missing_ok=True)
                removed += 1
        return removed


def check_row(row: dict[str, Any]) -> None:
    """Raise SchemaError unless ``row`` holds exactly the columns of the current schema."""
    missing, unknown = ROW_COLUMNS - set(row), set(row) - ROW_COLUMNS
    if missing or unknown:
        problems = [f"{what} {', '.join(sorted(cols))}" for what, cols in
                    (("missing", missing), ("unknown", unknown)) if cols]  # fmt: skip
        raise SchemaError(f"a results row of schema {SCHEMA_VERSION}: " + "; ".join(problems))


def _rows_of(table: pa.Table) -> list[dict[str, Any]]:
    """A run's rows as ``write`` takes them (without the version, which the store adds)."""
    return [{k: v for k, v in r.items() if k != "schema_version"} for r in table.to_pylist()]


def _merge(
    stored: list[dict[str, Any]], new: list[dict[str, Any]], replace: bool
) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], dict[str, Any]]]]:
    """The rows to store for a run (lr order), and the (stored, new) pairs where a stored
    result was kept over a failed new row."""
    from synthbench.sweep import lr_key  # here: the sweep's imports pull in torch

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


def _in_place(path: Path) -> bool:
    """Whether the run in ``path`` is of the task and mechanism its folders name (its config
    says which), so that of two copies of a run the one in its own place is kept."""
    try:
        config = json.loads(pq.read_table(path, columns=["config"])["config"][0].as_py())
        place = (f"task={config['task']}", f"mechanism={config['mechanism']}")
    except Exception:  # unreadable, or no config to tell: not known to be in place
        return False
    return place == (path.parent.parent.name, path.parent.name)


def _schema_of(columns: list[str]) -> pa.Schema:
    """The Arrow schema of ``columns`` (partition columns are strings)."""
    fields = {f.name: f for f in SCHEMA} | {p: pa.field(p, pa.string()) for p in PARTITIONS}
    return pa.schema([fields[c] for c in columns])


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
