"""``synthbench bench train``: what training costs, measured on the real training loop.

Each (task, mechanism) runs ``synthbench.run.train.train_eval`` (model building, task generation,
AdamW steps, evaluation: the code ``synthbench run`` runs) once, at the protocol's settings
with ``steps`` steps, seed 0 and its first lr, while a global optimizer-step hook of torch
(``register_optimizer_step_post_hook``) notes the time of every step. So, without touching the
loop:

    step time = mean interval between consecutive steps, after the first tenth of them
    fixed     = wall time of the run - steps * step time

``fixed`` is what a run costs besides its steps (building the model, generating the
validation and test sets, evaluating, the first steps' warm-up). A run of the protocol then
takes about fixed + protocol.steps * step time, and ``synthbench run --task all`` about the
sum of that over the tasks, times the seeds, times the learning rates: an estimate (the
machine's load and a diverging run move it). Nothing is written to the task results.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pandas as pd
import pyarrow as pa
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from synthbench.bench.common import params_json
from synthbench.core.task import TASKS
from synthbench.core.text import plural
from synthbench.run.protocols import Protocol
from synthbench.run.spec import RunSpec
from synthbench.run.train import train_eval

METRICS = [
    ("task", pa.string()),
    ("protocol", pa.string()),
    ("protocol_version", pa.int64()),
    ("steps", pa.int64()),  # steps of the measured run
    ("batch_size", pa.int64()),
    ("step_ms", pa.float64()),
    ("steps_per_s", pa.float64()),
    ("tokens_per_s", pa.float64()),  # batch_size * seq_len tokens per step
    ("fixed_s", pa.float64()),  # per run, besides its steps
    ("run_s", pa.float64()),  # predicted per run at the protocol's steps, one lr
    ("wall_s", pa.float64()),  # the measured run
    ("n_params", pa.int64()),
]


@contextmanager
def step_times() -> Iterator[list[float]]:
    """The wall-clock time after every optimizer step taken inside the block."""
    times: list[float] = []
    handle = register_optimizer_step_post_hook(lambda *_: times.append(time.perf_counter()))
    try:
        yield times
    finally:
        handle.remove()


def _run(task: str, mechanism: str, protocol: Protocol, steps: int, device: torch.device):
    spec = RunSpec.resolve(task, mechanism, dataclasses.replace(protocol, steps=steps), seed=0)
    return spec, train_eval(spec, protocol.lrs[0], device)


def warm_up(task: str, mechanism: str, protocol: Protocol, device: torch.device) -> None:
    """A two-step run, not measured: what the first run in a process loads (code, kernels)
    would otherwise count as the fixed cost of the first measured task."""
    _run(task, mechanism, protocol, 2, device)


def measure_task(
    task: str, mechanism: str, protocol: Protocol, steps: int, device: torch.device
) -> dict[str, Any]:
    with step_times() as times:
        spec, run = _run(task, mechanism, protocol, steps, device)
    seq_len = TASKS.get(task)(**spec.task_params).seq_len
    row = {
        "mechanism": spec.mechanism,
        "label": spec.mechanism,
        "params": params_json(spec.mechanism_params),
        "seq_len": seq_len,
        "status": run["status"],  # a diverged run stops early: its times say nothing
        "error": run.get("error"),
        "task": spec.task,
        "protocol": protocol.name,
        "protocol_version": protocol.version,
        "steps": steps,
        "batch_size": protocol.batch_size,
        "wall_s": run["wall_seconds"],
        "n_params": run.get("n_params"),
    }
    if row["status"] != "ok":
        return row
    skip = steps // 10  # the first steps load code and pick kernels
    step_s = (times[-1] - times[skip]) / (len(times) - 1 - skip)
    fixed = run["wall_seconds"] - steps * step_s
    return row | {
        "step_ms": step_s * 1e3,
        "steps_per_s": 1 / step_s,
        "tokens_per_s": protocol.batch_size * seq_len / step_s,
        "fixed_s": fixed,
        "run_s": fixed + protocol.steps * step_s,
    }


def task_line(row: dict[str, Any]) -> str:
    head = f"{row['label']:<16} {row['task']:<16}"
    if row["status"] != "ok":
        return f"{head} {row['status']}: {row['error']}"
    return (
        f"{head} {row['steps_per_s']:8.1f} steps/s {row['tokens_per_s']:12,.0f} tok/s  "
        f"step {row['step_ms']:7.2f} ms  fixed {row['fixed_s']:5.2f} s  "
        f"-> {row['run_s']:7.1f} s per run"
    )


def suite_seconds(rows: pd.DataFrame, protocol: Protocol, all_tasks: list[str]) -> float | None:
    """The predicted wall time of ``synthbench run --task all`` for one mechanism: the
    predicted runs summed over the tasks (the mean run for a task not measured), times the
    protocol's seeds and lrs. None without a successful measurement."""
    ok = rows[rows["status"] == "ok"].drop_duplicates("task").set_index("task")["run_s"]
    if ok.empty:
        return None
    per_task = [ok.get(t, ok.mean()) for t in all_tasks]
    return float(sum(per_task)) * protocol.seeds * len(protocol.lrs)


def suite_line(mechanism: str, rows: pd.DataFrame, protocol: Protocol, all_tasks) -> str:
    seconds = suite_seconds(rows, protocol, all_tasks)
    ok = rows[rows["status"] == "ok"]
    if seconds is None:
        return f"{mechanism}: no successful measurement"
    measured = len(set(ok["task"]))
    rest = "" if measured == len(all_tasks) else f" ({measured} measured, the rest at their mean)"
    return (
        f"{mechanism}: mean {ok['steps_per_s'].mean():.1f} steps/s, "
        f"{ok['tokens_per_s'].mean():,.0f} tokens/s; `synthbench run --task all --mech "
        f"{mechanism} --protocol {protocol.name}` would take about {seconds / 60:.1f} min "
        f"(an estimate: {len(all_tasks)} tasks{rest} x {protocol.seeds} seeds x "
        f"{plural(len(protocol.lrs), 'lr')} x (fixed cost + {protocol.steps} steps) per run)"
    )
