"""``synthbench results`` and ``synthbench report``: reading the stored rows back."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer
from rich.table import Table

from synthbench.cli.common import (
    PluginOption,
    ResultsOption,
    UsageError,
    load_plugins,
    load_results,
    out,
    select_tasks,
    split,
    warn,
)
from synthbench.mechanism import MECHANISMS
from synthbench.publish import FORMATS, write_reports
from synthbench.report import DEFAULT_METRIC, METRICS, latest_versions, metric_values


def results_command(
    task: Annotated[str | None, typer.Option(help="Comma-separated task names.")] = None,
    mech: Annotated[str | None, typer.Option(help="Comma-separated mechanism names.")] = None,
    protocol: Annotated[str | None, typer.Option(help="Protocol name.")] = None,
    status: Annotated[str | None, typer.Option(help="ok, diverged or error.")] = None,
    all_lrs: Annotated[
        bool, typer.Option(help="Every lr's row, not only the selected one.")
    ] = False,
    csv: Annotated[
        Path | None, typer.Option(help="Write the rows as CSV ('-' for stdout).")
    ] = None,
    results: ResultsOption = Path("results"),
) -> None:
    """Filter the stored rows; print a summary or export them as CSV."""
    rows = load_results(results).rows
    if task:
        rows = rows[rows["task"].isin(split(task))]
    if mech:
        rows = rows[rows["mechanism"].isin(split(mech))]
    if protocol:
        rows = rows[rows["protocol"] == protocol]
    if status:
        rows = rows[rows["status"] == status]
    if not all_lrs:  # failed runs have no selected row: keep them so they stay visible
        rows = rows[rows["selected"].astype(bool) | (rows["status"] != "ok")]
    if csv is not None:
        # list columns (the learning curve) as JSON, one CSV field each
        rows = rows.assign(
            **{c: rows[c].map(_as_json) for c in ("curve_steps", "curve_val_token_acc")}
        )
        if str(csv) == "-":
            rows.to_csv(sys.stdout, index=False)
        else:
            rows.to_csv(csv, index=False)
            out.print(f"{len(rows)} rows -> {csv}", highlight=False)
        return
    table = Table(
        "task",
        "mechanism",
        "protocol",
        "seed",
        "lr",
        "status",
        "target",
        "token_acc",
        "exact_match",
        "seconds",
        "run_id",
    )
    rows = rows.sort_values(["protocol", "task", "mechanism", "seed", "lr"])
    targets = metric_values(rows, "target")  # each task's own metric: token_acc or free_token_acc
    for r, target in zip(rows.itertuples(), targets, strict=True):
        table.add_row(
            r.task,
            r.mechanism,
            r.protocol,
            str(r.seed),
            f"{r.lr:g}",
            r.status,
            _metric(target),
            _metric(r.token_acc),
            _metric(r.exact_match),
            f"{r.wall_seconds:.1f}",
            r.run_id,
        )
    out.print(table)
    out.print(f"{len(rows)} rows", highlight=False)


def _metric(value: float | None) -> str:
    return "--" if value is None or pd.isna(value) else f"{value:.3f}"


def report_command(
    results: ResultsOption = Path("results"),
    out_dir: Annotated[Path, typer.Option("--out", help="Where reports are written.")] = Path(
        "reports"
    ),
    metric: Annotated[str, typer.Option(help=" or ".join(METRICS))] = DEFAULT_METRIC,
    protocol: Annotated[
        str | None, typer.Option(help="Comma-separated protocols (default: every one).")
    ] = None,
    task: Annotated[str | None, typer.Option(help="Comma-separated task names.")] = None,
    mech: Annotated[str | None, typer.Option(help="Comma-separated mechanism names.")] = None,
    category: Annotated[str | None, typer.Option(help="Only the tasks of this category.")] = None,
    formats: Annotated[
        str, typer.Option("--format", help=f"Comma-separated outputs: {','.join(FORMATS)}.")
    ] = ",".join(FORMATS),
    compare: Annotated[
        str | None, typer.Option(help="Put published results beside ours: slay-paper.")
    ] = None,
    plugin: PluginOption = None,
) -> None:
    """Tables (Markdown, LaTeX), figures and the leaderboard page, one set per protocol."""
    if metric not in METRICS:
        raise UsageError(f"unknown metric '{metric}' ({', '.join(METRICS)})")
    load_plugins(plugin)  # a plugin's tasks and mechanisms have names and categories
    rows = load_results(results).rows
    keep = pd.Series(True, index=rows.index)
    if protocol:
        keep &= rows["protocol"].isin(split(protocol))
    if task or category:
        keep &= rows["task"].isin(select_tasks(task or "all", category))
    if mech:
        keep &= rows["mechanism"].isin([MECHANISMS.canonical(m) for m in split(mech)])
    rows = rows[keep]
    if rows.empty:
        raise UsageError(f"no results under {results}/ match the selection")
    rows, left_out = latest_versions(rows)
    for name, versions in left_out.items():
        old = ", ".join(f"v{v}" for v in versions)
        warn(f"protocol {name}: rows of older versions ({old}) left out; reporting the newest")
    written = write_reports(rows, out_dir, metric, tuple(split(formats)), compare)
    for path in written:
        out.print(f"wrote {path}", highlight=False)
    summary = [p for p in written if p.name == "summary.md"]
    for path in summary:
        out.print(f"\n{path.parent}:\n{path.read_text()}", highlight=False, markup=False)


def _as_json(values) -> str | None:
    """A stored list (a numpy array when read) as a JSON list; None stays empty."""
    return None if values is None else json.dumps([v.item() for v in values])
