"""Writing a file atomically: through a hidden temporary file beside it and a rename.

Readers see the old file or the new one, never half of one, and a write that fails (a full
disk, say) leaves the old file as it was and no temporary behind. Every report file (text,
LaTeX, HTML and figures) is written this way, and so are the results' Parquet files
(synthbench/run/store.py).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

TMP_PREFIX = ".tmp-"  # then the writer's pid: a stale one names the process that left it


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[BinaryIO]:
    """A binary file object whose content replaces ``path`` when the block ends without an
    exception. An OSError names ``path`` (not the temporary file)."""
    path = Path(path)
    special = path.exists() and not path.is_file() and not path.is_dir()
    if path.is_symlink() and not special:  # the file it points to is replaced, the link stays
        path = path.resolve()
    tmp = path.parent / f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}-{path.name}"
    try:
        if special:  # a device or a FIFO (/dev/null, /dev/stdout): written to, never replaced
            # by a regular file (as root, a rename would replace /dev/null itself)
            with open(path, "wb") as handle:
                yield handle
            return
        with open(tmp, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        if exc.filename == str(path):
            raise
        raise type(exc)(exc.errno, exc.strerror or str(exc), str(path)) from exc
    finally:
        tmp.unlink(missing_ok=True)


def write_atomically(path: Path, data: str | bytes) -> None:
    """Replace ``path`` with ``data`` (text is written as UTF-8)."""
    with atomic_output(path) as handle:
        handle.write(data.encode() if isinstance(data, str) else data)


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
