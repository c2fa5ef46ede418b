"""What stored runs cost: per protocol, version and mechanism, the trainings, their steps, the hours
they took on the CPU and on accelerators, and the accelerators' share (``synthbench results
--cost``; docs/RESULTS.md).

Every training counts, whatever its status and whether its lr was selected: a failed or an
unselected training cost its time too. A row trained on the CPU (``device`` "cpu") adds its
``wall_seconds`` to the CPU's wall hours and its ``cpu_seconds`` (the CPU time its process
spent: synthbench/run/clock.py) to the CPU time; one trained on any other device (a GPU's
name, mps) adds its wall seconds to the accelerator hours. CPU time is summed over the rows
that have it (rows since schema 10), and the count of those rows says how much of the CPU's
work it covers.
"""

from __future__ import annotations

import pandas as pd

HOUR = 3600.0
TOTAL = "(all)"  # the mechanism column of a protocol's total
COLUMNS = [
    "protocol", "version", "mechanism", "runs", "trainings", "steps", "cpu_wall_hours",
    "cpu_time_hours", "cpu_time_trainings", "cpu_trainings", "accelerator_hours",
    "accelerator_share",
]  # fmt: skip


def _summary(rows: pd.DataFrame) -> dict:
    on_cpu = rows["device"].eq("cpu")
    cpu_time = pd.to_numeric(rows.loc[on_cpu, "cpu_seconds"], errors="coerce")
    return {
        "runs": int(rows["run_id"].nunique()),
        "trainings": len(rows),
        "steps": int(pd.to_numeric(rows["steps_done"], errors="coerce").fillna(0).sum()),
        "cpu_wall_hours": float(rows.loc[on_cpu, "wall_seconds"].sum()) / HOUR,
        "cpu_time_hours": float(cpu_time.sum()) / HOUR,
        "cpu_time_trainings": int(cpu_time.notna().sum()),
        "cpu_trainings": int(on_cpu.sum()),
        "accelerator_hours": float(rows.loc[~on_cpu, "wall_seconds"].sum()) / HOUR,
        # the share of the trainings an accelerator trained
        "accelerator_share": float((~on_cpu).mean()) if len(rows) else 0.0,
    }


def cost_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per (protocol, version, mechanism) of ``rows`` (every training's row), then
    one per protocol version with mechanism ``TOTAL``; ``COLUMNS`` in that order."""
    if "cpu_seconds" not in rows:  # rows read from files before schema 10 alone
        rows = rows.assign(cpu_seconds=float("nan"))
    lines = []
    recipes = rows.groupby(["protocol", "protocol_version"], sort=True, observed=True)
    for (protocol, version), of_recipe in recipes:
        at = {"protocol": protocol, "version": int(version)}
        for mechanism, part in of_recipe.groupby("mechanism", sort=True, observed=True):
            lines.append({**at, "mechanism": mechanism, **_summary(part)})
        lines.append({**at, "mechanism": TOTAL, **_summary(of_recipe)})
    return pd.DataFrame(lines, columns=COLUMNS)
