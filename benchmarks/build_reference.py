"""Build the reference baselines that ship with synthbench from measured results trees.

    python benchmarks/build_reference.py [TREE ...] [--out synthbench/data/reference/quick.parquet]

TREE defaults to benchmarks/runs/rebuild; the trees may hold both protocols. Of the runs
stored there it keeps those of

- a protocol of ``REFERENCE_PROTOCOLS`` (quick and quick-block: both tracks), each at this
  synthbench's version (synthbench.run.protocols.PROTOCOLS), and the current SUITE_VERSION
  (synthbench/run/spec.py);
- a mechanism of ``REFERENCE_MECHANISMS`` (synthbench/report/reference.py), seeds 0-2;
- a built-in task at its default parameters, with the protocol's defaults: the run id must
  be the one ``RunSpec.resolve(task, mech, PROTOCOLS.get(protocol), seed)`` gives today;
- a complete lr sweep (every lr the sweep needs has a row, none an error, the selected lr
  marked as synthbench/run/lr_selection.py selects it);

and writes every lr row of those runs, every stored column, to ONE zstd-compressed Parquet
file (what ``synthbench report`` shows beside a user's rows and ``synthbench reproduce``
re-runs: synthbench/report/reference.py), ordered by protocol (as ``REFERENCE_PROTOCOLS``),
mechanism (as ``REFERENCE_MECHANISMS``), task, seed and lr. It prints what it dropped and
why, per (protocol, mechanism) how many runs and tasks it holds and which (task, seed) are
missing, and per mechanism and device the block track's training seconds over the core
track's on the runs both hold there; the file's metadata (``synthbench_reference``) says the
same, per protocol its version, the missing runs as [protocol, task, mechanism, seed], the
costs as ``track_cost``. A run id found in several trees is taken from the first tree given.
The output is deterministic: the same trees give the same bytes.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import pandas as pd

from synthbench.core.task import TASKS, in_default_suite
from synthbench.core.text import plural
from synthbench.report.reference import (
    REFERENCE_MECHANISMS,
    REFERENCE_PROTOCOLS,
    SEEDS,
    SHIPPED,
    write,
)
from synthbench.run.lr_selection import sweep_state
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.schema import SCHEMA, lr_key
from synthbench.run.spec import SUITE_VERSION, RunSpec
from synthbench.run.store import ResultStore

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TREES = [ROOT / "benchmarks" / "runs" / "rebuild"]
DEFAULT_OUT = ROOT / "synthbench" / "data" / SHIPPED


def builtin_tasks() -> list[str]:
    """The built-in tasks of the default suite: the reference holds no State task."""
    return sorted(e.name for e in TASKS.entries() if e.source == "builtin" and in_default_suite(e))


def expected_run_ids() -> dict[str, tuple[str, str, str, int]]:
    """run id -> (protocol, task, mechanism, seed) of every run the reference may hold."""
    expected = {}
    for name in REFERENCE_PROTOCOLS:
        protocol = PROTOCOLS.get(name)
        for task in builtin_tasks():
            for mech in REFERENCE_MECHANISMS:
                first = RunSpec.resolve(task, mech, protocol, SEEDS[0])
                for seed in SEEDS:
                    spec = first.with_seed(seed) if seed != SEEDS[0] else first
                    expected[spec.run_id] = (name, task, mech, seed)
    return expected


def load_trees(trees: list[Path]) -> tuple[pd.DataFrame, list[str]]:
    """Every row of the trees, a run id taken from the first tree that holds it."""
    frames, notes, seen = [], [], set()
    for tree in trees:
        if not tree.is_dir():
            raise SystemExit(f"error: {tree} is not a results tree (no such folder)")
        report = ResultStore(tree).load(warn=False)
        for path, reason in report.skipped:
            notes.append(f"skipped {path}: {reason}")
        rows = report.rows
        again = set(rows["run_id"]) & seen
        if again:
            repeated = plural(len(again), "run")
            notes.append(f"{repeated} of {tree} also in an earlier tree: kept from there")
            rows = rows[~rows["run_id"].isin(again)]
        seen |= set(rows["run_id"])
        frames.append(rows)
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return rows, notes


def why_dropped(run: pd.DataFrame, expected: dict[str, tuple[str, str, str, int]]) -> str | None:
    """Why a run (its rows) does not belong in the reference, or None."""
    first = run.iloc[0]
    name = str(first["protocol"])
    if name not in REFERENCE_PROTOCOLS:
        return f"protocol {name}"
    protocol = PROTOCOLS.get(name)
    if int(first["protocol_version"]) != protocol.version:
        return f"protocol {name} v{first['protocol_version']} (today: v{protocol.version})"
    if int(first["suite_version"]) != SUITE_VERSION:
        return f"suite v{first['suite_version']} (today: v{SUITE_VERSION})"
    if first["mechanism"] not in REFERENCE_MECHANISMS:
        return f"mechanism {first['mechanism']} (not a reference mechanism)"
    if int(first["seed"]) not in SEEDS:
        return f"seed {first['seed']} (the reference holds seeds {SEEDS[0]}-{SEEDS[-1]})"
    if first["task"] not in builtin_tasks():
        return f"task {first['task']} (not a built-in task)"
    here = (name, first["task"], first["mechanism"], int(first["seed"]))
    if expected.get(first["run_id"]) != here:
        return "not the default config today (task or mechanism parameters, threads, pos, ...)"
    records = run.to_dict("records")
    if any(r["status"] == "error" for r in records):
        return "an lr stored as an error (the sweep would train it again)"
    state = sweep_state(protocol, records)
    if not state.complete:
        return "lr sweep incomplete"
    for r in records:
        if bool(r["selected"]) != (lr_key(r["lr"]) == state.selected):
            return "selected lr not marked as the sweep selects it"
    return None


def seed_ranges(seeds: list[int]) -> str:
    return "all seeds" if seeds == list(SEEDS) else "seed " + ",".join(map(str, seeds))


def report_cell(rows: pd.DataFrame, held: set, summary: dict, name: str, mech: str) -> dict:
    """Print what the reference holds of (protocol ``name``, ``mech``) and what it lacks, add
    the lacking runs to ``summary["missing"]``; its runs and tasks."""
    mine = rows[(rows["protocol"] == name) & (rows["mechanism"] == mech)]
    missing = {}
    for task in builtin_tasks():
        absent = [s for s in SEEDS if (name, task, mech, s) not in held]
        if absent:
            missing[task] = absent
            summary["missing"] += [[name, task, mech, s] for s in absent]
    runs, tasks = mine["run_id"].nunique(), mine["task"].nunique()
    line = f"{name:<11} {mech:<14} {runs:>3} runs on {tasks:>2} tasks"
    if len(missing) == len(builtin_tasks()) and all(v == list(SEEDS) for v in missing.values()):
        line += "; missing: every task (no run)"
    elif missing:
        line += "; missing: " + ", ".join(f"{t} ({seed_ranges(s)})" for t, s in missing.items())
    print(line)
    return {"runs": int(runs), "tasks": int(tasks)}


def track_costs(rows: pd.DataFrame) -> dict[str, dict[str, dict]]:
    """Per mechanism and device, the training seconds of its block-track runs over those of
    its core-track runs, on the (task, seed) both tracks hold on that device: every lr row's
    ``wall_seconds``, one thread each (the cost the published-layers issue asks to measure).
    Runs of one device are paired only with runs of the same device: a GPU's seconds over a
    CPU's would measure the machines, not the tracks."""
    by_track = {PROTOCOLS.get(name).track: name for name in REFERENCE_PROTOCOLS}
    core, block = by_track.get("core"), by_track.get("block")
    costs: dict[str, dict[str, dict]] = {}
    for mech in REFERENCE_MECHANISMS:
        mine = rows[rows["mechanism"] == mech]
        for device, on_device in mine.groupby(mine["device"].str.split(":").str[0], sort=True):
            runs = pd.Series(
                list(zip(on_device["task"], on_device["seed"], strict=True)), index=on_device.index
            )
            both = set(runs[on_device["protocol"] == core]) & set(
                runs[on_device["protocol"] == block]
            )
            if not both:
                continue
            seconds = on_device[runs.isin(both)].groupby("protocol")["wall_seconds"].sum()
            c = costs.setdefault(mech, {})[device] = {
                "runs": len(both),
                "core_seconds": round(float(seconds[core]), 1),
                "block_seconds": round(float(seconds[block]), 1),
                "ratio": round(float(seconds[block] / seconds[core]), 3),
            }
            print(
                f"cost {mech:<14} block/core {c['ratio']:.2f}x on {c['runs']} runs in both on "
                f"{device} ({c['block_seconds']:,.0f} s against {c['core_seconds']:,.0f} s of "
                "training)"
            )
    return costs


def build(trees: list[Path], out: Path) -> dict:
    rows, notes = load_trees(trees)
    for note in notes:
        print(note)
    expected = expected_run_ids()
    kept, dropped = [], defaultdict(list)
    for _, run in rows.groupby("run_id", sort=True):
        reason = why_dropped(run, expected)
        if reason is None:
            kept.append(run)
        else:
            first = run.iloc[0]
            dropped[reason].append(
                f"{first['protocol']}/{first['task']}/{first['mechanism']}/seed {first['seed']}"
            )
    for reason, runs in sorted(dropped.items()):
        shown = ", ".join(runs[:3]) + (", ..." if len(runs) > 3 else "")
        print(f"dropped {plural(len(runs), 'run')}: {reason} ({shown})")
    table_rows = pd.concat(kept, ignore_index=True) if kept else rows.iloc[:0]
    # the tuples' order, not the names': the core track first, the baselines in their order
    protocol_order = {p: i for i, p in enumerate(REFERENCE_PROTOCOLS)}
    mech_order = {m: i for i, m in enumerate(REFERENCE_MECHANISMS)}
    table_rows = (
        table_rows.assign(
            _p=table_rows["protocol"].map(protocol_order),
            _m=table_rows["mechanism"].map(mech_order),
        )
        .sort_values(["_p", "_m", "task", "seed", "lr"], kind="stable")
        .drop(columns=["_p", "_m"])
    )
    held = set(
        zip(
            table_rows["protocol"], table_rows["task"], table_rows["mechanism"],
            table_rows["seed"].astype(int), strict=True,
        )
    )  # fmt: skip
    summary = {
        "protocols": list(REFERENCE_PROTOCOLS),
        "protocol_versions": {p: PROTOCOLS.get(p).version for p in REFERENCE_PROTOCOLS},
        "suite_version": SUITE_VERSION,
        "schema_version": int(SCHEMA.metadata[b"synthbench_schema_version"]),
        "seeds": list(SEEDS),
        "mechanisms": {},
        "missing": [],
        "torch_version": sorted({str(v) for v in table_rows["torch_version"].dropna()}),
        "synthbench_version": sorted({str(v) for v in table_rows["synthbench_version"].dropna()}),
    }
    for name in REFERENCE_PROTOCOLS:
        summary["mechanisms"][name] = {}
        for mech in REFERENCE_MECHANISMS:
            summary["mechanisms"][name][mech] = report_cell(table_rows, held, summary, name, mech)
    summary["track_cost"] = track_costs(table_rows)
    write(table_rows, out, summary)
    total = table_rows["run_id"].nunique()
    print(f"wrote {out}: {total} runs, {len(table_rows)} rows, {out.stat().st_size:,} bytes")
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", type=Path, default=DEFAULT_TREES, metavar="TREE")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    build(args.trees, args.out)


if __name__ == "__main__":
    sys.exit(main())
