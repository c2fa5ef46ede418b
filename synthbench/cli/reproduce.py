"""``synthbench reproduce``: train a random sample of the shipped reference runs again on this
machine and say whether they reproduce (the rule: synthbench/report/reference.py, ``compare``)."""

from __future__ import annotations

import math
import random
import secrets
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import torch
import typer

from synthbench.cli.common import (
    DeviceOption,
    UsageError,
    check_writable_folder,
    fail,
    filter_names,
    load_plugins,
    names_in,
    out,
    path_parser,
)
from synthbench.cli.progress import RunView
from synthbench.core.mechanism import MECHANISMS
from synthbench.core.task import TASKS
from synthbench.core.text import plural
from synthbench.report import reference, reproduction
from synthbench.run import provenance, runner
from synthbench.run.devices import default_jobs, resolve_device, worker_devices
from synthbench.run.executors import InProcess, LocalPool
from synthbench.run.limits import check_runs
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.spec import MAX_THREADS
from synthbench.run.store import ResultStore


def reproduce_command(
    runs: Annotated[int, typer.Option(help="How many reference runs to train again.")] = 3,
    sample_seed: Annotated[
        int | None,
        typer.Option(help="Seed of the random sample (default: a new one, printed)."),
    ] = None,
    task: Annotated[
        str | None, typer.Option(help="Only reference runs of these tasks (comma-separated).")
    ] = None,
    mech: Annotated[
        str | None,
        typer.Option(help="Only reference runs of these mechanisms (comma-separated)."),
    ] = None,
    protocol: Annotated[
        str | None,
        typer.Option(help="Only reference runs of these protocols (comma-separated)."),
    ] = None,
    max_seconds: Annotated[
        float | None,
        typer.Option(
            help="Only runs whose stored trainings took less than this many seconds in all "
            "(the cheap ones)."
        ),
    ] = None,
    results: Annotated[
        Path | None,
        typer.Option(
            "--results",
            help="Where the runs are stored (default: a temporary folder, removed after); a "
            "run already stored there is compared as it is.",
            parser=path_parser("--results"),
            metavar="DIR",
        ),
    ] = None,
    jobs: Annotated[
        int | None,
        typer.Option(
            help="Trainings at once, in worker processes (default: one per core on the CPU, "
            "up to 4 per GPU); 1 trains in this process."
        ),
    ] = None,
    threads: Annotated[
        int | None,
        typer.Option(
            help="Torch threads per training (default: the reference's; another count is "
            "another run, compared within the tolerance)."
        ),
    ] = None,
    device: DeviceOption = "cpu",
) -> None:
    """Train a random sample of the reference runs shipped with synthbench again and check
    that they reproduce. The sample takes its runs from the reference's protocols (both
    tracks) in turn: --runs 2 trains one of each.

    Each run is rebuilt from its stored config (its run id must come out the same: if not,
    the shipped reference is stale) and trained at every lr of its sweep. On a CPU, where
    the torch version, the thread count, the vector instruction set and the CPU model are
    those the reference was made with, it reproduces only if its results are identical, bit
    for bit (the same selected lr, every metric of every lr). Elsewhere, and on any GPU,
    bit-identity cannot be asked for (the header says why): its selected test metric (the
    task's target metric) must lie within max(3 x the std of the reference's values over the
    seeds of its cell, 1 / the protocol's test examples) of the reference's; a cell is the
    runs that differ only in their seed (a laddered task's level is one), and a cell of one
    seed takes the spread pooled over its protocol's cells of several. One line per run;
    exit status 0 when every run reproduces, 1 otherwise."""
    if runs < 1:
        raise UsageError(f"--runs must be >= 1, got {runs}")
    filters = {"--task": task, "--mech": mech, "--protocol": protocol}
    for option, value in filters.items():  # one naming nothing is an error, never "no filter"
        if value is not None:
            names_in(value, option, option.removeprefix("--").replace("mech", "mechanism"))
    if max_seconds is not None and not 0 < max_seconds < math.inf:
        raise UsageError(f"--max-seconds must be > 0 and finite, got {max_seconds:g}")
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {jobs}")
    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise UsageError(f"--threads must be in [1, {MAX_THREADS}], got {threads}")
    if results is not None:
        check_writable_folder(results, "--results")
    load_plugins(None)
    ref = reference.load()
    if ref.problem is not None:
        raise fail(f"{ref.problem}: rebuild it (benchmarks/build_reference.py)", 1)
    if ref.rows.empty:
        raise fail(f"the reference {ref.where} holds no run", 1)
    # a task or mechanism this install does not know cannot be trained: left out, cleanly
    rows = ref.rows[ref.rows["task"].isin(TASKS.names())]
    rows = rows[rows["mechanism"].isin(MECHANISMS.names())]
    if task is not None:
        names = filter_names(task, "--task", ref.rows["task"], TASKS, "task")
        rows = rows[rows["task"].isin(names)]
    if mech is not None:
        names = filter_names(mech, "--mech", ref.rows["mechanism"], MECHANISMS, "mechanism")
        rows = rows[rows["mechanism"].isin(names)]
    if protocol is not None:
        names = filter_names(protocol, "--protocol", ref.rows["protocol"], PROTOCOLS, "protocol")
        rows = rows[rows["protocol"].isin(names)]
    candidates = _runs(rows)
    if candidates.empty:
        held = ", ".join(dict.fromkeys(ref.rows["mechanism"]))
        protocols = ", ".join(dict.fromkeys(ref.rows["protocol"]))
        raise UsageError(
            f"no reference run matches the selection (the reference holds {held} on "
            f"{plural(ref.rows['task'].nunique(), 'task')}, protocol {protocols})"
        )
    if max_seconds is not None:
        cheap = candidates[candidates["seconds"] < max_seconds]
        if cheap.empty:
            raise UsageError(
                f"no reference run of the selection took less than {max_seconds:g} s (the "
                f"cheapest took {candidates['seconds'].min():.1f} s)"
            )
        candidates = cheap
    seed = secrets.randbelow(1_000_000) if sample_seed is None else sample_seed
    picked = _sample(candidates, runs, random.Random(seed))
    chosen = candidates.loc[picked].sort_values(["protocol", "task", "mechanism", "seed"])
    try:
        specs = [reproduction.spec_of(r, threads) for r in chosen["first"]]
    except reproduction.StaleReference as exc:
        raise fail(str(exc), 1) from None
    made = chosen["first"].iloc[0]
    dev = resolve_device(device)
    here = {"torch_version": torch.__version__, "threads": specs[0].threads, "device": str(dev),
            "cpu_isa": provenance.cpu_isa(), "cpu_model": provenance.cpu_model()}  # fmt: skip
    why = reproduction.setting_difference(made, here)
    expected = (
        "identical results expected"
        if why is None
        else f"results within a tolerance expected, not bit for bit: {why}"
    )
    out.print(
        f"reproducing {plural(len(chosen), 'reference run')} of {len(candidates)} (sample seed "
        f"{seed}); the reference: {_setting(made)}; here: {_setting(here)}: {expected}",
        highlight=False,
    )
    check_runs(specs, dev)  # sequence lengths, the memory a run needs
    with ExitStack() as stack:
        folder = results
        if folder is None:
            temporary = tempfile.TemporaryDirectory(prefix="synthbench-reproduce-")
            folder = Path(stack.enter_context(temporary))
        _execute(specs, folder, dev, jobs)
        store = ResultStore(folder)
        verdicts = []
        cells = _cells(ref.rows[ref.rows["protocol"].isin({s.protocol.name for s in specs})])
        pooled_of = {name: reproduction.pooled_std(held.values()) for name, held in cells.items()}
        for spec, run_id in zip(specs, chosen.index, strict=True):
            stored = _records(ref.rows[ref.rows["run_id"] == run_id])
            now = store.read_run(spec.protocol.name, spec.task, spec.mechanism, spec.run_id)
            seeds = cells[spec.protocol.name][reproduction.cell_key(stored[0])]  # the spread
            pooled = pooled_of[spec.protocol.name]
            stand_in = len(seeds) < 2 and pooled is not None
            verdict = reproduction.compare(
                stored, now, seeds, spec.protocol.test_examples, pooled[0] if stand_in else None
            )
            verdicts.append(verdict)
            line = _line(spec, verdict)
            if stand_in and verdict.verdict != reproduction.IDENTICAL:
                line += (
                    f" (its cell has one seed: the spread of {plural(pooled[1], 'cell')} of "
                    f"{spec.protocol.name}, pooled)"
                )
            out.print(line, highlight=False, markup=False)
    bad = sum(not v.ok for v in verdicts)
    if bad:
        raise fail(f"{bad} of {plural(len(verdicts), 'reference run')} did not reproduce", 1)
    every = "the run reproduces" if len(verdicts) == 1 else f"all {len(verdicts)} runs reproduce"
    out.print(every, highlight=False)


def _setting(row) -> str:
    """What a row was made with: torch, threads, device and (on a CPU) its instruction set
    and model."""
    said = [row.get(c) for c in ("cpu_isa", "cpu_model")]
    said = [v for v in said if isinstance(v, str)]
    cpu = f" ({', '.join(said)})" if str(row.get("device")) == "cpu" and said else ""
    return (
        f"torch {row['torch_version']}, {plural(int(row['threads']), 'thread')}, "
        f"{row['device']}{cpu}"
    )


def _runs(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per reference run (by run id): protocol, task, mechanism, seed, the stored
    seconds of all its trainings, and its first row (what its spec is rebuilt from)."""
    if rows.empty:
        return pd.DataFrame(columns=["protocol", "task", "mechanism", "seed", "seconds", "first"])
    grouped = rows.groupby("run_id", sort=True)
    runs = grouped[["protocol", "task", "mechanism", "seed"]].first()
    runs["seconds"] = grouped["wall_seconds"].sum()
    runs["first"] = [part.iloc[0] for _, part in grouped]
    return runs


def _sample(candidates: pd.DataFrame, runs: int, rng: random.Random) -> list[str]:
    """``runs`` run ids of ``candidates``, round-robin over their protocols (the reference
    holds both tracks: ``--runs 2`` retrains one of each), each protocol's runs and the
    protocols' order shuffled by ``rng``: the same seed, the same sample."""
    protocols = sorted(set(candidates["protocol"]))
    rng.shuffle(protocols)  # which track comes first, where --runs is not a multiple
    queues = []
    for name in protocols:
        ids = sorted(candidates.index[candidates["protocol"] == name])
        rng.shuffle(ids)
        queues.append(ids)
    picked = []
    for turn in range(max(len(q) for q in queues)):
        picked += [q[turn] for q in queues if turn < len(q)]
    return picked[:runs]


def _records(rows: pd.DataFrame) -> list[dict[str, Any]]:
    return rows.sort_values("lr").to_dict("records")


def _cells(rows: pd.DataFrame) -> dict[str, dict[str, list[float]]]:
    """Protocol -> cell (``reproduction.cell_key``: the runs that differ only in their seed) ->
    the reference's result (``reproduction.selected_value``) of each of its runs that has one."""
    cells: dict[str, dict[str, list[float]]] = {}
    for _, run in rows.groupby("run_id"):
        records = _records(run)
        values = cells.setdefault(records[0]["protocol"], {})
        found = values.setdefault(reproduction.cell_key(records[0]), [])
        value = reproduction.selected_value(records)
        if value is not None:
            found.append(value)
    return cells


def _execute(specs, folder: Path, dev: torch.device, jobs: int | None) -> None:
    """Train what ``folder`` does not hold of ``specs``, as ``synthbench run`` does."""
    threads = specs[0].threads

    def make_executor(n_units: int):
        n = min(n_units, jobs or default_jobs(dev, threads))
        if n <= 1:
            return InProcess(dev, own_process=True)
        return LocalPool(worker_devices(dev, n), [], threads)

    view = RunView(specs, folder, f"device {dev}", False)
    try:
        runner.execute(specs, ResultStore(folder), make_executor, events=view)
    except KeyboardInterrupt:
        raise fail("interrupted", 130) from None
    finally:
        view.close()


def _value(value: float | None) -> str:
    return "--" if value is None else f"{value:.4f}"


def _line(spec, verdict: reproduction.Verdict) -> str:
    head = (
        f"{spec.task:<16} {spec.mechanism:<14} seed {spec.seed}  {spec.protocol.name:<11}  "
        f"reference {_value(verdict.reference)}  reproduced {_value(verdict.reproduced)}  "
    )
    if verdict.verdict == reproduction.IDENTICAL:
        return head + "identical"
    if verdict.verdict == reproduction.WITHIN:
        note = f": {verdict.reason}" if verdict.reason else ""
        return head + f"within {verdict.tolerance:.4f}{note}"
    return head + f"{reproduction.NOT_REPRODUCED}: {verdict.reason}"
