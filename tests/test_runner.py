"""The runner: what it plans, what it skips, how it streams rows and grows sweeps, and that
every executor (this process, local workers, Ray) stores the same rows."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from clitools import ENV, SUBPROCESS_ENV, command_line
from test_plugin_exits import unload
from typer.testing import CliRunner

from synthbench.cli import app
from synthbench.core import children
from synthbench.core.mechanism import MECHANISMS
from synthbench.core.registry import load_plugin_file
from synthbench.core.task import TASKS
from synthbench.run import provenance, runner
from synthbench.run.clock import Seconds
from synthbench.run.executors import MAX_ATTEMPTS, LocalPool, RayPool
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.runner import Events, Unit
from synthbench.run.schema import lr_key
from synthbench.run.spec import RunSpec
from synthbench.run.store import ResultStore
from synthbench.run.train import blank_row

pytestmark = pytest.mark.usefixtures("single_thread")

CPU = torch.device("cpu")
SMOKE = PROTOCOLS.get("smoke")
GRID = dataclasses.replace(SMOKE, lrs=(1e-3, 3e-3, 1e-2))
# compared across executors: columns a training computes (wall time and stamps differ)
RESULT = ["status", "token_acc", "exact_match", "val_token_acc", "val_exact_match",
          "final_loss", "n_params", "selected", "threads"]  # fmt: skip

# A plugin file with a mechanism and a protocol that trains in a second to mid accuracy:
# rows that are neither at chance nor saturated, so a difference would show.
PLUGIN = """
import torch.nn.functional as F

from synthbench import MECHANISMS, FeatureMapMechanism
from synthbench.run.protocols import PROTOCOLS, Protocol


@MECHANISMS.register("relu-runner-test", complexity="linear", family="feature-map",
                     reference="tests/test_runner.py")
class ReLUFeatures(FeatureMapMechanism):
    def feature_map(self, x, is_query):
        return F.relu(x) + 1e-2

    @property
    def feature_dim(self):
        return self.head_dim


PROTOCOLS.add("tiny-runner-test", Protocol(
    name="tiny-runner-test", version=1, description="tests only", d_model=32, n_heads=2,
    n_layers=1, steps=60, batch_size=16, lrs=(1e-2,), val_examples=32, test_examples=64,
    eval_batch_size=64, seeds=1))
"""


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    """The plugin loaded for this module's tests, and unloaded after them (its mechanism and
    protocol would otherwise show in every later test of the worker)."""
    path = tmp_path_factory.mktemp("plugin") / "runner_test_plugin.py"
    path.write_text(PLUGIN)
    load_plugin_file(path, [TASKS, MECHANISMS])
    yield path
    unload(path)
    PROTOCOLS._remove("tiny-runner-test")


def invoke(*args):
    result = CliRunner().invoke(app, [str(a) for a in args], env=ENV)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def fake_row(spec: RunSpec, lr: float, acc: float, status: str = "ok") -> dict:
    """A complete row as a training would return it, with chosen metrics."""
    row = blank_row(spec, lr)
    if status == "ok":
        row.update(token_acc=acc, exact_match=0.0, val_token_acc=acc, val_exact_match=0.0,
                   final_loss=1.0, n_params=1, steps_done=spec.protocol.steps)  # fmt: skip
    return {**row, "status": status, **provenance.stamp(CPU)}


class FakeExecutor:
    """Trains nothing: each unit's row comes from ``accuracy(unit)``; after ``stop_after``
    rows it raises KeyboardInterrupt (a Ctrl-C in the middle of a suite)."""

    def __init__(self, accuracy, capacity=1, stop_after=None, status=lambda u: "ok"):
        self.accuracy, self.capacity, self.stop_after = accuracy, capacity, stop_after
        self.status = status
        self.queue, self.trained, self.closed = [], [], False

    def submit(self, unit):
        self.queue.append(unit)

    def wait(self):
        if self.stop_after is not None and len(self.trained) >= self.stop_after:
            raise KeyboardInterrupt
        unit = self.queue.pop(0)
        self.trained.append(unit.lr)
        return unit, fake_row(unit.spec, unit.lr, self.accuracy(unit), self.status(unit))

    def close(self):
        self.closed = True


def kv(protocol=SMOKE, seed=0, mech="linear") -> RunSpec:
    return RunSpec.resolve("kv_recall", mech, protocol, seed, {"pairs": 4, "queries": 2})


def stored_rows(root: Path) -> pd.DataFrame:
    report = ResultStore(root).load(warn=False)
    assert report.skipped == []
    return report.rows


# -- plan -----------------------------------------------------------------------------------


def test_plan_resolves_names_once_and_deduplicates_aliases():
    specs = runner.plan(["mqar", "kv_recall"], ["elu", "linear"], SMOKE, 2, threads=1)
    assert [(s.task, s.mechanism, s.seed) for s in specs] == [
        ("kv_recall", "linear", 0),
        ("kv_recall", "linear", 1),
    ]
    assert specs[0].category == "Memory"
    assert specs[1].run_id == RunSpec.resolve("kv_recall", "linear", SMOKE, 1).run_id


@pytest.mark.parametrize("seeds", [0, -1, 1.5, True])
def test_plan_rejects_bad_seed_counts(seeds):
    with pytest.raises(ValueError, match="seeds"):
        runner.plan(["copy"], ["linear"], SMOKE, seeds)


def test_threads_are_in_the_run_id_and_the_rows():
    one, two = (
        kv(),
        RunSpec.resolve("kv_recall", "linear", SMOKE, 0, {"pairs": 4, "queries": 2}, threads=2),
    )
    assert one.run_id != two.run_id and one.config()["threads"] == 1
    assert blank_row(two, 1e-3)["threads"] == 2
    with pytest.raises(ValueError, match="threads"):
        RunSpec.resolve("copy", "linear", SMOKE, 0, threads=0)


def test_training_uses_the_specs_thread_count_and_restores_the_callers(monkeypatch):
    seen = []
    monkeypatch.setattr(
        "synthbench.run.train._train_and_evaluate",
        lambda *args: seen.append(torch.get_num_threads()) or Seconds(),  # none before
    )
    spec = RunSpec.resolve("copy", "linear", SMOKE, 0, threads=3)
    runner.run_sweep(spec, CPU)
    assert seen == [3] and torch.get_num_threads() == 1


# -- execute --------------------------------------------------------------------------------


def test_execute_streams_rows_and_skips_what_is_stored(tmp_path):
    store, specs = ResultStore(tmp_path), [kv(seed=0), kv(seed=1)]
    executor = FakeExecutor(lambda u: 0.5)
    outcome = runner.execute(specs, store, lambda n: executor)
    assert outcome.statuses == {"ok": 2} and outcome.stored == 0 and executor.closed
    rows = stored_rows(tmp_path)
    assert len(rows) == 2 and rows["selected"].all()

    made = []
    outcome = runner.execute(specs, store, lambda n: made.append(n))
    assert outcome.stored == 2 and made == []  # nothing to do: no executor is even built


def test_a_grid_is_split_into_trainings_and_the_best_lr_selected(tmp_path):
    accuracy = {1e-3: 0.2, 3e-3: 0.7, 1e-2: 0.4}
    executor = FakeExecutor(lambda u: accuracy[u.lr], capacity=3)
    runner.execute([kv(GRID)], ResultStore(tmp_path), lambda n: executor)
    rows = stored_rows(tmp_path).sort_values("lr")
    assert rows["lr"].tolist() == [1e-3, 3e-3, 1e-2]
    assert rows["selected"].tolist() == [False, True, False]


def test_a_sweep_grows_while_its_best_lr_sits_at_the_edge(tmp_path):
    growing = dataclasses.replace(GRID, lr_extend=3)
    # accuracy peaks at 0.1: two steps past the grid's top edge
    executor = FakeExecutor(lambda u: 1 - abs(u.lr - 0.1))

    class Seen(Events):
        grown: list = []

        def grew(self, units):
            self.grown += [u.lr for u in units]

    seen = Seen()
    outcome = runner.execute([kv(growing)], ResultStore(tmp_path), lambda n: executor, events=seen)
    up = [1e-2]
    for _ in range(3):  # 0.033 (0.93), 0.11 (0.99), 0.37 (0.73): the best is inside again
        up.append(lr_key(up[-1] * up[-1] / (up[-2] if len(up) > 1 else 3e-3)))
    assert seen.grown == up[1:]
    rows = stored_rows(tmp_path).sort_values("lr")
    assert rows["lr"].tolist() == [1e-3, 3e-3, *up] and outcome.trainings == 6
    assert rows.loc[rows["selected"], "lr"].tolist() == [up[2]]


def test_an_interrupted_sweep_keeps_its_rows_unselected_and_resumes(tmp_path):
    store, spec = ResultStore(tmp_path), kv(GRID)
    accuracy = {1e-3: 0.2, 3e-3: 0.7, 1e-2: 0.4}
    first = FakeExecutor(lambda u: accuracy[u.lr], stop_after=1)
    with pytest.raises(KeyboardInterrupt):
        runner.execute([spec], store, lambda n: first)
    assert first.closed
    rows = stored_rows(tmp_path)
    assert len(rows) == 1 and not rows["selected"].any()  # stored, not yet a result

    second = FakeExecutor(lambda u: accuracy[u.lr])
    runner.execute([spec], store, lambda n: second)
    assert sorted(second.trained) == [3e-3, 1e-2]  # only what was missing
    rows = stored_rows(tmp_path).sort_values("lr")
    assert rows["lr"].tolist() == [1e-3, 3e-3, 1e-2]
    assert rows["selected"].tolist() == [False, True, False]
    assert not list(tmp_path.rglob(".tmp-*"))


def test_an_lr_stored_as_an_error_trains_again(tmp_path):
    store, spec = ResultStore(tmp_path), kv(GRID)
    failing = FakeExecutor(lambda u: 0.5, status=lambda u: "error" if u.lr == 3e-3 else "ok")
    outcome = runner.execute([spec], store, lambda n: failing)
    assert outcome.statuses == {"ok": 1}  # selected among the lrs that worked
    again = FakeExecutor(lambda u: 0.9)
    runner.execute([spec], store, lambda n: again)
    assert again.trained == [3e-3]
    rows = stored_rows(tmp_path)
    assert (rows["status"] == "ok").all() and len(rows) == 3
    assert rows.loc[rows["selected"], "lr"].tolist() == [3e-3]


def test_force_keeps_the_stored_result_until_the_new_one_is_complete(tmp_path):
    store, spec = ResultStore(tmp_path), kv(GRID)
    runner.execute([spec], store, lambda n: FakeExecutor(lambda u: 0.5))
    (path,) = store.files()
    before = path.read_bytes()
    interrupted = FakeExecutor(lambda u: 0.9, stop_after=2)
    with pytest.raises(KeyboardInterrupt):
        runner.execute([spec], store, lambda n: interrupted, force=True)
    assert path.read_bytes() == before
    runner.execute([spec], store, lambda n: FakeExecutor(lambda u: 0.9), force=True)
    assert set(stored_rows(tmp_path)["token_acc"]) == {0.9}


def test_longest_trainings_go_first_when_workers_share_the_queue(tmp_path):
    short = RunSpec.resolve("copy", "linear", SMOKE, 0, {"n": 4})
    long = RunSpec.resolve("copy", "linear", SMOKE, 0, {"n": 32})
    order = [u.spec.task_params["n"] for u in runner.longest_first(
        [Unit(short, 1e-3), Unit(long, 1e-3)])]  # fmt: skip
    assert order == [32, 4]


# -- executors: the same rows whatever runs them ---------------------------------------------

MID = ["--task", "copy,sort", "--task-param", "n=4", "--mech", "linear,relu-runner-test",
       "--protocol", "tiny-runner-test", "--seeds", "1"]  # fmt: skip


@pytest.fixture(scope="module")
def sequential_rows(plugin, tmp_path_factory):
    root = tmp_path_factory.mktemp("sequential")
    result = invoke("run", *MID, "--plugin", plugin, "--results", root, "--jobs", 1)
    assert result.exit_code == 0, result.output
    assert "at once" not in result.output  # one training at a time, in this process
    rows = stored_rows(root).set_index("run_id").sort_index()
    assert len(rows) == 4
    mid = rows[(rows["token_acc"] > 0.2) & (rows["token_acc"] < 0.99)]
    assert "relu-runner-test" in set(mid["mechanism"]), rows[["mechanism", "token_acc"]]
    return rows


@pytest.mark.slow
@pytest.mark.parametrize(
    "start",
    [
        pytest.param("forkserver", marks=pytest.mark.skipif(
            "forkserver" not in multiprocessing.get_all_start_methods(), reason="no fork server"
        )),
        "spawn",  # where there is no fork server
    ],
)  # fmt: skip
def test_local_workers_store_the_same_rows_as_one_process(
    plugin, sequential_rows, tmp_path, monkeypatch, start
):
    monkeypatch.setattr(children, "START_METHOD", start)
    result = invoke("run", *MID, "--plugin", plugin, "--results", tmp_path, "--jobs", 2)
    assert result.exit_code == 0, result.output
    assert "2 at once" in result.output
    rows = stored_rows(tmp_path).set_index("run_id").sort_index()
    pd.testing.assert_frame_equal(rows[RESULT], sequential_rows[RESULT])


# a command's first child starts its fork server: a script per case, so that no server
# started earlier (this test process's) decides what it loaded
FORKED = """
import gc
import sys
from synthbench.core import children
from synthbench.run import executors


def loaded(conn):
    modules = sorted(m for m in ("torch", "torch._dynamo") if m in sys.modules)
    conn.send((modules, gc.get_freeze_count() > 0))


if __name__ == "__main__":
    if sys.argv[1] == "trains":
        executors.expect_local_workers()
    mine, theirs = children.context().Pipe()
    child = children.context().Process(target=loaded, args=(theirs,))
    child.start()
    print(mine.recv())
    child.join()
"""


@pytest.mark.slow
@pytest.mark.skipif(
    "forkserver" not in multiprocessing.get_all_start_methods(), reason="no fork server"
)
@pytest.mark.parametrize(
    ("children_do", "loaded"),
    [("trains", ["torch", "torch._dynamo"]), ("checks", ["torch"])],
)
def test_a_forked_worker_starts_with_what_a_training_loads(tmp_path, children_do, loaded):
    """torch._dynamo, which a training's first optimizer imports (about 2.4 CPU-s), is
    loaded once by the fork server of a command that trains in workers, not by every worker
    it forks; a command whose children only run checks never loads it. Either way the child
    starts with what the server loaded frozen out of the garbage collector's sight
    (synthbench/core/fork_server_ready.py)."""
    script = tmp_path / "forked.py"
    script.write_text(FORKED)
    done = subprocess.run(
        [sys.executable, script, children_do], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str((loaded, True))


@pytest.mark.ray
def test_ray_stores_the_same_rows_as_one_process(plugin, sequential_rows, tmp_path):
    pytest.importorskip("ray", reason='the Ray extra: pip install "synthbench[ray]"')
    result = invoke(
        "run", *MID, "--plugin", plugin, "--results", tmp_path, "--executor", "ray", "--jobs", 2
    )
    assert result.exit_code == 0, result.output
    rows = stored_rows(tmp_path).set_index("run_id").sort_index()
    pd.testing.assert_frame_equal(rows[RESULT], sequential_rows[RESULT])


DIES = """
import os, pathlib, signal
import torch.nn.functional as F
from synthbench import MECHANISMS, FeatureMapMechanism

DIED = pathlib.Path({marker!r})


class Features(FeatureMapMechanism):
    def feature_map(self, x, is_query):
        return F.elu(x) + 1

    @property
    def feature_dim(self):
        return self.head_dim


@MECHANISMS.register("dies-once{suffix}", complexity="linear", family="test", reference="test")
class DiesOnce(Features):
    def feature_map(self, x, is_query):
        if not DIED.exists():  # the first training anywhere kills its own process
            DIED.write_text("")
            os.kill(os.getpid(), signal.SIGKILL)
        return super().feature_map(x, is_query)


@MECHANISMS.register("always-dies{suffix}", complexity="linear", family="test",
                     reference="test")
class AlwaysDies(Features):
    def feature_map(self, x, is_query):
        os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_a_lost_worker_is_replaced_and_its_training_retried(tmp_path, executor):
    """A worker killed (SIGKILL) in the middle of a training: the training runs again, and
    is stored once; one that kills every worker it runs on ends as an error row."""
    if executor == "ray":
        pytest.importorskip("ray", reason='the Ray extra: pip install "synthbench[ray]"')
    plugin, marker, suffix = tmp_path / "dies.py", tmp_path / "died", f"-{executor}-test"
    plugin.write_text(DIES.format(marker=str(marker), suffix=suffix))
    load_plugin_file(plugin, [TASKS, MECHANISMS])
    once = RunSpec.resolve("copy", f"dies-once{suffix}", SMOKE, 0, {"n": 4})
    always = RunSpec.resolve("copy", f"always-dies{suffix}", SMOKE, 0, {"n": 4})
    store = ResultStore(tmp_path / "results")
    if executor == "local":
        pool = LocalPool([CPU, CPU], [plugin])
    else:
        pool = RayPool(None, [plugin], cpus=1, jobs=2)
    outcome = runner.execute([once, always], store, lambda n: pool)
    assert marker.exists()  # it did die once
    rows = stored_rows(tmp_path / "results").set_index("mechanism")
    assert len(rows) == 2  # one row each: no duplicate from the retry
    assert rows.loc[f"dies-once{suffix}", "status"] == "ok"
    lost = rows.loc[f"always-dies{suffix}"]
    assert lost["status"] == "error"
    if executor == "local":
        assert f"died (signal 9) {MAX_ATTEMPTS} times" in lost["error"]
    else:
        assert "WorkerCrashedError" in lost["error"] or "died" in lost["error"], lost["error"]
    assert outcome.statuses == {"ok": 1, "error": 1}


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_a_lost_worker_retries_its_whole_pack(tmp_path, executor):
    """Packed trainings (two seeds of one run) whose worker is killed: the pack trains again
    and each training is stored once; a pack that kills every worker it runs on ends as an
    error row for each of its trainings."""
    if executor == "ray":
        pytest.importorskip("ray", reason='the Ray extra: pip install "synthbench[ray]"')
    plugin, marker = tmp_path / "dies.py", tmp_path / "died"
    suffix = f"-{executor}-pack-test"
    plugin.write_text(DIES.format(marker=str(marker), suffix=suffix))
    load_plugin_file(plugin, [TASKS, MECHANISMS])
    specs = [
        RunSpec.resolve("copy", f"{name}{suffix}", SMOKE, seed, {"n": 4})
        for name in ("dies-once", "always-dies")
        for seed in (0, 1)
    ]
    store = ResultStore(tmp_path / "results")
    if executor == "local":
        pool = LocalPool([CPU, CPU], [plugin])
    else:
        pool = RayPool(None, [plugin], cpus=1, jobs=2)
    outcome = runner.execute(specs, store, lambda n: pool, pack=2)
    assert marker.exists()
    rows = stored_rows(tmp_path / "results")
    assert len(rows) == 4  # one row per training: no duplicate from the retry
    statuses = rows.groupby("mechanism")["status"].apply(sorted).to_dict()
    assert statuses == {f"dies-once{suffix}": ["ok", "ok"], f"always-dies{suffix}": ["error"] * 2}
    assert outcome.statuses == {"ok": 2, "error": 2}


# -- packed training through the runner ------------------------------------------------------


class PackRecorder:
    """Trains nothing, like FakeExecutor, but takes packs too: records what each submission
    held and how many were out at once."""

    def __init__(self, accuracy, capacity=1):
        self.accuracy, self.capacity = accuracy, capacity
        self.submissions, self.queue, self.ready, self.most_out = [], [], [], 0

    def submit(self, work):
        units = list(getattr(work, "units", [work]))
        self.submissions.append(units)
        self.queue.append(list(units))
        self.most_out = max(self.most_out, len(self.queue) + bool(self.ready))

    def wait(self):
        if not self.ready:
            self.ready = self.queue.pop(0)
        unit = self.ready.pop(0)
        return unit, fake_row(unit.spec, unit.lr, self.accuracy(unit))

    def close(self):
        pass


def test_trainings_that_differ_in_seed_and_lr_go_out_as_packs(tmp_path):
    """pack=4: the six trainings of two seeds x three lrs of one run go out as a pack of
    four then one of two; another task's trainings are never in the same pack; the
    executor's capacity counts packs, not trainings; every row is stored and selected."""
    accuracy = {1e-3: 0.2, 3e-3: 0.7, 1e-2: 0.4}
    specs = [kv(GRID, seed=0), kv(GRID, seed=1), RunSpec.resolve("copy", "linear", GRID, 0)]
    executor = PackRecorder(lambda u: accuracy[u.lr], capacity=1)
    outcome = runner.execute(specs, ResultStore(tmp_path), lambda n: executor, pack=4)
    sizes = [len(units) for units in executor.submissions]
    assert sorted(sizes) == [2, 3, 4] and executor.most_out == 1
    for units in executor.submissions:
        assert len({(u.spec.task, u.spec.mechanism) for u in units}) == 1
        assert len({u.key for u in units}) == len(units)
    assert outcome.statuses == {"ok": 3} and outcome.trainings == 9
    rows = stored_rows(tmp_path)
    assert len(rows) == 9
    assert sorted(rows.loc[rows["selected"], "lr"]) == [3e-3] * 3


def test_pack_one_submits_single_trainings(tmp_path):
    executor = PackRecorder(lambda u: 0.5)
    runner.execute([kv(GRID, seed=0), kv(GRID, seed=1)], ResultStore(tmp_path),
                   lambda n: executor, pack=1)  # fmt: skip
    assert [len(units) for units in executor.submissions] == [1] * 6


PACKED = [*MID[:-1], "2"]  # two seeds: a pack of the two trainings of each (task, mechanism)


@pytest.fixture(scope="module")
def unpacked_rows(plugin, tmp_path_factory):
    root = tmp_path_factory.mktemp("unpacked")
    result = invoke("run", *PACKED, "--plugin", plugin, "--results", root, "--jobs", 1)
    assert result.exit_code == 0, result.output
    return stored_rows(root).set_index("run_id").sort_index()


@pytest.mark.parametrize(
    "executor",
    [
        "in-process",
        pytest.param("local", marks=pytest.mark.slow),
        pytest.param("ray", marks=pytest.mark.ray),
    ],
)
def test_packed_runs_store_the_rows_of_separate_trainings(
    plugin, unpacked_rows, tmp_path, executor
):
    """`run --pack 2` on every executor, with a built-in mechanism and a plugin's: the rows
    of the trainings run one at a time, within float32 tolerance (a batched kernel sums in
    another order), statuses and selections exactly."""
    how = {"in-process": ["--jobs", 1], "local": ["--jobs", 2], "ray": ["--executor", "ray"]}
    if executor == "ray":
        pytest.importorskip("ray", reason='the Ray extra: pip install "synthbench[ray]"')
    result = invoke(
        "run", *PACKED, "--plugin", plugin, "--results", tmp_path, *how[executor], "--pack", 2
    )
    assert result.exit_code == 0, result.output
    rows = stored_rows(tmp_path).set_index("run_id").sort_index()
    assert len(rows) == len(unpacked_rows) == 8
    exact = ["status", "selected", "n_params", "threads", "steps_done"]
    pd.testing.assert_frame_equal(rows[exact], unpacked_rows[exact])
    close = ["token_acc", "exact_match", "val_token_acc", "final_loss"]
    pd.testing.assert_frame_equal(rows[close], unpacked_rows[close], rtol=1e-3, atol=2e-3)


def shown_on_stderr(message, category, filename, lineno, file=None, line=None):
    """Python's own way of showing a warning, which pytest replaces to record them."""
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


# the command in this process (the fast tier), or in a process of its own, where --jobs 2's
# worker says it (the slow tier)
@pytest.mark.parametrize(
    "jobs",
    [
        "in-process",
        pytest.param("1", marks=pytest.mark.slow),
        pytest.param("2", marks=pytest.mark.slow),
    ],
)
def test_a_mechanism_that_cannot_pack_is_said_in_one_line(tmp_path, jobs):
    """linear's CPU scan has no vmap rule: its trainings run one at a time, and the command
    (or its worker) says so in one line, not Python's file, line and source line."""
    args = ["run", "--task", "copy", "--mech", "linear", "--protocol", "smoke", "--seeds", "2",
            "--task-param", "n=64", "--pack", "2", "--results", str(tmp_path)]  # fmt: skip
    if jobs == "in-process":
        with warnings.catch_warnings():
            warnings.simplefilter("always")  # a second warning would show as a second line
            warnings.showwarning = shown_on_stderr
            result = invoke(*args, "--jobs", "1")
        code, stderr = result.exit_code, result.stderr
    else:
        command = command_line(*args, "--jobs", jobs)
        done = subprocess.run(command, capture_output=True, text=True, env=SUBPROCESS_ENV)
        code, stderr = done.returncode, done.stderr
    assert code == 0, stderr
    said = [line for line in stderr.splitlines() if "cannot be packed" in line]
    assert len(said) == 1 and said[0].startswith("warning: packed training: linear"), said
    assert "train_packed(" not in stderr
    assert len(stored_rows(tmp_path)) == 2


@pytest.mark.parametrize("value", ["0", "65"])
def test_pack_out_of_range_is_refused_in_one_line(tmp_path, value):
    result = invoke("run", "--task", "copy", "--mech", "linear", "--protocol", "smoke",
                    "--results", tmp_path, "--pack", value)  # fmt: skip
    assert result.exit_code == 2
    assert "--pack must be in [1, 64]" in result.output
    assert not list(tmp_path.rglob("*.parquet"))


# -- SIGKILL of the driver -------------------------------------------------------------------

SLOW = """
import time
import torch.nn.functional as F
from synthbench import MECHANISMS, FeatureMapMechanism


@MECHANISMS.register("slow-runner-test", complexity="linear", family="test", reference="test")
class Slow(FeatureMapMechanism):
    def feature_map(self, x, is_query):
        time.sleep(0.01)
        return F.elu(x) + 1

    @property
    def feature_dim(self):
        return self.head_dim
"""


def slow_suite(tmp_path: Path, executor: str = "local") -> tuple[list[str], Path]:
    """The command of 8 slow smoke runs on 2 workers, and its results tree."""
    plugin, root = tmp_path / "slow.py", tmp_path / "results"
    plugin.write_text(SLOW)
    command = command_line("run", "--task", "copy,sort", "--task-param", "n=4",
                           "--mech", "slow-runner-test", "--protocol", "smoke", "--seeds", "4",
                           "--plugin", plugin, "--results", root, "--executor", executor,
                           "--jobs", "2")  # fmt: skip
    return command, root


def wait_for_files(proc: subprocess.Popen, root: Path, n: int = 2) -> list[int]:
    """Wait until ``n`` runs are stored; return the driver's descendant processes then."""
    deadline = time.monotonic() + 180
    while len(ResultStore(root).files()) < n:
        assert proc.poll() is None, "the run ended before it could be stopped"
        assert time.monotonic() < deadline, "no results appeared"
        time.sleep(0.01)
    return descendants(proc.pid)


def resume_completes(command: list[str], root: Path, n_before: int) -> None:
    """The same command again stores the rest: every run once, no temporary left."""
    resumed = subprocess.run(command, capture_output=True, text=True, env=SUBPROCESS_ENV,
                             timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"{n_before} already stored, {8 - n_before} to run" in resumed.stdout
    files = ResultStore(root).files()
    assert len(files) == 8 and not list(root.rglob(".tmp-*"))
    for path in files:
        rows = pq.read_table(path).to_pandas()
        assert len(rows) == 1 and (rows["run_id"] == path.stem).all(), path
    loaded = ResultStore(root).load(warn=False)
    assert loaded.skipped == []  # nothing torn or half-written that the readers leave out
    rows = loaded.rows
    assert rows["run_id"].is_unique and (rows["status"] == "ok").all()
    every_run = [(task, seed) for task in ("copy", "sort") for seed in range(4)]
    assert sorted(zip(rows["task"], rows["seed"], strict=True)) == every_run


def descendants(pid: int) -> list[int]:
    """The processes descending from ``pid`` (Linux /proc): its children, theirs, and so on
    (the local workers are the children of a fork server, itself the driver's child)."""
    parent_of = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent_of[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = [], [pid]
    while frontier:
        below = [child for child, parent in parent_of.items() if parent in frontier]
        found += below
        frontier = below
    return found


def all_gone(pids: list[int], timeout: float = 10) -> bool:
    """Whether every one of ``pids`` has exited within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(alive(pid) for pid in pids)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process tree from /proc")
@pytest.mark.parametrize("executor", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_sigkill_of_the_driver_then_the_same_command_resumes(tmp_path, executor):
    if executor == "ray":
        pytest.importorskip("ray", reason='the Ray extra: pip install "synthbench[ray]"')
    command, root = slow_suite(tmp_path, executor)
    proc = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=SUBPROCESS_ENV
    )
    try:
        workers = wait_for_files(proc, root)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    n_before = len(ResultStore(root).files())
    assert 2 <= n_before < 8
    if executor == "local":  # the workers notice and exit
        assert workers and all_gone(workers)
    resume_completes(command, root, n_before)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process tree from /proc")
def test_ctrl_c_stops_the_workers_keeps_finished_runs_and_resumes(tmp_path):
    command, root = slow_suite(tmp_path)
    # a terminal's Ctrl-C goes to the whole foreground process group: workers too
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=SUBPROCESS_ENV, start_new_session=True)  # fmt: skip
    try:
        workers = wait_for_files(proc, root)
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert stderr.strip().splitlines() == [
        "error: interrupted; finished trainings are stored, run the same command to resume"
    ]
    assert workers and all_gone(workers)
    assert not list(root.rglob(".tmp-*"))
    resume_completes(command, root, len(ResultStore(root).files()))
