"""What the bench commands share: where their rows go, what every row carries, timing.

Rows are stored as Parquet, one file per command run:

    <results>/bench/<kind>/<bench_id>.parquet        kind: scaling | fidelity | quadrature | train

``bench_id`` starts with the UTC time, so names sort by age. The file is rewritten (to a
hidden temporary name, then renamed) after every measured point, so a killed sweep keeps
what it finished and never leaves half a file. ``ResultStore`` skips ``<results>/bench/``.
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

from synthbench import provenance
from synthbench.store import BENCH_DIR, write_atomically

KINDS = ("scaling", "fidelity", "quadrature", "train")
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
    ("torch_version", pa.string()),
    ("synthbench_version", pa.string()),
    ("git_commit", pa.string()),
    ("created_at", pa.timestamp("us", tz="UTC")),
]


def bench_dir(results: Path, kind: str) -> Path:
    return Path(results) / BENCH_DIR / kind


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
        self, results: Path, kind: str, metrics: list[tuple[str, pa.DataType]], bench_id: str
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown bench kind {kind!r} ({', '.join(KINDS)})")
        self.kind, self.bench_id = kind, bench_id
        self.path = bench_dir(results, kind) / f"{bench_id}.parquet"
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
        write_atomically(table, self.path)


def bench_files(results: Path, kind: str) -> list[Path]:
    """The stored files of one kind, oldest first (their names start with the UTC time)."""
    folder = bench_dir(results, kind)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.parquet") if not p.name.startswith("."))


def load_bench(results: Path, kind: str, bench_id: str | None = None) -> pd.DataFrame | None:
    """The rows of one stored run of ``kind``: ``bench_id``'s, else the newest; None if none."""
    files = bench_files(results, kind)
    if bench_id is not None:
        files = [p for p in files if p.stem == bench_id]
        if not files:
            raise ValueError(f"no {kind} results with id {bench_id} under {results}/")
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
