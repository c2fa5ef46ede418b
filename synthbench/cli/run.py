"""``synthbench run``: parse the options, hand the runs to the runner, render its progress."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import torch
import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from synthbench.bench.common import DEFAULT_BENCH_RESULTS
from synthbench.cli.common import (
    STDOUT,
    DeviceOption,
    PluginOption,
    ResultsOption,
    UsageError,
    check_run_paths,
    check_writable_folder,
    fail,
    load_plugins,
    os_error,
    out,
    select_mechanisms,
    select_tasks,
    split,
    warn,
)
from synthbench.cli.progress import Eta, EtaColumn, RunningColumn
from synthbench.core.params import parse_assignments
from synthbench.core.text import did_you_mean, plural
from synthbench.integrity.guard import leak_guard
from synthbench.run import cost, grid, runner
from synthbench.run.devices import default_jobs, resolve_device, worker_devices
from synthbench.run.executors import EXECUTORS, InProcess, LocalPool, RayPool
from synthbench.run.grid import load_sweep_file
from synthbench.run.limits import MAX_RUNS, MAX_SEEDS, check_runs
from synthbench.run.lr_selection import run_status
from synthbench.run.phases import phase
from synthbench.run.protocols import protocol_of_track
from synthbench.run.provenance import device_name
from synthbench.run.runner import Unit
from synthbench.run.schema import LEAKY
from synthbench.run.spec import MAX_THREADS, RunSpec
from synthbench.run.store import ResultStore
from synthbench.run.work import MAX_PACK, default_pack

LARGE_PLAN = 500  # runs: above this, the count is printed before planning them
# the options of how runs execute, shared by `run` and `sweep`
JobsOption = Annotated[
    int | None,
    typer.Option(
        help="Trainings at once. Local: worker processes (default: one per core on the CPU, "
        "up to 4 per GPU); 1 trains in this process. Ray: at most this many tasks."
    ),
]
ThreadsOption = Annotated[
    int,
    typer.Option(
        help="Torch threads per training (part of the run's config: it changes "
        "the floating-point sums)."
    ),
]
ExecutorOption = Annotated[str, typer.Option(help="local (this machine) or ray (a Ray cluster).")]
RayAddressOption = Annotated[
    str | None,
    typer.Option(
        help="Join this Ray cluster (e.g. ray://head:10001, auto); default: a local Ray instance."
    ),
]
CpusPerRunOption = Annotated[
    float | None, typer.Option(help="Ray: CPUs a training asks for (default: --threads).")
]
GpusPerRunOption = Annotated[
    float, typer.Option(help="Ray: GPUs a training asks for (a fraction shares one).")
]
PackOption = Annotated[
    int | None,
    typer.Option(
        help="Train up to N trainings of one task and mechanism (its seeds and lrs) as one "
        "batched model; 1: never. Default: 16 on a GPU, 1 on the CPU (measured slower "
        "there: docs/BENCHMARKS.md)."
    ),
]
ForceOption = Annotated[bool, typer.Option("--force", help="Run again even if already stored.")]
YesOption = Annotated[
    bool,
    typer.Option("--yes", help=f"Plan a grid of more than {MAX_RUNS:,} runs (refused without)."),
]


def run_command(
    task: Annotated[
        str,
        typer.Option(
            help="'all' (the default suite), 'extended' (all and the State tasks) or "
            "comma-separated task names."
        ),
    ] = "all",
    category: Annotated[str | None, typer.Option(help="Only the tasks of this category.")] = None,
    mech: Annotated[
        str, typer.Option(help="'all' or comma-separated mechanism names.")
    ] = "softmax",
    seeds: Annotated[
        int | None, typer.Option(help="Seeds 0..N-1 (default: the protocol's).")
    ] = None,
    protocol: Annotated[
        str, typer.Option(help="Protocol preset (synthbench list protocols).")
    ] = "quick",
    track: Annotated[
        str | None,
        typer.Option(
            help="core (each mechanism's rule alone, the default) or block (its published "
            "layer in a standard block): the protocol's twin in that track, e.g. quick-block."
        ),
    ] = None,
    device: DeviceOption = "auto",
    jobs: JobsOption = None,
    pack: PackOption = None,
    threads: ThreadsOption = 1,
    executor: ExecutorOption = "local",
    ray_address: RayAddressOption = None,
    cpus_per_run: CpusPerRunOption = None,
    gpus_per_run: GpusPerRunOption = 0.0,
    task_param: Annotated[
        list[str] | None,
        typer.Option(
            help="KEY=VALUE for every selected task, e.g. n=64 (repeatable); a list sweeps: "
            "pairs=4,8,16,32."
        ),
    ] = None,
    mech_param: Annotated[
        list[str] | None,
        typer.Option(
            help="KEY=VALUE for every selected mechanism, e.g. eps=1e-4 (repeatable); a list "
            "sweeps."
        ),
    ] = None,
    protocol_param: Annotated[
        list[str] | None,
        typer.Option(
            help="KEY=VALUE of a protocol field, e.g. d_model=128 (repeatable; in the run id); "
            "a list sweeps: d_model=32,64,128."
        ),
    ] = None,
    difficulty: Annotated[
        str | None,
        typer.Option(
            help="Difficulty presets of each task, comma-separated: a ladder such as "
            "easy,default,hard (--task-param goes on top)."
        ),
    ] = None,
    results: ResultsOption = Path("results"),
    plugin: PluginOption = None,
    force: ForceOption = False,
    yes: YesOption = False,
    eval_length_mult: Annotated[
        float | None,
        typer.Option(
            help="Also test at this multiple of the trained length (tasks with a length "
            "knob; stored as long_token_acc, long_exact_match)."
        ),
    ] = None,
    pos: Annotated[
        str | None,
        typer.Option(
            help="Positional encoding instead of the protocol's: learned, sinusoidal, none, "
            "rope, rope-learned or rope-cayley (docs/POSITIONS.md)."
        ),
    ] = None,
    pos_param: Annotated[
        list[str] | None,
        typer.Option(help="KEY=VALUE of the rotation, e.g. rotate_fraction=0.5 (repeatable)."),
    ] = None,
) -> None:
    """Train and evaluate every (task, mechanism, seed); one Parquet file per run."""
    run_grid(
        task=task,
        category=category,
        mech=mech,
        seeds=seeds,
        protocol=protocol,
        track=track,
        device=device,
        jobs=jobs,
        pack=pack,
        threads=threads,
        executor=executor,
        ray_address=ray_address,
        cpus_per_run=cpus_per_run,
        gpus_per_run=gpus_per_run,
        task_params=parse_assignments(task_param),
        mech_params=parse_assignments(mech_param),
        protocol_params=parse_assignments(protocol_param),
        difficulty=difficulty,
        results=results,
        plugin=plugin,
        force=force,
        yes=yes,
        eval_length_mult=eval_length_mult,
        pos=pos,
        pos_params=parse_assignments(pos_param),
    )


def sweep_command(
    file: Annotated[
        Path,
        typer.Argument(
            help="A TOML sweep file: task, mech, protocol, seeds, difficulty and the tables "
            "task_params, mech_params, protocol_params (a list sweeps; docs/RUNNING.md).",
            show_default=False,
        ),
    ],
    device: DeviceOption = "auto",
    jobs: JobsOption = None,
    pack: PackOption = None,
    threads: ThreadsOption = 1,
    executor: ExecutorOption = "local",
    ray_address: RayAddressOption = None,
    cpus_per_run: CpusPerRunOption = None,
    gpus_per_run: GpusPerRunOption = 0.0,
    results: ResultsOption = Path("results"),
    plugin: PluginOption = None,
    force: ForceOption = False,
    yes: YesOption = False,
) -> None:
    """Run the grid a sweep file describes (what `run` would with the same lists)."""
    grid_options = load_sweep_file(file)
    run_grid(
        task=grid_options.get("task", "all"),
        category=grid_options.get("category"),
        mech=grid_options.get("mech", "softmax"),
        seeds=grid_options.get("seeds"),
        protocol=grid_options.get("protocol", "quick"),
        device=device,
        jobs=jobs,
        pack=pack,
        threads=threads,
        executor=executor,
        ray_address=ray_address,
        cpus_per_run=cpus_per_run,
        gpus_per_run=gpus_per_run,
        task_params=grid_options.get("task_params", {}),
        mech_params=grid_options.get("mech_params", {}),
        protocol_params=grid_options.get("protocol_params", {}),
        difficulty=grid_options.get("difficulty"),
        results=results,
        plugin=plugin,
        force=force,
        yes=yes,
        eval_length_mult=grid_options.get("eval_length_mult"),
        pos=grid_options.get("pos"),
        pos_params=grid_options.get("pos_params", {}),
    )


def run_grid(
    *,
    task: str,
    category: str | None,
    mech: str,
    seeds: int | None,
    protocol: str,
    track: str | None = None,
    device: str,
    jobs: int | None,
    pack: int | None,
    threads: int,
    executor: str,
    ray_address: str | None,
    cpus_per_run: float | None,
    gpus_per_run: float,
    task_params: dict[str, Any],
    mech_params: dict[str, Any],
    protocol_params: dict[str, Any],
    difficulty: str | None,
    results: Path,
    plugin: list[Path] | None,
    force: bool,
    yes: bool,
    eval_length_mult: float | None,
    pos: str | None,
    pos_params: dict[str, Any],
) -> None:
    """``synthbench run`` (and ``sweep``) with the parameters parsed: plan the grid of runs,
    check it, train what is not stored, render the progress."""
    load_plugins(plugin)
    try:
        proto = protocol_of_track(protocol, track)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    check_execution(threads, jobs, pack, executor, device, cpus_per_run, gpus_per_run)
    n_seeds = proto.seeds if seeds is None else seeds
    if not 1 <= n_seeds <= MAX_SEEDS:
        raise UsageError(f"--seeds must be in [1, {MAX_SEEDS}], got {n_seeds}")
    check_writable_folder(results, "--results")
    tasks, mechs = select_tasks(task, category), select_mechanisms(mech)
    difficulties = split(difficulty) if difficulty is not None else None
    size = runner.plan_size(
        tasks, mechs, proto, n_seeds, task_params=task_params, mechanism_params=mech_params,
        difficulties=difficulties, protocol_params=protocol_params,
    )  # fmt: skip
    if size > MAX_RUNS and not yes:
        raise UsageError(
            f"this grid is {size:,} runs, more than {MAX_RUNS:,}: narrow its lists, or give "
            "--yes to plan them all"
        )
    if size > LARGE_PLAN:  # said before the planning, which takes a while at this size
        out.print(f"planning {size:,} runs", highlight=False)
    with out.status(f"planning {plural(size, 'run')}"), phase("planning"):
        specs = runner.plan(
            tasks,
            mechs,
            proto,
            n_seeds,
            task_params=task_params,
            mechanism_params=mech_params,
            eval_length_mult=eval_length_mult,
            pos=pos,
            pos_params=pos_params,
            threads=threads,
            difficulties=difficulties,
            protocol_params=protocol_params,
        )
    presets = set(difficulties or ()) - {"default"}
    train_specs(
        specs,
        device=device,
        jobs=jobs,
        pack=pack,
        threads=threads,
        executor=executor,
        ray_address=ray_address,
        cpus_per_run=cpus_per_run,
        gpus_per_run=gpus_per_run,
        results=results,
        plugin=plugin,
        force=force,
        resized=bool(task_params or mech_params or protocol_params or presets),
        positions=bool(pos is not None or pos_params),
    )


def check_execution(
    threads: int,
    jobs: int | None,
    pack: int | None,
    executor: str,
    device: str,
    cpus_per_run: float | None,
    gpus_per_run: float,
) -> None:
    """The options of how runs execute (shared by run, sweep and ``facts run``), checked
    before anything is planned."""
    if executor not in EXECUTORS:
        hint = did_you_mean(executor, EXECUTORS)
        raise UsageError(f"unknown executor '{executor}'{hint} ({', '.join(EXECUTORS)})")
    if not 1 <= threads <= MAX_THREADS:
        raise UsageError(f"--threads must be in [1, {MAX_THREADS}], got {threads}")
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {jobs}")
    if pack is not None and not 1 <= pack <= MAX_PACK:
        raise UsageError(f"--pack must be in [1, {MAX_PACK}], got {pack}")
    if cpus_per_run is not None and not 0 < cpus_per_run < math.inf:
        raise UsageError(f"--cpus-per-run must be > 0 and finite, got {cpus_per_run:g}")
    if not 0 <= gpus_per_run < math.inf:
        raise UsageError(f"--gpus-per-run must be >= 0 and finite, got {gpus_per_run:g}")
    if executor == "ray" and device not in ("auto", "cpu"):
        raise UsageError("with --executor ray the device follows --gpus-per-run, not --device")


def train_specs(
    specs: list[RunSpec],
    *,
    device: str,
    jobs: int | None,
    pack: int | None,
    threads: int,
    executor: str,
    ray_address: str | None,
    cpus_per_run: float | None,
    gpus_per_run: float,
    results: Path,
    plugin: list[Path] | None,
    force: bool,
    resized: bool = False,
    positions: bool = False,
) -> None:
    """Train the planned runs that are not stored (all with ``force``), render the progress,
    and exit non-zero if any raised, diverged everywhere or leaked. ``resized``: the plan
    changes default sizes (the cost estimate says so); ``positions``: it sets positions."""
    dev = resolve_device(device) if executor == "local" else None
    if pack is None:  # where it is measured to help (synthbench/run/packed.py)
        pack = default_pack(dev or torch.device("cuda" if gpus_per_run else "cpu"))
    with out.status("checking the plan"), phase("planning"):
        check_run_paths(ResultStore(results), specs)  # before any training: where files go
        check_runs(specs, dev)  # sequence lengths, the memory a run needs
    names = list(dict.fromkeys(s.mechanism for s in specs))
    names = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    checking = f"checking {names} for causality (no position may see a later one)"
    with out.status(checking), phase("leak guard"):
        refusal = leak_guard(specs, ResultStore(results), dev)  # synthbench/integrity/guard.py
    if refusal:  # a mechanism that sees later positions never trains; its runs say leaky
        raise fail(refusal, 1)

    def make_executor(n_units: int):
        """Built once the plan knows how many trainings there are (none: none built)."""
        if executor == "ray":
            return RayPool(ray_address, plugin or [], cpus_per_run or threads, gpus_per_run, jobs)
        n = min(n_units, jobs or default_jobs(dev, threads))
        if n <= 1:
            return InProcess(dev, own_process=True)
        return LocalPool(worker_devices(dev, n), plugin or [], threads)

    where = f"device {dev}" if dev is not None else f"Ray at {ray_address or 'a local instance'}"
    # the device a stored row names (a GPU's model); under Ray, --gpus-per-run's
    row_device = device_name(dev) if dev is not None else None if gpus_per_run else "cpu"

    def estimate(units: list[Unit], capacity: int) -> list[str]:
        """What the trainings will cost (synthbench/run/cost.py), said before they start."""
        trainings = cost.trainings_of(units)
        found = cost.plan_estimate(trainings, results, DEFAULT_BENCH_RESULTS, threads, row_device)
        notes = ["; at the default sizes, which this grid changes"] if resized else []
        if found.sources.get("table") and row_device != "cpu":
            notes.append(f"; the table's are a CPU's, this command trains on {dev or 'Ray'}")
        plugins = "".join(f" --plugin {p}" for p in plugin or [])
        return cost.lines(found, capacity, "".join(notes), plugins)

    view = RunView(specs, results, where, positions, estimate=estimate)
    try:
        try:
            outcome = runner.execute(
                specs, ResultStore(results), make_executor, force=force, events=view, pack=pack
            )
        finally:
            view.close()  # the bar ends its line: a message below starts on a line of its own
    except KeyboardInterrupt:
        raise fail(
            "interrupted; finished trainings are stored, run the same command to resume", 130
        ) from None
    except BrokenPipeError:
        raise  # stdout closed (`| head`): guard exits quietly
    except OSError as exc:  # a full disk, say: each file is replaced whole or not at all
        if exc.filename == STDOUT:  # what we print, not what we store
            raise
        raise fail(
            f"cannot store results: {os_error(exc)}; what was stored before is intact, "
            "run the same command to resume",
            1,
        ) from None
    summary = ", ".join(f"{n} {s}" for s, n in sorted(outcome.statuses.items())) or "nothing new"
    if outcome.claimed:  # another command computes them; the same command later does the rest
        summary += f"; {outcome.claimed} skipped: claimed by another command"
    out.print(f"done: {summary}", highlight=False)
    if outcome.failure() and not outcome.statuses.get("error"):
        raise fail(outcome.failure(), 1)
    if outcome.statuses.get("error"):
        raise fail(
            f"{plural(outcome.statuses['error'], 'run')} raised; their errors are stored "
            "(synthbench results --status error) and they rerun next time",
            1,
        )
    leaky = outcome.statuses.get(LEAKY, 0) + outcome.stored_leaky
    if leaky:  # a learned parameter switched a leak on in training, now or before
        raise fail(
            f"{plural(leaky, 'run')} not causal after training: stored with status leaky, never "
            "ranked (synthbench results --status leaky; changed plugin code is a new run)",
            1,
        )


class RunView(runner.Events):
    """The header line, the progress bar (only when there is something to train) and one
    line per finished run."""

    def __init__(
        self,
        specs: list[RunSpec],
        results: Path,
        where: str,
        show_pos: bool,
        estimate: Callable[[list[Unit], int], list[str]] | None = None,
    ):
        self.specs, self.results, self.where, self.show_pos = specs, results, where, show_pos
        self.estimate = estimate  # the lines saying what the trainings will cost
        self.varying = grid.varying_keys(specs)  # what tells the points of a grid apart
        self.progress: Progress | None = None
        self.eta: Eta | None = None
        self.bar = None

    def skipped(self, line: str) -> None:
        warn(line)

    def planned(self, runs: int, stored: int, units: list[Unit], capacity: int) -> None:
        specs = self.specs
        tasks = len({s.task for s in specs})
        mechs = len({s.mechanism for s in specs})
        seeds = len({s.seed for s in specs})
        first = specs[0]
        pos_note = ""
        if self.show_pos:  # say which positions the user asked for
            params = ", ".join(f"{k}={v}" for k, v in first.pos_params.items())
            pos_note = f", pos {first.protocol.pos}" + (f" ({params})" if params else "")
        workers = f", {capacity} at once" if capacity > 1 else ""
        n_points = len({(s.task, s.mechanism, grid.point_label(s, self.varying)) for s in specs})
        per_cell = n_points // (tasks * mechs)
        parts = [plural(tasks, "task"), plural(mechs, "mechanism")]
        parts += [plural(per_cell, "grid point")] if self.varying else []
        parts.append(plural(seeds, "seed"))
        if tasks * mechs * per_cell * seeds == runs and n_points == tasks * mechs * per_cell:
            shape = " x ".join(parts)  # every combination: the counts multiply to the runs
        else:  # a sample (reproduce), or grids of other sizes: what the runs span
            shape = "over " + ", ".join(parts)
        out.print(
            f"{plural(runs, 'run')} ({shape}, protocol "
            f"{first.protocol.name}{pos_note}, {self.where}, {plural(first.threads, 'thread')} per "
            f"training{workers}); {stored} already stored, {runs - stored} to run "
            f"({plural(len(units), 'training')}) -> {self.results}/",
            highlight=False,
        )
        if not units:
            return
        for line in self.estimate(units, capacity) if self.estimate else []:
            out.print(line, highlight=False, markup=False)
        self.eta = Eta(capacity)
        self.eta.add(units)
        self.progress = Progress(
            TextColumn("trainings"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            EtaColumn(self.eta),
            RunningColumn(self.eta),
            console=out,
        )
        self.progress.start()
        self.bar = self.progress.add_task("trainings", total=len(units))

    def started(self, unit: Unit) -> None:
        self.eta.started(unit)

    def finished(self, unit: Unit, row: dict[str, Any]) -> None:
        self.eta.finished(unit, row["wall_seconds"])
        self.progress.advance(self.bar)

    def grew(self, units: list[Unit]) -> None:
        self.eta.add(units)
        self.progress.update(self.bar, total=self.progress.tasks[0].total + len(units))
        for unit in units:
            self.progress.console.print(
                f"   {unit.spec.label()}: best lr at the grid's edge, adding lr {unit.lr:g}",
                highlight=False,
            )

    def run_done(self, spec: RunSpec, rows: list[dict[str, Any]]) -> None:
        self.progress.console.print(run_line(spec, rows, self.varying), highlight=False)

    def notice(self, spec: RunSpec, message: str) -> None:
        warn(f"{spec.label()}: {message}")

    def unplanned(self, units: list[Unit]) -> None:
        if units and self.progress is not None:
            self.eta.drop(units)
            self.progress.update(self.bar, total=self.progress.tasks[0].total - len(units))

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def run_line(spec: RunSpec, rows: list[dict[str, Any]], varying: tuple[str, ...] = ()) -> str:
    best = run_status(rows)
    seconds = sum(r["wall_seconds"] for r in rows)
    head = f"{spec.task:<16} {spec.mechanism:<12} seed {spec.seed}"
    if varying:  # a grid: which point
        head += f"  {grid.point_label(spec, varying)}"
    if best["status"] != "ok":
        reason = escape(str(best.get("error")))
        return f"[red]x[/] {head}  {best['status']}: {reason}  ({seconds:.1f}s)"
    long = ""
    if best.get("long_token_acc") is not None:
        long = f"  at {spec.eval_length_mult:g}x length {best['long_token_acc']:.3f}"
    target = best.get("target_metric") or "token_acc"
    free = f"  free-running {best['free_token_acc']:.3f}" if target == "free_token_acc" else ""
    # the best lr alone at the grid's edge: its optimum may lie beyond the grid
    edge = " (edge)" if best.get("lr_edge") and len(rows) > 1 else ""
    stopped = f" at step {best['steps_done']}" if best["steps_done"] < spec.protocol.steps else ""
    return (
        f"[green]ok[/] {head}  lr {best['lr']:g}{edge}{stopped}  token_acc "
        f"{best['token_acc']:.3f}{free}  exact {best['exact_match']:.3f}{long}  ({seconds:.1f}s)"
    )
