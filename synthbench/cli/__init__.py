"""The ``synthbench`` command line: one module per command group, sharing ``common``.

run, sweep          cli/run.py       (the runner: synthbench/run/runner.py; grids:
                                      synthbench/run/grid.py)
list, show-task,    cli/catalog.py
audit
results, report,    cli/results.py
migrate
bench ...           cli/bench.py     (the measurements: synthbench/bench)
facts ...           cli/facts.py     (the literature's findings: synthbench/facts)
--version,          here
--*-completion
"""

import sys


def _interrupted(kind, value, traceback, previous=sys.excepthook) -> None:
    """Ctrl-C while the command line loads (torch takes seconds, before ``main`` runs): one
    line instead of a traceback; Python still exits as killed by SIGINT (status 130)."""
    if issubclass(kind, KeyboardInterrupt):
        sys.stderr.write("error: interrupted\n")
    else:
        previous(kind, value, traceback)


sys.excepthook = _interrupted  # first, before the imports below

import gc  # noqa: E402
import importlib.metadata  # noqa: E402
from typing import Annotated  # noqa: E402

import torch  # noqa: E402
import typer  # noqa: E402

from synthbench.cli import bench, catalog, check, facts, reproduce, results, run  # noqa: E402
from synthbench.cli.common import (  # noqa: E402
    INTERRUPTED,
    STDOUT,
    ClickException,
    closed_stdout,
    echo,
    fail,
    guard,
    os_error,
)


def _flag_type(option: typer.core.TyperOption, ctx) -> str | None:
    """No type column for a flag in help: ``--force``, not ``--force <bool>``."""
    return None if option.is_flag else _option_type(option, ctx)


# typer has no hook for the class of the options it builds: its method is replaced here, once
# (a typer without it shows the type column of flags too: cosmetic)
_option_type = getattr(typer.core.TyperOption, "display_type_rich", None)
if _option_type is not None:
    typer.core.TyperOption.display_type_rich = _flag_type


class _OneLineErrors(typer.core.TyperGroup):
    """click's own parse errors (an unknown option or command, a value that is not a
    number, a missing value or argument) as one line ``error: ...`` with exit status 2, as
    every other input error, instead of typer's boxed usage; help, ``--version`` and
    completion work as click has them."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:  # not standalone: click raises its errors here instead of printing them
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except ClickException as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # typer has printed the help
                code = exc.exit_code
            else:
                message = " ".join(exc.format_message().split())
                ctx = getattr(exc, "ctx", None)
                where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
                code = fail(message + where, exc.exit_code).exit_code
        except typer.Abort:  # end of input at a prompt
            code = fail("aborted", 1).exit_code
        code = code if isinstance(code, int) else 0  # a command returns None
        if standalone_mode:
            sys.exit(code)
        return code


app = typer.Typer(
    cls=_OneLineErrors,
    # --install-completion, --show-completion: for the shell they detect (docs/CLI.md: another one)
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Synthetic-task benchmark suite and leaderboard for attention mechanisms.",
)


def _version(value: bool) -> None:
    if value:
        try:
            version = importlib.metadata.version("synthbench")
        except importlib.metadata.PackageNotFoundError:  # a source tree that is not installed
            version = "(not installed)"
        echo(f"synthbench {version} (torch {torch.__version__})")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", callback=_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    pass


app.command("run")(guard(run.run_command))
app.command("sweep")(guard(run.sweep_command))
app.command("check")(guard(check.check_command))  # cli/check.py: synthbench/integrity/contract.py
app.command("list")(guard(catalog.list_command))
app.command("show-task")(guard(catalog.show_task_command))
app.command("audit")(guard(catalog.audit_command))
app.command("results")(guard(results.results_command))
app.command("report")(guard(results.report_command))
app.command("migrate")(guard(results.migrate_command))
app.command("reproduce")(guard(reproduce.reproduce_command))  # synthbench/report/reference.py
app.add_typer(bench.bench_app, name="bench")  # cost and fidelity benchmarks
app.add_typer(facts.facts_app, name="facts")  # synthbench/facts: the literature's findings


def main() -> None:
    # What is loaded by now (torch, pandas, the registries: 200,000+ tracked objects) lives as
    # long as the command: out of the collector's sight, a collection during the command does
    # not walk it
    gc.freeze()
    try:
        try:
            app()
        finally:
            gc.freeze()  # nor do the interpreter's collections at exit (1-3 s of each command)
            if sys.stdout is not None:  # None: started with stdout closed (`>&-`)
                sys.stdout.flush()  # a reader gone (`| head`) shows here, not at exit
    except BrokenPipeError:
        sys.exit(closed_stdout())
    except OSError as exc:  # that flush, on a full disk say
        fail(os_error(OSError(exc.errno, exc.strerror, exc.filename or STDOUT)), 1)
        sys.exit(1)
    except KeyboardInterrupt:  # outside a command (guard): while typer parses, say
        fail("interrupted")
        sys.exit(INTERRUPTED)
