"""Plugin code may raise anything, not only an Exception: ``sys.exit()`` (SystemExit), a
KeyboardInterrupt of its own, GeneratorExit, a BaseException subclass. None of them may end
a command silently or pass for the user's Ctrl-C, so every place that runs plugin code (a
training, the checks, the command line's last resort) catches BaseException and hands it to
``caught``: a Ctrl-C the user pressed goes on as an interrupt, anything else is that code's
failure, stored or reported as such.

A Ctrl-C is the user's only where this process received a SIGINT. The command line counts
them (``count_interrupts``); a worker process ignores SIGINT (its driver handles Ctrl-C),
so a KeyboardInterrupt there is always the code's; where nobody counts (synthbench used as
a library), a KeyboardInterrupt is taken for the user's, so that Ctrl-C always works.

Python drops an exception raised inside a finalizer or a weakref callback: a Ctrl-C that
lands in one (a module lock's callback, while a training's first step imports torch._dynamo
lazily) would be lost, and the command would train on. So a counted Ctrl-C is also raised
again where work goes on (``raise_pending``: each training step, each turn of the runner),
and the dropped one is not printed as a traceback.
"""

from __future__ import annotations

import functools
import signal
import sys
import traceback

_received = 0  # SIGINTs this process received while counted


def _count(signum, frame) -> None:
    global _received
    _received += 1
    signal.default_int_handler(signum, frame)  # raises KeyboardInterrupt, as without us


def count_interrupts() -> None:
    """Count the SIGINTs this process receives (from the main thread; Ctrl-C still raises
    KeyboardInterrupt as it does by default)."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _count)
        sys.unraisablehook = functools.partial(_unraisable, sys.unraisablehook)


def _unraisable(previous, unraisable) -> None:
    """A Ctrl-C that Python drops (raised in a finalizer) goes unprinted: ``raise_pending``
    raises it again; anything else goes to the hook that was in place before."""
    if not (_received and isinstance(unraisable.exc_value, KeyboardInterrupt)):
        previous(unraisable)


def raise_pending() -> None:
    """The user's Ctrl-C again, if this process received one: where it was raised first,
    Python may have dropped it (above). Cheap enough for every training step."""
    if _received:
        raise KeyboardInterrupt


def from_user(exc: BaseException) -> bool:
    """Whether ``exc`` is the user's Ctrl-C (not something code raised)."""
    if not isinstance(exc, KeyboardInterrupt):
        return False
    handler = signal.getsignal(signal.SIGINT)
    if handler is signal.SIG_IGN:  # a worker: Ctrl-C is its driver's to handle
        return False
    return _received > 0 if handler is _count else True


def caught(exc: BaseException) -> BaseException:
    """``exc``, caught where code under test or training raised it; the user's Ctrl-C (and
    nothing else) is raised again."""
    if from_user(exc):
        raise exc
    return exc


def describe(exc: BaseException) -> str:
    """One line for what code raised: ``Type: message`` for an Exception (as a traceback
    ends), else what was raised and where (``SystemExit(3) raised at plugin.py:12``), since
    such an exit is only ever a plugin's doing."""
    if isinstance(exc, Exception):
        return f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" raised at {frames[-1].filename}:{frames[-1].lineno}" if frames else " raised"
    return f"{repr(exc)[:200]}{where}"
