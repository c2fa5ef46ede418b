"""Ship the built-in facts' measured runs with synthbench (synthbench/facts/shipped.py).

    python benchmarks/ship_facts.py TREE [TREE ...] [--out synthbench/data/facts_runs.parquet]

Of the runs stored in the trees (and in the file already shipped, which is kept unless
--fresh) it keeps every lr row of the runs a built-in fact declares at its own seeds
(``fact_specs``: today's run ids, so rows of another code version never enter), whose sweep is
settled (``complete_runs``), and writes them to one Parquet file in the shipped reference's
format, ordered by run id and lr, with a summary in its metadata. A run found in several
places is taken from the first tree given, the shipped file last. It prints per fact how
many of its runs the file holds. The same rows give the same bytes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from synthbench.facts import FACTS
from synthbench.facts.evaluate import fact_specs
from synthbench.facts.shipped import complete_runs, load, shipped_path
from synthbench.report.reference import write
from synthbench.run.store import ResultStore


def declared_runs() -> dict[str, set[str]]:
    """Built-in fact -> the run ids it declares."""
    return {
        entry.name: {s.run_id for specs in fact_specs(entry.obj).values() for s in specs}
        for entry in FACTS.entries()
        if entry.source == "builtin"
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", type=Path, help="results trees")
    parser.add_argument("--out", type=Path, default=shipped_path())
    parser.add_argument("--fresh", action="store_true", help="ignore the file already shipped")
    args = parser.parse_args(argv)
    declared = declared_runs()
    wanted = set().union(*declared.values())
    sources = [ResultStore(tree).load(warn=False).rows for tree in args.trees]
    if not args.fresh:
        found = load()
        if found.problem:
            print(f"left out: {found.problem}", file=sys.stderr)
        sources.append(found.rows)
    taken: list[pd.DataFrame] = []
    seen: set[str] = set()
    for rows in sources:  # a run from the first place that holds it, whole
        mine = rows[rows["run_id"].isin(wanted - seen)]
        mine = mine[mine["run_id"].isin(complete_runs(mine))]
        seen |= set(mine["run_id"])
        taken.append(mine)
    rows = pd.concat(taken, ignore_index=True).sort_values(["run_id", "lr"], kind="stable")
    summary = {name: f"{len(ids & seen)}/{len(ids)}" for name, ids in declared.items()}
    write(rows.reset_index(drop=True), args.out, {"facts_runs": summary})
    for name, held in summary.items():
        print(f"{name}: {held} runs")
    print(f"wrote {args.out}: {len(seen)} runs, {len(rows)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
