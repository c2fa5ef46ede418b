"""Recipe v2's panel: how much of each verdict the training recipe decides, counted on rows.

    python benchmarks/recipe_panel.py [SOURCE ...] [--markdown] [--step-costs TABLE ...]
        [--cells-of PROTOCOL:VERSION] [--cells PROTOCOL:VERSION]

SOURCE: a results tree or a Parquet file of rows (default: the shipped reference,
synthbench/data/reference/quick.parquet). Of its rows it keeps the panel, declared before
the new recipe was measured (docs/EXAMPLES.md, "Recipe v2"): the tasks ``PANEL_TASKS`` crossed
with the mechanisms ``PANEL_MECHANISMS``, each protocol at each of its versions, with tasks
and mechanisms at their defaults. Per (protocol, version) it counts, over the panel's runs:

- **knife-edge runs**: the selected lr beat every other lr the run tried by more than
  ``KNIFE_EDGE`` on the validation score (a diverged lr scores 0);
- **runs that learned nothing**: no lr came ``LEARNED`` above the task's chance;
- **undertrained runs**: the selected lr's validation score was still rising at its last
  curve point (``RISING`` or more over the last ``RISE_POINTS`` points) and below 0.9;
- **bimodal cells**: seeds more than ``BIMODAL`` apart in score (the test value of the
  task's target metric at the selected lr);
- **pairs separated per task**: two mechanisms' seed means differ by at least 0.05 and by
  more than their two 95% intervals added, each interval 1.96 standard errors of a mean
  over the seeds whose variance holds both the seeds' spread and the finite test set
  (each run's stored standard error): the rule of synthbench/report/informative.py, which
  `synthbench audit --informative` applies to every task; and of those, the pairs
  **separated with neither cell decided by the recipe** (``separated_clean``): neither
  mechanism's cell on that task holds a knife-edge or an undertrained run, so the gap is not
  one lr's or one budget's;
- **CPU seconds**: the training seconds of rows trained on a CPU (a GPU's are listed apart);
  **CPU time**, the rows' own ``cpu_seconds`` (the CPU time each training's process spent,
  schema 10), summed over the runs whose CPU rows all have it (``cpu_time_runs`` of them);
  and, since wall seconds are what a loaded machine inflates, **steps** (the optimizer
  steps trained, every lr of every run) and, with ``--step-costs``, **modelled CPU seconds**:
  each row's steps times its (protocol, task, mechanism)'s seconds per step in the given
  tables (synthbench/data/step_costs.csv, of this version and of the one the earlier rows
  were trained under), the same figure for a step of the same model whatever the recipe.

``--cells-of quick:7`` counts every recipe on the (task, mechanism) cells that recipe has
runs in: a panel under way, against the same cells of the recipe before it. ``--cells
quick:7`` prints that recipe's cells instead, a Markdown line each: every seed's score at its
selected lr, with its flags.

These definitions (but the separation rule, the package's) are the panel's own, written
here once, and applied alike to every recipe: they do not read the rows' own
``lr_robustness`` or ``lr_gap`` (older rows lack them), so today's rows and the new ones are
counted by the same code.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

from synthbench.report.informative import cell_intervals, separated, separated_pairs

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = ROOT / "synthbench" / "data" / "reference" / "quick.parquet"

PANEL_TASKS = (
    "kv_recall", "multihop", "parity", "modular", "selective_copy", "compression", "stack",
    "induction",
)  # fmt: skip
PANEL_MECHANISMS = (
    "softmax", "linear", "deltanet", "gated-deltanet", "mamba2", "gla", "retnet", "based",
)  # fmt: skip
KNIFE_EDGE = 0.3
LEARNED = 0.05
RISING, RISE_POINTS, SOLVED = 0.02, 2, 0.9
BIMODAL = 0.5


def step_costs(tables: list[Path]) -> dict[tuple[str, int, str, str], float]:
    """(protocol, version, task, mechanism) -> seconds per step, from step-cost tables; a
    version whose steps cost what another's do (``cost.SAME_STEPS``) shares its figure."""
    from synthbench.run.cost import SAME_STEPS, read_table

    found = {}
    for path in tables:
        for r in read_table(path).itertuples():
            found[(r.protocol, int(r.protocol_version), r.task, r.mechanism)] = r.step_seconds
    for (protocol, version, task, mech), seconds in list(found.items()):
        for later in _sharing(protocol, version, SAME_STEPS):
            found.setdefault((protocol, later, task, mech), seconds)
    return found


def _sharing(protocol: str, version: int, same: dict[str, set[int]]) -> list[int]:
    """The versions of ``protocol`` that price their steps by ``version``'s."""
    from synthbench.run.protocols import PROTOCOLS

    here = PROTOCOLS.get(protocol).version if protocol in PROTOCOLS else None
    return [here] if here is not None and version in same.get(protocol, ()) else []


def load(source: Path) -> pd.DataFrame:
    """Every row of a results tree or a Parquet file."""
    if source.is_file():
        return pd.read_parquet(source)
    from synthbench.run.store import ResultStore

    loaded = ResultStore(source).load(warn=False)
    for line in loaded.warnings():
        print(f"warning: {line}", file=sys.stderr)
    return loaded.rows


def panel_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The panel's rows: its tasks and mechanisms. A cell must hold one setting of the task's
    and the mechanism's parameters (the panel runs them at their defaults): a source with
    several is refused, since seeds of different settings are not one cell."""
    rows = rows[rows["task"].isin(PANEL_TASKS) & rows["mechanism"].isin(PANEL_MECHANISMS)]
    settings = rows.groupby(["protocol", "protocol_version", "task", "mechanism"])[
        ["task_params", "mechanism_params"]
    ].nunique()
    mixed = settings[(settings > 1).any(axis=1)]
    if len(mixed):
        raise ValueError(f"cells with several parameter settings: {list(mixed.index)[:3]}")
    return rows.copy()


def validation_score(row) -> float:
    value = row["val_token_acc"]
    return 0.0 if row["status"] != "ok" or value is None or value != value else float(value)


def run_table(rows: pd.DataFrame, per_step: dict | None = None) -> pd.DataFrame:
    """One row per run: its cell, seed, and each count's verdict (``per_step``: seconds per
    step by (protocol, version, task, mechanism), for the modelled CPU seconds)."""
    records = []
    if "cpu_seconds" not in rows:  # a Parquet file of rows before schema 10
        rows = rows.assign(cpu_seconds=math.nan)
    keys = ["protocol", "protocol_version", "task", "mechanism", "run_id"]
    for (protocol, version, task, mech, _), part in rows.groupby(keys, sort=True):
        part = part[part["status"].isin(["ok", "diverged"])]
        chosen = part[part["selected"].astype(bool) & part["status"].eq("ok")]
        if chosen.empty:
            continue
        best = chosen.iloc[0]
        on_cpu = part[part["device"].eq("cpu")]
        scores = sorted((validation_score(r) for _, r in part.iterrows()), reverse=True)
        others = scores[1:]  # the best is the selected lr's (or ties with it)
        chance = float(best["chance_token_acc"])
        curve = list(best["curve_val_token_acc"]) if best["curve_val_token_acc"] is not None else []
        value = best[best["target_metric"]] if best["target_metric"] in best else best["token_acc"]
        se = best.get(f"{best['target_metric']}_se", np.nan)
        records.append(
            {
                "protocol": protocol,
                "version": int(version),
                "task": task,
                "mechanism": mech,
                "seed": int(best["seed"]),
                "lr": float(best["lr"]),
                "score": float(value),
                "se": float(se) if se is not None and se == se else 0.0,
                "knife_edge": bool(others) and validation_score(best) - max(others) > KNIFE_EDGE,
                "learned_nothing": max(scores) < chance + LEARNED,
                "undertrained": len(curve) > RISE_POINTS
                and curve[-1] - curve[-1 - RISE_POINTS] >= RISING
                and validation_score(best) < SOLVED,
                "lrs": len(part),
                "cpu_seconds": float(on_cpu["wall_seconds"].sum()),
                "cpu_time": float(on_cpu["cpu_seconds"].sum(min_count=len(on_cpu)))
                if len(on_cpu)
                else math.nan,
                "steps": int(part["steps_done"].sum()),
                "modelled_seconds": float(part["steps_done"].sum())
                * (per_step or {}).get((protocol, int(version), task, mech), math.nan),
                "gpu_seconds": float(part.loc[~part["device"].eq("cpu"), "wall_seconds"].sum()),
            }
        )
    return pd.DataFrame(records)


def counts(runs: pd.DataFrame) -> dict:
    """The panel's counts of one (protocol, version)."""
    by_cell = runs.groupby(["task", "mechanism"])["score"]
    spread = by_cell.max() - by_cell.min()
    return {
        "runs": len(runs),
        "cells": int(by_cell.ngroups),
        "knife_edge": int(runs["knife_edge"].sum()),
        "learned_nothing": int(runs["learned_nothing"].sum()),
        "undertrained": int(runs["undertrained"].sum()),
        "bimodal": int((spread > BIMODAL).sum()),
        "separated": separated_pairs(runs, value="score"),
        "separated_clean": separated_clean(runs),
        "cpu_seconds": round(runs["cpu_seconds"].sum()),
        "cpu_time": round(runs["cpu_time"].sum()),
        "cpu_time_runs": int(runs["cpu_time"].notna().sum()),
        "gpu_seconds": round(runs["gpu_seconds"].sum()),
        "steps": int(runs["steps"].sum()),
        "modelled_seconds": round(runs["modelled_seconds"].sum(min_count=len(runs)))
        if runs["modelled_seconds"].notna().all()
        else None,
    }


def separated_clean(runs: pd.DataFrame) -> dict[str, int]:
    """Per task: the pairs separated (the package's rule) whose two cells hold no knife-edge
    and no undertrained run."""
    found = {}
    for task, part in runs.groupby("task", sort=True):
        recipe_made = part.groupby("mechanism")[["knife_edge", "undertrained"]].any().any(axis=1)
        cells = cell_intervals(part, "score")
        found[task] = sum(
            separated(cells[a], cells[b])
            for a, b in combinations(sorted(cells), 2)
            if not (recipe_made[a] or recipe_made[b])
        )
    return found


def cell_table(runs: pd.DataFrame) -> str:
    """One Markdown line per cell of ``runs`` (one protocol and version): each seed's score
    at its selected lr, flagged K (knife-edge), U (undertrained) or N (learned nothing), the
    cell's mean, and B where the cell is bimodal."""
    lines = [
        "| task | mechanism | seeds: score (selected lr) | mean | bimodal |",
        "|---|---|---|---:|---|",
    ]
    for (task, mech), cell in runs.groupby(["task", "mechanism"], sort=True):
        seeds = []
        for r in cell.sort_values("seed").itertuples():
            flags = "".join(
                mark for mark, on in (("K", r.knife_edge), ("U", r.undertrained),
                                      ("N", r.learned_nothing)) if on
            )  # fmt: skip
            seeds.append(f"{r.score:.3f} ({r.lr:.2g}{' ' + flags if flags else ''})")
        spread = cell["score"].max() - cell["score"].min()
        bimodal = "B" if spread > BIMODAL else ""
        lines.append(
            f"| {task} | {mech} | {', '.join(seeds)} | {cell['score'].mean():.3f} | {bimodal} |"
        )
    return "\n".join(lines)


def markdown(results: dict[tuple[str, int], dict]) -> str:
    names = [f"{p} v{v}" for p, v in results]
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for key in ("runs", "cells", "knife_edge", "learned_nothing", "undertrained", "bimodal",
                "cpu_seconds", "cpu_time", "cpu_time_runs", "gpu_seconds", "steps",
                "modelled_seconds"):  # fmt: skip
        lines.append(f"| {key} | " + " | ".join(str(r[key]) for r in results.values()) + " |")
    for task in PANEL_TASKS:
        values = [str(r["separated"].get(task, "--")) for r in results.values()]
        lines.append(f"| pairs separated: {task} | " + " | ".join(values) + " |")
    for task in PANEL_TASKS:
        values = [str(r["separated_clean"].get(task, "--")) for r in results.values()]
        lines.append(f"| of them, clean: {task} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def runs_of(runs: pd.DataFrame, recipe: str) -> pd.DataFrame:
    """The runs of ``recipe`` (``protocol:version``, e.g. quick:7); ValueError (one line)
    for a malformed name or a recipe without runs."""
    protocol, _, version = recipe.partition(":")
    if not version.isdigit():
        raise ValueError(f"{recipe!r} is not PROTOCOL:VERSION (quick:7, say)")
    own = (
        runs[runs["protocol"].eq(protocol) & runs["version"].eq(int(version))]
        if len(runs)
        else runs
    )
    if own.empty:
        raise ValueError(f"no run of {protocol} v{version} in the sources")
    return own


def on_cells_of(runs: pd.DataFrame, recipe: str) -> pd.DataFrame:
    """``runs`` of every recipe, kept to the (task, mechanism) cells that ``recipe``
    (``protocol:version``, e.g. quick:7) has runs in."""
    own = runs_of(runs, recipe)
    cells = pd.MultiIndex.from_frame(own[["task", "mechanism"]].drop_duplicates())
    return runs[pd.MultiIndex.from_frame(runs[["task", "mechanism"]]).isin(cells)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="*", type=Path, default=[DEFAULT_SOURCE])
    parser.add_argument("--markdown", action="store_true", help="print one Markdown table")
    parser.add_argument(
        "--step-costs", nargs="*", type=Path, default=[],
        help="step-cost tables (synthbench/data/step_costs.csv, of each version compared)",
    )  # fmt: skip
    parser.add_argument(
        "--cells", metavar="PROTOCOL:VERSION",
        help="print one Markdown line per cell of this recipe: each seed's score, selected lr "
        "and flags, instead of the counts",
    )  # fmt: skip
    parser.add_argument(
        "--cells-of", metavar="PROTOCOL:VERSION",
        help="count every recipe on the cells (task, mechanism) this one has runs in: a "
        "panel under way against the same cells of another recipe",
    )  # fmt: skip
    args = parser.parse_args(argv)
    per_step = step_costs(args.step_costs)
    tables = []
    for source in args.sources:
        if not source.exists():
            print(f"error: {source} does not exist", file=sys.stderr)
            return 2
        try:
            runs = run_table(panel_rows(load(source)), per_step)
        except ValueError as exc:
            print(f"error: {source}: {exc}", file=sys.stderr)
            return 2
        if runs.empty:
            print(f"warning: {source}: no complete run of the panel", file=sys.stderr)
            continue
        tables.append(runs)
    runs = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    if args.cells_of and not runs.empty:
        try:
            runs = on_cells_of(runs, args.cells_of)
        except ValueError as exc:
            print(f"error: --cells-of: {exc}", file=sys.stderr)
            return 2
    if args.cells:
        try:
            print(cell_table(runs_of(runs, args.cells)))
        except ValueError as exc:
            print(f"error: --cells: {exc}", file=sys.stderr)
            return 2
        return 0
    results = {}
    if not runs.empty:
        for (protocol, version), part in runs.groupby(["protocol", "version"], sort=True):
            results[(protocol, int(version))] = counts(part)
    if args.markdown:
        print(markdown(results))
    else:
        for (protocol, version), result in results.items():
            print(json.dumps({"protocol": protocol, "version": version, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
