"""Write the shipped table of per-step costs (synthbench/data/step_costs.csv) that
``synthbench run`` estimates its CPU time from (synthbench/run/cost.py, docs/PROTOCOLS.md
"Cost per mechanism").

    python benchmarks/step_costs.py --cache FILE [--out synthbench/data/step_costs.csv]
        [--no-measure] [--protocols P,P...] [--reference FILE]

Run it on the reference machine (the 2-core CPU the shipped reference was measured on), one
thread. Every figure is seconds per optimizer step of one training at the protocol's whole
schedule, the training's fixed costs (the model, the evaluation sets, the curve points, the
test evaluation, the checks) spread over its steps. Each row of the table says where its
figure comes from (``source``):

- ``reference``: the median wall_seconds / steps_done of the ok rows of the protocol in
  synthbench/data/reference/quick.parquet (or ``--reference``) for that task and mechanism
  trained on the CPU (whole `synthbench run` sweeps; rows a lent GPU trained are left out),
  with the rows' trainings per run and mean share of the steps: quick's, and a block-track
  protocol's for the pairs the reference holds in it;
- ``runs``: the same from the quick rows of benchmarks/runs/quick-v4, for the mechanisms the
  reference does not hold (the modern baselines);
- ``layout``: a ``reference`` or ``runs`` figure of a task whose default layout changed since
  those rows were trained, times the ratio (``scale``) of the step time on today's layout to
  the step time on the rows' layout (FORMER), measured back to back for every mechanism: the
  median over the mechanisms (a change of length hits them alike; one ratio carries the
  machine's noise);
- ``measured``: the protocol's whole training measured here, as `synthbench run` trains it
  (seed 0, its first lr): wall / steps (smoke's 20 steps, smoke-block's 40, slay-paper's 200);
- ``scaled``: the quick figure of the pair times the ratio (``scale``) of this protocol's step
  time to quick's, measured back to back on the tasks of SCALED_TASKS: the median over them
  for the mechanism (a change of width and batch, or of the block around the mechanism, hits
  every task alike, each mechanism in its own way); for a protocol too slow to train the
  pairs whole here (standard: 4000 steps of batch 64 at d_model 128, 10 to 60 minutes a
  training; quick-block and standard-block, the block track's, twice quick's and standard's
  steps), for the pairs the reference does not hold in that protocol. A mechanism whose
  ratio is not measured this time takes the median over the tasks the reference holds in the
  protocol of that figure over quick's (whole runs), else (with ``--protocols``) the ratio
  the table at ``--out`` holds for it (measured before).

Step times are the mean interval between optimizer steps after the first tenth, as in
`synthbench bench train` (``step_ms``), from a short training with tiny evaluation sets.
Not a short training's whole wall time: its evaluation scores an untrained model, whose
free-running generation, corrected token after token, can cost minutes (performer on
long_copy) where a trained model's costs seconds. Ratios measured back to back cancel what
the machine's load (a shared machine) does between pairs.

``--docs`` also puts the written table's summary (``synthbench.run.cost_table.markdown_table``)
between the cost-table markers of docs/PROTOCOLS.md, which a test checks against the shipped
table.

``--cache`` keeps the measurements (JSON lines): an interrupted run resumes, and
``--no-measure`` writes the table from what the cache holds (leaving the rest out).
``--protocols`` measures and writes only those protocols' rows, keeping the other rows of the
table at ``--out``, and ``--mechs`` only those mechanisms' rows (a mechanism the table lacks
is measured without measuring the others again). A scaled protocol then scales that table's
quick figures, unless quick is among those written, and keeps that table's ratios where none
is measured: the quick figures change with a new reference, the ratio of two step times
measured here does not, so the rebuilt reference's quick figures rescale standard without
measuring it again.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from synthbench.bench.throughput import step_times
from synthbench.run import cost, cost_table
from synthbench.run.protocols import PROTOCOLS, Protocol
from synthbench.run.spec import RunSpec
from synthbench.run.store import ResultStore
from synthbench.run.train import train_eval

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "synthbench" / "data" / "reference" / "quick.parquet"
RUNS = ROOT / "benchmarks" / "runs" / "quick-v4"
DEFAULT_OUT = ROOT / "synthbench" / "data" / cost.STEP_COSTS
DOC = ROOT / "docs" / "PROTOCOLS.md"
DOC_MARKERS = ("<!-- cost-table -->\n", "<!-- /cost-table -->")
ROW_COLUMNS = ["task", "mechanism", "protocol", "protocol_version", "run_id", "status",
               "wall_seconds", "steps_done", "steps", "task_params", "device"]  # fmt: skip
# the knobs added since the quick rows, at the values that bring the rows' layouts back
# (docs/TASKS.md: each task's suite v2 layout)
FORMER = {
    "compression": {"max_pad": 0},
    "induction": {"fixed_repeats": True},
    "selective_copy": {"tail": 0},
    "stack": {"climb": 0, "nested": False, "practice": False},
}
WHOLE = ("smoke", "smoke-block", "slay-paper")  # trained whole
SCALED = ("standard", "quick-block", "standard-block")  # scaled from quick by step times
# the tasks whose step times scale the SCALED protocols (short to long sequences)
SCALED_TASKS = (
    "addition",
    "sort",
    "multihop",
    "copy",
    "kv_recall",
    "pattern",
    "retrieval",
    "reverse",
)
# steps of a training measured for its step time
STEPS = {"quick": 40, "standard": 12, "quick-block": 40, "standard-block": 12}
TINY = 16  # examples of each evaluation set of such a training


def reference_rows(reference: pd.DataFrame, protocol: str) -> pd.DataFrame:
    """The reference's rows of ``protocol`` trained on the CPU, at its version here or one
    whose steps cost the same (``cost.SAME_STEPS``): the table prices this machine's trainings of
    today's model, and a GPU's rows (the rebuild's leases) say nothing of them."""
    versions = {PROTOCOLS.get(protocol).version, *cost.SAME_STEPS.get(protocol, ())}
    mine = reference[
        (reference["protocol"] == protocol)
        & (reference["device"] == "cpu")
        & reference["protocol_version"].isin(versions)
    ]
    return mine.assign(source="reference")


def quick_rows(reference: pd.DataFrame) -> pd.DataFrame:
    """The quick rows the figures come from: the reference's, then those of the runs tree
    for mechanisms the reference lacks."""
    reference = reference_rows(reference, "quick")
    runs = ResultStore(RUNS).load(columns=ROW_COLUMNS, warn=False).rows
    runs = runs[(runs["protocol"] == "quick") & ~runs["mechanism"].isin(reference["mechanism"])]
    return pd.concat([reference, runs.assign(source="runs")], ignore_index=True)


_warm: set[tuple[str, str]] = set()


def train(protocol: Protocol, task: str, mechanism: str, task_params=None) -> dict:
    """One training, timed step by step (the first in this process of a protocol and
    mechanism after an unmeasured two-step one, which loads what a first training loads)."""
    device = torch.device("cpu")
    if (protocol.name, mechanism) not in _warm:
        warm = dataclasses.replace(protocol, steps=2)
        train_eval(RunSpec.resolve(task, mechanism, warm, 0, task_params), warm.lrs[0], device)
        _warm.add((protocol.name, mechanism))
    spec = RunSpec.resolve(task, mechanism, protocol, 0, task_params)
    with step_times() as times:
        row = train_eval(spec, protocol.lrs[0], device)
    if row["status"] != "ok":
        raise RuntimeError(f"{protocol.name} {task} {mechanism}: {row['status']} {row['error']}")
    skip = protocol.steps // 10  # the first steps load code and pick kernels
    step_s = (times[-1] - times[skip]) / (len(times) - 1 - skip)
    return {
        "measured_steps": protocol.steps,
        "wall_s": row["wall_seconds"],
        "step_ms": step_s * 1e3,
        "at": time.strftime("%Y-%m-%d"),
    }


def whole(protocol: Protocol, task: str, mechanism: str, task_params=None) -> dict:
    """The protocol's training as `synthbench run` trains it."""
    return train(protocol, task, mechanism, task_params)


def step_time(protocol: Protocol, task: str, mechanism: str, task_params=None) -> dict:
    """A short training with tiny evaluation sets, for its step time."""
    short = dataclasses.replace(
        protocol, steps=STEPS[protocol.name], stop_at=0.0, pace_margin=0.0,
        val_examples=TINY, test_examples=TINY, eval_batch_size=TINY,
    )  # fmt: skip
    return train(short, task, mechanism, task_params)


class Measurements:
    """Measured trainings by key, kept in a JSON-lines cache."""

    def __init__(self, cache: Path | None, measure: bool = True) -> None:
        self.cache, self.done, self.measure = cache, {}, measure
        if cache is not None and cache.exists():
            for line in cache.read_text().splitlines():
                record = json.loads(line)
                self.done[record["key"]] = record

    def get(self, how, protocol: Protocol, task: str, mech: str, task_params=None, tag=""):
        """``how`` (whole or step_time) of a training; ``tag``: another one of the same.
        None when not measured and ``measure`` is off."""
        layout = json.dumps(task_params, sort_keys=True) if task_params else "default"
        kind = f"full{protocol.steps}" if how is whole else f"steps{STEPS[protocol.name]}"
        key = f"{protocol.name}/{task}/{mech}/{layout}" + (f"/{tag}" if tag else "") + f"/{kind}"
        if how is step_time and not tag:  # a whole quick training of 40 steps timed them too
            key = next((k for k in (key, key.replace("/steps", "/full")) if k in self.done), key)
        if key not in self.done:
            if not self.measure:
                return None
            record = {"key": key, **how(protocol, task, mech, task_params)}
            self.done[key] = record
            if self.cache is not None:
                with self.cache.open("a") as f:
                    f.write(json.dumps(record) + "\n")
            print(f"{key}: {record}", flush=True)
        return self.done[key]


def held_ratios(held: pd.DataFrame, quick_figures: dict) -> dict:
    """Per pair the reference holds in a scaled protocol, its figure over the pair's quick
    figure, in the form ``ratios`` gives (no step time measured): whole runs' ratios, whose
    median scales the mechanism's tasks the reference holds only from another device."""
    return {
        (r.task, r.mechanism): (r.step_seconds / quick_figures[r.task, r.mechanism], None)
        for r in held.itertuples()
        if (r.task, r.mechanism) in quick_figures
    }


def earlier_scales(table: pd.DataFrame, protocol: str) -> dict[str, tuple[float, dict]]:
    """Per mechanism, the ratio (``scale``) of ``table``'s scaled figures of ``protocol``, and
    per task the step times that were measured for it."""
    if "source" not in table:
        return {}
    mine = table[(table["protocol"] == protocol) & (table["source"] == "scaled")]
    found = {}
    for mech, part in mine.groupby("mechanism"):
        measured = {
            r.task: {"measured_steps": r.measured_steps, "step_ms": r.step_ms}
            for r in part.itertuples()
            if pd.notna(r.step_ms)
        }
        found[mech] = (float(part["scale"].iloc[0]), measured)
    return found


def write_docs_table(table: pd.DataFrame, doc: Path = DOC) -> None:
    """``table``'s summary between ``doc``'s cost-table markers, the rest of ``doc`` kept."""
    start, end = DOC_MARKERS
    head, rest = doc.read_text().split(start, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(f"{head}{start}{cost_table.markdown_table(table)}{end}{tail}")


def figure(protocol: Protocol, task: str, mech: str, source: str, **fields) -> dict:
    return {"protocol": protocol.name, "protocol_version": protocol.version, "task": task,
            "mechanism": mech, "source": source, **fields}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, help="JSON lines of the measurements (resumes)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--no-measure", action="store_true", help="only what --cache holds (leave the rest out)"
    )
    parser.add_argument(
        "--reference", type=Path, default=REFERENCE, help="the reference rows to read"
    )
    parser.add_argument(
        "--protocols",
        help="comma-separated: measure and write only these protocols' rows, keeping the "
        "other rows of --out (default: every protocol)",
    )
    parser.add_argument(
        "--mechs",
        help="comma-separated: measure and write only these mechanisms' rows of those "
        "protocols, keeping the other rows of --out (default: every mechanism of the reference)",
    )
    parser.add_argument(
        "--docs", action="store_true", help="also rewrite docs/PROTOCOLS.md's cost table"
    )
    args = parser.parse_args(argv)
    every = ("quick", *WHOLE, *SCALED)
    wanted = every if args.protocols is None else [p.strip() for p in args.protocols.split(",")]
    unknown = [p for p in wanted if p not in every]
    if unknown:
        parser.error(
            f"no figures for protocol {', '.join(unknown)}; choose from {', '.join(every)}"
        )
    if not args.reference.is_file():
        parser.error(f"no reference rows at {args.reference}: no such file")
    try:
        reference_table = pd.read_parquet(args.reference, columns=ROW_COLUMNS)
    except (OSError, ValueError, KeyError) as exc:  # not Parquet, or lacking columns
        parser.error(f"cannot read the reference rows {args.reference}: {exc}")
    only = None if args.mechs is None else [m.strip() for m in args.mechs.split(",")]
    kept = before = pd.DataFrame({"protocol": []})  # before: the table as it was
    if args.protocols is not None or only is not None:
        if not args.out.is_file():
            parser.error(f"--protocols and --mechs keep the other rows of {args.out}, "
                         "which does not exist")  # fmt: skip
        before = cost.read_table(args.out)
        rewritten = before["protocol"].isin(wanted)
        if only is not None:
            rewritten &= before["mechanism"].isin(only)
        kept = before[~rewritten]
    torch.set_num_threads(1)
    measured = Measurements(args.cache, measure=not args.no_measure)
    quick = PROTOCOLS.get("quick")
    rows = quick_rows(reference_table)
    # pairs the reference holds in a scaled protocol (the block track's, once rebuilt): their
    # own rows' figures, as quick's
    held = {name: cost.figures_of_rows(reference_rows(reference_table, name)) for name in SCALED}
    held_pairs = {
        name: set(zip(f["task"], f["mechanism"], strict=True)) for name, f in held.items()
    }
    tasks = cost_table.builtin_tasks()
    mechanisms = list(dict.fromkeys(rows["mechanism"]))
    if only is not None:
        unknown = [m for m in only if m not in mechanisms]
        if unknown:
            near = difflib.get_close_matches(unknown[0], mechanisms, n=3)
            hint = f" (close: {', '.join(near)})" if near else ""
            parser.error(f"the reference holds no quick rows of {', '.join(unknown)}{hint}; "
                         f"it holds {', '.join(mechanisms)}")  # fmt: skip
        mechanisms = [m for m in mechanisms if m in only]
    reference = set(rows.loc[rows["source"] == "reference", "mechanism"])
    derived = cost.figures_of_rows(rows).set_index(["task", "mechanism"])
    layouts = rows.groupby("task")["task_params"].first().map(json.loads)
    layouts = {t: FORMER.get(t, {}) | params for t, params in layouts.items()}
    changed = [
        t for t in tasks if layouts[t] != RunSpec.resolve(t, "softmax", quick, 0).task_params
    ]
    if "quick" in wanted:
        print(f"layouts changed since the quick rows: {', '.join(changed) or 'none'}", flush=True)

    def layout_scale(task: str, mech: str) -> tuple[float, dict] | None:
        new = measured.get(step_time, quick, task, mech)
        former = measured.get(step_time, quick, task, mech, layouts[task])
        return None if new is None or former is None else (new["step_ms"] / former["step_ms"], new)

    def protocol_scale(protocol: Protocol, task: str, mech: str) -> tuple[float, dict] | None:
        base = measured.get(step_time, quick, task, mech, tag=protocol.name)
        here = measured.get(step_time, protocol, task, mech)
        return None if base is None or here is None else (here["step_ms"] / base["step_ms"], here)

    # measure, the cheap first: layouts and the smoke trainings, the scaled protocols' step
    # times, then slay-paper (the reference's mechanisms first)
    if measured.measure:
        for mech in mechanisms:
            for task in tasks:
                if "quick" in wanted and task in changed:
                    layout_scale(task, mech)
                for name in ("smoke", "smoke-block"):
                    if name in wanted:
                        measured.get(whole, PROTOCOLS.get(name), task, mech)
        for name in (n for n in SCALED if n in wanted):
            for mech in mechanisms:
                if all((t, mech) in held_pairs.get(name, ()) for t in tasks):
                    continue  # nothing of it to scale
                for task in SCALED_TASKS:
                    protocol_scale(PROTOCOLS.get(name), task, mech)
        if "slay-paper" in wanted:
            for mech in sorted(mechanisms, key=lambda m: m not in reference):
                for task in tasks:
                    measured.get(whole, PROTOCOLS.get("slay-paper"), task, mech)

    # a single ratio of step times carries the machine's noise (compression, whose length did
    # not change, measured 0.77 to 1.59): a figure is scaled by the median over a group,
    # a layout's over the mechanisms (its length hits them alike), a scaled protocol's over
    # the tasks (its width and batch, or its block, hit them alike, each mechanism in its
    # own way)
    def ratios(scale, pairs) -> dict:
        found = {pair: scale(*pair) for pair in pairs}
        return {pair: r for pair, r in found.items() if r is not None}

    def medians(found: dict, by: int) -> dict:
        groups: dict[str, list[float]] = {}
        for pair, (ratio, _) in found.items():
            groups.setdefault(pair[by], []).append(ratio)
        return {group: statistics.median(values) for group, values in groups.items()}

    def measured_fields(m: dict | None) -> dict:
        return {} if m is None else {"measured_steps": m["measured_steps"], "step_ms": m["step_ms"]}

    figures, quick_figures = [], {}
    if "quick" in wanted:
        layout = ratios(layout_scale, [(t, m) for t in changed for m in mechanisms])
        layout_medians = medians(layout, 0)
        for (task, mech), found in derived.iterrows():
            if mech not in mechanisms:
                continue
            source = rows.loc[rows["mechanism"] == mech, "source"].iloc[0]
            fields = {k: found[k] for k in ("rows", "trainings_per_run", "steps_frac")}
            fields |= {"protocol_version": int(found["protocol_version"])}
            seconds = found["step_seconds"]
            if task in changed:
                if task not in layout_medians:
                    continue
                fields |= measured_fields(layout.get((task, mech), (None, None))[1])
                fields["scale"] = layout_medians[task]
                seconds, source = seconds * layout_medians[task], "layout"
            quick_figures[task, mech] = seconds
            figures.append(figure(quick, task, mech, source, step_seconds=seconds, **fields))
    else:  # the kept table's
        for r in kept[kept["protocol"] == "quick"].itertuples():
            quick_figures[r.task, r.mechanism] = r.step_seconds
    for name in (n for n in WHOLE if n in wanted):
        protocol = PROTOCOLS.get(name)
        for mech in mechanisms:
            for task in tasks:
                m = measured.get(whole, protocol, task, mech)
                if m is not None:
                    fields = measured_fields(m) | {
                        "step_seconds": m["wall_s"] / m["measured_steps"]
                    }
                    figures.append(figure(protocol, task, mech, "measured", **fields))
    for name in (n for n in SCALED if n in wanted):
        protocol = PROTOCOLS.get(name)
        for found in held[name].itertuples():
            if found.mechanism not in mechanisms:
                continue
            fields = {k: getattr(found, k) for k in ("rows", "trainings_per_run", "steps_frac")}
            figures.append(figure(protocol, found.task, found.mechanism, "reference",
                                  step_seconds=found.step_seconds, **fields))  # fmt: skip
        unheld = [
            (t, m)
            for t, m in quick_figures
            if m in mechanisms and (t, m) not in held_pairs.get(name, ())
        ]
        sample = [(t, m) for t, m in unheld if t in SCALED_TASKS]
        found = ratios(functools.partial(protocol_scale, protocol), sample)
        by_mechanism = medians(found, 1)
        whole_runs = medians(held_ratios(held[name], quick_figures), 1)
        earlier = earlier_scales(before, name)
        for task, mech in unheld:
            if mech in by_mechanism:  # measured now (or cached)
                scale = by_mechanism[mech]
                fields = measured_fields(found.get((task, mech), (None, None))[1])
            elif mech in whole_runs:  # the reference's CPU runs of its other tasks
                scale, fields = whole_runs[mech], {}
            elif mech in earlier:  # the ratio the table holds, measured before
                scale, measured_then = earlier[mech]
                fields = measured_then.get(task, {})
            else:
                continue
            seconds = quick_figures[task, mech] * scale
            fields |= {"scale": scale, "step_seconds": seconds}
            figures.append(figure(protocol, task, mech, "scaled", **fields))
    table = pd.concat([t for t in (kept, pd.DataFrame(figures)) if len(t)], ignore_index=True)
    cost.write_table(table, args.out)
    print(f"wrote {len(figures)} figures ({', '.join(wanted)}), kept {len(kept)}, to {args.out}")
    if args.docs:  # from the file as written (rounded), as the docs test reads it
        write_docs_table(cost.read_table(args.out))
        print(f"wrote its summary to {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
