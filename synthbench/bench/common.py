"""What the bench commands share: where their rows go, what every row carries, timing.

Rows are stored as Parquet, one file per command run, in a tree of their own (default
``bench-results/``, beside ``results/``):

    <bench-results>/<kind>/<bench_id>.parquet       kind: scaling | fidelity | quadrature | train

Not inside the results tree: rows of another schema there make its readers (pandas, pyarrow,
DuckDB, Polars reading ``results/`` as one table) fail. Older versions wrote them to
``<results>/bench/<kind>/``, which ``bench plot`` still reads and ``ResultStore`` skips.

``bench_id`` starts with the UTC time, so names sort by age. The file is rewritten (to a
hidden temporary name, then renamed) after every measured point, so a killed sweep keeps
what it finished and never leaves half a file.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import torch

from synthbench.core.text import did_you_mean
from synthbench.run import provenance
from synthbench.run.store import BENCH_DIR, write_table

KINDS = ("scaling", "fidelity", "quadrature", "train", "decode")
# the paper's Fig. 2 line-up (001 sec. 3.2), plus spherical Yat, the kernel SLAY linearises
DEFAULT_MECHS = ("softmax", "linear", "performer", "cosformer", "yat", "yat-spherical", "slay")
STATUSES = ("ok", "oom", "time_limit", "error", "nonfinite", "noisy")

# Columns of every kind; each kind adds its own metric columns.
META = [
    ("kind", pa.string()),
    ("bench_id", pa.string()),
    ("mechanism", pa.string()),  # the registered name
    ("label", pa.string()),  # what tables and plots call the row (name and any variant)
    ("params", pa.string()),  # JSON: the mechanism's complete constructor parameters
    ("seq_len", pa.int64()),
    ("status", pa.string()),  # one of STATUSES
    ("error", pa.string()),
    ("device", pa.string()),
    ("cpu_isa", pa.string()),  # torch's CPU capability (synthbench/run/provenance.py)
    ("cpu_model", pa.string()),  # the CPU's vendor, family/model/stepping and name
    ("torch_version", pa.string()),
    ("synthbench_version", pa.string()),
    ("git_commit", pa.string()),
    ("created_at", pa.timestamp("us", tz="UTC")),
]


DEFAULT_BENCH_RESULTS = Path("bench-results")


def bench_dir(bench_results: Path, kind: str) -> Path:
    return Path(bench_results) / kind


def legacy_bench_dir(results: Path, kind: str) -> Path:
    """Where older versions stored the rows: inside the results tree."""
    return Path(results) / BENCH_DIR / kind


def check_bench_results(bench_results: Path) -> None:
    """Refuse a bench tree in a results tree (a folder with task=... folders, or under
    one): the results' readers would trip on the bench rows."""
    folder = Path(bench_results).absolute()
    for place in (folder, *folder.parents):
        runs = (*place.glob("protocol=*"), *place.glob("task=*"))  # either layout's top level
        if place.is_dir() and any(p.is_dir() for p in runs):
            raise ValueError(
                f"--bench-results {bench_results} is inside the results tree {place} (bench rows "
                "there make its readers fail); choose a folder beside it, e.g. bench-results"
            )


def new_bench_id() -> str:
    return f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"


def params_json(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def feature_dim(mechanism: torch.nn.Module | None) -> int | None:
    """Features per position of a feature-map mechanism; None for any other."""
    try:
        return int(mechanism.feature_dim)
    except (AttributeError, NotImplementedError, TypeError):
        return None


class BenchFile:
    """The rows of one command run of one kind, rewritten atomically as they come."""

    def __init__(
        self,
        bench_results: Path,
        kind: str,
        metrics: list[tuple[str, pa.DataType]],
        bench_id: str,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(
                f"unknown bench kind {kind!r}{did_you_mean(kind, KINDS)} ({', '.join(KINDS)})"
            )
        self.kind, self.bench_id = kind, bench_id
        self.path = bench_dir(bench_results, kind) / f"{bench_id}.parquet"
        self.schema = pa.schema(META + metrics, metadata={"synthbench_bench_kind": kind})
        self.rows: list[dict[str, Any]] = []

    def add(self, rows: list[dict[str, Any]], device: torch.device) -> None:
        stamp = {"kind": self.kind, "bench_id": self.bench_id, **provenance.stamp(device)}
        self.rows += [{**row, **stamp} for row in rows]
        self._write()

    def _write(self) -> None:
        unknown = {c for row in self.rows for c in row} - set(self.schema.names)
        if unknown:  # a programming error: a metric missing from the kind's schema
            raise KeyError(f"columns not in the {self.kind} schema: {', '.join(sorted(unknown))}")
        table = pa.Table.from_pylist(self.rows, schema=self.schema)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_table(table, self.path)


def bench_files(bench_results: Path, kind: str, legacy: Path | None = None) -> list[Path]:
    """The stored files of one kind, oldest first (their names start with the UTC time);
    with ``legacy`` (a results tree) also those older versions stored inside it."""
    folders = [bench_dir(bench_results, kind)]
    if legacy is not None:
        folders.append(legacy_bench_dir(legacy, kind))
    files = [p for f in folders if f.is_dir() for p in f.glob("*.parquet")]
    return sorted((p for p in files if not p.name.startswith(".")), key=lambda p: p.name)


def load_bench(
    bench_results: Path, kind: str, bench_id: str | None = None, legacy: Path | None = None
) -> pd.DataFrame | None:
    """The rows of one stored run of ``kind``: ``bench_id``'s, else the newest; None if none."""
    files = bench_files(bench_results, kind, legacy)
    if bench_id is not None:
        files = [p for p in files if p.stem == bench_id]
        if not files:
            raise ValueError(f"no {kind} results with id {bench_id} under {bench_results}/")
    return pd.read_parquet(files[-1]) if files else None


# -- timing ---------------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_ms(work: Callable[[], object], device: torch.device) -> float:
    """Milliseconds of one ``work()``: CUDA events around it on a GPU (then synchronised),
    the wall clock on a CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    begin = time.perf_counter()
    work()
    return (time.perf_counter() - begin) * 1e3


def median_ms(work: Callable[[], object], device: torch.device, repeats: int, warmup: int):
    """The median of ``repeats`` timed calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        work()
    sync(device)
    return statistics.median(timed_ms(work, device) for _ in range(repeats))
