"""What every command shares: the consoles, one-line errors, plugins, selections, options.

Every failure the user can cause (an unknown name, a bad parameter, a broken plugin, a
corrupt results file) ends in one line naming the culprit; nothing stored is touched.
"""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from synthbench.executors import ExecutorError
from synthbench.mechanism import MECHANISMS
from synthbench.registry import PluginError, PluginWarning, UnknownNameError, load_plugin_file
from synthbench.store import LoadReport, ResultStore
from synthbench.task import CATEGORIES, TASKS

out = Console(soft_wrap=True)
err = Console(stderr=True)
warnings.simplefilter("ignore", PluginWarning)  # reported once, as one line each, below

PluginOption = Annotated[
    list[Path] | None,
    typer.Option("--plugin", help="Python file that registers tasks or mechanisms (repeatable)."),
]
ResultsOption = Annotated[Path, typer.Option("--results", help="Results tree.")]
DeviceOption = Annotated[
    str, typer.Option(help="auto, cpu, cuda, cuda:N, mps or any other torch device.")
]


class UsageError(Exception):
    """A user error: printed as one line, exit status 2."""


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``message`` as one error line; the caller raises the returned exit."""
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


def echo(line: str = "") -> None:
    """A plain line on stdout (no markup, no highlighting)."""
    out.print(line, highlight=False, markup=False)


def guard(command):
    """Turn user errors into one-line messages with exit status 2."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except (UnknownNameError, PluginError, UsageError, ExecutorError, ValueError) as exc:
            if os.environ.get("SYNTHBENCH_DEBUG"):  # the full traceback, for developers
                raise
            raise fail(str(exc)) from None

    return wrapper


def load_plugins(files: list[Path] | None) -> None:
    """Entry-point plugins (a failed one is a warning line) and the given plugin files."""
    for registry in (TASKS, MECHANISMS):
        registry.load_plugins()
        for error in registry.plugin_errors:
            warn(str(error))
    for path in files or []:
        load_plugin_file(path, [TASKS, MECHANISMS])


def split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def select_tasks(task: str, category: str | None) -> list[str]:
    """'all' or comma-separated names, optionally only one category -> canonical names."""
    names = TASKS.names() if task == "all" else [TASKS.canonical(n) for n in split(task)]
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


def select_mechanisms(value: str, option: str = "--mech") -> list[str]:
    """'all' or comma-separated names -> canonical names, each once."""
    names = MECHANISMS.names() if value == "all" else split(value)
    mechs = list(dict.fromkeys(MECHANISMS.canonical(m) for m in names))
    if not mechs:
        raise UsageError(f"{option} names no mechanism")
    return mechs


def load_results(results: Path, columns: list[str] | None = None) -> LoadReport:
    """The stored rows, with one warning line per file that had to be skipped."""
    report = ResultStore(results).load(columns=columns, warn=False)
    for path, reason in report.skipped:
        warn(f"skipping {path}: {reason}")
    return report
