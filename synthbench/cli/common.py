"""What every command shares: the consoles, one-line errors, plugins, selections, options.

Every failure the user can cause (an unknown name, a bad parameter, a broken plugin, a
corrupt results file) ends in one line naming the culprit; nothing stored is touched.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
import uuid
import warnings
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from tabulate import tabulate

from synthbench.core.atomic import TMP_PREFIX
from synthbench.core.interrupts import count_interrupts, describe, from_user
from synthbench.core.mechanism import MECHANISMS
from synthbench.core.registry import PluginError, PluginWarning, UnknownNameError, load_plugin_file
from synthbench.core.task import CATEGORIES, TASK_SETS, TASKS, task_set
from synthbench.core.text import did_you_mean, plural
from synthbench.facts.fact import FACTS
from synthbench.run.executors import ExecutorError
from synthbench.run.packed import notes_on_one_line
from synthbench.run.store import LoadReport, ResultStore

STDOUT = "stdout"  # the file name of an error writing to stdout (a full disk under `> file`)


class ClosedStdout(SystemExit):
    """Our own exit on a closed stdout: every other SystemExit in a command is plugin code's
    (``guard``)."""


class _Stdout(Console):
    def on_broken_pipe(self) -> None:
        """The reader of stdout went away (``| head``): rich would exit with status 1; exit
        as a program killed by the closed pipe does (``closed_stdout``), from any thread."""
        self.quiet = True
        raise ClosedStdout(closed_stdout())

    def _check_buffer(self) -> None:
        """Where rich writes: an error names stdout, not taken for one of the files we write."""
        try:
            super()._check_buffer()
        except BrokenPipeError:
            raise
        except OSError as exc:
            exc.filename = exc.filename or STDOUT
            raise


out = _Stdout(soft_wrap=True)
err = Console(stderr=True)
warnings.simplefilter("ignore", PluginWarning)  # reported once, as one line each, below
notes_on_one_line()  # a mechanism that packed training falls back on: one line


def path_parser(option: str):
    """A path option's parser: an empty value, which Path reads as the current folder, is
    refused (one line, exit 2) instead of writing there."""

    def parse(value: str | Path) -> Path:  # the default comes as a Path
        if not str(value).strip():
            raise fail(f"{option} is empty: give a path ('.' for the current folder)")
        return Path(value)

    return parse


PluginOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--plugin",
        help="Python file that registers tasks or mechanisms (repeatable).",
        parser=path_parser("--plugin"),
        metavar="FILE",
    ),
]

ResultsOption = Annotated[
    Path,
    typer.Option("--results", help="Results tree.", parser=path_parser("--results"), metavar="DIR"),
]
DeviceOption = Annotated[
    str, typer.Option(help="auto, cpu, cuda, cuda:N, mps or any other torch device.")
]
LogOption = Annotated[  # experiment tracking: synthbench/run/tracking.py
    list[str] | None,
    typer.Option(
        help="Log each training's curve, lr, config and final metrics as it trains: "
        "tensorboard, wandb or mlflow (repeatable or comma-separated; each an optional extra: "
        "pip install 'synthbench[tensorboard]'), under RESULTS/.logs (docs/RUNNING.md).",
        metavar="BACKEND",
    ),
]


class UsageError(Exception):
    """A user error: printed as one line, exit status 2."""


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``message`` as one error line; the caller raises the returned exit."""
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


def write_stdout(text: str) -> None:
    """Text as it is (JSON, CSV) on stdout; an error writing it names stdout."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, STDOUT) from None


def echo(line: str = "") -> None:
    """A plain line on stdout (no markup, no highlighting)."""
    out.print(line, highlight=False, markup=False)


def print_rows(console: Console, headers: list[str], cells: list[list[str]], caption=None) -> None:
    """A table whose first column is a name, never cut: piped, plain aligned rows (for grep,
    cut, less -S); in a terminal, a table whose columns are at least as wide as their widest
    word (text wraps between words) or, where the terminal is too narrow for that, each name
    beside its other columns, one a line."""
    if not console.is_terminal:
        console.print(
            tabulate(cells, headers=headers, tablefmt="plain", disable_numparse=True),
            highlight=False, markup=False, emoji=False,
        )  # fmt: skip
        if caption:
            console.print(caption, highlight=False, markup=False)
        return
    widths = [
        max(len(w) for text in [header, *(row[i] for row in cells)] for w in text.split())
        for i, header in enumerate(headers)
    ]
    if sum(widths) + 3 * len(widths) + 1 <= console.width:  # a border and padding each
        table = Table(caption=caption)
        for i, (header, width) in enumerate(zip(headers, widths, strict=True)):
            table.add_column(header, no_wrap=i == 0, min_width=width)
        for row in cells:
            table.add_row(*row)
    else:
        table = Table(headers[0], "", caption=caption, show_lines=True)
        table.columns[0].no_wrap = True
        table.columns[1].overflow = "fold"  # a word wider than the terminal breaks, not cut
        for row in cells:
            details = [f"{h}: {v}" for h, v in zip(headers[1:], row[1:], strict=True) if v]
            table.add_row(row[0], "\n".join(details))
    console.print(table)


def guard(command):
    """Turn user errors into one-line messages with exit status 2, an operating-system error
    (a full disk, a permission) into one line naming its path with status 1, Ctrl-C into
    one line with status 130, and a closed stdout (``| head``) into a quiet exit."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        debug = os.environ.get("SYNTHBENCH_DEBUG")  # the full traceback, for developers
        count_interrupts()  # so that a KeyboardInterrupt plugin code raises is not a Ctrl-C
        try:
            return command(*args, **kwargs)
        except (UnknownNameError, PluginError, UsageError, ExecutorError, ValueError) as exc:
            if debug:
                raise
            raise fail(str(exc)) from None
        except BrokenPipeError:
            raise typer.Exit(closed_stdout()) from None
        except KeyboardInterrupt as exc:
            if from_user(exc):
                raise fail("interrupted", INTERRUPTED) from None
            raise fail(f"plugin code ended the command: {describe(exc)}", 1) from None
        except OSError as exc:
            if debug:
                raise
            raise fail(os_error(exc), 1) from None
        except (typer.Exit, typer.Abort, ClickException):
            raise  # typer's and click's own: an exit status, a parse error
        except Exception as exc:  # a bug, ours or a plugin's: one line naming where it was
            if debug:
                raise
            raise fail(unexpected(exc), 1) from None
        except ClosedStdout:
            raise
        except BaseException as exc:  # sys.exit() or a BaseException of plugin code's own
            if debug:  # the traceback, never a silent exit with the plugin's status
                raise RuntimeError(f"plugin code ended the command: {describe(exc)}") from exc
            raise fail(f"plugin code ended the command: {describe(exc)}", 1) from None

    return wrapper


# click's error base: typer >= 0.24 carries its own copy of click, older ones use click's
ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def unexpected(exc: Exception) -> str:
    """An exception nobody expected as one line: its type, message and the innermost place
    in a file of ours or a plugin's (not a library's) where it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "site-packages" not in f.filename] or frames
    where = f" at {ours[-1].filename}:{ours[-1].lineno}" if ours else ""
    text = " ".join(str(exc).split())
    return (
        f"unexpected {type(exc).__name__}" + (f": {text}" if text else "") + where
        + " (SYNTHBENCH_DEBUG=1 shows the traceback)"
    )  # fmt: skip


INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
CLOSED_PIPE = 141  # 128 + SIGPIPE, what a program killed by a closed pipe reports


def closed_stdout() -> int:
    """The reader of stdout went away (``synthbench ... | head``): send what is left to
    /dev/null, so that the flush at exit does not fail again (the Python docs' recipe for
    SIGPIPE), and return the exit status."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return CLOSED_PIPE


def os_error(exc: OSError) -> str:
    """An operating-system error as one line: the path(s) and the reason."""
    reason = exc.strerror or str(exc)
    if exc.filename is None:
        return reason
    where = f"{exc.filename} -> {exc.filename2}" if exc.filename2 else str(exc.filename)
    return f"{where}: {reason}"


def check_writable_folder(path: Path, option: str) -> None:
    """Refuse, before any work, a folder option the command could not write into: a file, a
    folder under a file, or one this user may not write (for a folder not made yet, its
    nearest existing parent), tried by making a file there."""
    _check_writable(path, path, option)


def check_writable_file(path: Path, option: str) -> None:
    """Refuse, before any work, a file option that cannot be written: a folder, or one in a
    folder the command could not write into (``check_writable_folder``)."""
    if path.is_dir():
        raise UsageError(f"{option} {path} is a folder, not a file")
    _check_writable(path.parent, path, option)


def _check_writable(folder: Path, given: Path, option: str) -> None:
    place = next(p for p in (folder, *folder.parents) if os.path.lexists(p) or p == p.parent)
    if not place.is_dir():
        what = "a file, not a folder" if place.is_file() else "not a folder"
    elif not os.access(place, os.W_OK | os.X_OK):
        what = "not writable by this user"
    else:
        # access() answers for the permission bits, which root passes everywhere: whether a
        # file can be made there (/proc, a full or odd file system) is only known by trying
        probe = place / f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}-probe"
        try:
            probe.open("xb").close()
            probe.unlink()
            return
        except OSError as exc:
            what = f"not writable ({exc.strerror or exc})"
    raise UsageError(
        f"{option} {given} is {what}" if place == given else f"{option} {given}: {place} is {what}"
    )


def load_plugins(files: list[Path] | None) -> None:
    """Entry-point plugins (a failed one is a warning line) and the given plugin files."""
    for registry in (TASKS, MECHANISMS, FACTS):
        registry.load_plugins()
        for error in registry.plugin_errors:
            warn(str(error))
    for path in files or []:
        if not load_plugin_file(path, [TASKS, MECHANISMS, FACTS]):  # the wrong file, most likely
            warn(f"plugin file {path} registers no task, mechanism or fact")


def split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def names_in(value: str, option: str, what: str, known: tuple[str, ...] = ()) -> list[str]:
    """The comma-separated names an option was given; one that names nothing (``''``,
    ``,,``) is a one-line error, never read as "no filter" nor as nothing to do (naming the
    ``known`` names, where the option has a fixed few)."""
    names = split(value)
    if not names:
        choices = f"; choose from {', '.join(known)}" if known else ""
        raise UsageError(f"{option} names no {what} (got {value!r}){choices}")
    return names


def _task_name(name: str) -> str:
    """A task's canonical name; an unknown one is refused with the close matches among the
    tasks and the named sets (``--task extnded``: did you mean extended?)."""
    try:
        return TASKS.canonical(name)
    except UnknownNameError:
        spellings = [*TASK_SETS, *(n for e in TASKS.entries() for n in (e.name, *e.aliases))]
        known = ", ".join([*TASK_SETS, *TASKS.names()])
        hint = did_you_mean(name, spellings)
        raise UsageError(f"unknown task '{name}'{hint} (known: {known})") from None


def select_tasks(task: str, category: str | None) -> list[str]:
    """'all' (the default suite), 'extended' (all and the State tasks) or comma-separated
    names, optionally only one category -> canonical names. A category with 'all' picks
    from every task: ``--category State`` names the State tasks itself."""
    if task in TASK_SETS:
        names = task_set("extended" if category is not None else task)
    else:
        names = [_task_name(n) for n in names_in(task, "--task", "task")]
    if category is not None:
        wanted = {c.lower(): c for c in CATEGORIES}
        if category.lower() not in wanted:
            hint = did_you_mean(category, CATEGORIES)
            raise UsageError(
                f"unknown category '{category}'{hint} (categories: {', '.join(CATEGORIES)})"
            )
        names = [
            n for n in names if TASKS.entry(n).metadata["category"] == wanted[category.lower()]
        ]
    if not names:
        raise UsageError("no task matches the selection")
    return list(dict.fromkeys(names))


def select_mechanisms(value: str, option: str = "--mech") -> list[str]:
    """'all' or comma-separated names -> canonical names, each once."""
    names = MECHANISMS.names() if value == "all" else names_in(value, option, "mechanism")
    return list(dict.fromkeys(MECHANISMS.canonical(m) for m in names))


def say_slow_check(limit: float, option: str = ""):
    """What a command says of a check still running in its child process
    (integrity/isolation.py, ``on_slow``): which, for how long, where it is now, and when it
    is stopped (``option`` sets that limit)."""

    def say(label: str, seconds: float, where: str | None) -> None:
        at = f", now at {where}" if where else ""
        how = f" ({option})" if option else ""
        warn(f"{label} has run for {seconds:.0f} s{at}; it is stopped after {limit:g} s{how}")

    return say


def load_results(results: Path, columns: list[str] | None = None) -> LoadReport:
    """The stored rows, with one warning line per file that had to be skipped (the store
    cannot read it) or holds rows left out (synthbench/run/row_checks.py)."""
    if os.path.lexists(results) and not results.is_dir():
        raise UsageError(f"--results {results} is not a folder")
    if not results.exists():  # a mistyped path would read as a tree with nothing stored
        raise UsageError(f"no results under {results}/: the folder does not exist")
    report = ResultStore(results).load(columns=columns, warn=False)
    for line in report.warnings():
        warn(line)
    if report.legacy:
        warn(
            f"{plural(len(report.legacy), 'file')} in the layout before schema 6 (no "
            "protocol= level): read as they are; `synthbench migrate --results "
            f"{results}` moves them, so that DuckDB and Polars read the tree too"
        )
    return report


def check_run_paths(store: ResultStore, specs) -> None:
    """Refuse, before any training, a results tree where a run's file cannot go: anything
    but a folder where its protocol=, task= or mechanism= folder belongs, a folder (or
    anything but a file) at the file's own path, or a folder of the tree this user may not
    write."""
    runs: dict[tuple[str, str, str], list[str]] = {}  # a mechanism= folder's, its run ids
    for spec in specs:
        runs.setdefault((spec.protocol.name, spec.task, spec.mechanism), []).append(spec.run_id)
    folders = set()
    for key, run_ids in runs.items():
        path = store.path_for(*key, run_ids[0])
        folders |= set(path.parents[:3])  # its mechanism=, task= and protocol= folders
        # each folder listed once, not each run's path asked for (a grid may be 500,000 runs)
        found = _entries(path.parent)
        for run_id in run_ids:
            entry = found.get(f"{run_id}.parquet")
            if entry is not None and not entry.is_file():
                path = store.path_for(*key, run_id)
                what = "a folder" if entry.is_dir() else "not a file"
                raise UsageError(f"{path} is {what}, where a run's results file goes: move it away")
    for folder in sorted(folders):
        if os.path.lexists(folder) and not folder.is_dir():
            raise UsageError(f"{folder} is a file, where a folder of the results tree goes")
        if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
            raise UsageError(f"{folder} is not writable by this user")


def _entries(folder: Path) -> dict[str, os.DirEntry]:
    """What ``folder`` holds by name; nothing where it is not a folder that can be listed."""
    try:
        with os.scandir(folder) as entries:
            return {entry.name: entry for entry in entries}
    except OSError:  # absent, a file, or not readable: the folder checks say which
        return {}


def filter_names(value: str, option: str, stored, registry=None, kind: str = "name") -> list[str]:
    """The comma-separated names of a filter option over stored rows: a name found in
    ``stored`` as it is, else the ``registry``'s canonical name (an alias resolved; an
    unknown name is its one-line error with the close matches); without a registry, an
    unknown name is such an error of our own, over ``stored``. A value naming nothing is
    an error (``names_in``), never "no filter"."""
    stored = sorted({str(s) for s in stored})
    names = []
    for name in names_in(value, option, kind):
        if name in stored:
            names.append(name)
        elif registry is not None:
            names.append(registry.canonical(name))
        else:
            hint = did_you_mean(name, stored)
            raise UsageError(f"unknown {kind} '{name}'{hint} (known: {', '.join(stored)})")
    return names
