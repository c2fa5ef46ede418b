"""What every child process of a command shares: the local workers that train
(synthbench/run/executors.py) and the process that runs plugin code's checks
(synthbench/integrity/isolation.py).

A child leaves Ctrl-C to its parent (which stops it), exits by itself when its parent is
gone, loads the same plugins, and on request writes where it stands: its parent sends it
``STACK_SIGNAL`` and faulthandler, a C-level handler that works even while plugin code
never returns to Python (``time.sleep``, a busy loop), appends its main thread's stack to a
file the parent reads (``StackFile.where``). So a command that stops a child (a time limit, Ctrl-C)
can say which file and line it stopped.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import re
import signal
import sysconfig
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

from synthbench.core.mechanism import MECHANISMS
from synthbench.core.registry import load_plugin_file
from synthbench.core.task import TASKS

# where the platform has one (not Windows): the signal that asks a child for its stack
STACK_SIGNAL = getattr(signal, "SIGUSR1", None)
STACK_WAIT = 1.0  # seconds a parent waits for the stack it asked for
_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<function>\S+)')
# frames of these folders are the machinery around the code that runs, not that code: the
# engine's rooms that run checks and trainings, and Python's library (its installed
# packages aside, where a plugin may live; torch is machinery wherever it is)
_ENGINE = tuple(
    str(folder) + os.sep
    for folder in (
        Path(__file__).resolve().parents[1] / "integrity",
        Path(__file__).resolve().parents[1] / "run",
        Path(__file__).resolve().parent,
    )
)
_STDLIB = str(Path(sysconfig.get_paths()["stdlib"]).resolve()) + os.sep
_INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


# How a child starts: forked by a fork server where the platform has one, a process started
# once per parent with torch and the modules named by ``preload`` loaded (a child then starts
# in about 0.05 s, where a fresh interpreter takes about 2 s to load torch: every command's
# local workers and checks, and a long-lived parent such as a notebook or a test session
# starts many). Never a plain fork of the parent: it would copy torch's threads. Elsewhere,
# spawn.
_FORK_SERVER = "forkserver" in multiprocessing.get_all_start_methods()
START_METHOD = "forkserver" if _FORK_SERVER else "spawn"
_PRELOADED: list[str] = []
_READY = "synthbench.core.fork_server_ready"  # last: freezes what the server has loaded


def preload(module: str) -> None:
    """Have the fork server load ``module`` before it forks any child (each module whose
    functions children run names itself when imported; a server already running keeps
    what it loaded, and a child imports the rest)."""
    if module not in _PRELOADED:
        _PRELOADED.append(module)
        if _FORK_SERVER:  # whatever START_METHOD says now: a test may set spawn for a while
            forkserver = multiprocessing.get_context("forkserver")
            forkserver.set_forkserver_preload([*_PRELOADED, _READY])


def context():
    """The multiprocessing context children start in (``START_METHOD``)."""
    return multiprocessing.get_context(START_METHOD)


def take_environment(environ: dict[str, str]) -> None:
    """In a child: the environment its parent had when it started the child (a fork
    server's children inherit the server's, from when the server started)."""
    os.environ.clear()
    os.environ.update(environ)


def leave_ctrl_c_to_the_parent() -> None:
    """In a child: Ctrl-C is its parent's to handle (it stops the child), so SIGINT is
    ignored here, and a KeyboardInterrupt is always plugin code's, stored or reported as
    its failure (synthbench/core/interrupts.py). Only the main thread may set a handler."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def exit_when_closed(alive: Connection) -> None:
    """Exit this child as soon as the other end of ``alive``, which only its parent holds,
    closes: the parent is gone (killed, even with SIGKILL). Unlike watching the parent's
    pid, this holds for a child that a fork server forked (its parent process is the
    server), and it is told at once rather than at the next poll."""

    def watch() -> None:
        try:
            alive.poll(None)  # returns at end-of-file: nothing is ever sent
        except OSError:
            pass
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def load_plugins(files: list[str]) -> None:
    """Entry-point plugins and the given plugin files, as the parent loaded them."""
    registries = [TASKS, MECHANISMS]
    for registry in registries:
        registry.load_plugins()
    for path in files:
        load_plugin_file(path, registries)


def dump_stack_on_request(path: str | None) -> None:
    """In a child: append the main thread's stack to the ``StackFile`` at ``path`` whenever
    ``STACK_SIGNAL`` comes (every thread's: the signal may land on another; ``StackFile.where``
    picks the main one). The child holds the file open for its life and removes its name at
    once: the parent holds it open too, and nothing is left behind, even after a kill."""
    if STACK_SIGNAL is None or path is None:
        return
    handle = open(path, "a")  # appended: the parent reads what a request added
    try:
        os.unlink(path)
    except OSError:
        pass
    faulthandler.register(STACK_SIGNAL, file=handle, all_threads=True, chain=False)


class StackFile:
    """Where a child writes its stack when asked (``dump_stack_on_request(path)``), and
    what its parent reads it with (``where``). ``close`` when done with the child."""

    def __init__(self) -> None:
        handle, self.path = tempfile.mkstemp(prefix="synthbench-stack-", suffix=".txt")
        self._reader = os.fdopen(handle, "rb")  # open before the child removes its name

    def where(self, pid: int, main: str) -> str | None:
        """Where the child ``pid`` stands now: ``file:line in function`` of the innermost
        frame of its main thread (the stack that holds a frame of function ``main``) outside
        Python's library and synthbench's machinery; None where it cannot say (no such
        signal here, the child gone, nothing written in time)."""
        if STACK_SIGNAL is None:
            return None
        try:
            start = os.fstat(self._reader.fileno()).st_size
            os.kill(pid, STACK_SIGNAL)
        except (OSError, ValueError):  # the child gone, or this file closed
            return None
        deadline = time.monotonic() + STACK_WAIT
        text = ""
        while time.monotonic() < deadline:
            time.sleep(0.05)
            self._reader.seek(start)
            text = self._reader.read().decode(errors="replace")
            if _stacks(text, main):  # written whole: the main thread's stack holds ``main``
                break
        return innermost(_stacks(text, main))

    def close(self) -> None:
        self._reader.close()
        try:
            os.unlink(self.path)  # the child never took it (it died first)
        except OSError:
            pass


def _stacks(text: str, main: str) -> list[tuple[str, int, str]]:
    """The frames (file, line, function), innermost first, of the thread whose stack in a
    faulthandler dump holds a frame of function ``main``; [] if none does (yet)."""
    for block in re.split(r"\n(?=\S)", text):
        frames = [
            (m["file"], int(m["line"]), m["function"])
            for m in map(_FRAME.match, block.splitlines())
            if m is not None
        ]
        if any(function == main for _, _, function in frames):
            return frames
    return []


def innermost(frames: list[tuple[str, int, str]]) -> str | None:
    """``file:line in function`` of the innermost frame that is not machinery (Python's
    library, synthbench's engine, torch): the code that was running; else the innermost."""
    if not frames:
        return None
    for file, line, function in frames:
        if not _machinery(str(Path(file).resolve()) if file.startswith(os.sep) else file):
            return f"{file}:{line} in {function}"
    file, line, function = frames[0]
    return f"{file}:{line} in {function}"


def _machinery(path: str) -> bool:
    if path.startswith(_ENGINE) or f"{os.sep}torch{os.sep}" in path:
        return True
    return path.startswith(_STDLIB) and not any(folder in path for folder in _INSTALLED)
