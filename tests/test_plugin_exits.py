"""Plugin code that raises what is not an Exception (issue 32): sys.exit(), a KeyboardInterrupt
of its own, GeneratorExit, a BaseException subclass. `check` reports it as the check's
failure, `run` stores the run as failed naming the file and line (in this process, in local
workers and on Ray), and neither exits silently; the user's Ctrl-C (a real SIGINT) still
interrupts (synthbench/core/interrupts.py)."""

from __future__ import annotations

import signal
import sys
import textwrap
from pathlib import Path

import pytest
from clitools import SMOKE, assert_error, invoke

from synthbench.core import interrupts
from synthbench.core.mechanism import MECHANISMS
from synthbench.core.registry import load_plugin_file
from synthbench.core.task import TASKS
from synthbench.run.store import ResultStore

pytestmark = pytest.mark.usefixtures("single_thread")

# what every misbehaving plugin of these tests builds on: an attention with a weight (its
# checks need a parameter) and the registration they share
ATTENTION = """

class Attention(nn.Module):
    def __init__(self, head_dim, n_heads):
        super().__init__()
        self.proj = nn.Linear(head_dim, head_dim)

    def forward(self, q, k, v, causal=True):
        return F.scaled_dot_product_attention(self.proj(q), k, v, is_causal=causal)


def register(name):
    return MECHANISMS.register(name, complexity="quadratic", family="test", reference="none")
"""

PLUGIN = (
    """
import multiprocessing
import os
import signal

import torch.nn.functional as F
from torch import nn

from synthbench import MECHANISMS, TASKS
from synthbench.tasks.copy import Copy


class Custom(BaseException):
    pass

"""
    + ATTENTION
    + """


SENT = []


def ctrl_c():
    # the user's Ctrl-C, as a terminal sends it: to the command, and to the child process a
    # plugin's checks run in (whose parent the command is), once
    os.kill(os.getpid(), signal.SIGINT)
    parent = multiprocessing.parent_process()  # the command (a fork server forked this child)
    if parent is not None and not SENT:
        SENT.append(parent.pid)
        os.kill(parent.pid, signal.SIGINT)


def exiting(name, raised):
    @register(name)
    class Exits(Attention):
        def forward(self, q, k, v, causal=True):
            raise raised  # forward


exiting("exits-3", SystemExit(3))
exiting("exits-0", SystemExit(0))
exiting("interrupts", KeyboardInterrupt())
exiting("gen-exit", GeneratorExit())
exiting("custom-exit", Custom("mine"))


@register("exits-in-set-max-len")
class ExitsInSetMaxLen(Attention):
    def set_max_len(self, max_len):
        raise SystemExit(5)  # set_max_len


@register("exits-in-extra-inputs")
class ExitsInExtraInputs(Attention):
    @property
    def extra_inputs(self):
        raise Custom("no inputs")  # extra_inputs


@register("exits-in-init")
class ExitsInInit(Attention):
    def __init__(self, head_dim, n_heads):
        raise SystemExit(4)  # __init__


@register("ctrl-c")
class CtrlC(Attention):
    def forward(self, q, k, v, causal=True):
        ctrl_c()
        return super().forward(q, k, v, causal)


@register("ctrl-c-in-training")
class CtrlCInTraining(Attention):
    def forward(self, q, k, v, causal=True):
        if q.shape[0] > 2:  # a training batch, not the checks' (of 2) before it
            ctrl_c()
        return super().forward(q, k, v, causal)


@TASKS.register("exits-in-generate", category="Basic", description="copy that exits")
class ExitsInGenerate(Copy):
    def generate(self, n, generator, device="cpu"):
        raise SystemExit(6)  # generate
"""
)

# a mechanism whose forward raises: what it raises, as a check line and as a stored error
RAISED = {
    "exits-3": ("SystemExit: 3", "SystemExit(3)"),
    "exits-0": ("SystemExit: 0", "SystemExit(0)"),
    "interrupts": ("KeyboardInterrupt", "KeyboardInterrupt()"),
    "gen-exit": ("GeneratorExit", "GeneratorExit()"),
    "custom-exit": ("Custom: mine", "Custom('mine')"),
}
# every check but state-size calls forward
FORWARD_CHECKS = ["layout", "causality", "causality-forward", "dtypes", "large-inputs"]
FORWARD_CHECKS += ["determinism"]
# plugin code outside forward that every check and training builds: where, what it raises
BUILT = {
    "exits-in-set-max-len": ("set_max_len", "SystemExit: 5", "SystemExit(5)"),
    "exits-in-extra-inputs": ("extra_inputs", "Custom: no inputs", "Custom('no inputs')"),
}


def line(marker: str, source: str = PLUGIN) -> int:
    """The line of ``source`` marked ``# marker``."""
    lines = textwrap.dedent(source).lstrip().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.endswith(f"# {marker}"))


def load(path: Path, source: str):
    path.write_text(textwrap.dedent(source).lstrip())
    load_plugin_file(path, [TASKS, MECHANISMS])


def unload(path: Path) -> None:
    for registry in (TASKS, MECHANISMS):
        for entry in list(registry.entries()):
            if str(path) in entry.source:
                registry._remove(entry.name)
    for name in [m for m, module in sys.modules.items() if module and path.stem in m]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    path = tmp_path_factory.mktemp("plugin") / "exiting_mechanisms.py"
    load(path, PLUGIN)
    yield path
    unload(path)


@pytest.fixture(autouse=True)
def no_sigint_yet(monkeypatch):
    """As a command that has received no Ctrl-C."""
    monkeypatch.setattr(interrupts, "_received", 0)


def assert_no_error_line(result) -> None:
    assert "error:" not in result.stderr and "Traceback" not in result.output, result.output


@pytest.mark.parametrize("name", sorted(RAISED))
def test_check_reports_what_a_forward_raised_as_a_failed_check(plugin, name):
    result = invoke("check", name, "--plugin", plugin, "--length", 8)
    assert result.exit_code == 1, result.output
    check_text, _ = RAISED[name]
    for check in FORWARD_CHECKS:
        assert f"FAIL  {name}  {check:<17}  raised {check_text} (" in result.stdout
    assert f"PASS  {name}  state-size" in result.stdout
    assert_no_error_line(result)


@pytest.mark.parametrize("name", sorted(BUILT))
def test_check_reports_what_building_raised_as_failed_checks(plugin, name):
    """Code the checks run to build the mechanism, outside its forward (set_max_len, the
    extra inputs): every check fails naming it; none ends the command."""
    result = invoke("check", name, "--plugin", plugin, "--length", 8)
    assert result.exit_code == 1, result.output
    _, check_text, _ = BUILT[name]
    for check in FORWARD_CHECKS:
        assert f"FAIL  {name}  {check:<17}  raised {check_text} (" in result.stdout
    assert_no_error_line(result)


EXECUTORS = {
    "in-process": ["--jobs", 1],
    "local-workers": ["--jobs", 2],
    "ray": ["--executor", "ray", "--jobs", 2],
}


@pytest.mark.parametrize(
    "executor",
    [
        "in-process",
        pytest.param("local-workers", marks=pytest.mark.slow),
        pytest.param("ray", marks=pytest.mark.ray),  # slow: tests/conftest.py
    ],
)
def test_run_stores_the_run_as_failed_naming_the_plugin(plugin, tmp_path, executor):
    if executor == "ray":
        pytest.importorskip("ray", reason='the Ray extra: pip install "synthbench[ray]"')
    stored = {name: (raised, line("forward")) for name, (_, raised) in RAISED.items()}
    stored |= {name: (raised, line(where)) for name, (where, _, raised) in BUILT.items()}
    results = tmp_path / "results"
    args = ["run", "--task", "copy", "--mech", ",".join(stored), "--protocol", "smoke"]
    args += ["--seeds", 1, "--results", results, "--plugin", plugin, *EXECUTORS[executor]]
    result = invoke(*args)
    assert result.exit_code == 1, result.output
    assert f"error: {len(stored)} runs raised; their errors are stored" in result.stderr
    rows = ResultStore(results).load(warn=False).rows.set_index("mechanism")
    assert sorted(rows.index) == sorted(stored) and set(rows["status"]) == {"error"}
    lines = result.stdout.splitlines()
    # a Ray worker loads the plugin from a copy of its source, under the same file name
    where = plugin.name if executor == "ray" else str(plugin)
    for name, (raised, at) in stored.items():
        error = rows.loc[name, "error"]
        assert error.startswith(f"{raised} raised at ") and error.endswith(f"{where}:{at}"), error
        # the run's line names the mechanism and what it raised
        assert any(f" {name} " in s and f"error: {error}" in s for s in lines), name


def test_a_task_whose_generate_exits_is_stored_as_failed(plugin, tmp_path):
    results = tmp_path / "results"
    args = ["run", "--task", "exits-in-generate", "--mech", "softmax", *SMOKE]
    result = invoke(*args, "--results", results, "--plugin", plugin)
    assert result.exit_code == 1, result.output
    (row,) = ResultStore(results).load(warn=False).rows.to_dict("records")
    assert row["status"] == "error"
    assert row["error"] == f"SystemExit(6) raised at {plugin}:{line('generate')}"


def test_a_constructor_that_exits_is_a_one_line_error_naming_it(plugin, tmp_path):
    message = (
        f"mechanism exits-in-init cannot be built: SystemExit(4) raised at "
        f"{plugin}:{line('__init__')}"
    )
    results = tmp_path / "results"
    assert_error(invoke("check", "exits-in-init", "--plugin", plugin), 2, message)
    args = ["run", "--mech", "exits-in-init", "--task", "copy", *SMOKE, "--results", results]
    assert_error(invoke(*args, "--plugin", plugin), 2, message)
    assert not results.exists()  # refused before anything is written, as any bad parameter


def test_a_task_that_exits_giving_its_lengths_is_a_one_line_error_naming_it(tmp_path):
    """`check` without --length checks at every task's lengths: a task whose code exits
    there is named, with the way around it."""
    path = tmp_path / "lengthless_task.py"
    load(path, LENGTHLESS)
    try:
        result = invoke("check", "softmax", "--plugin", path)
        message = "task lengthless cannot give its sequence lengths: SystemExit(7) raised at "
        where = f"{path}:{line('seq_len', LENGTHLESS)}"
        assert_error(result, 2, f"{message}{where} (--length sets the lengths to check at")
        assert invoke("check", "softmax", "--length", 8, "--plugin", path).exit_code == 0
    finally:
        unload(path)


LENGTHLESS = """
from synthbench import TASKS
from synthbench.tasks.copy import Copy

@TASKS.register("lengthless", category="Basic", description="copy without a length")
class Lengthless(Copy):
    @property
    def seq_len(self):
        raise SystemExit(7)  # seq_len
"""


@pytest.mark.parametrize(
    "command, mechanism",
    [("check", "ctrl-c"), ("run", "ctrl-c"), ("run", "ctrl-c-in-training")],
    ids=["check", "run-leak-guard", "run-training"],
)
def test_the_users_ctrl_c_inside_plugin_code_still_interrupts(plugin, tmp_path, command, mechanism):
    """A real SIGINT arriving while plugin code runs is the user's Ctrl-C: exit 130, not a
    failure of the plugin, and nothing stored."""
    results = tmp_path / "results"
    if command == "check":
        result = invoke("check", mechanism, "--length", 8, "--plugin", plugin)
    else:
        args = ["run", "--mech", mechanism, "--task", "copy", *SMOKE, "--results", results]
        result = invoke(*args, "--plugin", plugin)
    assert result.exit_code == 130, result.output
    assert result.stderr.strip().startswith("error: interrupted"), result.stderr
    if command == "run":
        assert ResultStore(results).load(warn=False).rows.empty


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
