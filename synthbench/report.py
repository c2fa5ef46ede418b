"""Reports from stored rows: the per-task mean +- std table over seeds, as Markdown and LaTeX.

Only the row each run selected (its best lr on the validation set) counts. A run with no
successful row is shown as ``--`` and counted in a footnote, never as 0. Tables are split
by protocol: one protocol per table, always.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from synthbench.task import CATEGORIES

# long_*: the test set at --eval-length-mult times the trained length (length generalisation)
METRICS = ("token_acc", "exact_match", "long_token_acc", "long_exact_match")
MISSING = "--"


@dataclass
class SeedTable:
    protocol: str
    protocol_version: int
    metric: str
    cells: pd.DataFrame  # index (category, task), columns mechanisms: (mean, std, n) or None
    n_seeds: int
    failed: dict[str, int]  # status -> number of runs without a successful row


def label_task_variants(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows of one task run with different task parameters are different table rows: each
    such task is renamed ``task (k=v, ...)`` with the parameters in which its variants differ.
    """
    if "task_params" not in rows or rows.empty:
        return rows
    rows = rows.copy()
    for task, part in rows.groupby("task"):
        variants = {text: json.loads(text) for text in part["task_params"].unique()}
        if len(variants) < 2:
            continue
        keys = sorted(set().union(*variants.values()))
        differing = [k for k in keys if len({repr(v.get(k)) for v in variants.values()}) > 1]
        for text, params in variants.items():
            label = ", ".join(f"{k}={params.get(k)}" for k in differing)
            rows.loc[(rows["task"] == task) & (rows["task_params"] == text), "task"] = (
                f"{task} ({label})"
            )
    return rows


def aggregate(rows: pd.DataFrame, metric: str = "token_acc") -> pd.DataFrame:
    """Per (protocol, category, task, mechanism): mean, std (ddof 1; 0 for one seed), number
    of successful seeds, and the number of runs that diverged or raised. A task run with
    several parameter sets gives one row per set (``label_task_variants``)."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} ({', '.join(METRICS)})")
    rows = label_task_variants(rows)
    if metric.startswith("long_"):  # only the runs evaluated at a longer length count
        rows = rows[rows["eval_length_mult"].notna()]
        mults = sorted(rows["eval_length_mult"].unique())
        if len(mults) > 1:
            raise ValueError(
                f"rows hold several eval length multipliers ({', '.join(f'{m:g}' for m in mults)})"
                "; a table shows one"
            )
    keys = ["protocol", "category", "task", "mechanism"]
    ok = rows[(rows["status"] == "ok") & rows["selected"].astype(bool)]
    stats = ok.groupby(keys)[metric].agg(["mean", "std", "count"])
    stats["std"] = stats["std"].fillna(0.0)
    # a run failed if none of its rows succeeded; its status is that of its last row
    per_run = rows.groupby([*keys, "run_id"])["status"].agg(
        lambda s: "ok" if (s == "ok").any() else s.iloc[-1]
    )
    failed = (
        per_run[per_run != "ok"]
        .reset_index()
        .groupby(keys)["status"]
        .agg(
            diverged=lambda s: int((s == "diverged").sum()),
            error=lambda s: int((s == "error").sum()),
        )
        .astype(int)  # an empty aggregation would otherwise come back with object columns
    )
    table = stats.join(failed, how="outer")
    table[["count", "diverged", "error"]] = (
        table[["count", "diverged", "error"]].fillna(0).astype(int)
    )
    return table.reset_index()


def latest_versions(rows: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, list[int]]]:
    """Keep, for each protocol, the rows of its newest version; also return the older
    versions left out, so that a table never mixes two versions of a protocol."""
    newest = rows.groupby("protocol")["protocol_version"].transform("max")
    older = rows[rows["protocol_version"] != newest]
    left_out = {
        str(name): sorted(int(v) for v in part["protocol_version"].unique())
        for name, part in older.groupby("protocol")
    }
    return rows[rows["protocol_version"] == newest], left_out


def seed_tables(rows: pd.DataFrame, metric: str = "token_acc") -> list[SeedTable]:
    """One table per protocol: tasks (grouped by category) as rows, mechanisms as columns.

    ``rows`` must hold one version per protocol (see ``latest_versions``)."""
    versions = rows.groupby("protocol")["protocol_version"].unique()
    mixed = [name for name, found in versions.items() if len(found) > 1]
    if mixed:
        raise ValueError(f"rows mix several versions of protocol {', '.join(mixed)}; keep one")
    order = {c: i for i, c in enumerate(CATEGORIES)}
    agg = aggregate(rows, metric)
    tables = []
    for protocol, part in agg.groupby("protocol", sort=True):
        part = part.sort_values(
            ["category", "task"], key=lambda s: s.map(order) if s.name == "category" else s
        )
        index = pd.MultiIndex.from_frame(part[["category", "task"]].drop_duplicates())
        mechanisms = sorted(part["mechanism"].unique())
        cells = pd.DataFrame(index=index, columns=mechanisms, dtype=object)
        for r in part.itertuples():
            cells.at[(r.category, r.task), r.mechanism] = (
                (r.mean, r.std, r.count) if r.count > 0 else None
            )
        tables.append(
            SeedTable(
                protocol=str(protocol),
                protocol_version=int(versions[protocol][0]),
                metric=metric,
                cells=cells,
                n_seeds=int(part["count"].max()),
                failed={"diverged": int(part["diverged"].sum()), "error": int(part["error"].sum())},
            )
        )
    return tables


def _cell(value, n_seeds: int, pm: str) -> str:
    if not isinstance(value, tuple):
        return MISSING
    mean, std, n = value
    text = f"{mean:.3f} {pm} {std:.3f}"
    return text if n == n_seeds else f"{text} (n={n})"


def _footnotes(table: SeedTable) -> list[str]:
    notes = [
        f"{table.metric} on the test set, mean {'+-'} std over {table.n_seeds} seeds; "
        f"protocol {table.protocol} v{table.protocol_version}."
    ]
    failed = ", ".join(f"{n} {status}" for status, n in table.failed.items() if n)
    if failed:
        notes.append(f"{MISSING}: no successful run ({failed}).")
    elif table.cells.isna().any().any():
        notes.append(f"{MISSING}: not run.")
    return notes


def to_markdown(table: SeedTable) -> str:
    body = [
        [category, task, *(_cell(v, table.n_seeds, "±") for v in row)]
        for (category, task), row in table.cells.iterrows()
    ]
    text = tabulate(
        body,
        headers=["category", "task", *table.cells.columns],
        tablefmt="pipe",
        disable_numparse=True,
    )
    return text + "\n\n" + "\n".join(_footnotes(table)) + "\n"


def latex_escape(text: str) -> str:
    replacements = {
        "\\": r"\textbackslash{}",
        "&": r"\&",
        "%": r"\%",
        "$": r"\$",
        "#": r"\#",
        "_": r"\_",
        "{": r"\{",
        "}": r"\}",
        "~": r"\textasciitilde{}",
        "^": r"\textasciicircum{}",
    }
    return "".join(replacements.get(ch, ch) for ch in str(text))


def to_latex(table: SeedTable) -> str:
    mechanisms = list(table.cells.columns)
    lines = [
        r"\begin{tabular}{ll" + "c" * len(mechanisms) + "}",
        r"\toprule",
        " & ".join(["Category", "Task", *map(latex_escape, mechanisms)]) + r" \\",
        r"\midrule",
    ]
    for (category, task), row in table.cells.iterrows():
        cells = [_cell(v, table.n_seeds, r"$\pm$") for v in row]
        lines.append(" & ".join([latex_escape(category), latex_escape(task), *cells]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    notes = " ".join(latex_escape(n) for n in _footnotes(table))
    return "\n".join(lines) + f"\n% {notes}\n"


def write_reports(rows: pd.DataFrame, out: Path, metric: str = "token_acc") -> list[Path]:
    """Write ``<out>/<protocol>/tasks_<metric>.{md,tex}``; returns the paths written."""
    written = []
    for table in seed_tables(rows, metric):
        folder = out / table.protocol
        folder.mkdir(parents=True, exist_ok=True)
        for suffix, render in ((".md", to_markdown), (".tex", to_latex)):
            path = folder / f"tasks_{metric}{suffix}"
            path.write_text(render(table))
            written.append(path)
    return written
