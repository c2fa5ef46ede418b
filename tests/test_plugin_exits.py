"""Plugin code that raises what is not an Exception (issue 32): sys.exit(), a KeyboardInterrupt
of its own, a BaseException subclass. `check` reports it as the check's failure, `run`
stores the run as failed naming the file and line, and neither exits silently; the user's
Ctrl-C still interrupts (synthbench/core/interrupts.py)."""

from __future__ import annotations

import signal
import sys
import textwrap

import pytest
from clitools import SMOKE, assert_error, invoke

from synthbench.core import interrupts
from synthbench.core.mechanism import MECHANISMS
from synthbench.core.registry import load_plugin_file
from synthbench.core.task import TASKS
from synthbench.run.store import ResultStore

PLUGIN = """
from torch import nn
from synthbench import MECHANISMS


class Custom(BaseException):
    pass


def exiting(name, raised):
    @MECHANISMS.register(name, complexity="quadratic", family="test", reference="none")
    class Exits(nn.Module):
        def __init__(self, head_dim, n_heads):
            super().__init__()
            self.proj = nn.Linear(head_dim, head_dim)

        def forward(self, q, k, v, causal=True):
            raise raised  # line 17


exiting("exits-3", SystemExit(3))
exiting("exits-0", SystemExit(0))
exiting("interrupts", KeyboardInterrupt())
exiting("custom-exit", Custom("mine"))


@MECHANISMS.register("exits-in-init", complexity="quadratic", family="test", reference="none")
class ExitsInInit(nn.Module):
    def __init__(self, head_dim, n_heads):
        raise SystemExit(4)  # line 29
"""
RAISED = {
    "exits-3": ("SystemExit: 3", "SystemExit(3)"),
    "exits-0": ("SystemExit: 0", "SystemExit(0)"),
    "interrupts": ("KeyboardInterrupt", "KeyboardInterrupt()"),
    "custom-exit": ("Custom: mine", "Custom('mine')"),
}


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    path = tmp_path_factory.mktemp("plugin") / "exiting_mechanisms.py"
    path.write_text(textwrap.dedent(PLUGIN).lstrip())
    load_plugin_file(path, [TASKS, MECHANISMS])
    yield path
    for entry in list(MECHANISMS.entries()):
        if str(path) in entry.source:
            MECHANISMS._remove(entry.name)
    for name in [m for m, module in sys.modules.items() if module and "exiting_mech" in m]:
        del sys.modules[name]


@pytest.fixture(autouse=True)
def no_sigint_yet(monkeypatch):
    """As a command that has received no Ctrl-C."""
    monkeypatch.setattr(interrupts, "_received", 0)


@pytest.mark.parametrize("name", sorted(RAISED))
def test_check_reports_what_a_forward_raised_as_a_failed_check(plugin, name):
    result = invoke("check", name, "--plugin", plugin)
    assert result.exit_code == 1, result.output
    check_text, _ = RAISED[name]
    assert f"FAIL  {name}  layout" in result.stdout
    assert f"raised {check_text} (float64, length" in result.stdout


@pytest.mark.parametrize("jobs", [1, 2])
def test_run_stores_the_run_as_failed_naming_the_plugin(plugin, tmp_path, jobs):
    names = sorted(RAISED)
    results = tmp_path / "results"
    args = ["run", "--task", "copy", "--mech", ",".join(names), "--protocol", "smoke"]
    args += ["--seeds", 1, "--jobs", jobs, "--results", results, "--plugin", plugin]
    result = invoke(*args)
    assert result.exit_code == 1, result.output
    assert f"error: {len(names)} runs raised; their errors are stored" in result.stderr
    rows = ResultStore(results).load(warn=False).rows.set_index("mechanism")
    assert sorted(rows.index) == names and set(rows["status"]) == {"error"}
    for name, (_, raised) in RAISED.items():
        assert rows.loc[name, "error"] == f"{raised} raised at {plugin}:17", rows.loc[name]


def test_a_constructor_that_exits_is_a_one_line_error_naming_it(plugin, tmp_path):
    message = f"mechanism exits-in-init cannot be built: SystemExit(4) raised at {plugin}:29"
    for command in ("check", "run"):
        args = [command, "--mech" if command == "run" else "", "exits-in-init"]
        args = [a for a in args if a] + ["--plugin", plugin]
        if command == "run":
            args += [*SMOKE, "--task", "copy", "--results", tmp_path / "results"]
        assert_error(invoke(*args), 2, message)


def test_a_keyboard_interrupt_is_the_users_only_after_a_sigint(monkeypatch):
    interrupts.count_interrupts()
    assert signal.getsignal(signal.SIGINT) is interrupts._count
    assert not interrupts.from_user(KeyboardInterrupt())  # raised by code: no SIGINT came
    assert not interrupts.from_user(SystemExit(0))
    monkeypatch.setattr(interrupts, "_received", 1)  # as after a Ctrl-C
    assert interrupts.from_user(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        interrupts.caught(KeyboardInterrupt())
    # where SIGINT is ignored (a worker), a KeyboardInterrupt is never the user's
    monkeypatch.setattr(signal, "getsignal", lambda _: signal.SIG_IGN)
    assert not interrupts.from_user(KeyboardInterrupt())
