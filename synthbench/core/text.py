"""Words for messages, in one place: counts (every message says "1 seed" and "3 seeds",
never "3 seed(s)" or "1 seeds"), values quoted in a message, cut to a line, and the close
matches of a name nobody knows."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def noun(n, word: str, many: str | None = None) -> str:
    """``word`` for ``n`` of it: itself for 1, else its plural (``many``, or ``word`` + s)."""
    return word if n == 1 else many or word + "s"


def plural(n, word: str, many: str | None = None) -> str:
    """``n`` and ``word``, in the plural unless ``n`` is 1: ``plural(1, "seed")`` is
    "1 seed", ``plural(3, "seed")`` "3 seeds", ``plural(0, "run")`` "0 runs"; ``many`` is
    the plural of an irregular word (``plural(2, "category", "categories")``). The
    leaderboard page's script has the same two functions, for what it rewrites."""
    return f"{n} {noun(n, word, many)}"


def short_repr(value, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters: a message quotes what it refuses, and
    what it refuses can be a megabyte of brackets."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def did_you_mean(name, known: Iterable, n: int = 3) -> str:
    """``"; did you mean a, b?"`` for the names in ``known`` close to ``name`` (at most
    ``n``), or ``""`` where none is: the hint every "unknown ..." message carries."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=n, cutoff=0.5)
    return f"; did you mean {', '.join(close)}?" if close else ""


def duration(seconds: float) -> str:
    """A span as people say it: 40 s, 12 min, 1.3 h, 4.2 days."""
    if seconds < 0.5:
        return "<1 s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
