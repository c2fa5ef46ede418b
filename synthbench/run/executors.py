"""Executors: where the trainings of ``synthbench run`` execute.

All three take the same work, a training (a run at one lr, ``runner.Unit``) or a
``work.Pack`` of them trained as one batched model, and give back the same rows, one
training's at a time from ``wait``; only the driver process writes them to the store.

- ``InProcess``: one after another in this process (``--jobs 1``).
- ``LocalPool``: worker processes on this machine (``--jobs N``), each with its own device
  (round-robin over the GPUs: ``devices.worker_devices``), forked by a fork server that has
  torch and the engine loaded where the platform has one (core/children.py). A worker loads
  the same plugin files as the driver, ignores Ctrl-C (the driver stops it), and exits by
  itself when the driver dies. A worker that dies mid-training is replaced and its training
  retried; one still training after ``max_seconds`` (``run --max-seconds``) is stopped, and
  its training stored as an error naming where it was (core/children.py), not retried.
- ``RayPool``: tasks on a Ray cluster (``--executor ray``): a local instance, or an existing
  cluster through ``--ray-address``. Rows travel back to the driver, so the workers need no
  shared filesystem; plugin files travel as their source. Its workers ignore Ctrl-C too. Ray
  retries a task whose worker was lost. Needs the optional extra: ``pip install
  "synthbench[ray]"``.

The runner keeps at most ``capacity`` pieces of work submitted at a time, so that every
submitted one is training.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
import warnings
from collections import deque
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch

from synthbench.core import children
from synthbench.core.mechanism import MECHANISMS
from synthbench.core.registry import PluginWarning, load_plugin_file
from synthbench.core.task import TASKS
from synthbench.core.text import noun
from synthbench.run import phases
from synthbench.run.allocator import reuse_freed_memory
from synthbench.run.packed import notes_on_one_line
from synthbench.run.tracking import Tracking
from synthbench.run.train import failed_row
from synthbench.run.work import train_work, trainings_of

EXECUTORS = ("local", "ray")
MAX_ATTEMPTS = 3  # a training whose worker dies this many times is stored as an error


class ExecutorError(RuntimeError):
    """An executor that cannot go on (a worker that cannot start, Ray missing)."""


class _Results:
    """The rows of finished work not yet handed out: ``wait`` gives one training's row at
    a time, and a pack finishes several at once."""

    def __init__(self) -> None:
        self._ready: deque = deque()

    def _hand_out(self, work, rows: list[dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
        self._ready.extend(zip(trainings_of(work), rows, strict=True))
        return self._ready.popleft()


def lost_rows(work, device, error: str) -> list[dict[str, Any]]:
    """An error row for each training of ``work`` (its worker lost, say)."""
    return [failed_row(u.spec, u.lr, torch.device(device), error) for u in trainings_of(work)]


class InProcess(_Results):
    """One training after another, in this process. ``own_process``: the process is there
    to train (the command line), so its allocator is set for training
    (``allocator.reuse_freed_memory``), which a caller that measures memory would not want."""

    capacity = 1

    def __init__(
        self, device: torch.device, own_process: bool = False, logs: Tracking | None = None
    ) -> None:
        self.device = device
        self.logs = logs  # where the trainings log (--log: synthbench/run/tracking.py)
        if own_process:
            reuse_freed_memory()
        self._queue: deque = deque()
        super().__init__()

    def submit(self, work) -> None:
        self._queue.append(work)

    def wait(self) -> tuple[Any, dict[str, Any]]:
        if self._ready:
            return self._ready.popleft()
        work = self._queue.popleft()
        return self._hand_out(work, train_work(work, self.device, self.logs))

    def close(self) -> None:
        self._queue.clear()
        self._ready.clear()


# -- local worker processes -------------------------------------------------------------------

children.preload(__name__)  # a worker is forked with this module (torch, the engine) loaded


def expect_local_workers() -> None:
    """Said before a command's first child starts (a plugin's checks may start the fork
    server before the workers): its fork server will fork trainings, so it loads what a
    training's first optimizer imports too (torch/_compile.py's _disable_dynamo loads
    torch._dynamo: about 2.4 CPU-s that every new worker would pay before its first step).
    A server that forks only checks, which never train, skips it."""
    children.preload("torch._dynamo")


def _worker_main(
    conn: Connection,
    device: str,
    plugin_files: list[str],
    parent_alive: Connection,
    stacks: str | None,
    environ: dict[str, str],
    logs: Tracking | None = None,
) -> None:
    """A local worker: train each piece of work it receives, send back its rows; None ends
    it, as does its parent's end (``parent_alive``: a pipe whose other end only the driver
    holds). Its stack goes to ``stacks`` when asked (core/children.py: a time limit says
    where it stopped a training). ``environ``: the driver's environment when it started the
    worker."""
    children.take_environment(environ)
    children.leave_ctrl_c_to_the_parent()
    children.exit_when_closed(parent_alive)
    children.dump_stack_on_request(stacks)
    warnings.simplefilter("ignore", PluginWarning)  # the driver reported them already
    notes_on_one_line()
    reuse_freed_memory()
    try:
        children.load_plugins(plugin_files)
    except Exception as exc:
        conn.send(("fatal", f"a worker could not load the plugins: {exc}"))
        return
    try:
        while True:
            try:
                unit = conn.recv()
            except EOFError:  # the driver is gone
                return
            if unit is None:
                return
            conn.send(("started", None))  # a time limit counts from here, not from its start
            conn.send(("rows", train_work(unit, torch.device(device), logs)))
    finally:
        phases.write()  # a worker's exit skips atexit


class _Worker:
    """A worker process; ``watched``: it can say where it stands (a time limit needs it)."""

    def __init__(
        self,
        device: torch.device,
        plugin_files: list[str],
        watched: bool = False,
        logs: Tracking | None = None,
    ) -> None:
        self.device = device
        context = children.context()
        self.conn, child = context.Pipe()
        alive, self._alive = context.Pipe(duplex=False)  # never written: closed at the end
        self.stacks = children.StackFile() if watched else None
        stacks = self.stacks and self.stacks.path
        self.process = context.Process(
            target=_worker_main,
            args=(child, str(device), plugin_files, alive, stacks, dict(os.environ), logs),
            daemon=True,
            name=f"synthbench-worker-{device}",
        )
        self.process.start()
        child.close()  # the child's end lives in the child: EOF here when it dies
        alive.close()  # likewise: the child sees end-of-file when this process ends
        self.unit = None
        self.since: float | None = None  # when it began its unit (time.monotonic)

    def where(self) -> str | None:
        """Where its training stands (file:line in function), if it can tell."""
        if self.stacks is None or not self.process.is_alive():
            return None
        return self.stacks.where(self.process.pid, _worker_main.__name__)

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=10)
        self.conn.close()
        self._alive.close()
        if self.stacks is not None:
            self.stacks.close()


class LocalPool(_Results):
    """``jobs`` worker processes on this machine; ``devices`` gives each one's device.
    ``max_seconds``: a piece of work (a training, or a pack of them trained together) still
    running after that long is stopped, its worker replaced, and its trainings given error
    rows naming where it was (not retried: it would hang again)."""

    def __init__(
        self,
        devices: list[torch.device],
        plugin_files: list[Path],
        threads: int = 1,
        max_seconds: float | None = None,
        logs: Tracking | None = None,
    ):
        if not devices:
            raise ValueError("a local pool needs at least one worker")
        self.capacity = len(devices)
        self.max_seconds = max_seconds
        self._files = [str(Path(p).resolve()) for p in plugin_files]
        self._threads = threads
        self._logs = logs
        self._attempts: dict = {}
        self._waiting: deque = deque()
        super().__init__()
        expect_local_workers()
        self._workers = [self._spawn(d) for d in devices]

    def _spawn(self, device: torch.device) -> _Worker:
        # a worker's OpenMP pool is sized when torch loads in it, from the environment: a
        # spawned worker's own, a forked one's the fork server's (each training then sets
        # its threads)
        previous = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = str(self._threads)
        try:
            watched = self.max_seconds is not None
            return _Worker(device, self._files, watched, self._logs)
        finally:
            if previous is None:
                del os.environ["OMP_NUM_THREADS"]
            else:
                os.environ["OMP_NUM_THREADS"] = previous

    def submit(self, unit) -> None:
        self._waiting.append(unit)
        self._dispatch()

    def _dispatch(self) -> None:
        for i, worker in enumerate(self._workers):
            if not self._waiting:
                return
            if worker.unit is not None:
                continue
            try:
                worker.conn.send(self._waiting[0])
            except OSError:  # it died while idle: a new one takes the unit
                worker.stop()
                worker = self._workers[i] = self._spawn(worker.device)
                worker.conn.send(self._waiting[0])
            worker.unit = self._waiting.popleft()
            worker.since = None  # until it says it began (a new worker loads torch first)

    def wait(self) -> tuple[Any, dict[str, Any]]:
        if self._ready:
            return self._ready.popleft()
        while True:
            busy = [w for w in self._workers if w.unit is not None]
            if not busy:
                raise ExecutorError("wait() with nothing submitted")
            timeout = None
            begun = [w.since for w in busy if w.since is not None]
            if self.max_seconds is not None and begun:  # until the first one is overdue
                timeout = max(0.0, min(begun) + self.max_seconds - time.monotonic())
            ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy], timeout)
            for worker in busy:
                if worker.conn in ready or worker.process.sentinel in ready:
                    result = self._collect(worker)
                    if result is not None:
                        self._dispatch()
                        return self._hand_out(*result)
            for worker in busy:
                if self._overdue(worker):
                    result = self._stop_overdue(worker)
                    self._dispatch()
                    return self._hand_out(*result)
            self._dispatch()

    def _overdue(self, worker: _Worker) -> bool:
        return (
            self.max_seconds is not None
            and worker.unit is not None
            and worker.since is not None
            and time.monotonic() - worker.since >= self.max_seconds
        )

    def _stop_overdue(self, worker: _Worker):
        """(work, error rows) of a worker past ``max_seconds``: it is stopped and replaced."""
        where = worker.where()
        seconds = time.monotonic() - worker.since
        unit, worker.unit = worker.unit, None
        index = self._workers.index(worker)
        worker.stop()
        self._workers[index] = self._spawn(worker.device)
        at = f", at {where}" if where else ""
        message = f"TimeLimit: stopped after {self.max_seconds:g} s (--max-seconds){at}"
        rows = lost_rows(unit, worker.device, message)
        return unit, [{**row, "wall_seconds": seconds} for row in rows]

    def _collect(self, worker: _Worker):
        """(work, rows) if ``worker`` sent its rows; None if it only said it began its work,
        or if it died (then it is replaced)."""
        try:
            while worker.conn.poll():
                kind, payload = worker.conn.recv()
                if kind == "started":
                    worker.since = time.monotonic()
                    continue
                if kind == "fatal":
                    raise ExecutorError(payload)
                unit, worker.unit = worker.unit, None
                return unit, payload
            if worker.process.is_alive():
                return None
        except (EOFError, OSError):
            pass
        worker.process.join(timeout=10)
        code = worker.process.exitcode
        unit, worker.unit = worker.unit, None
        index = self._workers.index(worker)
        worker.stop()
        self._workers[index] = self._spawn(worker.device)
        attempts = self._attempts[unit.key] = self._attempts.get(unit.key, 0) + 1
        how = f"signal {-code}" if code is not None and code < 0 else f"exit status {code}"
        if attempts >= MAX_ATTEMPTS:
            message = f"WorkerLost: its worker process died ({how}) {attempts} times"
            return unit, lost_rows(unit, worker.device, message)
        self._waiting.appendleft(unit)  # retried first, on the new worker
        return None

    def close(self) -> None:
        self._waiting.clear()
        self._ready.clear()
        for worker in self._workers:
            if worker.unit is None and worker.process.is_alive():
                try:
                    worker.conn.send(None)
                except OSError:
                    pass
        for worker in self._workers:
            if worker.unit is None:
                worker.process.join(timeout=5)
            worker.stop()


# -- Ray --------------------------------------------------------------------------------------

_loaded_sources: set[str] = set()  # in a Ray worker: the plugin sources already loaded


def _load_plugin_sources(sources: list[tuple[str, str]]) -> None:
    """Load plugin files shipped as (file name, source): written once to a folder named
    by their hash, then loaded like the driver's files."""
    children.load_plugins([])
    for name, source in sources:
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        if digest in _loaded_sources:
            continue
        folder = Path(tempfile.gettempdir()) / f"synthbench-plugin-{digest}"
        folder.mkdir(exist_ok=True)
        path = folder / name
        if not path.exists():
            path.write_text(source)
        load_plugin_file(path, [TASKS, MECHANISMS])
        _loaded_sources.add(digest)


def _ray_train(
    work, device: str, sources: list[tuple[str, str]], logs: Tracking | None = None
) -> list[dict[str, Any]]:
    children.leave_ctrl_c_to_the_parent()  # RayPool.close cancels a task by killing its worker
    notes_on_one_line()
    reuse_freed_memory()
    _load_plugin_sources(sources)
    return train_work(work, torch.device(device), logs)


class RayPool(_Results):
    """Trainings as Ray tasks, each asking for ``cpus`` CPUs and ``gpus`` GPUs (a fraction
    shares a GPU). ``address`` joins a running cluster; None starts a local instance (of
    ``local_cpus`` CPUs, default all) that is shut down on close."""

    def __init__(
        self,
        address: str | None,
        plugin_files: list[Path],
        cpus: float = 1,
        gpus: float = 0,
        jobs: int | None = None,
        local_cpus: int | None = None,
        logs: Tracking | None = None,
    ) -> None:
        try:
            import ray
        except ImportError:
            raise ExecutorError(
                'the ray executor needs Ray: pip install "synthbench[ray]"'
            ) from None
        if not cpus > 0 or gpus < 0:
            raise ValueError(f"--cpus-per-run must be > 0 and --gpus-per-run >= 0 ({cpus}, {gpus})")
        self._ray = ray
        self._started = not ray.is_initialized()
        if self._started:
            options = {"num_cpus": local_cpus} if address is None else {}
            try:
                ray.init(
                    address=address,
                    include_dashboard=False,
                    logging_level=logging.ERROR,
                    log_to_driver=False,
                    **options,
                )
            except Exception as exc:  # connection refused, bad address...
                raise ExecutorError(f"cannot start or join Ray at {address}: {exc}") from None
        self.device = "cuda" if gpus > 0 else "cpu"
        self._logs = logs
        self._sources = [(Path(p).name, Path(p).read_text()) for p in plugin_files]
        self._task = ray.remote(_ray_train).options(
            num_cpus=cpus, num_gpus=gpus, max_retries=MAX_ATTEMPTS - 1
        )
        resources = ray.cluster_resources()
        fits = [resources.get("CPU", 0) // cpus]
        if gpus > 0:
            fits.append(resources.get("GPU", 0) // gpus)
        if min(fits) < 1:
            raise ExecutorError(
                f"no node of the Ray cluster has {cpus:g} {noun(cpus, 'CPU')} and {gpus:g} "
                f"{noun(gpus, 'GPU')} for a run "
                f"(cluster: {resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs)"
            )
        self.capacity = int(min(fits) if jobs is None else min(min(fits), jobs))
        self._refs: dict = {}
        super().__init__()

    def submit(self, unit) -> None:
        ref = self._task.remote(unit, self.device, self._sources, self._logs)
        self._refs[ref] = unit

    def wait(self) -> tuple[Any, dict[str, Any]]:
        if self._ready:
            return self._ready.popleft()
        ready, _ = self._ray.wait(list(self._refs), num_returns=1)
        work = self._refs.pop(ready[0])
        try:
            rows = self._ray.get(ready[0])
        except self._ray.exceptions.RayError as exc:  # lost more often than retried, or a
            # plugin that fails on the worker: error rows, retried by the next command
            cause = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            rows = lost_rows(work, self.device, f"{type(exc).__name__}: {cause}")
        return self._hand_out(work, rows)

    def close(self) -> None:
        for ref in self._refs:
            try:
                self._ray.cancel(ref, force=True)
            except Exception:  # already finished or gone
                pass
        self._refs.clear()
        self._ready.clear()
        if self._started:
            self._ray.shutdown()
