"""Plugin code's checks, run where their end can be observed: in a child process.

A mechanism's ``forward`` may call ``os._exit``, crash the interpreter or never return. Run
in the command's own process, the command would end without a word, or wait forever. So
``synthbench check`` and run's leak guard (integrity/guard.py) hand each check to one child
process (forked by a fork server that has torch loaded, or spawned where the platform has
no fork server; one for all the checks of a command, replaced only when a check ends it),
and wait on it:

- a check that ends the process is said as such (``Ended``: its exit status or signal), and
  the next check starts a new child;
- a check still running after ``notice`` seconds is said once (``on_slow``), with where it
  stands (the file and line the child is at: synthbench/core/children.py); one still
  running after ``limit`` seconds is stopped (``Ended``, naming where it was);
- the user's Ctrl-C stops the child and raises ``Interrupted``, which names where it was.

Only plugin code goes there: a mechanism of a ``--plugin`` file or an installed plugin.
Built-in mechanisms, synthbench's own tested code, are checked in the command's process, and
a command that checks no plugin's starts no child (the first costs about 2 s: it loads torch).
So does a mechanism the child does not know as this process does (registered by code of this
process alone: a notebook, a test).
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from synthbench.core import children
from synthbench.core.interrupts import caught, describe
from synthbench.core.mechanism import MECHANISMS
from synthbench.core.registry import PluginWarning
from synthbench.integrity.causality import one_thread

CHECK_SECONDS = 300.0  # a check's time limit, by default
NOTICE_SECONDS = 15.0  # a check running this long is said, with where it stands
START_SECONDS = 300.0  # the child's start (torch and the plugins load in it)
_MAIN = "_serve"  # the child's main function: its stack is the one that tells where


class Ended(Exception):
    """A check that ended the process it ran in, or ran past its time limit: ``how`` (one
    phrase: "ended the process it ran in (exit status 5)") and ``where`` it was, if known."""

    def __init__(self, how: str, where: str | None = None) -> None:
        super().__init__(how)
        self.how, self.where = how, where

    def __str__(self) -> str:
        return self.how + (f", at {self.where}" if self.where else "")


class Interrupted(KeyboardInterrupt):
    """The user's Ctrl-C while ``label`` ran in the child, and ``where`` it was."""

    def __init__(self, label: str, where: str | None) -> None:
        super().__init__(label)
        self.label, self.where = label, where

    def __str__(self) -> str:
        return f"interrupted during {self.label}" + (f", at {self.where}" if self.where else "")


def from_plugin(name: str) -> bool:
    """Whether mechanism ``name`` is a plugin's (a file's or an installed package's)."""
    return MECHANISMS.entry(name).source != "builtin"


def _identity(name: str) -> str:
    """What tells the child's mechanism ``name`` for this process's: a plugin file's hash
    (the child names the file by its absolute path), else where it was registered from."""
    entry = MECHANISMS.entry(name)
    return entry.origin if isinstance(entry.origin, str) else entry.source


def _here(function: Callable, args: tuple) -> Any:
    """A job in this process, as the child runs it."""
    with one_thread():
        return function(*args)


def _serve(
    conn: Connection,
    plugin_files: list[str],
    stacks: str,
    parent_alive: Connection,
    environ: dict[str, str],
) -> None:
    """The child: load the plugins, then run each job it receives and send back its
    result; None (or its parent gone) ends it. ``parent_alive``: a pipe whose other end only
    the parent holds (its end-of-file says the parent is gone); ``environ``: the parent's
    environment when it started this child (a fork server's children inherit the server's)."""
    children.take_environment(environ)
    children.leave_ctrl_c_to_the_parent()
    children.exit_when_closed(parent_alive)
    children.dump_stack_on_request(stacks)
    warnings.simplefilter("ignore", PluginWarning)  # the parent reported them already
    try:
        children.load_plugins(plugin_files)
    except BaseException as exc:  # the parent loaded them: only a plugin that fails by chance
        conn.send(("fatal", describe(caught(exc))))  # (its parent then checks in its own)
        return
    conn.send(("ready", None))
    while True:
        try:
            job = conn.recv()
        except EOFError:  # the parent is gone
            return
        if job is None:
            return
        identities, function, args = job
        known = all(
            name in MECHANISMS.names() and _identity(name) == identity
            for name, identity in identities.items()
        )
        if not known:
            conn.send(("absent", None))
            continue
        conn.send(("started", None))
        try:
            with one_thread():  # checks run on one thread (tiny inputs: threads only wait)
                result = function(*args)
        except BaseException as exc:  # what the checks themselves did not catch
            conn.send(("raised", describe(caught(exc))))
            continue
        conn.send(("done", result))


children.preload(__name__)  # the checks' child is forked with this module loaded


class CheckProcess:
    """One child process for the checks of a command (``run(label, names, f, *args)``
    returns ``f(*args)`` computed there). ``limit``: seconds a check may run; ``notice``:
    after how long a running check is said (``on_slow(label, seconds, where)``)."""

    def __init__(
        self,
        plugin_files: list[str] | None = None,
        limit: float = CHECK_SECONDS,
        notice: float = NOTICE_SECONDS,
        on_slow: Callable[[str, float, str | None], None] | None = None,
    ) -> None:
        self.files = [os.path.abspath(p) for p in plugin_files or []]
        self.limit, self.notice, self.on_slow = limit, notice, on_slow
        self._context = children.context()
        self._process = None
        self._conn: Connection | None = None
        self._alive: Connection | None = None  # its end-of-file in the child: this one is gone
        self._stacks: children.StackFile | None = None
        self._ready = False
        self._isolated = True  # False once the child cannot load the plugins: checks run here

    def start(self, names: list[str]) -> None:
        """Start the child now if mechanisms ``names`` hold a plugin's (it loads torch and
        the plugins while this process goes on)."""
        if self._process is not None or not self._isolated or not any(map(from_plugin, names)):
            return
        self._conn, child = self._context.Pipe()
        alive, self._alive = self._context.Pipe(duplex=False)  # never written: closed at exit
        self._stacks = children.StackFile()
        previous = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"  # checks run on one thread: no larger pool
        try:
            self._process = self._context.Process(
                target=_serve,
                args=(child, self.files, self._stacks.path, alive, dict(os.environ)),
                daemon=True,
                name="synthbench-checks",
            )
            self._process.start()
        finally:
            if previous is None:
                del os.environ["OMP_NUM_THREADS"]
            else:
                os.environ["OMP_NUM_THREADS"] = previous
        child.close()  # the child's end lives in the child: EOF here when it dies
        alive.close()
        self._ready = False

    def run(self, label: str, names: list[str], function: Callable, *args: Any) -> Any:
        """``function(*args)``, computed in the child where mechanisms ``names`` hold a
        plugin's (here otherwise, and where the child does not know them as this process
        does); Ended if it ends the child or runs past the limit, Interrupted on the user's
        Ctrl-C. ``label`` names it in messages."""
        if threading.current_thread() is not threading.main_thread() or not self._isolated:
            return _here(function, args)  # (a thread cannot take Ctrl-C: no child to stop)
        if not any(map(from_plugin, names)):  # synthbench's own code
            return _here(function, args)
        self.start(names)
        if not self._ready:
            try:
                kind, _ = self._receive(label, START_SECONDS, notice=None)
            except Ended:
                kind = "ended"
            if kind != "ready":  # it could not start, or load the plugins: checked here
                self._stop()
                self._isolated = False
                return _here(function, args)
            self._ready = True
        identities = {name: _identity(name) for name in names}
        try:
            self._conn.send((identities, function, args))
        except Exception:  # what cannot be pickled cannot travel: checked here
            return _here(function, args)
        kind, payload = self._receive(label, self.limit, notice=None)
        if kind == "absent":
            return _here(function, args)
        kind, payload = self._receive(label, self.limit, notice=self.notice)  # "started" came
        if kind == "done":
            return payload
        raise Ended(f"raised {payload}")

    def _receive(self, label: str, limit: float, notice: float | None) -> tuple[str, Any]:
        """The child's next message, within ``limit`` seconds (``on_slow`` after
        ``notice``); Ended if it dies or runs past the limit (it is stopped)."""
        start = time.monotonic()
        said = notice is None or self.on_slow is None
        try:
            while True:
                now = time.monotonic()
                until = start + (limit if said else min(limit, notice))
                ready = wait([self._conn, self._process.sentinel], timeout=max(0.0, until - now))
                if self._conn in ready:
                    try:
                        return self._conn.recv()
                    except (EOFError, OSError):
                        raise self._died() from None
                if self._process.sentinel in ready:
                    raise self._died()
                elapsed = time.monotonic() - start
                if elapsed >= limit:
                    where = self._where()
                    self._stop()
                    raise Ended(f"did not return within {limit:g} s", where)
                if not said and elapsed >= notice:
                    said = True
                    self.on_slow(label, elapsed, self._where())
        except KeyboardInterrupt:  # no plugin code runs here: the user's Ctrl-C
            where = self._where() if self._process is not None else None
            self._stop()
            raise Interrupted(label, where) from None

    def _died(self) -> Ended:
        """The child ended: how, and a new one for the next check."""
        self._process.join(timeout=10)
        code = self._process.exitcode
        self._stop()
        how = f"signal {-code}" if code is not None and code < 0 else f"exit status {code}"
        return Ended(f"ended the process it ran in ({how})")

    def _where(self) -> str | None:
        if self._process is None or not self._process.is_alive():
            return None
        return self._stacks.where(self._process.pid, _MAIN)

    def _stop(self) -> None:
        if self._process is not None:
            if self._process.is_alive():
                self._process.kill()
            self._process.join(timeout=10)
            self._conn.close()
            self._alive.close()
            self._stacks.close()
        self._process, self._conn, self._alive, self._ready = None, None, None, False

    def close(self) -> None:
        """End the child (done with it)."""
        if self._process is not None and self._process.is_alive():
            try:
                self._conn.send(None)
                self._process.join(timeout=2)
            except OSError:
                pass
        self._stop()
