"""Per-run claims: two ``synthbench run`` commands on one results tree never both compute a run.

    <results>/.claims/<run_id>       {"pid": ..., "host": ..., "started": ..., "token": ...}

The driver claims a run before it hands out the run's first training (the file is created
with O_CREAT | O_EXCL: of two commands, one gets it) and releases it when the run completes or
the command ends, Ctrl-C and errors included. A run claimed by another live command is left
to it. While a claim is held its modification time is refreshed every ``HEARTBEAT_S``.

A claim is stale, and taken over, when the command that made it is gone:

- on this host, when its pid no longer exists (a SIGKILLed command leaves no run stuck);
- on any host, when its heartbeat is older than ``STALE_AFTER_S``: a process on another
  machine that shares the results tree cannot be checked, and a pid may have been reused.

The directory is hidden, so the store and the readers of the tree (pyarrow, the DuckDB and
Polars globs) never see it. Only the driver claims: workers, local or Ray, never do.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from synthbench.core.atomic import TMP_PREFIX, process_alive

CLAIMS_DIR = ".claims"
HEARTBEAT_S = 60.0
STALE_AFTER_S = 600.0  # ten missed heartbeats
# a claim file is written right after it is created: one still empty or cut after this long
# was left by a process killed in between
_WRITE_GRACE_S = 10.0
_TOKENS: set[str] = set()  # the claims this process holds (a claim with its pid and another
# token was left by an earlier process that had the same pid)


@dataclass(frozen=True)
class Holder:
    """Who holds a claim."""

    pid: int
    host: str
    started: str  # UTC, ISO 8601
    token: str

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.host} (since {self.started})"

    def text(self) -> str:
        return json.dumps(
            {"pid": self.pid, "host": self.host, "started": self.started, "token": self.token}
        )

    @staticmethod
    def parse(text: str) -> Holder | None:
        try:
            data = json.loads(text)
            return Holder(int(data["pid"]), str(data["host"]), str(data["started"]),
                          str(data["token"]))  # fmt: skip
        except (ValueError, TypeError, KeyError):
            return None


class Claims:
    """The claims one command holds on a results tree; ``close`` releases them all."""

    def __init__(
        self,
        root: str | Path,
        heartbeat_s: float = HEARTBEAT_S,
        stale_after_s: float = STALE_AFTER_S,
    ) -> None:
        self.dir = Path(root) / CLAIMS_DIR
        self.heartbeat_s, self.stale_after_s = heartbeat_s, stale_after_s
        self._held: dict[str, Holder] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def take(self, run_id: str) -> Holder | None:
        """Claim ``run_id``: None when this command holds it now, else the live holder."""
        if run_id in self._held:
            return None
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / run_id
        holder = None
        for _ in range(5):  # a few rounds: others may be taking or releasing it meanwhile
            mine = Holder(os.getpid(), socket.gethostname(),
                          datetime.now(timezone.utc).isoformat(timespec="seconds"),
                          uuid.uuid4().hex)  # fmt: skip
            if self._create(path, mine):
                with self._lock:
                    self._held[run_id] = mine
                _TOKENS.add(mine.token)
                self._start_heartbeat()
                return None
            try:
                text, mtime = path.read_text(), path.stat().st_mtime
            except FileNotFoundError:
                continue  # released meanwhile
            holder = Holder.parse(text)
            if not self._stale(holder, time.time() - mtime):
                return holder or Holder(0, "?", "?", "")
            self._remove_if_unchanged(path, text)
        return holder or Holder(0, "?", "?", "")

    def release(self, run_id: str) -> None:
        with self._lock:
            mine = self._held.pop(run_id, None)
        if mine is None:
            return
        _TOKENS.discard(mine.token)
        path = self.dir / run_id
        try:
            if Holder.parse(path.read_text()) == mine:  # never remove another's claim
                path.unlink()
        except FileNotFoundError:
            pass

    def close(self) -> None:
        """Release every claim held, stop the heartbeat."""
        self._stop.set()
        for run_id in list(self._held):
            self.release(run_id)
        if self._beat is not None:
            self._beat.join(timeout=5)
        try:
            self.dir.rmdir()  # leave no empty folder behind (not one that holds other claims)
        except OSError:
            pass

    def __enter__(self) -> Claims:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------

    def _create(self, path: Path, mine: Holder) -> bool:
        """Create the claim file whole or not at all: written aside, then hard-linked into
        place (the link fails if the claim exists), so a kill never leaves an empty claim
        that would hold the run for the write grace."""
        aside = self.dir / f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}-claim"
        try:
            aside.write_text(mine.text())
        except FileNotFoundError:  # the folder was removed by a command that ended meanwhile
            self.dir.mkdir(parents=True, exist_ok=True)
            return self._create(path, mine)
        try:
            os.link(aside, path)
            return True
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: create exclusively, then write
            return self._create_in_place(path, mine)
        finally:
            aside.unlink(missing_ok=True)

    @staticmethod
    def _create_in_place(path: Path, mine: Holder) -> bool:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as handle:
            handle.write(mine.text())
        return True

    def _stale(self, holder: Holder | None, age: float) -> bool:
        if age > self.stale_after_s:
            return True
        if holder is None:  # being written in place, or cut short by a kill
            return age > _WRITE_GRACE_S
        if holder.host != socket.gethostname():
            return False  # cannot be checked from here: live until its heartbeat stops
        if holder.pid == os.getpid():
            return holder.token not in _TOKENS
        return not process_alive(holder.pid)

    def _remove_if_unchanged(self, path: Path, text: str) -> None:
        """Remove the stale claim ``text`` at ``path``; if another command replaced it by a
        live claim in the meantime, that one stays. The rename is atomic: of two commands
        taking over one stale claim, one moves the stale claim, the other (if it moved the
        new claim instead) puts that back."""
        aside = self.dir / f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}-stale"
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return
        try:
            if aside.read_text() != text:
                try:
                    os.link(aside, path)  # fails if a claim is there again: that one stays
                except FileExistsError:
                    pass
        finally:
            aside.unlink(missing_ok=True)

    def _start_heartbeat(self) -> None:
        if self._beat is None:
            self._beat = threading.Thread(target=self._heartbeat, daemon=True,
                                          name="synthbench-claims")  # fmt: skip
            self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            with self._lock:
                held = list(self._held)
            for run_id in held:
                try:
                    os.utime(self.dir / run_id)
                except OSError:
                    pass  # released meanwhile
