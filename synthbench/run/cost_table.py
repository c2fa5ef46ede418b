"""The documentation's cost table: per mechanism, what one seed of the built-in suite costs
under each protocol, from the shipped table of per-step costs (synthbench/run/cost.py);
docs/PROTOCOLS.md embeds it (benchmarks/step_costs.py --docs writes it, a test checks it)."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from synthbench.core.task import TASKS, in_default_suite
from synthbench.core.text import duration
from synthbench.run.cost import (
    TABLE_SOURCES,
    Estimate,
    Training,
    adapts,
    estimate,
    protocol_factors,
    read_table,
    table_costs,
)
from synthbench.run.protocols import PROTOCOLS


def suite_seconds(
    table: pd.DataFrame,
    protocol: str,
    mechanism: str,
    tasks: Iterable[str],
    factors: dict[str, tuple[float, float]] | None = None,
) -> Estimate | None:
    """One seed of ``tasks`` under ``protocol`` for ``mechanism`` from ``table``'s figures
    (None when a task has none): every lr the grid starts with, at the whole schedule, and
    what to expect as `synthbench run` expects it (a pair without measured runs at the
    protocol's means, ``factors``: ``protocol_factors(table)`` unless given)."""
    proto = PROTOCOLS.get(protocol)
    mine = table[(table["protocol"] == protocol) & (table["mechanism"] == mechanism)]
    plan = [
        Training(
            protocol, task, mechanism, proto.steps, len(proto.lrs), adapts(proto), proto.max_steps
        )
        for task in tasks
        for _ in proto.lrs
    ]
    factors = protocol_factors(table) if factors is None else factors
    found = estimate(plan, table_costs(mine), factors)
    return None if found.unknown else found


def builtin_tasks() -> list[str]:
    """The built-in tasks of the default suite (not the State tasks: ``--task extended``)."""
    return sorted(e.name for e in TASKS.entries() if e.source == "builtin" and in_default_suite(e))


def markdown_table(table: pd.DataFrame | None = None) -> str:
    """Per mechanism, the training time (the trainings' wall seconds summed, one at a time in
    one process: its first training's cost included) of one seed of the built-in suite under
    each protocol from the shipped table (every lr the grid starts with, at the whole
    schedule; for a protocol
    that adapts and whose runs were measured, also what to expect), and where the figures
    come from (docs/PROTOCOLS.md embeds this; a test checks it)."""
    table = read_table() if table is None else table
    tasks = builtin_tasks()
    protocols = [p for p in PROTOCOLS.names() if p in set(table["protocol"])]
    factors = protocol_factors(table)
    columns = []  # (protocol, expected)
    for name in protocols:
        columns.append((name, False))
        if adapts(PROTOCOLS.get(name)) and name in factors:
            columns.append((name, True))

    def head(name: str, expected: bool) -> str:
        p = PROTOCOLS.get(name)
        if expected:
            return f"{name}: expected"
        steps = f"{p.max_steps} steps (the cap)" if p.max_steps else f"{p.steps} steps"
        return f"{name}: {_lrs(p)} x {steps}"

    rows = ["| mechanism | " + " | ".join(head(*c) for c in columns) + " |"]
    rows.append("|---|" + "---:|" * len(columns))
    for mechanism in sorted(set(table["mechanism"])):
        # one estimate per protocol gives both its columns
        estimates = {name: suite_seconds(table, name, mechanism, tasks, factors)
                     for name in protocols}  # fmt: skip
        cells = []
        for name, expected in columns:
            found = estimates[name]
            value = None if found is None else found.expected if expected else found.seconds
            cells.append("-" if value is None else ("~" if expected else "") + duration(value))
        rows.append(f"| {mechanism} | " + " | ".join(cells) + " |")
    sources = []
    for name, expected in columns:
        counts = table[table["protocol"] == name]["source"].value_counts()
        said = ", ".join(f"{counts[s]} {s}" for s in TABLE_SOURCES if s in counts)
        sources.append("as above" if expected else said)
    rows.append("| *figures* | " + " | ".join(sources) + " |")
    return "\n".join(rows) + "\n"


def _lrs(protocol) -> str:
    return "1 lr" if len(protocol.lrs) == 1 else f"{len(protocol.lrs)} lrs"
