"""``synthbench facts list | run | report``: the literature's findings as pre-declared checks
(synthbench/facts/)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pandas as pd
import typer

from synthbench.cli.common import (
    DeviceOption,
    PluginOption,
    ResultsOption,
    UsageError,
    check_writable_folder,
    guard,
    load_plugins,
    load_results,
    out,
    path_parser,
    print_rows,
    split,
    warn,
)
from synthbench.cli.execution import (
    ExecutorOption,
    ForceOption,
    JobsOption,
    PackOption,
    RayAddressOption,
    ThreadsOption,
)
from synthbench.cli.run import check_execution, train_specs
from synthbench.core.text import plural
from synthbench.facts import report
from synthbench.facts import shipped as facts_shipped
from synthbench.facts.evaluate import decide, fact_specs
from synthbench.facts.fact import FACTS
from synthbench.report.formats import markdown_table
from synthbench.run.limits import MAX_SEEDS

facts_app = typer.Typer(
    no_args_is_help=True,
    help="The literature's findings as checks declared before running: list, run, report.",
)
NamesArgument = Annotated[
    str, typer.Argument(help="'all', or comma-separated fact names (synthbench facts list).")
]
ShippedOption = Annotated[
    bool,
    typer.Option(
        "--shipped/--no-shipped",
        help="Count the facts' runs that ship with synthbench (measured rows; yours of the "
        "same run take precedence): run trains only what neither holds.",
    ),
]
FirstSeedOption = Annotated[
    int,
    typer.Option(
        help="Run and judge each fact at its seeds counted from this one (0: the declared "
        "seeds; another value re-runs the facts independently at other seeds)."
    ),
]


def _select(names: str) -> list[str]:
    """'all' or comma-separated fact names -> canonical names, each once; a value naming
    none ('', ',,') is a one-line error with the way to list them."""
    if names == "all":
        return FACTS.names()
    if not split(names):
        hint = "give 'all' or fact names (synthbench facts list)"
        raise UsageError(f"NAMES names no fact (got {names!r}): {hint}")
    return list(dict.fromkeys(FACTS.canonical(n) for n in split(names)))


def _check_first_seed(first_seed: int) -> None:
    if not 0 <= first_seed <= MAX_SEEDS:
        raise UsageError(f"--first-seed must be in [0, {MAX_SEEDS}], got {first_seed}")


@facts_app.command("list")
@guard
def list_command(
    plugin: PluginOption = None,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="A Markdown table (docs/FACTS.md embeds it).")
    ] = False,
) -> None:
    """Every fact: its name, track, runs, source and claim."""
    load_plugins(plugin)
    rows = []
    for entry in FACTS.entries():
        fact = entry.obj
        runs = len({s.run_id for specs in fact_specs(fact).values() for s in specs})  # shared
        rows.append([entry.name, fact.kind, fact.track, str(runs), fact.source, fact.claim])
    headers = ["fact", "kind", "track", "runs", "source", "claim"]
    if markdown:
        out.print(markdown_table(rows, headers), highlight=False, markup=False)
        return
    print_rows(out, headers, rows, caption=plural(len(rows), "fact"))


@facts_app.command("run")
@guard
def run_command(
    names: NamesArgument = "all",
    first_seed: FirstSeedOption = 0,
    device: DeviceOption = "auto",
    jobs: JobsOption = None,
    pack: PackOption = None,
    threads: ThreadsOption = 1,
    executor: ExecutorOption = "local",
    ray_address: RayAddressOption = None,
    results: ResultsOption = Path("results"),
    plugin: PluginOption = None,
    force: ForceOption = False,
    shipped: ShippedOption = True,
) -> None:
    """Train the runs the facts need (stored as any run is: resumable, shared between facts
    and with `synthbench run`), then print their verdicts."""
    load_plugins(plugin)
    chosen = _select(names)
    _check_first_seed(first_seed)
    check_execution(threads, jobs, pack, executor, device, None, 0.0)
    check_writable_folder(results, "--results")
    specs = {}
    for name in chosen:
        for arm_specs in fact_specs(FACTS.get(name), first_seed, threads).values():
            specs.update((s.run_id, s) for s in arm_specs)  # facts share runs: each trains once
    shipped_rows = _shipped_rows(shipped)
    measured = set() if force else facts_shipped.complete_runs(shipped_rows)
    todo = [s for run_id, s in specs.items() if run_id not in measured]
    line = f"{plural(len(specs), 'run')} for {plural(len(chosen), 'fact')}"
    if len(todo) < len(specs):
        line += f", {len(specs) - len(todo)} of them measured in the shipped facts runs"
    out.print(line, highlight=False)
    try:
        if todo:
            train_specs(
                todo,
                device=device,
                jobs=jobs,
                pack=pack,
                threads=threads,
                executor=executor,
                ray_address=ray_address,
                cpus_per_run=None,
                gpus_per_run=0.0,
                results=results,
                plugin=plugin,
                force=force,
                resized=True,
            )
        else:
            out.print("done: nothing new to train", highlight=False)
    finally:  # what the stored runs say, even when some failed (those facts: inconclusive)
        rows = _rows(results, shipped_rows)
        _warn_unshipped(chosen, shipped_rows, rows, first_seed)
        _print_verdicts(chosen, rows, first_seed)


def _shipped_rows(shipped: bool) -> pd.DataFrame:
    """The shipped facts runs (none with ``--no-shipped``, or where the file is stale: said)."""
    if not shipped:
        return pd.DataFrame()
    found = facts_shipped.load()
    if found.problem:
        warn(f"{found.problem}: judged on your rows alone")
    return found.rows


def _rows(results: Path, shipped_rows: pd.DataFrame) -> pd.DataFrame:
    """Your rows under ``results`` (none: a folder that does not exist, where shipped rows
    stand in) with the shipped runs you lack."""
    if not results.exists() and not shipped_rows.empty:
        return shipped_rows
    return facts_shipped.with_shipped(load_results(results).rows, shipped_rows)


def _warn_unshipped(
    chosen: list[str], shipped_rows: pd.DataFrame, rows: pd.DataFrame, first_seed: int
) -> None:
    """One line where the shipped facts runs predate arms of the chosen facts (an arm
    declared or changed since they were measured): those facts are judged without them."""
    missing = {
        name: arms
        for name in chosen
        if (arms := facts_shipped.arms_not_shipped(FACTS.get(name), shipped_rows, rows, first_seed))
    }
    if missing:
        arms = "; ".join(f"{name}: {', '.join(labels)}" for name, labels in missing.items())
        count = plural(sum(map(len, missing.values())), "arm")
        warn(
            f"the shipped facts runs predate {count} of {plural(len(missing), 'fact')} "
            f"({arms}): `synthbench facts run {','.join(missing)}` trains them"
        )


def _print_verdicts(chosen: list[str], rows: pd.DataFrame, first_seed: int) -> None:
    outcomes = [decide(name, FACTS.get(name), rows, first_seed) for name in chosen]
    print_rows(
        out,
        ["fact", "verdict", "ours", "why"],
        [
            [o.name, o.decision.verdict, o.decision.figures or "-", o.decision.reason or ""]
            for o in outcomes
        ],
        caption=report.counts_line(outcomes),
    )


@facts_app.command("report")
@guard
def report_command(
    names: NamesArgument = "all",
    first_seed: FirstSeedOption = 0,
    results: ResultsOption = Path("results"),
    out_dir: Annotated[
        Path,
        typer.Option(
            "--out", help="Where reports are written.", parser=path_parser("--out"), metavar="DIR"
        ),
    ] = Path("reports"),
    plugin: PluginOption = None,
    shipped: ShippedOption = True,
) -> None:
    """reports/facts.md (a page: every fact, its rule, our figures beside the source's) and
    reports/facts.tex (a table for a paper's appendix), from the stored rows."""
    load_plugins(plugin)
    chosen = _select(names)
    _check_first_seed(first_seed)
    check_writable_folder(out_dir, "--out")
    shipped_rows = _shipped_rows(shipped)
    rows = _rows(results, shipped_rows)
    source = f"the rows under {results}/"
    if not shipped_rows.empty:
        source += " and the facts runs shipped with synthbench (yours take precedence)"
    _warn_unshipped(chosen, shipped_rows, rows, first_seed)
    outcomes = [decide(name, FACTS.get(name), rows, first_seed) for name in chosen]
    for path in report.write(outcomes, out_dir, source):
        out.print(f"wrote {path}", highlight=False)
    out.print(report.counts_line(outcomes), highlight=False)
