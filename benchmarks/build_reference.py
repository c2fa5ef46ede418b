"""Build the reference baselines that ship with synthbench from measured results trees.

    python benchmarks/build_reference.py [TREE ...] [--out synthbench/data/reference/quick.parquet]

TREE defaults to benchmarks/runs/rebuild; the trees may hold both protocols. Of the runs
stored there it keeps those of

- a protocol of ``REFERENCE_PROTOCOLS`` (quick and quick-block: both tracks), each at this
  synthbench's version (synthbench.run.protocols.PROTOCOLS), and the current SUITE_VERSION
  (synthbench/run/spec.py);
- a mechanism of ``REFERENCE_MECHANISMS`` (synthbench/report/reference.py);
- a run that ``synthbench run --task extended --mech <those> --protocol P`` plans today
  (``planned_runs``): every built-in task, the default suite's and the State tasks, each
  laddered one at each level of its ladder with the protocol's seeds dealt to the levels
  (docs/TASKS.md, "Ladders"), the others at their defaults and every seed; and the seeds
  that recipe v2's seed rule (synthbench/run/seeds.py) adds to a cell whose planned runs
  are complete and disagree, as ``run`` adds them (``expected_runs``). The run id must be
  the one today's code gives: another version of a task, a mechanism, the protocol or the
  suite is a run of something else;
- a complete lr sweep (every lr the sweep needs has a row, none an error, the selected lr
  marked as synthbench/run/lr_selection.py selects it);

and writes every lr row of those runs, every stored column, to ONE zstd-compressed Parquet
file (what ``synthbench report`` shows beside a user's rows and ``synthbench reproduce``
re-runs: synthbench/report/reference.py), ordered by protocol (as ``REFERENCE_PROTOCOLS``),
mechanism (as ``REFERENCE_MECHANISMS``), task, seed and lr. It prints what it dropped and
why, per (protocol, mechanism) how many runs and tasks it holds and which (task, seed) are
missing, per mechanism and device the block track's training seconds over the core
track's on the runs both hold there, and the cells whose runs trained on more than one kind
of device; the file's metadata (``synthbench_reference``) says the same, per protocol its
version, the missing runs as [protocol, task, mechanism, seed], the costs as
``track_cost``, the cells of mixed devices as ``mixed_devices``. A run id found in several
trees is taken from the first tree given. The output is deterministic: the same trees give
the same bytes.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import pandas as pd

from synthbench.core.task import TASKS, task_set
from synthbench.core.text import plural
from synthbench.report.reference import REFERENCE_MECHANISMS, REFERENCE_PROTOCOLS, SHIPPED, write
from synthbench.report.reproduction import device_type
from synthbench.run.lr_selection import sweep_state
from synthbench.run.planning import plan, suite_difficulties
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.schema import SCHEMA, lr_key
from synthbench.run.seeds import Cells, Growth
from synthbench.run.spec import SUITE_VERSION, RunSpec
from synthbench.run.store import ResultStore

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TREES = [ROOT / "benchmarks" / "runs" / "rebuild"]
DEFAULT_OUT = ROOT / "synthbench" / "data" / SHIPPED


def builtin_tasks() -> list[str]:
    """The built-in tasks of ``--task extended``: the default suite's and the State tasks."""
    return [name for name in task_set("extended") if TASKS.entry(name).source == "builtin"]


def planned_runs(name: str) -> list[RunSpec]:
    """The runs ``synthbench run --task extended --mech <REFERENCE_MECHANISMS> --protocol
    NAME`` plans at the protocol's seeds, before the seed rule adds any (the rebuild's
    streams run that command, a mechanism and a track at a time)."""
    protocol = PROTOCOLS.get(name)
    difficulties = suite_difficulties("extended", None, None, protocol.seeds)
    return plan(
        builtin_tasks(), list(REFERENCE_MECHANISMS), protocol, protocol.seeds,
        difficulties=difficulties,
    )  # fmt: skip


def expected_runs(rows: pd.DataFrame) -> dict[str, RunSpec]:
    """run id -> RunSpec of every run the reference may hold: the planned runs, and the
    seeds the seed rule adds to each cell whose planned runs ``rows`` holds complete and
    whose scores disagree, or to the levels of a ladder out of order, as the runner adds
    them (``Cells``)."""
    runs = rows.groupby("run_id") if len(rows) else []
    records = {run_id: run.to_dict("records") for run_id, run in runs}
    expected: dict[str, RunSpec] = {}
    for name in REFERENCE_PROTOCOLS:
        expected.update((spec.run_id, spec) for spec in _runs_with_added_seeds(name, records))
    return expected


def _runs_with_added_seeds(name: str, records: dict[str, list[dict]]) -> list[RunSpec]:
    """The planned runs of protocol ``name`` and the seeds the rules add to them, judging
    the runs ``records`` (run id -> its rows) holds complete."""
    specs = planned_runs(name)
    cells = Cells(enabled=True)
    cells.plan(specs)
    added: list[RunSpec] = []

    def complete_held(runs: list[RunSpec]) -> None:
        for spec in runs:
            held = records.get(spec.run_id)
            if held and sweep_state(spec.protocol, held).complete:
                cells.complete(spec, held)

    def take(growth: Growth) -> None:
        complete_held(growth.added)
        added.extend(growth.added)

    complete_held(specs)
    cells.grow_until_settled(specs, take)
    return [*specs, *added]


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


def why_dropped(run: pd.DataFrame, expected: dict[str, RunSpec]) -> str | None:
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
    if first["task"] not in builtin_tasks():
        return f"task {first['task']} (not a built-in task)"
    if first["run_id"] not in expected:
        return (
            "not a run the rebuild plans (task or mechanism parameters, threads, pos, a level "
            "of another ladder, or a seed that neither the protocol nor the seed rule gives)"
        )
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


def report_cell(
    held: set[str], expected: dict[str, RunSpec], summary: dict, name: str, mech: str
) -> dict:
    """Print what the reference holds of (protocol ``name``, ``mech``) and what it lacks (the
    expected runs it does not hold, by task and seed), add the lacking runs to
    ``summary["missing"]``; its runs and tasks."""
    mine = [s for s in expected.values() if s.protocol.name == name and s.mechanism == mech]
    missing: dict[str, list[int]] = defaultdict(list)
    for spec in sorted(mine, key=lambda s: (s.task, s.seed)):
        if spec.run_id not in held:
            missing[spec.task].append(spec.seed)
            summary["missing"].append([name, spec.task, mech, spec.seed])
    kept = [s for s in mine if s.run_id in held]
    runs, tasks = len(kept), len({s.task for s in kept})
    line = f"{name:<11} {mech:<14} {runs:>3} runs on {tasks:>2} tasks"
    if not runs:
        line += "; missing: every task (no run)"
    elif missing:
        seeds = ", ".join(f"{t} (seed {','.join(map(str, s))})" for t, s in missing.items())
        line += f"; missing: {seeds}"
    print(line)
    return {"runs": runs, "tasks": tasks}


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
        for device, on_device in mine.groupby(mine["device"].map(device_type), sort=True):
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


def mixed_devices(rows: pd.DataFrame) -> list[list]:
    """The cells (protocol, task, mechanism: what a board averages over seeds and levels)
    whose runs trained on more than one kind of device, each as [protocol, task, mechanism,
    {device type: its runs}] (a run whose lrs trained on two kinds counts under both):
    floating-point sums differ between devices, so such a cell's spread is partly theirs."""
    found = []
    for (protocol, task, mech), cell in rows.groupby(["protocol", "task", "mechanism"], sort=True):
        kinds = cell["device"].map(device_type)
        if kinds.nunique() > 1:
            runs = cell.groupby(kinds)["run_id"].nunique()
            found.append([protocol, task, mech, {k: int(n) for k, n in runs.items()}])
    return found


def build(trees: list[Path], out: Path) -> dict:
    rows, notes = load_trees(trees)
    for note in notes:
        print(note)
    expected = expected_runs(rows)
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
    held = set(table_rows["run_id"])
    summary = {
        "protocols": list(REFERENCE_PROTOCOLS),
        "protocol_versions": {p: PROTOCOLS.get(p).version for p in REFERENCE_PROTOCOLS},
        "suite_version": SUITE_VERSION,
        "schema_version": int(SCHEMA.metadata[b"synthbench_schema_version"]),
        # per protocol: the seeds a cell starts with, and how many the seed rule may give it
        "seeds": {p: PROTOCOLS.get(p).seeds for p in REFERENCE_PROTOCOLS},
        "max_seeds": {p: PROTOCOLS.get(p).max_seeds for p in REFERENCE_PROTOCOLS},
        "mechanisms": {},
        "missing": [],
        "torch_version": sorted({str(v) for v in table_rows["torch_version"].dropna()}),
        "synthbench_version": sorted({str(v) for v in table_rows["synthbench_version"].dropna()}),
    }
    for name in REFERENCE_PROTOCOLS:
        summary["mechanisms"][name] = {}
        for mech in REFERENCE_MECHANISMS:
            summary["mechanisms"][name][mech] = report_cell(held, expected, summary, name, mech)
    summary["track_cost"] = track_costs(table_rows)
    summary["mixed_devices"] = mixed_devices(table_rows)
    for protocol, task, mech, runs in summary["mixed_devices"]:
        kinds = ", ".join(f"{kind} {plural(n, 'run')}" for kind, n in runs.items())
        print(f"mixed devices: {protocol} {task} {mech} ({kinds})")
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
