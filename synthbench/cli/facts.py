"""``synthbench facts list | run | report``: the literature's findings as pre-declared checks
(synthbench/facts/)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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
)
from synthbench.cli.run import (
    ExecutorOption,
    ForceOption,
    JobsOption,
    PackOption,
    RayAddressOption,
    ThreadsOption,
    check_execution,
    train_specs,
)
from synthbench.core.text import plural
from synthbench.facts import report
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
FirstSeedOption = Annotated[
    int,
    typer.Option(
        help="Run and judge each fact at its seeds counted from this one (0: the declared "
        "seeds; another value re-runs the facts independently at other seeds)."
    ),
]


def _select(names: str) -> list[str]:
    chosen = FACTS.names() if names == "all" else [FACTS.canonical(n) for n in split(names)]
    if not chosen:
        raise UsageError("no fact named")
    return list(dict.fromkeys(chosen))


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
        runs = sum(len(specs) for specs in fact_specs(fact).values())
        rows.append([entry.name, fact.track, str(runs), fact.source, fact.claim])
    headers = ["fact", "track", "runs", "source", "claim"]
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
    out.print(f"{plural(len(specs), 'run')} for {plural(len(chosen), 'fact')}", highlight=False)
    try:
        train_specs(
            list(specs.values()),
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
    finally:  # what the stored runs say, even when some failed (those facts: inconclusive)
        _print_verdicts(chosen, results, first_seed)


def _print_verdicts(chosen: list[str], results: Path, first_seed: int) -> None:
    rows = load_results(results).rows
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
) -> None:
    """reports/facts.md (a page: every fact, its rule, our figures beside the source's) and
    reports/facts.tex (a table for a paper's appendix), from the stored rows."""
    load_plugins(plugin)
    chosen = _select(names)
    _check_first_seed(first_seed)
    check_writable_folder(out_dir, "--out")
    rows = load_results(results).rows
    outcomes = [decide(name, FACTS.get(name), rows, first_seed) for name in chosen]
    for path in report.write(outcomes, out_dir, str(results)):
        out.print(f"wrote {path}", highlight=False)
    out.print(report.counts_line(outcomes), highlight=False)
