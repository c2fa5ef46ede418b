"""Checkpoints of a training in progress (synthbench/run/checkpoint.py): a training killed
half-way resumes from its last checkpoint and stores the row it would have stored without
the interruption, every metric equal, its wall and CPU time counting both parts."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from synthbench.core import interrupts
from synthbench.run import checkpoint, clock, runner, train
from synthbench.run.executors import InProcess
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.spec import RunSpec
from synthbench.run.store import ResultStore

pytestmark = pytest.mark.usefixtures("single_thread")

CPU = torch.device("cpu")
LR = 3e-3
# columns that differ between two trainings of the same run whatever they computed
STAMPS = {*clock.COLUMNS, "created_at"}


def spec_of(task: str, mech: str, protocol: str, steps: int = 30) -> RunSpec:
    """A short training with several learning-curve points before and after a checkpoint."""
    short = dataclasses.replace(PROTOCOLS.get(protocol), steps=steps)
    return RunSpec.resolve(task, mech, short, 0)


def same_result(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for column in a.keys() - STAMPS:
        x, y = a[column], b[column]
        if isinstance(x, list | tuple | np.ndarray):  # the learning curve
            assert list(x) == list(y), column
        else:
            assert x == y or (x != x and y != y), column  # NaN: no long test, say


def interrupt_after(monkeypatch, saves: int) -> list[int]:
    """Every step ends with a checkpoint; the ``saves``-th one is followed by a Ctrl-C: a
    real SIGINT to this process, the user's, which a training raises again instead of
    storing it as an error (a bare KeyboardInterrupt would be code's where this process
    counts SIGINTs, as it does once a command-line test ran in it: core/interrupts.py)."""
    monkeypatch.setattr(checkpoint, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr(interrupts, "_received", 0)  # counted for this test only
    real, done = checkpoint.save, []

    def save_then_stop(*args):
        written = real(*args)
        done.append(1)
        if len(done) == saves:
            os.kill(os.getpid(), signal.SIGINT)
        return written

    monkeypatch.setattr(checkpoint, "save", save_then_stop)
    return done


@pytest.mark.parametrize(
    ("task", "mech", "protocol"),
    [  # the fast tier resumes one training; the slow tier the block track's and performer's
        ("copy", "softmax", "smoke"),
        pytest.param("kv_recall", "deltanet", "smoke-block", marks=pytest.mark.slow),
        # random features, drawn as the model is built
        pytest.param("copy", "performer", "smoke", marks=pytest.mark.slow),
    ],
)
def test_an_interrupted_training_resumes_to_the_row_it_would_have_had(
    task, mech, protocol, tmp_path, monkeypatch
):
    spec = spec_of(task, mech, protocol)
    whole = train.train_eval(spec, LR, CPU)
    path = tmp_path / "training.pt"
    interrupt_after(monkeypatch, saves=17)
    with pytest.raises(KeyboardInterrupt):
        train.train_eval(spec, LR, CPU, saved=path)
    state = torch.load(path, weights_only=True)
    assert state["step"] == 17 and state["seconds"] > 0 and state["cpu_seconds"] > 0
    monkeypatch.undo()
    resumed = train.train_eval(spec, LR, CPU, saved=path)
    assert resumed["status"] == "ok"
    same_result(whole, resumed)
    # the time before the stop counts, on both clocks
    assert resumed["wall_seconds"] >= state["seconds"]
    assert resumed["cpu_seconds"] >= state["cpu_seconds"]


def test_a_checkpoint_without_cpu_time_leaves_the_rows_cpu_seconds_unknown(tmp_path, monkeypatch):
    """A checkpoint written before rows had cpu_seconds holds the wall seconds only: the
    resumed row counts them, and its CPU time, half unmeasured, is null, not the half."""
    spec = spec_of("copy", "softmax", "smoke")
    path = tmp_path / "training.pt"
    interrupt_after(monkeypatch, saves=10)
    with pytest.raises(KeyboardInterrupt):
        train.train_eval(spec, LR, CPU, saved=path)
    monkeypatch.undo()
    state = torch.load(path, weights_only=True)
    del state["cpu_seconds"]
    state["seconds"] = 1e4  # as if the first part had taken hours: it counts
    torch.save(state, path)
    resumed = train.train_eval(spec, LR, CPU, saved=path)
    assert resumed["status"] == "ok" and resumed["wall_seconds"] > 1e4
    assert resumed["cpu_seconds"] is None


def scripted_rise(monkeypatch) -> None:
    """Every curve point's validation token accuracy set to step / 100, the training itself
    real: a curve that still rises at every end of its schedule (recipe v2)."""
    real = train.curve_point

    def rising(row, protocol, budget, step, val_metrics):
        val_metrics["token_acc"] = step / 100
        return real(row, protocol, budget, step, val_metrics)

    monkeypatch.setattr(train, "curve_point", rising)


@pytest.mark.parametrize(
    ("saves", "horizon"),
    [  # killed before the first extension, in the 1st (the slow tier), the 2nd
        (15, 20),
        pytest.param(25, 30, marks=pytest.mark.slow),
        (35, 40),
    ],
)
def test_a_training_killed_in_an_extension_resumes_on_its_own_schedule(
    saves, horizon, tmp_path, monkeypatch
):
    """A training extended past its 20 steps (its curve still rising: 20 -> 30 -> 40, the
    cap) resumes with its schedule's end and its lr as they were: the same row."""
    extending = dataclasses.replace(PROTOCOLS.get("smoke"), max_steps=40, rise_margin=0.01)
    spec = RunSpec.resolve("copy", "softmax", extending, 0)
    scripted_rise(monkeypatch)
    whole = train.train_eval(spec, LR, CPU)
    assert whole["status"] == "ok" and whole["steps_done"] == 40
    path = tmp_path / "training.pt"
    interrupt_after(monkeypatch, saves=saves)
    with pytest.raises(KeyboardInterrupt):
        train.train_eval(spec, LR, CPU, saved=path)
    state = torch.load(path, weights_only=True)
    assert (state["step"], state["horizon"]) == (saves, horizon)
    monkeypatch.undo()
    scripted_rise(monkeypatch)
    same_result(whole, train.train_eval(spec, LR, CPU, saved=path))


DROPPED_CTRL_C = """
import os, signal
from synthbench.core import interrupts
interrupts.count_interrupts()  # as the command line does

class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C
        for _ in range(3):  # Python raises it here, at a loop's turn, and drops it
            pass

Finalized()
print("went on", interrupts._received, flush=True)
interrupts.raise_pending()
"""


def test_a_ctrl_c_python_drops_in_a_finalizer_still_stops_the_training(monkeypatch):
    """Python drops what a finalizer or a weakref callback raises: a Ctrl-C that lands in
    one (a module lock's callback, as a training's first step imports torch._dynamo) must
    still stop the training, and is not printed as an ignored exception."""
    done = subprocess.run([sys.executable, "-c", DROPPED_CTRL_C], capture_output=True, text=True)
    assert done.stdout == "went on 1\n", done.stderr  # dropped where it was raised
    assert "Exception ignored" not in done.stderr, done.stderr
    assert done.returncode == -signal.SIGINT  # raised again: Python's exit on Ctrl-C
    monkeypatch.setattr(interrupts, "_received", 1)  # as after that Ctrl-C, in this process
    previous = signal.signal(signal.SIGINT, interrupts._count)  # counted, as it was there
    try:
        with pytest.raises(KeyboardInterrupt):
            train.train_eval(spec_of("copy", "softmax", "smoke"), LR, CPU)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_checkpoint_of_another_training_or_a_torn_file_is_not_resumed(tmp_path, monkeypatch):
    spec = spec_of("copy", "softmax", "smoke")
    whole = train.train_eval(spec, LR, CPU)
    path = tmp_path / "training.pt"
    interrupt_after(monkeypatch, saves=10)
    with pytest.raises(KeyboardInterrupt):
        train.train_eval(spec, 1e-2, CPU, saved=path)  # another lr's checkpoint
    monkeypatch.undo()
    same_result(whole, train.train_eval(spec, LR, CPU, saved=path))
    path.write_bytes(b"not a checkpoint")
    same_result(whole, train.train_eval(spec, LR, CPU, saved=path))


def test_a_checkpoint_is_only_resumed_with_the_arithmetic_that_wrote_it(tmp_path, monkeypatch):
    """Another CPU instruction set or model (a results tree on shared storage, resumed
    elsewhere) or another torch build sums in another order: its checkpoint is not taken
    up."""
    path = tmp_path / "training.pt"
    here = checkpoint.identity("run", LR, None, CPU)
    assert checkpoint.save(path, here, {"step": 3})
    assert checkpoint.load(path, here)["step"] == 3
    monkeypatch.setattr(checkpoint, "cpu_isa", lambda: "another instruction set")
    assert checkpoint.load(path, checkpoint.identity("run", LR, None, CPU)) is None
    monkeypatch.undo()
    monkeypatch.setattr(checkpoint, "cpu_model", lambda: "another CPU model")
    assert checkpoint.load(path, checkpoint.identity("run", LR, None, CPU)) is None
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert checkpoint.load(path, checkpoint.identity("run", LR, None, CPU)) is None


def test_nowhere_to_write_a_checkpoint_leaves_the_result_as_it_is(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "CHECKPOINT_SECONDS", 0.0)
    spec = spec_of("copy", "softmax", "smoke")
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    row = train.train_eval(spec, LR, CPU, saved=blocked / "training.pt")  # its folder is a file
    monkeypatch.undo()
    same_result(train.train_eval(spec, LR, CPU), row)


def test_the_runner_resumes_a_killed_training_and_deletes_its_checkpoint(tmp_path, monkeypatch):
    spec = spec_of("copy", "softmax", "smoke")  # one lr: one training a run
    (lr,) = spec.protocol.lrs
    reference = ResultStore(tmp_path / "whole")
    runner.execute([spec], reference, lambda n: InProcess(CPU))
    store = ResultStore(tmp_path / "results")
    interrupt_after(monkeypatch, saves=12)
    with pytest.raises(KeyboardInterrupt):
        runner.execute([spec], store, lambda n: InProcess(CPU))
    folder = store.root / checkpoint.FOLDER
    assert [p.name for p in folder.iterdir()] == [f"{spec.run_id}-lr{lr!r}.pt"]
    assert store.load(warn=False).rows.empty  # nothing stored, and the folder is no result
    monkeypatch.undo()
    runner.execute([spec], store, lambda n: InProcess(CPU))
    assert not list(folder.iterdir())  # its row is stored: the checkpoint is gone
    (a,) = reference.load(warn=False).rows.to_dict("records")
    (b,) = store.load(warn=False).rows.to_dict("records")
    same_result(a, b)
