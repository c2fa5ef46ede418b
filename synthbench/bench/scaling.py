"""``synthbench bench scaling``: latency, peak memory and throughput of one attention layer
against sequence length (SLAY 001 sec. 3.2 "Benchmark setup", Fig. 2, App. L.6).

The layer is ``synthbench.core.model.MultiHeadAttention`` (q, k, v projections of the embedding,
the mechanism, the output projection), causal, float32, on random N(0, 1) embeddings. For
lengths doubling from ``min_len`` to ``max_len`` every (mechanism, length) point runs in
fresh processes (forked from a server that imported torch once, so that a point costs no new
import), each starting with a short call at min(L, 128) (it loads code and kernels and
allocates the parameter gradients):

1. memory: the peak above that level of one forward (no grad) and of one forward + backward
   (``memory.peak_bytes``); on a CPU in a process of its own, with glibc's mmap threshold
   fixed so that the resident set size follows the tensors;
2. time: ``warmup`` rounds, then ``repeats`` rounds, each one forward (no grad) and one
   forward + backward, timed with CUDA events on a GPU; the medians are stored. On a CPU in
   a second process with the usual allocator; on a GPU after the memory, in the same one.

A point stops as ``oom`` when an allocation fails under the memory limit (or the kernel kills
the process), and as ``time_limit`` when its rounds would take longer than ``time_limit``
seconds (projected after each round) or a process overruns it by ``GRACE_S``. A mechanism
stops growing L at its first failed point; the sweep goes on with the next one.
"""

from __future__ import annotations

import dataclasses
import functools
import signal
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import torch
from torch import nn

from synthbench.bench.common import feature_dim, params_json, timed_ms
from synthbench.bench.memory import (
    cpu_method,
    is_out_of_memory,
    limit_cuda,
    limit_data,
    peak_bytes,
)
from synthbench.core import children
from synthbench.core.linear_attention import linear_attention
from synthbench.core.mechanism import MECHANISMS, FeatureMapMechanism, mechanism_params
from synthbench.core.model import MultiHeadAttention
from synthbench.core.registry import load_plugin_file
from synthbench.run.allocator import map_large_blocks

WARM_LEN = 128  # the short first call of every process
GRACE_S = 60.0  # process start, CUDA initialisation, building the layer: beyond the time limit
SUMMARY_FROM = 1024  # the per-token ratios are taken from L = 1K (the targets)
MiB = 2**20

METRICS = [
    ("complexity", pa.string()),
    ("feature_dim", pa.int64()),  # features per position of a feature-map mechanism
    ("d_model", pa.int64()),
    ("heads", pa.int64()),
    ("batch", pa.int64()),
    ("fwd_ms", pa.float64()),  # median forward latency, no grad
    ("fwd_bwd_ms", pa.float64()),  # median forward + backward latency
    ("peak_fwd_mb", pa.float64()),  # peak memory of one forward (MiB above the level before)
    ("peak_mb", pa.float64()),  # peak memory of one forward + backward (MiB)
    ("tokens_per_s", pa.float64()),  # batch * L / forward seconds (the paper's throughput)
    ("fwd_bwd_tokens_per_s", pa.float64()),
    ("us_per_token", pa.float64()),  # forward + backward microseconds per token
    ("kib_per_token", pa.float64()),  # forward + backward peak KiB per token
    ("repeats", pa.int64()),
    ("warmup", pa.int64()),
    ("threads", pa.int64()),
    ("time_limit_s", pa.float64()),
    ("memory_limit_gb", pa.float64()),
    ("memory_method", pa.string()),  # vmhwm | ru_maxrss | cuda_max_allocated
]


@dataclass(frozen=True)
class Series:
    """One line of the plots: a mechanism with its parameters (and maybe tiled features)."""

    mechanism: str
    label: str
    complexity: str
    params: dict[str, Any] = field(default_factory=dict)
    feature_dim: int | None = None
    tile_to: int | None = None  # repeat the features to this many (``TiledFeatures``)


@dataclass(frozen=True)
class Setup:
    d_model: int = 256
    heads: int = 8
    batch: int = 1
    min_len: int = 128
    max_len: int = 131072
    repeats: int = 5
    warmup: int = 2
    time_limit: float = 60.0  # seconds per point
    memory_limit: int | None = None  # bytes the measured work may allocate
    device: str = "cpu"
    threads: int = 1
    plugins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        problems = []
        if min(self.d_model, self.heads, self.batch, self.min_len, self.repeats) < 1:
            problems.append("--d-model, --heads, --batch, --min-len and --repeats must be >= 1")
        elif self.d_model % self.heads:
            problems.append(f"--d-model {self.d_model} is not divisible by --heads {self.heads}")
        if self.max_len < self.min_len:
            problems.append(f"--max-len {self.max_len} is below --min-len {self.min_len}")
        if self.warmup < 0:
            problems.append("--warmup must be >= 0")
        if not self.time_limit > 0:
            problems.append("--time-limit must be > 0")
        if self.memory_limit is not None and not self.memory_limit > 0:
            problems.append("--memory-limit-gb must be > 0")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def lengths(self) -> list[int]:
        """min_len, doubling, up to max_len."""
        lengths = [self.min_len]
        while lengths[-1] * 2 <= self.max_len:
            lengths.append(lengths[-1] * 2)
        return lengths


class TiledFeatures(nn.Module):
    """``base``'s feature map repeated to ``feature_dim`` features per position, on the same
    linear-attention core: linear attention at another feature dimension (and state size), so
    that SLAY's R P M features can be timed against ``linear`` at as many features."""

    def __init__(self, base: FeatureMapMechanism, feature_dim: int) -> None:
        super().__init__()
        self.base, self.feature_dim = base, feature_dim

    def _tile(self, phi: torch.Tensor) -> torch.Tensor:
        reps = -(-self.feature_dim // phi.shape[-1])
        return phi.repeat(*([1] * (phi.dim() - 1)), reps)[..., : self.feature_dim]

    def forward(self, q, k, v, causal: bool = True):
        base = self.base
        phi_q, phi_k = base.feature_map(q, is_query=True), base.feature_map(k, is_query=False)
        return linear_attention(
            self._tile(phi_q),
            self._tile(phi_k),
            v,
            causal,
            eps=base.eps,
            chunk_size=base.chunk_size,
            signed=base.signed,
        )


def build_mechanism(
    series: Series, head_dim: int, heads: int, seq_len: int | None = None
) -> nn.Module:
    """The series' mechanism; a ValueError names it if its parameters do not fit. A
    mechanism with a positional ``horizon`` (cosformer) gets at least the sequence length,
    as its paper sets M = L (by default it takes the length of each call)."""
    params = dict(series.params)
    if seq_len is not None and params.get("horizon") is not None:
        params["horizon"] = max(params["horizon"], seq_len)
    try:
        mechanism = MECHANISMS.get(series.mechanism)(head_dim, heads, **params)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"mechanism {series.mechanism}: {exc}") from exc
    return TiledFeatures(mechanism, series.tile_to) if series.tile_to else mechanism


def make_series(names: list[str], setup: Setup, compare_features: bool) -> list[Series]:
    """A series per mechanism at its defaults. With ``compare_features``, also ``linear`` with
    its features tiled to the feature dimension of every selected SLAY-family mechanism."""
    series = []
    for name in names:
        entry = MECHANISMS.entry(name)
        s = Series(
            entry.name, entry.name, entry.metadata["complexity"], mechanism_params(entry.obj)
        )
        features = feature_dim(build_mechanism(s, setup.head_dim, setup.heads))
        series.append(dataclasses.replace(s, feature_dim=features))
    if compare_features:
        linear = MECHANISMS.entry("linear")
        own = feature_dim(linear.obj(setup.head_dim, setup.heads))
        dims = {
            s.feature_dim
            for s in series
            if MECHANISMS.entry(s.mechanism).metadata["family"] == "slay" and s.feature_dim
        }
        for dim in sorted(dims - {own}):
            params = mechanism_params(linear.obj)
            label = f"linear (F={dim})"
            series.append(Series(linear.name, label, "linear", params, dim, tile_to=dim))
    return series


# -- one point, in a child process ----------------------------------------------------------


def _forward(layer: nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        layer(x)


def _forward_backward(layer: nn.Module, x: torch.Tensor) -> None:
    layer(x).sum().backward()  # the parameter gradients accumulate: no allocation per call


def _memory(forward, forward_backward, device: torch.device) -> dict[str, Any]:
    return {
        "status": "ok",
        "peak_fwd_mb": peak_bytes(forward, device) / MiB,
        "peak_mb": peak_bytes(forward_backward, device) / MiB,
        "memory_method": "cuda_max_allocated" if device.type == "cuda" else cpu_method(),
    }


def _timings(forward, forward_backward, device: torch.device, setup: Setup) -> dict[str, Any]:
    rounds, fwd, both = setup.warmup + setup.repeats, [], []
    start = time.perf_counter()
    for i in range(rounds):
        fwd.append(timed_ms(forward, device))
        both.append(timed_ms(forward_backward, device))
        projected = (time.perf_counter() - start) / (i + 1) * rounds
        if projected > setup.time_limit:  # stored with the timings of this one round
            return {
                "status": "time_limit",
                "error": f"{rounds} rounds would take about {projected:.3g} s "
                f"(limit {setup.time_limit:g} s); timings of one round",
                "fwd_ms": fwd[-1],
                "fwd_bwd_ms": both[-1],
            }
    return {
        "status": "ok",
        "fwd_ms": statistics.median(fwd[setup.warmup :]),
        "fwd_bwd_ms": statistics.median(both[setup.warmup :]),
    }


def _measure(series: Series, setup: Setup, seq_len: int, what: str) -> dict[str, Any]:
    """``what``: "memory", "time" or "both" (on CUDA, where the allocator's statistics do not
    depend on what the process did before)."""
    torch.set_num_threads(setup.threads)
    for path in setup.plugins:  # a fresh process: a plugin file's mechanisms are not there yet
        load_plugin_file(path, [MECHANISMS])
    device = torch.device(setup.device)
    if what == "memory" and device.type == "cpu":
        map_large_blocks()
    torch.manual_seed(0)
    mechanism = build_mechanism(series, setup.head_dim, setup.heads, seq_len)
    layer = MultiHeadAttention(setup.d_model, setup.heads, mechanism).to(device)
    x = torch.randn(setup.batch, seq_len, setup.d_model, device=device)
    _forward_backward(layer, x[:, : min(seq_len, WARM_LEN)])
    if setup.memory_limit is not None:
        if device.type == "cuda":
            limit_cuda(setup.memory_limit, device)
        elif not limit_data(setup.memory_limit):
            raise RuntimeError("cannot set RLIMIT_DATA here: the memory limit is not enforced")
    forward = functools.partial(_forward, layer, x)
    forward_backward = functools.partial(_forward_backward, layer, x)
    result = {"status": "ok"}
    if what in ("memory", "both"):
        result = _memory(forward, forward_backward, device)
    if what in ("time", "both") and result["status"] == "ok":
        result |= _timings(forward, forward_backward, device, setup)
    return result


def _child(connection, series: Series, setup: Setup, seq_len: int, what: str) -> None:
    try:
        result = _measure(series, setup, seq_len, what)
    except BaseException as exc:  # reported to the parent, which stores it and goes on
        status = "oom" if is_out_of_memory(exc) else "error"
        result = {"status": status, "error": f"{type(exc).__name__}: {exc}"[:500]}
    connection.send(result)
    connection.close()


def _context():
    """Fresh processes without a fresh import of torch each: forked from a server that
    imported this module (and torch) once but ran nothing (core/children.py)."""
    children.preload(__name__)
    return children.context()


def run_in_child(series: Series, setup: Setup, seq_len: int, what: str) -> dict[str, Any]:
    """``_measure`` in a fresh process, killed if it overruns the time limit by GRACE_S."""
    context = _context()
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(
        target=_child, args=(sender, series, setup, seq_len, what), daemon=True
    )
    process.start()
    sender.close()
    result, timed_out = None, False
    try:
        if receiver.poll(setup.time_limit + GRACE_S):
            try:
                result = receiver.recv()
            except EOFError:  # it died without a word
                pass
        else:
            timed_out = True
    finally:
        if process.is_alive():
            process.kill()
        process.join()
        receiver.close()
    if result is not None:
        return result
    if timed_out:
        limit = setup.time_limit + GRACE_S
        return {"status": "time_limit", "error": f"killed after {limit:g} s"}
    if process.exitcode == -signal.SIGKILL:  # not ours: most likely the kernel's OOM killer
        return {"status": "oom", "error": "killed by SIGKILL (out of memory?)"}
    return {"status": "error", "error": f"the measuring process died (code {process.exitcode})"}


def measure_point(series: Series, setup: Setup, seq_len: int) -> dict[str, Any]:
    """One row: memory first (it stops an out-of-memory point early), then the timings; on a
    CPU in two processes, so that the timings run with the usual allocator settings."""
    if torch.device(setup.device).type == "cuda":
        result = run_in_child(series, setup, seq_len, "both")
    else:
        result = run_in_child(series, setup, seq_len, "memory")
        if result["status"] == "ok":
            result |= run_in_child(series, setup, seq_len, "time")
    tokens = setup.batch * seq_len
    params = {**series.params, "tile_to": series.tile_to} if series.tile_to else series.params
    fwd, both, peak = (result.get(k) for k in ("fwd_ms", "fwd_bwd_ms", "peak_mb"))
    return {
        "mechanism": series.mechanism,
        "label": series.label,
        "params": params_json(params),
        "seq_len": seq_len,
        "status": result["status"],
        "error": result.get("error"),
        "complexity": series.complexity,
        "feature_dim": series.feature_dim,
        "d_model": setup.d_model,
        "heads": setup.heads,
        "batch": setup.batch,
        "fwd_ms": fwd,
        "fwd_bwd_ms": both,
        "peak_fwd_mb": result.get("peak_fwd_mb"),
        "peak_mb": peak,
        "tokens_per_s": tokens / fwd * 1e3 if fwd else None,
        "fwd_bwd_tokens_per_s": tokens / both * 1e3 if both else None,
        "us_per_token": both * 1e3 / tokens if both is not None else None,
        "kib_per_token": peak * 1024 / tokens if peak is not None else None,
        "repeats": setup.repeats,
        "warmup": setup.warmup,
        "threads": setup.threads,
        "time_limit_s": setup.time_limit,
        "memory_limit_gb": setup.memory_limit / 2**30 if setup.memory_limit else None,
        "memory_method": result.get("memory_method"),
    }


def sweep(series: list[Series], setup: Setup, on_row) -> None:
    """Every series over the lengths; a series stops at its first point that is not ok.
    ``on_row(row)`` gets each row as it is measured (to store and print it)."""
    for s in series:
        for seq_len in setup.lengths():
            row = measure_point(s, setup, seq_len)
            on_row(row)
            if row["status"] != "ok":
                break


# -- printing -------------------------------------------------------------------------------


def point_line(row: dict[str, Any]) -> str:
    head = f"{row['label']:<18} L {row['seq_len']:>7}"
    if row["status"] != "ok":
        return f"{head}  {row['status']}: {row['error']}"
    return (
        f"{head}  fwd {row['fwd_ms']:9.2f} ms  fwd+bwd {row['fwd_bwd_ms']:9.2f} ms  "
        f"peak {row['peak_mb']:9.1f} MiB  {row['tokens_per_s']:12,.0f} tok/s  "
        f"{row['us_per_token']:8.2f} us/tok  {row['kib_per_token']:7.2f} KiB/tok"
    )


def _ratio(values: pd.Series) -> float | None:
    return float(values.max() / values.min()) if len(values) > 1 and values.min() > 0 else None


def _slope(x: pd.Series, y: pd.Series) -> float | None:
    keep = y > 0
    if keep.sum() < 2:
        return None
    return float(np.polyfit(np.log(x[keep]), np.log(y[keep]), 1)[0])


def summarise(rows: pd.DataFrame) -> pd.DataFrame:
    """Per series: the longest successful L, what stopped it, and from L = 1K on the ratios
    max/min of the forward + backward time per token and of the peak memory per token (the
    targets for linear mechanisms: within 1.5x, flat) and the log-log slopes of time and memory
    against L (about 1 for linear, 2 for quadratic)."""
    summary = []
    for label, part in rows.groupby("label", sort=False):
        ok = part[part["status"] == "ok"].sort_values("seq_len")
        failed = part[part["status"] != "ok"]
        long = ok[ok["seq_len"] >= SUMMARY_FROM]
        summary.append(
            {
                "label": label,
                "complexity": part["complexity"].iloc[0],
                "longest_ok": int(ok["seq_len"].max()) if len(ok) else None,
                "stopped_by": failed["status"].iloc[0] if len(failed) else "max-len",
                "time_per_token_ratio": _ratio(long["us_per_token"]),
                "memory_per_token_ratio": _ratio(long["kib_per_token"]),
                "time_slope": _slope(long["seq_len"], long["fwd_bwd_ms"]),
                "memory_slope": _slope(long["seq_len"], long["peak_mb"]),
            }
        )
    return pd.DataFrame(summary)


def slay_ratios(rows: pd.DataFrame) -> list[tuple[str, str, pd.Series]]:
    """For every SLAY-family series: its forward + backward time over that of ``linear`` with
    as many features (``linear (F=...)``) per length, and over plain ``linear``."""
    ok = rows[rows["status"] == "ok"]
    times = {label: part.set_index("seq_len")["fwd_bwd_ms"] for label, part in ok.groupby("label")}
    result = []
    for label, part in rows.groupby("label", sort=False):
        mechanism = part["mechanism"].iloc[0]
        if mechanism not in MECHANISMS or label not in times:
            continue
        if MECHANISMS.entry(mechanism).metadata["family"] != "slay":
            continue
        for other in (f"linear (F={int(part['feature_dim'].iloc[0])})", "linear"):
            if other in times:
                ratio = (times[label] / times[other]).dropna()
                if len(ratio):
                    result.append((label, other, ratio))
    return result


def summary_lines(rows: pd.DataFrame) -> list[str]:
    def fmt(value, spec=".2f"):
        return "-" if value is None or pd.isna(value) else f"{value:{spec}}"

    lines = [
        f"summary (ratios and slopes from L = {SUMMARY_FROM} to the longest successful L):",
        f"{'mechanism':<18} {'complexity':<10} {'longest L':>9} {'stopped by':>10} "
        f"{'time/token max/min':>18} {'memory/token max/min':>20} {'time ~ L^a':>10} "
        f"{'memory ~ L^b':>12}",
    ]
    for s in summarise(rows).itertuples():
        time_ratio = fmt(s.time_per_token_ratio)
        if s.complexity == "linear" and s.time_per_token_ratio is not None:
            time_ratio += " ok" if s.time_per_token_ratio <= 1.5 else " >1.5"
        lines.append(
            f"{s.label:<18} {s.complexity:<10} {fmt(s.longest_ok, '.0f'):>9} {s.stopped_by:>10} "
            f"{time_ratio:>18} {fmt(s.memory_per_token_ratio):>20} {fmt(s.time_slope):>10} "
            f"{fmt(s.memory_slope):>12}"
        )
    for label, other, ratio in slay_ratios(rows):
        per_length = ", ".join(f"{int(n)}: {r:.2f}x" for n, r in ratio.items())
        target = " (target <= 2x)" if other != "linear" else ""
        lines.append(
            f"{label} / {other}, fwd+bwd time: {per_length}; max {ratio.max():.2f}x{target}"
        )
    return lines
