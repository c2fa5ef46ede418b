"""``synthbench run``: parse the options, hand the runs to the runner, render its progress."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any

import torch
import typer

from synthbench.bench.common import DEFAULT_BENCH_RESULTS
from synthbench.cli.common import (
    INTERRUPTED,
    STDOUT,
    DeviceOption,
    LogOption,
    PluginOption,
    ResultsOption,
    UsageError,
    check_run_paths,
    check_writable_folder,
    fail,
    load_plugins,
    names_in,
    os_error,
    out,
    say_slow_check,
    select_mechanisms,
    select_tasks,
    warn,
)
from synthbench.cli.execution import (
    CompileOption,
    CpusPerRunOption,
    DryRunOption,
    ExecutorOption,
    ForceOption,
    GpusPerRunOption,
    JobsOption,
    MaxSecondsOption,
    PackOption,
    RayAddressOption,
    ThreadsOption,
    YesOption,
)
from synthbench.cli.progress import RunView
from synthbench.core.params import parse_assignments
from synthbench.core.text import did_you_mean, plural
from synthbench.integrity.guard import Guarded, leak_guard
from synthbench.integrity.isolation import CHECK_SECONDS, CheckProcess, Interrupted
from synthbench.run import cost, cost_lines, executors, runner, tracking
from synthbench.run.devices import default_jobs, resolve_device, worker_devices
from synthbench.run.executors import EXECUTORS, InProcess, LocalPool, RayPool
from synthbench.run.grid import load_sweep_file
from synthbench.run.limits import MAX_RUNS, MAX_SEEDS, check_runs
from synthbench.run.phases import phase
from synthbench.run.planning import suite_difficulties
from synthbench.run.protocols import Protocol, protocol_of_track
from synthbench.run.provenance import device_name
from synthbench.run.runner import Unit
from synthbench.run.schema import LEAKY
from synthbench.run.spec import MAX_THREADS, RunSpec
from synthbench.run.store import ResultStore
from synthbench.run.train import check_compiler
from synthbench.run.work import MAX_PACK, default_pack

LARGE_PLAN = 500  # runs: above this, the count is printed before planning them


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
            "layer in fla's block: an RMSNorm before the mixer and before the MLP, a final "
            "RMSNorm, fla's gated SwiGLU MLP and N(0, 0.02) init): the protocol's twin in "
            "that track, e.g. quick-block."
        ),
    ] = None,
    device: DeviceOption = "auto",
    jobs: JobsOption = None,
    pack: PackOption = None,
    threads: ThreadsOption = 1,
    compile: CompileOption = False,
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
    dry_run: DryRunOption = False,
    max_seconds: MaxSecondsOption = None,
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
    log: LogOption = None,
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
        compile=compile,
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
        dry_run=dry_run,
        max_seconds=max_seconds,
        eval_length_mult=eval_length_mult,
        pos=pos,
        pos_params=parse_assignments(pos_param),
        log=log,
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
    compile: CompileOption = False,
    executor: ExecutorOption = "local",
    ray_address: RayAddressOption = None,
    cpus_per_run: CpusPerRunOption = None,
    gpus_per_run: GpusPerRunOption = 0.0,
    results: ResultsOption = Path("results"),
    plugin: PluginOption = None,
    force: ForceOption = False,
    yes: YesOption = False,
    dry_run: DryRunOption = False,
    max_seconds: MaxSecondsOption = None,
    log: LogOption = None,
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
        compile=compile,
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
        dry_run=dry_run,
        max_seconds=max_seconds,
        eval_length_mult=grid_options.get("eval_length_mult"),
        pos=grid_options.get("pos"),
        pos_params=grid_options.get("pos_params", {}),
        log=log,
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
    compile: bool = False,
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
    dry_run: bool = False,
    max_seconds: float | None = None,
    eval_length_mult: float | None,
    pos: str | None,
    pos_params: dict[str, Any],
    log: list[str] | None = None,
) -> None:
    """``synthbench run`` (and ``sweep``) with the parameters parsed: plan the grid of runs,
    check it, train what is not stored, render the progress."""
    load_plugins(plugin)
    try:
        proto = protocol_of_track(protocol, track)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    check_execution(threads, jobs, pack, executor, device, cpus_per_run, gpus_per_run, max_seconds)
    if compile and pack is not None and pack > 1:
        raise UsageError(
            f"--compile trains one training at a time: it cannot be combined with --pack {pack} "
            "(give --pack 1, or leave --pack out)"
        )
    n_seeds = proto.seeds if seeds is None else seeds
    if not 1 <= n_seeds <= MAX_SEEDS:
        raise UsageError(f"--seeds must be in [1, {MAX_SEEDS}], got {n_seeds}")
    check_writable_folder(results, "--results")
    logs = tracking.from_options(log, results)  # known and installed, before any planning
    tasks, mechs = select_tasks(task, category), select_mechanisms(mech)
    given = None if difficulty is None else names_in(difficulty, "--difficulty", "preset")
    # the suite scores each task over its ladder; a task named alone runs what it says
    difficulties = suite_difficulties(task, task_params, given, n_seeds)
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
            compiled=compile,
            difficulties=difficulties,
            protocol_params=protocol_params,
        )
    check_max_seeds(n_seeds, {spec.protocol for spec in specs})
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
        dry_run=dry_run,
        more_seeds=True,  # the plan holds whole cells: seeds 0..N-1 of each
        max_seconds=max_seconds,
        logs=logs,
    )


def check_max_seeds(n_seeds: int, protocols: Iterable[Protocol]) -> None:
    """``--seeds`` no more than each planned protocol's ``max_seeds`` (where it has one): the
    seeds a cell grows to where its seeds disagree (synthbench/run/seeds.py)."""
    for point in sorted(protocols, key=lambda p: p.max_seeds):
        if point.max_seeds and n_seeds > point.max_seeds:
            raise UsageError(
                f"--seeds {n_seeds} is more than protocol {point.name}'s max_seeds "
                f"{point.max_seeds} (the seeds a cell grows to where its seeds disagree): "
                f"give --seeds {point.max_seeds} or fewer, or a larger max_seeds"
            )


def check_execution(
    threads: int,
    jobs: int | None,
    pack: int | None,
    executor: str,
    device: str,
    cpus_per_run: float | None,
    gpus_per_run: float,
    max_seconds: float | None = None,
) -> None:
    """The options of how runs execute (shared by run, sweep and ``facts run``), checked
    before anything is planned."""
    if max_seconds is not None:
        if not 0 < max_seconds < math.inf:
            raise UsageError(f"--max-seconds must be > 0 and finite, got {max_seconds:g}")
        if executor != "local":  # Ray's tasks are stopped by Ray: not by this command
            raise UsageError("--max-seconds needs the local executor (--executor local)")
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
    dry_run: bool = False,
    more_seeds: bool = False,
    max_seconds: float | None = None,
    logs: tracking.Tracking | None = None,
) -> None:
    """Train the planned runs that are not stored (all with ``force``), render the progress,
    and exit non-zero if any raised, diverged everywhere or leaked. ``resized``: the plan
    changes default sizes (the cost estimate says so); ``positions``: it sets positions;
    ``dry_run``: check the plan, say what it would train and cost, and stop there;
    ``more_seeds``: a cell whose seeds disagree gets more (``runner.execute``): for a plan
    of whole cells, not of chosen seeds (``facts run``); ``max_seconds``: a training still
    running after that long is stopped and stored as an error; ``logs``: ``--log``'s setting."""
    dev = resolve_device(device) if executor == "local" else None
    if pack is None:  # where it is measured to help (synthbench/run/packed.py)
        pack = default_pack(dev or torch.device("cuda" if gpus_per_run else "cpu"))
        if any(spec.compiled for spec in specs):
            pack = 1  # a compiled model trains alone (packing batches with vmap instead)
    if any(spec.compiled for spec in specs):  # said before anything trains, in one line
        try:
            check_compiler(dev or torch.device("cpu"))
        except ValueError as exc:
            raise UsageError(f"--compile: {exc}") from None
    guarded = Guarded()
    # trainings at once: the local executor's; Ray's --jobs (else unknown here: 1)
    at_once = jobs or (default_jobs(dev, threads) if executor == "local" else 1)
    if executor == "local" and (max_seconds or at_once > 1):
        executors.expect_local_workers()  # said before the checks' child starts
    # a plugin's leak checks run in a child (its code may end or hang it: isolation.py),
    # started now so that it loads while the plan is checked
    checks = None if dry_run else CheckProcess(plugin, on_slow=say_slow_check(CHECK_SECONDS))
    try:
        if checks is not None:
            checks.start(list(dict.fromkeys(spec.mechanism for spec in specs)))
        with out.status("checking the plan"), phase("planning"):
            check_run_paths(ResultStore(results), specs)  # before any training: where files go
            check_runs(specs, dev)  # sequence lengths, the memory a run needs
        if checks is not None:  # the guard stores a leaky mechanism's runs: the real run's
            names = list(dict.fromkeys(s.mechanism for s in specs))
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            checking = f"checking {', '.join(names[:3])}{more} for causality"
            with out.status(f"{checking} (no position may see a later one)"), phase("leak guard"):
                guarded = leak_guard(specs, ResultStore(results), dev, checks)  # guard.py
    except Interrupted as exc:  # Ctrl-C during a check: which one, and where it was
        raise fail(f"{exc}; nothing trained", INTERRUPTED) from None
    finally:
        if checks is not None:
            checks.close()
    if guarded.refusal:  # a mechanism that sees later positions never trains; its runs say leaky
        raise fail(guarded.refusal, 1)
    for line in guarded.ended:  # the other mechanisms' runs train
        warn(line)
    stopped = ""
    if guarded.stopped:
        specs = [spec for spec in specs if spec.run_id not in guarded.stopped]
        stopped = (
            f"{plural(len(guarded.stopped), 'run')} not trained: the leak check of their "
            "mechanism ended the process it ran in or never returned (see the warnings above)"
        )
        if not specs:
            raise fail(stopped, 1)

    def make_executor(n_units: int):
        """Built once the plan knows how many trainings there are (none: none built)."""
        if logs is not None:  # the log folders (and MLflow's experiment), made once, here
            out.print(tracking.prepare(logs), highlight=False)
        if executor == "ray":
            cpus = cpus_per_run or threads
            return RayPool(ray_address, plugin or [], cpus, gpus_per_run, jobs, logs=logs)
        n = min(n_units, at_once)
        if n <= 1 and max_seconds is None:  # a time limit needs a process it can stop
            return InProcess(dev, own_process=True, logs=logs)
        return LocalPool(worker_devices(dev, n), plugin or [], threads, max_seconds, logs)

    where = f"device {dev}" if dev is not None else f"Ray at {ray_address or 'a local instance'}"
    # the device a stored row names (a GPU's model); under Ray, --gpus-per-run's
    row_device = device_name(dev) if dev is not None else None if gpus_per_run else "cpu"

    def estimate(units: list[Unit], capacity: int) -> tuple[list[str], Callable]:
        """What the trainings will cost (synthbench/run/cost.py), said before they start, and
        what one training is expected to take (the progress bar's first ETA)."""
        trainings = cost.trainings_of(units)
        # in worker processes where make_executor starts them (Ray's: always elsewhere)
        workers = executor != "local" or capacity > 1 or max_seconds is not None
        found = cost.plan_estimate(
            trainings, results, DEFAULT_BENCH_RESULTS, threads, row_device,
            capacity=capacity, workers=workers,
        )  # fmt: skip
        notes = ["; at the default sizes, which this grid changes"] if resized else []
        if found.sources.get("table") and row_device != "cpu":
            notes.append(f"; the table's are a CPU's, this command trains on {dev or 'Ray'}")
        plugins = "".join(f" --plugin {p}" for p in plugin or [])

        def prior(unit: Unit) -> float | None:
            return found.training_seconds(cost.trainings_of([unit])[0])

        return cost_lines.lines(found, "".join(notes), plugins), prior

    view = RunView(
        specs, results, where, positions, estimate=estimate, dry_run=dry_run,
        more_seeds=more_seeds,
    )  # fmt: skip
    if dry_run:  # as many at once as the executor would run
        runner.dry_run(
            specs, ResultStore(results), lambda n: min(n, at_once), events=view, force=force,
            more_seeds=more_seeds,
        )  # fmt: skip
        out.print("dry run: nothing trained or written", highlight=False)
        return
    try:
        try:
            outcome = runner.execute(
                specs, ResultStore(results), make_executor, force=force, events=view, pack=pack,
                more_seeds=more_seeds,
            )  # fmt: skip
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
    also = f"; {stopped}" if stopped else ""  # one error line says both
    if outcome.failure() and not outcome.statuses.get("error"):
        raise fail(outcome.failure() + also, 1)
    if outcome.statuses.get("error"):
        raise fail(
            f"{plural(outcome.statuses['error'], 'run')} raised; their errors are stored "
            f"(synthbench results --status error) and they rerun next time{also}",
            1,
        )
    leaky = outcome.statuses.get(LEAKY, 0) + outcome.stored_leaky
    if leaky:  # a learned parameter switched a leak on in training, now or before
        raise fail(
            f"{plural(leaky, 'run')} not causal after training: stored with status leaky, never "
            f"ranked (synthbench results --status leaky; changed plugin code is a new run){also}",
            1,
        )
    if stopped:
        raise fail(stopped, 1)
