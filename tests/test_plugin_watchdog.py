"""Plugin code that ends the process it runs in or never returns (issue 73): `check` and
run's leak guard run a plugin's checks in a child process (synthbench/integrity/isolation.py),
so the command says which mechanism ended or hung it and where, and the other mechanisms'
runs still train; `run --max-seconds` turns a training that hangs into a stored error row.

What would end the command's own process runs in a subprocess here (`synthbench` started
by the test), so that on code without the child it fails the test, not the test runner."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from clitools import SMOKE, SUBPROCESS_ENV, assert_error, command_line, invoke
from test_plugin_exits import ATTENTION, line, load, unload

from synthbench.core import children
from synthbench.core.mechanism import MECHANISMS
from synthbench.integrity.causality import Subject
from synthbench.integrity.contract import run_check
from synthbench.integrity.guard import leak_guard
from synthbench.integrity.isolation import CheckProcess, Ended
from synthbench.run.planning import plan
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.store import ResultStore

pytestmark = pytest.mark.usefixtures("single_thread")

PLUGIN = (
    """
import os
import pathlib
import time

import torch.nn.functional as F
from torch import nn

from synthbench import MECHANISMS

# written when a hang begins, with the pid of the process that hangs: a test may press
# Ctrl-C then, or kill the command
ENTERED = pathlib.Path(__file__).with_suffix(".entered")

"""
    + ATTENTION
    + """


@register("ends")
class Ends(Attention):
    def forward(self, q, k, v, causal=True):
        os._exit(5)  # ends


@register("hangs")
class Hangs(Attention):
    def forward(self, q, k, v, causal=True):
        ENTERED.write_text(str(os.getpid()))
        time.sleep(3600)  # hangs


@register("hangs-in-training")
class HangsInTraining(Attention):
    def forward(self, q, k, v, causal=True):
        if q.shape[0] == 16:  # smoke's training batch; the checks' are smaller
            time.sleep(3600)  # hangs in training
        return super().forward(q, k, v, causal)
"""
)
SMOKE_PROTOCOL = PROTOCOLS.get("smoke")


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    path = tmp_path_factory.mktemp("watchdog") / "misbehaving.py"
    load(path, PLUGIN)
    yield path
    unload(path)


def synthbench(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    """``synthbench ARGS`` in a process of its own."""
    return subprocess.run(
        command_line(*args), env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=timeout
    )


def test_check_names_the_check_that_ended_its_process_and_checks_the_rest(plugin):
    done = synthbench("check", "ends,softmax", "--plugin", plugin, "--length", 8)
    assert done.returncode == 1, done.stderr
    assert (
        "FAIL  ends     layout             ended the process it ran in (exit status 5); "
        "the checks after it not run"
    ) in done.stdout
    assert "PASS  softmax  causality " in done.stdout and "PASS  softmax  recurrent " in done.stdout
    assert "Traceback" not in done.stderr and "error:" not in done.stderr


@pytest.mark.parametrize("jobs", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_run_trains_the_others_when_a_leak_check_ends_its_process(plugin, tmp_path, jobs):
    results = tmp_path / "results"
    args = ["run", "--task", "copy", "--mech", "ends,softmax", "--protocol", "smoke"]
    done = synthbench(*args, "--seeds", 1, "--jobs", jobs, "--plugin", plugin, "--results", results)
    assert done.returncode == 1, done.stderr
    warning = (
        "warning: mechanism ends: its leak check ended the process it ran in (exit status 5); "
        "1 run of it stored with status error, not trained "
        f"(synthbench check ends --plugin {plugin}"
    )
    assert warning in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: 1 run not trained: ")
    assert "done: 1 ok" in done.stdout
    rows = ResultStore(results).load(warn=False).rows.set_index("mechanism")
    assert rows.loc["softmax", "status"] == "ok"
    assert rows.loc["ends", "status"] == "error"
    assert rows.loc["ends", "error"] == (
        "not trained: its leak check ended the process it ran in (exit status 5)"
    )


@pytest.mark.parametrize("start", ["forkserver", pytest.param("spawn", marks=pytest.mark.slow)])
def test_check_stops_a_check_that_never_returns_naming_where(plugin, monkeypatch, start):
    """Its child forked by a fork server (where there is one) or spawned (elsewhere)."""
    monkeypatch.setattr(children, "START_METHOD", start)
    result = invoke("check", "hangs", "--plugin", plugin, "--length", 8, "--max-seconds", 3)
    assert result.exit_code == 1, result.output
    assert (
        f"FAIL  hangs  layout             did not return within 3 s, at {plugin}:"
        f"{line('hangs', PLUGIN)} in forward; the checks after it not run"
    ) in result.stdout


def test_the_leak_guard_stores_a_hung_check_as_errors_and_passes_the_rest(plugin, tmp_path):
    specs = plan(["copy"], ["hangs", "softmax"], SMOKE_PROTOCOL, 1)
    store = ResultStore(tmp_path)
    checks = CheckProcess([str(plugin)], limit=3)
    try:
        guarded = leak_guard(specs, store, None, checks)
    finally:
        checks.close()
    where = f"{plugin}:{line('hangs', PLUGIN)} in forward"
    assert guarded.refusal is None
    (ended,) = guarded.ended
    assert ended.startswith(
        f"mechanism hangs: its leak check did not return within 3 s, at {where}"
    )
    assert guarded.stopped == {s.run_id for s in specs if s.mechanism == "hangs"}
    rows = store.load(warn=False).rows
    assert rows["mechanism"].tolist() == ["hangs"] and rows["status"].tolist() == ["error"]


@pytest.mark.slow
def test_a_slow_check_is_said_once_with_where_it_stands(plugin):
    said = []
    checks = CheckProcess([str(plugin)], limit=4, notice=1, on_slow=lambda *a: said.append(a))
    subject = Subject("hangs", {}, 8, 2)
    try:
        with pytest.raises(Ended, match="did not return within 4 s, at "):
            checks.run("the layout check of hangs", ["hangs"], run_check, "layout", subject, [8])
    finally:
        checks.close()
    ((label, seconds, where),) = said
    assert label == "the layout check of hangs" and seconds >= 1
    assert where == f"{plugin}:{line('hangs', PLUGIN)} in forward"


def test_ctrl_c_during_a_plugins_check_names_it(plugin):
    entered = plugin.with_suffix(".entered")
    entered.unlink(missing_ok=True)
    args = command_line("check", "hangs", "--plugin", plugin, "--length", 8)
    process = subprocess.Popen(
        args, env=SUBPROCESS_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while not entered.exists() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.1)
        assert entered.exists(), "the check never started"
        process.send_signal(signal.SIGINT)  # as a terminal's Ctrl-C reaches the command
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert stderr.strip() == (
        "error: interrupted during the layout check of mechanism hangs, at "
        f"{plugin}:{line('hangs', PLUGIN)} in forward"
    )


def running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_the_checks_child_ends_when_its_command_is_killed(plugin):
    """SIGKILL of the command, its plugin's check hanging in the child: the child does not
    outlive it (a fork server's child watches the server, which ends with the command)."""
    entered = plugin.with_suffix(".entered")
    entered.unlink(missing_ok=True)
    args = command_line("check", "hangs", "--plugin", plugin, "--length", 8)
    process = subprocess.Popen(
        args, env=SUBPROCESS_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 120
        while not entered.exists() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.1)
        assert entered.exists(), "the check never started"
        time.sleep(0.2)
        child = int(entered.read_text())
        assert child != process.pid and running(child)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
        deadline = time.monotonic() + 10
        while running(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running(child), "the check's child outlived its command"
    finally:
        process.kill()


@pytest.mark.slow
def test_run_max_seconds_stores_a_hung_training_as_an_error(plugin, tmp_path):
    results = tmp_path / "results"
    args = ["run", "--task", "copy", "--mech", "hangs-in-training,softmax", *SMOKE]
    # a limit well above a smoke training's second or two, which a loaded machine (CI
    # installing beside it) stretched past 3 s: softmax must never be stopped by it
    result = invoke(*args, "--max-seconds", 10, "--plugin", plugin, "--results", results)
    assert result.exit_code == 1, result.output
    assert "error: 1 run raised; their errors are stored" in result.stderr
    rows = ResultStore(results).load(warn=False).rows.set_index("mechanism")
    assert rows.loc["softmax", "status"] == "ok"
    hung = rows.loc["hangs-in-training"]
    assert hung["status"] == "error" and hung["wall_seconds"] >= 10
    assert hung["error"] == (
        f"TimeLimit: stopped after 10 s (--max-seconds), at {plugin}:"
        f"{line('hangs in training', PLUGIN)} in forward"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--max-seconds", 0], "--max-seconds must be > 0 and finite, got 0"),
        (["run", "--max-seconds", "nan"], "--max-seconds must be > 0 and finite, got nan"),
        (["run", "--max-seconds", 5, "--executor", "ray"], "--max-seconds needs the local"),
        (["check", "softmax", "--max-seconds", -1], "--max-seconds must be > 0 and finite"),
    ],
)
def test_max_seconds_is_checked_before_anything_runs(tmp_path, args, message):
    results = tmp_path / "results"
    extra = ["--task", "copy", *SMOKE, "--results", results] if args[0] == "run" else []
    assert_error(invoke(*args, *extra), 2, message)
    assert not results.exists()


def test_built_in_mechanisms_start_no_child():
    """synthbench's own mechanisms are checked in the command's process: no child to pay
    for (a plugin's alone are worth its start)."""
    checks = CheckProcess()
    try:
        checks.start(["softmax", "linear"])
        results = checks.run(
            "x", ["softmax"], run_check, "layout", Subject("softmax", {}, 8, 2), [8]
        )
        assert checks._process is None and results[0].passed
    finally:
        checks.close()


DUMP = """\
Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/x/synthbench/core/children.py", line 60 in watch

Current thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1553 in _call_impl
  File "/home/me/my_plugin.py", line 12 in forward
  File "/x/synthbench/integrity/causality.py", line 190 in call
  File "/x/synthbench/integrity/isolation.py", line 80 in _serve
"""


def test_where_is_the_innermost_frame_of_the_main_thread_outside_the_machinery():
    frames = children._stacks(DUMP, "_serve")
    assert frames[1] == ("/home/me/my_plugin.py", 12, "forward")
    assert children.innermost(frames) == "/home/me/my_plugin.py:12 in forward"
    assert children._stacks(DUMP, "_worker_main") == []  # not written whole yet
    assert children.innermost([]) is None


def test_a_mechanism_registered_in_this_process_alone_is_checked_here(plugin):
    """A plugin's the child cannot know (registered by this process's code, not loaded from
    its file): checked in this process, as before."""
    metadata = MECHANISMS.entry("hangs").metadata
    with MECHANISMS._registering_from("plugin file elsewhere.py", "0123456789abcdef"):
        MECHANISMS.add("only-here", MECHANISMS.get("softmax"), **metadata)
    try:
        checks = CheckProcess([str(plugin)])
        try:
            subject = Subject("only-here", {}, 8, 2)
            (result,) = checks.run("x", ["only-here"], run_check, "layout", subject, [8])
        finally:
            checks.close()
        assert result.passed
    finally:
        MECHANISMS._remove("only-here")
