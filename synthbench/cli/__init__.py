"""The ``synthbench`` command line: one module per command group, sharing ``common``.

run                 cli/run.py       (the runner: synthbench/runner.py)
list, show-task,    cli/catalog.py
audit
results, report     cli/results.py
bench ...           cli/bench.py     (the measurements: synthbench/bench)
"""

import typer

from synthbench.cli import bench, catalog, results, run
from synthbench.cli.common import guard

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Synthetic-task benchmark suite and leaderboard for attention mechanisms.",
)
app.command("run")(guard(run.run_command))
app.command("list")(guard(catalog.list_command))
app.command("show-task")(guard(catalog.show_task_command))
app.command("audit")(guard(catalog.audit_command))
app.command("results")(guard(results.results_command))
app.command("report")(guard(results.report_command))
app.add_typer(bench.bench_app, name="bench")  # cost and fidelity benchmarks


def main() -> None:
    app()
