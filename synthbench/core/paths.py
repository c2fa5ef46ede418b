"""The one way a path is built from data read back (a stored row's names, a report's
folders): ``path_under`` refuses anything that would land outside its root.

A stored value is input like any other: a protocol column holding ``../../x`` or ``/tmp``
must never become a folder outside the results tree (``synthbench migrate`` once moved files
there, out of every reader's sight). Each part is checked to be one plain name of a folder
or file, and the joined path to lie inside the root, lexically (no filesystem access: it
runs once per planned run).
"""

from __future__ import annotations

from pathlib import Path

# what no single folder or file name may hold: a separator on any system we run on, NUL
_FORBIDDEN = ("/", "\\", "\x00")


class OutsideRoot(ValueError):
    """A path built from data that would not be one plain name under its root."""


def part_problem(part: object) -> str | None:
    """Why ``part`` cannot be one folder or file name under a root, or None."""
    if not isinstance(part, str):
        return f"{part!r} is not text"
    if part in ("", ".", ".."):
        return f"{part!r} is not a name"
    if any(c in part for c in _FORBIDDEN):
        return f"{part!r} holds a path separator or NUL"
    return None


def path_under(root: str | Path, *parts: str) -> Path:
    """``root/part/...``; OutsideRoot (a ValueError) unless every part is one plain name and
    the whole lies inside ``root``."""
    root = Path(root)
    for part in parts:
        problem = part_problem(part)
        if problem is not None:
            raise OutsideRoot(f"{problem}: no path under {root} is built from it")
    path = root.joinpath(*parts)
    # belt and braces: a part that still changed the root (a drive, say) shows in the parts
    if path.parts != (*root.parts, *parts):
        raise OutsideRoot(f"{path} lies outside {root}")
    return path
