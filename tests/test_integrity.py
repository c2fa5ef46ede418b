"""No stored result is ever lost: a stored result is never replaced by a failed training, a
file the store cannot read (or of a newer schema) at a run's path is never overwritten, and
two `synthbench run` commands on one results tree never both compute a run (per-run claims,
which a killed command does not leave stuck)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

import synthbench.run.provenance
import synthbench.run.work
from synthbench.cli import app
from synthbench.run import provenance, runner
from synthbench.run.claims import CLAIMS_DIR, Claims
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.schema import SCHEMA_VERSION
from synthbench.run.spec import RunSpec
from synthbench.run.store import NewerSchemaError, ResultStore, StoreNotice
from synthbench.run.train import blank_row, failed_row

pytestmark = pytest.mark.usefixtures("single_thread")

CPU = torch.device("cpu")
SMOKE = PROTOCOLS.get("smoke")
GRID = dataclasses.replace(SMOKE, lrs=(1e-3, 3e-3, 1e-2))
SCHEMA_NEXT = SCHEMA_VERSION + 1
ENV = {"COLUMNS": "250"}
SUBPROCESS_ENV = {**os.environ, **ENV, "OMP_NUM_THREADS": "1"}
COPY = ["--task", "copy", "--task-param", "n=4", "--mech", "linear", "--protocol", "smoke"]


@pytest.fixture(autouse=True)
def no_git(monkeypatch):
    """The rows' commit without running git (other sessions work in this checkout)."""
    monkeypatch.setattr(synthbench.run.provenance, "git_commit", lambda: "test")


def spec_of(seed: int = 0, protocol=SMOKE) -> RunSpec:
    return RunSpec.resolve("copy", "linear", protocol, seed, {"n": 4})


def row(spec: RunSpec, lr: float, status: str = "ok", acc: float = 0.5) -> dict:
    """A complete row as a training returns it: a result, or a failure with its error."""
    if status not in ("ok", "diverged"):
        return failed_row(spec, lr, CPU, "RuntimeError: boom")
    out = {**blank_row(spec, lr), "status": status, **provenance.stamp(CPU)}
    if status == "ok":
        out.update(token_acc=acc, exact_match=0.0, val_token_acc=acc, val_exact_match=0.0,
                   final_loss=1.0, n_params=1, steps_done=spec.protocol.steps)  # fmt: skip
    return out


def stored(store: ResultStore, spec: RunSpec) -> dict[float, tuple[str, float | None]]:
    """lr -> (status, token_acc) of what is stored for ``spec``."""
    return {r["lr"]: (r["status"], r["token_acc"])
            for r in store.read_run(spec.protocol.name, spec.task, spec.mechanism,
                                    spec.run_id)}  # fmt: skip


def invoke(*args):
    result = CliRunner().invoke(app, [str(a) for a in args], env=ENV)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def files_under(root: Path) -> dict[str, bytes]:
    """Every file under ``root``, hidden ones included: relative path -> bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# -- a stored result is never replaced by a failure ------------------------------------------


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("kept", ["ok", "diverged"])
def test_a_failed_row_never_replaces_a_stored_result(tmp_path, kept, replace):
    store, spec = ResultStore(tmp_path), spec_of()
    path = store.write([row(spec, 1e-3, kept, 0.7)])
    with pytest.warns(StoreNotice) as caught:
        store.write([row(spec, 1e-3, "error")], replace=replace)
    assert stored(store, spec)[1e-3][0] == kept
    (message,) = [str(w.message) for w in caught]
    assert str(path) in message and f"kept the stored {kept} row at lr 0.001" in message
    assert "RuntimeError: boom" in message


def test_a_result_replaces_a_result_and_an_error(tmp_path):
    store, spec = ResultStore(tmp_path), spec_of()
    store.write([row(spec, 1e-3, "error")])
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreNotice)  # nothing kept, nothing to say
        store.write([row(spec, 1e-3, "ok", 0.7)])
        store.write([row(spec, 1e-3, "ok", 0.9)])
        assert stored(store, spec) == {1e-3: ("ok", 0.9)}
        store.write([row(spec, 1e-3, "diverged")])  # a rerun's result is a result
    assert stored(store, spec) == {1e-3: ("diverged", None)}


def test_stored_results_at_other_lrs_stay_unless_the_run_is_replaced(tmp_path):
    store, spec = ResultStore(tmp_path), spec_of(protocol=GRID)
    store.write([row(spec, 1e-3, acc=0.2), row(spec, 3e-3, acc=0.3), row(spec, 1e-2, "error")])
    store.write([row(spec, 1e-2, acc=0.4)])
    assert stored(store, spec) == {1e-3: ("ok", 0.2), 3e-3: ("ok", 0.3), 1e-2: ("ok", 0.4)}
    with pytest.warns(StoreNotice, match="lr 0.003"):
        store.write([row(spec, 1e-2, acc=0.5), row(spec, 3e-3, "error")], replace=True)
    assert stored(store, spec) == {3e-3: ("ok", 0.3), 1e-2: ("ok", 0.5)}


def test_a_failed_force_rerun_keeps_the_stored_result_and_exits_1(tmp_path, monkeypatch):
    """Through the command line: a --force rerun whose training raises."""
    root = tmp_path / "results"
    first = invoke("run", *COPY, "--jobs", 1, "--results", root)
    assert first.exit_code == 0, first.output
    (path,) = ResultStore(root).files()
    before = path.read_bytes()
    monkeypatch.setattr(
        synthbench.run.work,
        "train_eval",
        lambda spec, lr, device, budget, saved: failed_row(spec, lr, device, "RuntimeError: boom"),
    )
    rerun = invoke("run", *COPY, "--jobs", 1, "--results", root, "--force")  # fmt: skip
    assert rerun.exit_code == 1, rerun.output
    assert path.read_bytes() == before  # not even rewritten
    lines = rerun.stderr.strip().splitlines()
    assert any("copy / linear / seed 0" in line and str(path) in line and "kept the stored ok"
               in line and "RuntimeError: boom" in line for line in lines), lines  # fmt: skip
    assert lines[-1] == (
        "error: 1 training failed where a stored result was kept (see the warnings above)"
    )
    assert "done: 1 ok" in rerun.stdout


def test_a_force_rerun_keeps_a_result_where_it_failed_and_selects_again(tmp_path):
    """A grid run: its best lr fails on the rerun; that lr's stored row stays, the other
    lrs take the new rows, and the selection is made again over what is stored."""
    store, spec = ResultStore(tmp_path), spec_of(protocol=GRID)
    first = {1e-3: 0.2, 3e-3: 0.7, 1e-2: 0.4}
    runner.execute([spec], store, lambda n: Executor(lambda u: row(spec, u.lr, acc=first[u.lr])))
    assert stored(store, spec)[3e-3] == ("ok", 0.7)
    second = {1e-3: 0.8, 1e-2: 0.1}

    def rerun(unit):
        return (
            row(spec, unit.lr, "error")
            if unit.lr == 3e-3
            else row(spec, unit.lr, acc=second[unit.lr])
        )

    seen = Notices()
    outcome = runner.execute([spec], store, lambda n: Executor(rerun), force=True, events=seen)
    assert outcome.kept == 1 and outcome.statuses == {"ok": 1}
    assert stored(store, spec) == {1e-3: ("ok", 0.8), 3e-3: ("ok", 0.7), 1e-2: ("ok", 0.1)}
    rows = store.load().rows
    assert rows.loc[rows["selected"], "lr"].tolist() == [1e-3]  # selected again, once
    assert len(seen.lines) == 1 and "kept the stored ok row at lr 0.003" in seen.lines[0]


class Executor:
    """Trains nothing: each unit's row is ``make(unit)``."""

    capacity = 1

    def __init__(self, make):
        self.make, self.queue = make, []

    def submit(self, unit):
        self.queue.append(unit)

    def wait(self):
        unit = self.queue.pop(0)
        return unit, self.make(unit)

    def close(self):
        pass


class Notices(runner.Events):
    def __init__(self):
        self.lines = []

    def notice(self, spec, message):
        self.lines.append(f"{spec.label()}: {message}")


# -- unreadable files and newer schema versions are never overwritten ------------------------


def _garbage(path):
    path.write_text("not parquet\n")


def _truncated(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _foreign(path):  # valid Parquet, not a synthbench file
    pq.write_table(pq.read_table(path).replace_schema_metadata(None), path)


def _folder(path):
    path.unlink()
    (path / "part-0.parquet").parent.mkdir()
    (path / "part-0.parquet").write_text("someone's folder\n")


UNREADABLE = {"garbage": _garbage, "truncated": _truncated, "foreign": _foreign,
              "folder": _folder}  # fmt: skip


def _newer(path, version=999):
    table = pq.read_table(path)
    metadata = {**table.schema.metadata, b"synthbench_schema_version": str(version).encode()}
    pq.write_table(table.replace_schema_metadata(metadata), path)


@pytest.mark.parametrize("case", list(UNREADABLE))
def test_an_unreadable_file_at_a_runs_path_is_moved_aside(tmp_path, case):
    store, spec = ResultStore(tmp_path), spec_of()
    path = store.write([row(spec, 1e-3, acc=0.3)])
    UNREADABLE[case](path)
    before = files_under(path) if path.is_dir() else path.read_bytes()
    with pytest.warns(StoreNotice) as caught:
        store.write([row(spec, 1e-3, acc=0.9)])
    assert stored(store, spec) == {1e-3: ("ok", 0.9)}
    (aside,) = [p for p in path.parent.iterdir() if p != path]
    assert aside.name.startswith(f".{path.name}.unreadable-")
    assert (files_under(aside) if aside.is_dir() else aside.read_bytes()) == before
    (message,) = [str(w.message) for w in caught]
    assert message.startswith(f"{path} could not be read (") and message.endswith(
        f"moved it to {aside}"
    )
    assert store.load().skipped == []  # out of the readers' way


def test_a_newer_schema_file_is_never_overwritten(tmp_path):
    store, spec = ResultStore(tmp_path), spec_of()
    path = store.write([row(spec, 1e-3, acc=0.3)])
    _newer(path)
    before = files_under(tmp_path)
    for replace in (False, True):
        with pytest.raises(NewerSchemaError, match="upgrade synthbench") as caught:
            store.write([row(spec, 1e-3, acc=0.9)], replace=replace)
        assert str(path) in str(caught.value) and "schema version 999" in str(caught.value)
    assert files_under(tmp_path) == before


@pytest.mark.parametrize("force", [False, True])
def test_run_moves_unreadable_files_aside_and_refuses_newer_ones(tmp_path, force):
    """Through the command line: seed 0's file is corrupt, seed 1's of a newer schema, seed
    2 is new. Seeds 0 and 2 are trained; seed 1 is refused, its file untouched; exit 1."""
    root = tmp_path / "results"
    assert invoke("run", *COPY, "--seeds", 2, "--jobs", 1, "--results", root).exit_code == 0
    store = ResultStore(root)
    corrupt, newer = (store.path_for("smoke", "copy", "linear", spec_of(s).run_id) for s in (0, 1))
    _garbage(corrupt)
    _newer(newer, SCHEMA_NEXT)
    garbage, newer_bytes = corrupt.read_bytes(), newer.read_bytes()
    args = ["run", *COPY, "--seeds", 3, "--jobs", 1, "--results", root]
    result = invoke(*args, *(["--force"] if force else []))
    assert result.exit_code == 1, result.output
    assert newer.read_bytes() == newer_bytes
    (aside,) = [p for p in corrupt.parent.iterdir() if ".unreadable-" in p.name]
    assert aside.read_bytes() == garbage
    assert sorted(store.load(warn=False).rows["seed"]) == [0, 2]
    err = result.stderr
    assert f"copy / linear / seed 0: {corrupt} could not be read" in err and str(aside) in err
    assert f"copy / linear / seed 1: refused: {newer} holds results of schema version " \
           f"{SCHEMA_NEXT}" in err and "upgrade synthbench" in err  # fmt: skip
    assert err.strip().splitlines()[-1].startswith("error: 1 run refused")
    assert "done: 2 ok" in result.stdout


# -- claims ---------------------------------------------------------------------------------


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def write_claim(root: Path, run_id: str, pid: int, host: str, age: float = 0.0) -> Path:
    path = root / CLAIMS_DIR / run_id
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": pid, "host": host, "started": "then", "token": "t"}))
    if age:
        os.utime(path, (time.time() - age, time.time() - age))
    return path


@pytest.mark.parametrize(
    "pid, host, age, live",
    [
        ("live", "here", 0, True),  # a live command on this host
        ("dead", "here", 0, False),  # its process is gone: taken over
        ("live", "elsewhere", 0, True),  # cannot be checked: live while its heartbeat goes on
        ("dead", "elsewhere", 0, True),
        ("live", "elsewhere", 601, False),  # no heartbeat for 10 minutes
        ("live", "here", 601, False),  # a reused pid
    ],
)
def test_a_claim_is_taken_over_only_once_stale(tmp_path, pid, host, age, live):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        number = other.pid if pid == "live" else dead_pid()
        name = socket.gethostname() if host == "here" else "elsewhere.example"
        path = write_claim(tmp_path, "abc", number, name, age)
        with Claims(tmp_path) as claims:
            holder = claims.take("abc")
            if live:
                assert holder is not None and holder.pid == number and holder.host == name
                assert str(holder).startswith(f"pid {number} on {name}")
            else:
                assert holder is None
                assert json.loads(path.read_text())["pid"] == os.getpid()
        assert path.exists() == live  # released on close; another's claim is never removed
    finally:
        other.kill()
        other.wait()


def test_claims_are_exclusive_and_released(tmp_path):
    with Claims(tmp_path) as first, Claims(tmp_path) as second:
        assert first.take("abc") is None
        assert first.take("abc") is None  # held already
        holder = second.take("abc")
        assert holder is not None and holder.pid == os.getpid()
        first.release("abc")
        assert second.take("abc") is None
    assert not (tmp_path / CLAIMS_DIR).exists()  # nothing left behind


def test_a_claim_appears_whole_or_not_at_all(tmp_path, monkeypatch):
    """A command killed while claiming leaves no empty claim (which would hold the run for
    the write grace): the claim is written aside and linked into place."""

    def killed(*args):
        raise SystemExit("killed")

    with Claims(tmp_path) as claims:
        monkeypatch.setattr(os, "link", killed)
        with pytest.raises(SystemExit):
            claims.take("abc")
        monkeypatch.undo()
        assert not (tmp_path / CLAIMS_DIR / "abc").exists()
        assert not list((tmp_path / CLAIMS_DIR).iterdir())  # nor the copy written aside
        with Claims(tmp_path) as other:
            assert other.take("abc") is None  # free at once


def test_without_hard_links_a_claim_is_created_in_place(tmp_path, monkeypatch):
    def unsupported(*args):
        raise PermissionError("hard links are not supported here")

    monkeypatch.setattr(os, "link", unsupported)
    with Claims(tmp_path) as first, Claims(tmp_path) as second:
        assert first.take("abc") is None
        assert json.loads((tmp_path / CLAIMS_DIR / "abc").read_text())["pid"] == os.getpid()
        assert second.take("abc") is not None  # still exclusive
        assert [p.name for p in (tmp_path / CLAIMS_DIR).iterdir()] == ["abc"]


# Gates every training of the command that loads it: records which process trained which
# run, and waits for the test to open the gate (the built-in mechanism trains; only the
# trainings' entry point is wrapped, so the run ids are those of `--mech linear`).
GATE = """
import os, pathlib, time
import synthbench.run.work as work

GATE = pathlib.Path({gate!r})
_train = work.train_eval


def gated(spec, lr, device, budget=None, saved=None):
    (GATE / f"trained-{{spec.run_id}}-{{os.getpid()}}").touch()
    while not (GATE / "open").exists():
        time.sleep(0.02)
    return _train(spec, lr, device, budget, saved)


work.train_eval = gated
"""


def gated_command(tmp_path: Path, seeds: int) -> tuple[list[str], Path, Path]:
    gate = tmp_path / "gate"
    gate.mkdir()
    plugin = tmp_path / "gate.py"
    plugin.write_text(GATE.format(gate=str(gate)))
    root = tmp_path / "results"
    command = [sys.executable, "-m", "synthbench.cli", "run", *COPY, "--seeds", str(seeds),
               "--jobs", "1", "--plugin", str(plugin), "--results", str(root)]  # fmt: skip
    return command, root, gate


def trained(gate: Path) -> dict[str, list[int]]:
    """run_id -> the pids of the processes that trained it."""
    found: dict[str, list[int]] = {}
    for marker in gate.glob("trained-*"):
        _, run_id, pid = marker.name.split("-")
        found.setdefault(run_id, []).append(int(pid))
    return found


def wait_until(condition, procs, timeout=120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert all(p.poll() is None for p in procs), "a command ended before the gate opened"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.slow
def test_two_commands_on_one_tree_compute_each_run_once(tmp_path):
    """Both plan all four runs (nothing is stored until the gate opens, which waits until
    each is training one); each run is then trained by exactly one of them."""
    command, root, gate = gated_command(tmp_path, seeds=4)
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=SUBPROCESS_ENV) for _ in range(2)]  # fmt: skip
    try:
        wait_until(lambda: len({p for pids in trained(gate).values() for p in pids}) == 2, procs)
        (gate / "open").touch()
        outputs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    pids = [p.pid for p in procs]
    for p, (stdout, stderr) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, stdout + stderr
        assert "0 already stored, 4 to run" in stdout  # both planned every run
    runs = trained(gate)
    specs = [spec_of(seed) for seed in range(4)]
    assert sorted(runs) == sorted(s.run_id for s in specs)
    assert all(len(by) == 1 for by in runs.values()), runs  # once each
    assert {by[0] for by in runs.values()} == set(pids)  # and both did some
    for pid, (stdout, _) in zip(pids, outputs, strict=True):  # one `ok` line per run it trained
        mine = [s for s in specs if runs[s.run_id] == [pid]]
        assert sum(line.startswith("ok ") for line in stdout.splitlines()) == len(mine)
    skipped = [(pid, line) for pid, (_, stderr) in zip(pids, outputs, strict=True)
               for line in stderr.splitlines() if "skipped: claimed by" in line]  # fmt: skip
    assert skipped, [o[1] for o in outputs]  # the second to claim a run says who has it
    for pid, line in skipped:
        (other,) = set(pids) - {pid}
        assert f"claimed by pid {other} on {socket.gethostname()}" in line
    rows = ResultStore(root).load().rows
    assert sorted(rows["seed"]) == [0, 1, 2, 3] and (rows["status"] == "ok").all()
    assert not (root / CLAIMS_DIR).exists()


@pytest.mark.slow
def test_the_claim_of_a_killed_command_is_taken_over(tmp_path):
    command, root, gate = gated_command(tmp_path, seeds=2)
    killed = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=SUBPROCESS_ENV)  # fmt: skip
    try:
        wait_until(lambda: trained(gate), [killed])
        killed.send_signal(signal.SIGKILL)
    finally:
        killed.kill()
        killed.wait()
    (run_id,) = trained(gate)
    claim = json.loads((root / CLAIMS_DIR / run_id).read_text())
    assert claim["pid"] == killed.pid  # left behind by the kill
    (gate / "open").touch()
    again = subprocess.run(command, capture_output=True, text=True, env=SUBPROCESS_ENV,
                           timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert "claimed" not in again.stderr and "done: 2 ok" in again.stdout
    by = trained(gate)[run_id]
    assert killed.pid in by and len(set(by)) == 2  # trained again, by the second command
    assert len(ResultStore(root).files()) == 2 and not (root / CLAIMS_DIR).exists()


def test_claims_live_outside_what_the_store_reads(tmp_path):
    store, spec = ResultStore(tmp_path), spec_of()
    store.write([row(spec, 1e-3)])
    write_claim(tmp_path, spec.run_id, os.getpid(), socket.gethostname())
    assert len(store.files()) == 1 and store.load().skipped == []
