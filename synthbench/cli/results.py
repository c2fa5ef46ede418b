"""``synthbench results``, ``report`` and ``migrate``: reading the stored rows back, and
moving an older tree's files into the current layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer

from synthbench.cli.common import (
    PluginOption,
    ResultsOption,
    UsageError,
    check_writable_file,
    check_writable_folder,
    fail,
    filter_names,
    load_plugins,
    load_results,
    names_in,
    os_error,
    out,
    path_parser,
    print_rows,
    select_tasks,
    split,
    warn,
    write_stdout,
)
from synthbench.core.atomic import write_atomically
from synthbench.core.mechanism import MECHANISMS, mixer
from synthbench.core.task import TASKS
from synthbench.core.text import did_you_mean, plural
from synthbench.report import published_lm, spent
from synthbench.report import reference as shipped
from synthbench.report.aggregate import (
    DEFAULT_METRIC,
    METRICS,
    latest_versions,
    metric_values,
)
from synthbench.report.compare import PUBLISHED_LM, check_comparison
from synthbench.report.publish import FORMATS, write_reports
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.row_checks import JSON_COLUMNS
from synthbench.run.schema import STATUSES
from synthbench.run.store import ResultStore


def results_command(
    task: Annotated[str | None, typer.Option(help="Comma-separated task names.")] = None,
    mech: Annotated[str | None, typer.Option(help="Comma-separated mechanism names.")] = None,
    protocol: Annotated[str | None, typer.Option(help="Comma-separated protocols.")] = None,
    status: Annotated[
        str | None, typer.Option(help="Comma-separated statuses: ok, diverged, error, leaky.")
    ] = None,
    all_lrs: Annotated[
        bool, typer.Option("--all-lrs", help="Every lr's row, not only the selected one.")
    ] = False,
    csv: Annotated[
        Path | None,
        typer.Option(
            help="Write the rows as CSV ('-' for stdout).",
            parser=path_parser("--csv"),
            metavar="FILE",
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print the rows as a JSON array of objects, every stored column."
        ),
    ] = False,
    cost: Annotated[
        bool,
        typer.Option(
            "--cost",
            help="What the rows cost, per protocol and mechanism: trainings, steps, CPU hours "
            "(wall and CPU time), accelerator hours and their share (every lr's row counts).",
        ),
    ] = False,
    results: ResultsOption = Path("results"),
    plugin: PluginOption = None,
) -> None:
    """Filter the stored rows; print a summary or export them as CSV or JSON. The summary's
    params column names each run's task and mechanism parameters that differ from the
    registered defaults (a plugin's: with --plugin, else all of them). With --cost, what
    the rows cost instead of the rows themselves."""
    if csv is not None and as_json:
        raise UsageError("--csv and --json both say where the rows go: give one")
    if csv is not None and str(csv) != "-":
        check_writable_file(csv, "--csv")
    load_plugins(plugin)  # a plugin's defaults, for the params column
    rows = stored = load_results(results).rows
    # a filter value is a name stored here or a registered one, as `run` takes it
    # (an empty value is an error, never "no filter": ``filter_names``)
    if task is not None:
        rows = rows[rows["task"].isin(filter_names(task, "--task", stored["task"], TASKS, "task"))]
    if mech is not None:
        names = filter_names(mech, "--mech", stored["mechanism"], MECHANISMS, "mechanism")
        rows = rows[rows["mechanism"].isin(names)]
    if protocol is not None:
        names = filter_names(protocol, "--protocol", stored["protocol"], PROTOCOLS, "protocol")
        rows = rows[rows["protocol"].isin(names)]
    if status is not None:
        known = {*STATUSES, *stored["status"]}
        rows = rows[rows["status"].isin(filter_names(status, "--status", known, kind="status"))]
    if cost:  # every training cost its time, selected or not
        rows = spent.cost_table(rows)
    elif not all_lrs:  # failed runs have no selected row: keep them so they stay visible
        rows = rows[rows["selected"].astype(bool) | (rows["status"] != "ok")]
    if as_json:
        write_stdout(_to_json(rows) + "\n")
        return
    if csv is not None:
        # list columns (the learning curve) as JSON, one CSV field each
        lists = [c for c in ("curve_steps", "curve_val_token_acc") if c in rows]
        rows = rows.assign(**{c: rows[c].map(_as_json) for c in lists})
        if str(csv) == "-":
            write_stdout(rows.to_csv(index=False))
        else:
            csv.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(csv, rows.to_csv(index=False))
            out.print(f"{plural(len(rows), 'row')} -> {csv}", highlight=False)
        return
    if cost:
        _print_costs(rows)
        return
    headers = ["task", "mechanism", "protocol", "seed", "lr", "status", "target", "token_acc"]
    # wall_s: the training's wall seconds (its row's wall_seconds), what `run` adds up per
    # run and estimates; cpu_s: the CPU seconds it cost (cpu_seconds, -- in rows before it);
    # params last, so that the columns before it keep their places
    headers += ["exact_match", "wall_s", "cpu_s", "run_id", "params"]
    rows = rows.sort_values(["protocol", "task", "mechanism", "seed", "lr"])
    targets = metric_values(rows, "target")  # each task's own metric: token_acc or free_token_acc
    changed = ChangedParams()
    cells = [
        [
            r.task,
            r.mechanism,
            r.protocol,
            str(r.seed),
            f"{r.lr:g}",
            r.status,
            _metric(target),
            _metric(r.token_acc),
            _metric(r.exact_match),
            f"{r.wall_seconds:.1f}",
            _seconds(r.cpu_seconds),
            r.run_id,
            changed.text(r.task, r.task_params, r.mechanism, r.mechanism_params, r.config),
        ]
        for r, target in zip(rows.itertuples(), targets, strict=True)
    ]
    print_rows(out, headers, cells)  # names whole, in a terminal or piped
    out.print(plural(len(rows), "row"), highlight=False)


def _print_costs(table: pd.DataFrame) -> None:
    headers = ["protocol", "version", "mechanism", "runs", "trainings", "steps", "cpu_wall_h",
               "cpu_time_h", "accelerator_h", "accelerator_share"]  # fmt: skip
    cells = []
    for r in table.itertuples():
        cpu_time = f"{r.cpu_time_hours:.2f}" if r.cpu_time_trainings else "--"
        if r.cpu_time_trainings < r.cpu_trainings:  # rows before schema 10 have none
            cpu_time += f" ({r.cpu_time_trainings} of {r.cpu_trainings} trainings)"
        cells.append([
            r.protocol, str(r.version), r.mechanism, str(r.runs), str(r.trainings), f"{r.steps:,}",
            f"{r.cpu_wall_hours:.2f}", cpu_time, f"{r.accelerator_hours:.2f}",
            f"{r.accelerator_share:.0%}",
        ])  # fmt: skip
    print_rows(out, headers, cells)
    out.print(
        "hours of every training (any lr, any status); CPU time: the CPU its process spent "
        "(synthbench/run/clock.py); accelerator_share: of the trainings",
        highlight=False,
    )


class ChangedParams:
    """The ``params`` cell of ``synthbench results``: a run's task and mechanism parameters
    that differ from the registered defaults, ``task: pairs=8; mech: temperature=0.5``, ""
    for a run at the defaults. The defaults are those a run gets without ``--task-param`` or
    ``--mech-param``: the task's with its protocol's pinned values, the mechanism's in the
    run's track (its published layer's in the block track) at the run's sizes. A task or
    mechanism not registered here (a plugin not loaded), or whose defaults cannot be built,
    shows every parameter it stored. Each distinct combination is worked out once."""

    def __init__(self) -> None:
        self._task: dict[tuple, str] = {}
        self._mechanism: dict[tuple, str] = {}
        self._sizes: dict[str, tuple] = {}

    def text(self, task: str, task_params, mechanism: str, mechanism_params, config) -> str:
        config = config if isinstance(config, str) else "{}"
        if config not in self._sizes:
            try:
                proto = json.loads(config).get("protocol", {})
                sizes = (proto.get("name"), proto.get("d_model"), proto.get("n_heads"),
                         proto.get("arch"))  # fmt: skip
            except (ValueError, AttributeError):
                sizes = (None, None, None, None)
            self._sizes[config] = sizes
        protocol, d_model, n_heads, arch = self._sizes[config]
        key = (task, task_params, protocol)
        if key not in self._task:
            self._task[key] = _task_changes(task, task_params, protocol)
        key = (mechanism, mechanism_params, d_model, n_heads, arch)
        if key not in self._mechanism:
            defaults = _mechanism_defaults(mechanism, d_model, n_heads, arch)
            self._mechanism[key] = _changes(mechanism_params, defaults)
        parts = [
            f"{kind}: {said}"
            for kind, said in (("task", self._task[(task, task_params, protocol)]),
                               ("mech", self._mechanism[key]))
            if said
        ]  # fmt: skip
        return "; ".join(parts)


def _task_changes(name: str, stored, protocol: str | None) -> str:
    """``_changes`` of a task's stored parameters from those a run gets by default under
    ``protocol`` (its pinned values on the task's defaults), less those the task derives
    from the others (kv_recall's queries, half its pairs unless given): the fewest that
    give the stored set."""
    try:
        params = json.loads(stored) if isinstance(stored, str) else None
        cls = TASKS.get(name) if name in TASKS else None
        pinned = PROTOCOLS.get(protocol).pinned_task_params(name) if protocol in PROTOCOLS else {}
        defaults = None if cls is None else cls(**pinned).param_dict()
    except Exception:  # a plugin task whose defaults do not build
        params, defaults = None, None
    if not isinstance(params, dict) or defaults is None:
        return _changes(stored, None)
    given = {k: v for k, v in params.items() if k not in defaults or not _same(v, defaults[k])}
    for key in list(given):  # the task itself gives it from the others
        rest = {k: v for k, v in given.items() if k != key}
        try:
            derived = cls(**{**pinned, **rest}).param_dict()
        except Exception:
            continue
        if all(_same(v, derived.get(k)) for k, v in params.items()):
            given = rest
    return ", ".join(f"{k}={v}" for k, v in given.items())


def _mechanism_defaults(name: str, d_model, n_heads, arch) -> dict | None:
    """The parameters a run of mechanism ``name`` gets by default in a model of these sizes
    and arch (its core's, or its published layer's: ``mixer``); None where not known."""
    if name not in MECHANISMS or None in (d_model, n_heads, arch):
        return None
    try:
        return mixer(name, int(d_model), int(n_heads), str(arch)).params(None)
    except Exception:  # a parameter without a default, or an arch this release lacks
        return None


def _changes(stored, defaults: dict | None) -> str:
    """``k=v, ...`` of the stored parameters (JSON) that differ from ``defaults`` (all of
    them where the defaults are not known)."""
    try:
        params = json.loads(stored) if isinstance(stored, str) else {}
    except ValueError:
        params = {}
    if not isinstance(params, dict):
        return ""
    return ", ".join(
        f"{k}={v}"
        for k, v in params.items()
        if defaults is None or k not in defaults or not _same(v, defaults[k])
    )


def _same(stored, value) -> bool:
    """Whether a stored parameter (read back from JSON) is ``value`` as a row stores it
    (JSON; str for what JSON cannot hold)."""
    text = json.dumps(value, sort_keys=True, default=str)
    return json.dumps(stored, sort_keys=True) == json.dumps(json.loads(text), sort_keys=True)


def _metric(value: float | None) -> str:
    return "--" if value is None or pd.isna(value) else f"{value:.3f}"


def _seconds(value: float | None) -> str:
    return "--" if value is None or pd.isna(value) else f"{value:.1f}"


def report_command(
    results: ResultsOption = Path("results"),
    out_dir: Annotated[
        Path,
        typer.Option(
            "--out", help="Where reports are written.", parser=path_parser("--out"), metavar="DIR"
        ),
    ] = Path("reports"),
    metric: Annotated[str, typer.Option(help=" or ".join(METRICS))] = DEFAULT_METRIC,
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
        str | None,
        typer.Option(
            help="Put published results beside ours: slay-paper (its table beside ours), "
            "published-lm (rank correlations with published language-model quality, and the "
            "share of published pairwise orderings the board reproduces)."
        ),
    ] = None,
    plugin: PluginOption = None,
    reference: Annotated[
        bool,
        typer.Option(
            "--reference/--no-reference",
            help="Show the reference runs shipped with synthbench (softmax, linear, ... under "
            "quick) beside yours, for your protocols and tasks, marked '(reference)'.",
        ),
    ] = True,
) -> None:
    """Tables (Markdown, LaTeX), figures and the leaderboard page, one set per protocol."""
    # every list is checked before a row is read: one naming nothing is an error, not "all"
    chosen_formats = tuple(names_in(formats, "--format", "format", FORMATS))
    for option, value in (("--protocol", protocol), ("--task", task), ("--mech", mech)):
        if value is not None:
            names_in(value, option, option.removeprefix("--").replace("mech", "mechanism"))
    if metric not in METRICS:
        raise UsageError(
            f"unknown metric '{metric}'{did_you_mean(metric, METRICS)} ({', '.join(METRICS)})"
        )
    check_comparison(compare)  # a typo is told before any row is read
    check_writable_folder(out_dir, "--out")
    load_plugins(plugin)  # a plugin's tasks and mechanisms have names and categories
    hint = f" {shipped.FIRST_RUN_HINT}" if reference else ""
    # --compare published-lm with nothing of the user's (a fresh clone): the shipped reference's
    # rows alone are compared, marked as ever
    alone = reference and compare == PUBLISHED_LM and not _has_rows(results)
    try:
        rows = _shipped_rows() if alone else load_results(results).rows
    except UsageError as exc:
        if hint and not results.exists():
            raise UsageError(f"{exc}{hint}") from None
        raise
    hint = hint if rows.empty or alone else ""
    both = task is not None or category is not None
    tasks = select_tasks("all" if task is None else task, category) if both else None
    mechs = None if mech is None else [MECHANISMS.canonical(m) for m in split(mech)]
    keep = pd.Series(True, index=rows.index)
    if protocol is not None:
        names = filter_names(protocol, "--protocol", rows["protocol"], PROTOCOLS, "protocol")
        keep &= rows["protocol"].isin(names)
    if tasks is not None:
        keep &= rows["task"].isin(tasks)
    if mechs is not None:
        keep &= rows["mechanism"].isin(mechs)
    rows = rows[keep]
    if rows.empty:
        raise UsageError(f"no results under {results}/ match the selection{hint}")
    rows, left_out = latest_versions(rows)
    for name, versions in left_out.items():
        old = ", ".join(f"v{v}" for v in versions)
        warn(f"protocol {name}: rows of older versions ({old}) left out; reporting the newest")
    replaced = None
    if alone:
        rows = shipped.mark(rows)
        out.print(
            f"no runs of yours under {results}/: comparing the shipped reference runs alone "
            f"({plural(rows['run_id'].nunique(), 'run')}), marked '{shipped.SUFFIX.strip()}'",
            highlight=False,
            markup=False,
        )
    elif reference:  # synthbench/report/reference.py: marked, so never taken for the user's own
        rows, added, problem, replaced = shipped.for_report(rows, tasks, mechs)
        if problem is not None:
            warn(problem)
        if added is not None:
            out.print(added, highlight=False, markup=False)
    try:
        # the reference runs yours replaced: the leaderboard names them
        written = write_reports(rows, out_dir, metric, chosen_formats, compare, replaced=replaced)
    except BrokenPipeError:
        raise
    except OSError as exc:  # a full disk, say: each report file is replaced whole or not at all
        raise fail(f"cannot write the reports: {os_error(exc)}", 1) from None
    for path in written:
        out.print(f"wrote {path}", highlight=False)
    if compare == PUBLISHED_LM:
        _say_uncompared(rows, written, "" if metric == DEFAULT_METRIC else f"-{metric}")
    summary = [p for p in written if p.name == "summary.md"]
    for path in summary:
        out.print(f"\n{path.parent}:\n{path.read_text()}", highlight=False, markup=False)


def _has_rows(results: Path) -> bool:
    """Whether ``results`` holds any stored row (a missing folder holds none)."""
    if not results.exists():
        return False
    return not load_results(results, columns=["run_id"]).rows.empty


def _shipped_rows() -> pd.DataFrame:
    """The shipped reference's rows, unmarked (``shipped.mark`` marks them once filtered)."""
    found = shipped.load()
    if found.problem is not None:
        raise UsageError(f"{found.problem}: no rows of yours, and no reference runs to compare")
    return found.rows


def _say_uncompared(rows: pd.DataFrame, written: list[Path], suffix: str) -> None:
    """A warning for each protocol ``--compare published-lm`` wrote nothing for: fewer than
    published_lm.MIN_MECHANISMS of the mechanisms the published tables cover."""
    data = published_lm.load()
    known = list(dict.fromkeys(data.loc[data["mechanism"] != "", "mechanism"]))
    names = {p.stem for p in written}
    for protocol, part in rows.groupby("protocol"):
        if f"{PUBLISHED_LM}-{protocol}{suffix}" in names:
            continue
        have = {str(m).removesuffix(shipped.SUFFIX) for m in part["mechanism"]}
        mine = [m for m in known if m in have]
        warn(
            f"--compare {PUBLISHED_LM}: protocol {protocol} has a complete leaderboard score "
            f"for fewer than {published_lm.MIN_MECHANISMS} of the mechanisms the published "
            f"tables cover ({', '.join(known)}; its rows have {', '.join(mine) or 'none'}): "
            "nothing compared"
        )


def migrate_command(results: ResultsOption = Path("results")) -> None:
    """Move the files of a tree written before schema 6 under protocol=<name>/ folders (a
    rename each: the files themselves are unchanged)."""
    if not results.is_dir():
        raise UsageError(f"no results under {results}/: the folder does not exist")
    check_writable_folder(results, "--results")
    done = ResultStore(results).migrate()
    for path, why in done.left:
        warn(f"left {path} where it is: {why}")
    where = f" ({', '.join(sorted(done.protocols))})" if done.protocols else ""
    out.print(f"moved {plural(len(done.moved), 'file')}{where}", highlight=False, markup=False)
    if done.left:  # each named above; nothing of theirs was moved or changed
        raise fail(
            f"{plural(len(done.left), 'file')} of the older layout left where "
            f"{'it is' if len(done.left) == 1 else 'they are'} (see the warnings above)",
            1,
        )


def _to_json(rows: pd.DataFrame) -> str:
    """The rows as a JSON array of objects with the stored columns as keys: the JSON columns
    (parameters, config) as objects, lists as lists, times in ISO 8601, a missing value
    null."""
    text = rows.to_json(orient="records", date_format="iso", double_precision=15)
    records = json.loads(text)
    for record in records:
        for column in JSON_COLUMNS:
            try:
                record[column] = json.loads(record[column])
            except (KeyError, TypeError, ValueError):  # absent, null, or null as text
                pass
    if not records:
        return "[]"
    return "[\n" + ",\n".join(json.dumps(r) for r in records) + "\n]"  # a row a line


def _as_json(values) -> str | None:
    """A stored list (a numpy array when read) as a JSON list; None stays empty."""
    return None if values is None else json.dumps([v.item() for v in values])
