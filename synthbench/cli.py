"""The ``synthbench`` command line: run, list, show-task, results, report.

Every failure the user can cause (an unknown name, a bad parameter, a broken plugin, a
corrupt results file) ends in one line naming the culprit; nothing stored is touched.
"""

import dataclasses
import functools
import os
import sys
import warnings
from pathlib import Path
from typing import Annotated

import pandas as pd
import torch
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from synthbench.bench import bench_app
from synthbench.mechanism import MECHANISMS, STATE_HEAD_DIM, STATE_LENGTH, state_size_at_defaults
from synthbench.params import parse_assignments
from synthbench.protocols import PROTOCOLS, Protocol
from synthbench.publish import FORMATS, write_reports
from synthbench.registry import PluginError, PluginWarning, UnknownNameError, load_plugin_file
from synthbench.report import METRICS, latest_versions
from synthbench.store import LoadReport, ResultStore
from synthbench.task import CATEGORIES, IGNORE, TASKS
from synthbench.train import RunSpec, resolve_device, run

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Synthetic-task benchmark suite and leaderboard for attention mechanisms.",
)
app.add_typer(bench_app, name="bench")  # cost and fidelity benchmarks: synthbench/bench
out = Console(soft_wrap=True)
err = Console(stderr=True)
warnings.simplefilter("ignore", PluginWarning)  # reported once, as one line each, below

PluginOption = Annotated[
    list[Path] | None,
    typer.Option("--plugin", help="Python file that registers tasks or mechanisms (repeatable)."),
]
ResultsOption = Annotated[Path, typer.Option("--results", help="Results tree.")]


class UsageError(Exception):
    """A user error: printed as one line, exit status 2."""


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _warn(message: str) -> None:
    err.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


def _load_plugins(files: list[Path] | None) -> None:
    for registry in (TASKS, MECHANISMS):
        registry.load_plugins()
        for error in registry.plugin_errors:
            _warn(str(error))
    for path in files or []:
        load_plugin_file(path, [TASKS, MECHANISMS])


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _select_tasks(task: str, category: str | None) -> list[str]:
    names = TASKS.names() if task == "all" else [TASKS.canonical(n) for n in _split(task)]
    if category is not None:
        wanted = {c.lower(): c for c in CATEGORIES}
        if category.lower() not in wanted:
            raise UsageError(f"unknown category '{category}' (categories: {', '.join(CATEGORIES)})")
        names = [
            n for n in names if TASKS.entry(n).metadata["category"] == wanted[category.lower()]
        ]
    if not names:
        raise UsageError("no task matches the selection")
    return list(dict.fromkeys(names))


def _load(results: Path, columns: list[str] | None = None) -> LoadReport:
    """The stored rows, with one warning line per file that had to be skipped."""
    report = ResultStore(results).load(columns=columns, warn=False)
    for path, reason in report.skipped:
        _warn(f"skipping {path}: {reason}")
    return report


def _guard(command):
    """Turn user errors into one-line messages with exit status 2."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except (UnknownNameError, PluginError, UsageError, ValueError) as exc:
            if os.environ.get("SYNTHBENCH_DEBUG"):  # the full traceback, for developers
                raise
            raise _fail(str(exc)) from None

    return wrapper


@app.command("run")
@_guard
def run_command(
    task: Annotated[str, typer.Option(help="'all' or comma-separated task names.")] = "all",
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
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    task_param: Annotated[
        list[str] | None,
        typer.Option(help="KEY=VALUE for every selected task, e.g. n=64 (repeatable)."),
    ] = None,
    mech_param: Annotated[
        list[str] | None,
        typer.Option(help="KEY=VALUE for every selected mechanism, e.g. eps=1e-4 (repeatable)."),
    ] = None,
    results: ResultsOption = Path("results"),
    plugin: PluginOption = None,
    force: Annotated[bool, typer.Option(help="Run again even if already stored.")] = False,
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
    _load_plugins(plugin)
    proto: Protocol = PROTOCOLS.get(protocol)
    tasks = _select_tasks(task, category)
    names = MECHANISMS.names() if mech == "all" else _split(mech)
    mechs = list(dict.fromkeys(MECHANISMS.canonical(m) for m in names))
    if not mechs:
        raise UsageError("--mech names no mechanism")
    n_seeds = proto.seeds if seeds is None else seeds
    if n_seeds < 1:
        raise UsageError(f"--seeds must be >= 1, got {n_seeds}")
    dev = resolve_device(device)
    task_overrides, mech_overrides = parse_assignments(task_param), parse_assignments(mech_param)
    pos_overrides = parse_assignments(pos_param)
    specs = [
        RunSpec.resolve(
            t, m, proto, s, task_overrides, mech_overrides, eval_length_mult, pos, pos_overrides
        )
        for t in tasks
        for m in mechs
        for s in range(n_seeds)
    ]

    store = ResultStore(results)
    store.remove_stale_temporaries()
    done = set() if force else store.done_run_ids(_load(results, ["run_id", "status"]))
    todo = [s for s in specs if s.run_id not in done]
    pos_note = ""
    if pos is not None or pos_param:  # say which positions the user asked for
        params = ", ".join(f"{k}={v}" for k, v in specs[0].pos_params.items())
        pos_note = f", pos {specs[0].protocol.pos}" + (f" ({params})" if params else "")
    out.print(
        f"{len(specs)} runs ({len(tasks)} tasks x {len(mechs)} mechanisms x {n_seeds} seeds, "
        f"protocol {proto.name}{pos_note}, device {dev}); {len(specs) - len(todo)} already stored, "
        f"{len(todo)} to run -> {results}/",
        highlight=False,
    )
    statuses: dict[str, int] = {}
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=out,
    )
    try:
        with progress:
            bar = progress.add_task("runs", total=len(todo))
            for spec in todo:
                progress.update(bar, description=spec.label())
                rows = run(spec, dev)
                store.write(rows)
                best = next((r for r in rows if r["selected"]), rows[-1])
                statuses[best["status"]] = statuses.get(best["status"], 0) + 1
                progress.console.print(_run_line(spec, rows, best), highlight=False)
                progress.advance(bar)
    except KeyboardInterrupt:
        raise _fail(
            "interrupted; finished runs are stored, run the same command to resume", 130
        ) from None
    summary = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) or "nothing new"
    out.print(f"done: {summary}", highlight=False)
    if statuses.get("error"):
        raise _fail(
            f"{statuses['error']} run(s) raised; their errors are stored "
            "(synthbench results --status error) and they rerun next time",
            1,
        )


def _run_line(spec: RunSpec, rows: list[dict], best: dict) -> str:
    seconds = sum(r["wall_seconds"] for r in rows)
    head = f"{spec.task:<16} {spec.mechanism:<12} seed {spec.seed}"
    if best["status"] != "ok":
        reason = escape(str(best.get("error")))
        return f"[red]x[/] {head}  {best['status']}: {reason}  ({seconds:.1f}s)"
    long = ""
    if best.get("long_token_acc") is not None:
        long = f"  at {spec.eval_length_mult:g}x length {best['long_token_acc']:.3f}"
    return (
        f"[green]ok[/] {head}  lr {best['lr']:g}  token_acc {best['token_acc']:.3f}  "
        f"exact {best['exact_match']:.3f}{long}  ({seconds:.1f}s)"
    )


@app.command("list")
@_guard
def list_command(
    what: Annotated[str, typer.Argument(help="tasks, mechs or protocols.")],
    plugin: PluginOption = None,
) -> None:
    """List the registered tasks, mechanisms or protocols."""
    kinds = {
        "tasks": "tasks",
        "task": "tasks",
        "mechs": "mechs",
        "mechanisms": "mechs",
        "mech": "mechs",
        "protocols": "protocols",
        "protocol": "protocols",
    }
    if what not in kinds:
        raise UsageError(f"cannot list '{what}' (tasks, mechs, protocols)")
    _load_plugins(plugin)
    kind = kinds[what]
    if kind == "tasks":
        table = Table(
            "category", "task", "aliases", "description", "defaults", "length knob", "source"
        )
        order = {c: i for i, c in enumerate(CATEGORIES)}
        for e in sorted(TASKS.entries(), key=lambda e: (order[e.metadata["category"]], e.name)):
            defaults = ", ".join(f"{f.name}={f.default}" for f in dataclasses.fields(e.obj.Params))
            table.add_row(
                e.metadata["category"],
                e.name,
                ", ".join(e.aliases),
                e.metadata["description"],
                defaults,
                e.obj.length_param or "",
                e.source,
            )
        categories = {e.metadata["category"] for e in TASKS.entries()}
        table.caption = f"{len(TASKS.names())} tasks in {len(categories)} categories"
    elif kind == "mechs":
        table = Table(
            "mechanism",
            "complexity",
            "family",
            f"state/head (L {STATE_LENGTH}, d {STATE_HEAD_DIM})",
            "aliases",
            "reference",
            "source",
        )
        for e in MECHANISMS.entries():
            table.add_row(
                e.name,
                e.metadata["complexity"],
                e.metadata["family"],
                _state_size(e.obj),
                ", ".join(e.aliases),
                e.metadata["reference"],
                e.source,
            )
    else:
        table = Table("protocol", "model", "training", "lrs", "seeds", "description")
        for e in PROTOCOLS.entries():
            p = e.obj
            table.add_row(
                f"{p.name} v{p.version}",
                f"{p.arch}, {p.pos} pos, d {p.d_model}, {p.n_heads} heads, {p.n_layers} layers",
                f"{p.steps} steps x batch {p.batch_size}",
                ", ".join(f"{lr:g}" for lr in p.lrs),
                str(p.seeds),
                p.description,
            )
    out.print(table)


def _state_size(cls) -> str:
    """The recurrent state one head carries at the default parameters, or '?' if unknown."""
    try:
        return f"{state_size_at_defaults(cls):,}"
    except Exception:  # a plugin that cannot say: shown, not fatal for the listing
        return "?"


@app.command("show-task")
@_guard
def show_task_command(
    name: Annotated[str, typer.Argument(help="Task name (synthbench list tasks).")],
    param: Annotated[
        list[str] | None, typer.Option("--param", help="KEY=VALUE task parameter (repeatable).")
    ] = None,
    difficulty: Annotated[str, typer.Option(help="easy, default or hard.")] = "default",
    seed: Annotated[int, typer.Option(help="Generator seed of the example.")] = 0,
    plugin: PluginOption = None,
) -> None:
    """Print one generated example, decoded, with the answer tokens in square brackets."""
    _load_plugins(plugin)
    entry = TASKS.entry(name)
    task = entry.obj.from_difficulty(difficulty, **parse_assignments(param))
    batch = task.generate(1, torch.Generator().manual_seed(seed))
    inputs, targets = batch.inputs[0].tolist(), batch.targets[0].tolist()
    # the full sequence is the inputs plus the last target (the final answer token)
    sequence = inputs + ([targets[-1]] if targets[-1] != IGNORE else [])
    answer = [False] + [t != IGNORE for t in targets]
    words = [
        f"[{task.token_name(t)}]" if is_answer else task.token_name(t)
        for t, is_answer in zip(sequence, answer, strict=False)
    ]
    params = " ".join(f"{k}={v}" for k, v in task.param_dict().items())
    out.print(
        f"{entry.name} ({entry.metadata['category']}): {entry.metadata['description']}\n"
        f"params: {params}; difficulty {difficulty}; vocab_size {task.vocab_size}; "
        f"input length {task.seq_len}; {sum(answer)} answer tokens, marked [..]\n"
        + " ".join(words),
        highlight=False,
        markup=False,
    )


@app.command("results")
@_guard
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
    rows = _load(results).rows
    if task:
        rows = rows[rows["task"].isin(_split(task))]
    if mech:
        rows = rows[rows["mechanism"].isin(_split(mech))]
    if protocol:
        rows = rows[rows["protocol"] == protocol]
    if status:
        rows = rows[rows["status"] == status]
    if not all_lrs:  # failed runs have no selected row: keep them so they stay visible
        rows = rows[rows["selected"].astype(bool) | (rows["status"] != "ok")]
    if csv is not None:
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
        "token_acc",
        "exact_match",
        "seconds",
        "run_id",
    )
    for r in rows.sort_values(["protocol", "task", "mechanism", "seed", "lr"]).itertuples():
        table.add_row(
            r.task,
            r.mechanism,
            r.protocol,
            str(r.seed),
            f"{r.lr:g}",
            r.status,
            _metric(r.token_acc),
            _metric(r.exact_match),
            f"{r.wall_seconds:.1f}",
            r.run_id,
        )
    out.print(table)
    out.print(f"{len(rows)} rows", highlight=False)


def _metric(value: float | None) -> str:
    return "--" if value is None or pd.isna(value) else f"{value:.3f}"


@app.command("report")
@_guard
def report_command(
    results: ResultsOption = Path("results"),
    out_dir: Annotated[Path, typer.Option("--out", help="Where reports are written.")] = Path(
        "reports"
    ),
    metric: Annotated[str, typer.Option(help=" or ".join(METRICS))] = "token_acc",
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
    _load_plugins(plugin)  # a plugin's tasks and mechanisms have names and categories
    rows = _load(results).rows
    keep = pd.Series(True, index=rows.index)
    if protocol:
        keep &= rows["protocol"].isin(_split(protocol))
    if task or category:
        keep &= rows["task"].isin(_select_tasks(task or "all", category))
    if mech:
        keep &= rows["mechanism"].isin([MECHANISMS.canonical(m) for m in _split(mech)])
    rows = rows[keep]
    if rows.empty:
        raise UsageError(f"no results under {results}/ match the selection")
    rows, left_out = latest_versions(rows)
    for name, versions in left_out.items():
        old = ", ".join(f"v{v}" for v in versions)
        _warn(f"protocol {name}: rows of older versions ({old}) left out; reporting the newest")
    written = write_reports(rows, out_dir, metric, tuple(_split(formats)), compare)
    for path in written:
        out.print(f"wrote {path}", highlight=False)
    summary = [p for p in written if p.name == "summary.md"]
    for path in summary:
        out.print(f"\n{path.parent}:\n{path.read_text()}", highlight=False, markup=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
