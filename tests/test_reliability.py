"""Bad inputs and faults through the real command line (issue 14, item 7): one row per fault.

Every row runs a command in a folder holding a copy of a stored results tree (two smoke
runs), after its ``setup`` has made the fault, and asserts:

- its exit status, and its own message: in the one error line (``error: ...``, nothing else
  on stderr but warnings); for a fault the command survives (status 0), in its output;
- no traceback;
- nothing lost: every file of the folder is as it was, or its bytes were moved aside to a
  new name; the only new files are those the row expects (``grows``), each there; nothing
  the store could read before has become unreadable.

In-process through typer's CliRunner; a real process where a signal is the fault
(``SIGNALS``). The closed pipe, Ctrl-C at start-up and the limits' timing are in
tests/test_cli_errors.py.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from clitools import (
    SMOKE,
    SUBPROCESS_ENV,
    assert_error,
    invoke,
    refuse_access,
    tree,
)

from synthbench.cli import catalog
from synthbench.core import atomic, interrupts
from synthbench.run import limits
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.spec import RunSpec
from synthbench.run.store import ResultStore

pytestmark = pytest.mark.usefixtures("single_thread")

RUN = ("run", "--task", "copy", *SMOKE, "--results", "{results}")  # copy: stored already


@dataclass
class Folder:
    """Where a row runs: ``results`` (the stored tree), ``afile`` (a file), anything else
    its setup makes under ``tmp``."""

    tmp: Path
    results: Path
    afile: Path
    monkeypatch: pytest.MonkeyPatch

    def fill(self, text: str) -> str:
        return text.format(tmp=self.tmp, results=self.results, afile=self.afile)


@dataclass(frozen=True)
class Fault:
    args: tuple[str, ...]  # the command line; {tmp}, {results}, {afile} filled in
    code: int  # its exit status
    message: str  # in its error line (status 0: in its output); filled in as args
    setup: Callable[[Folder], None] | None = None  # makes the fault, before the command
    grows: tuple[str, ...] = ()  # globs, under tmp, of the new files it must leave


def fault(id: str, *args, code: int, message: str, setup=None, grows=(), marks=()):
    return pytest.param(Fault(args, code, message, setup, grows), id=id, marks=marks)


# -- setups -------------------------------------------------------------------------------


def run_path(f: Folder, task: str, mech: str) -> Path:
    run_id = RunSpec.resolve(task, mech, PROTOCOLS.get("smoke"), 0).run_id
    return ResultStore(f.results).path_for("smoke", task, mech, run_id)


def stored_file(f: Folder, mech: str = "softmax") -> Path:
    return run_path(f, "copy", mech)


def chdir(f: Folder) -> None:
    f.monkeypatch.chdir(f.tmp)


def read_only(where: str):
    def setup(f: Folder) -> None:
        path = Path(f.fill(where))
        path.mkdir(parents=True, exist_ok=True)
        refuse_access(f.monkeypatch, path)

    return setup


def full_disk_at_second_results_file(f: Folder) -> None:
    """The second results file of the command hits a full disk, half written."""
    real, writes = pq.write_table, []

    def write_table(table, where, *args, **kwargs):
        writes.append(where)
        if len(writes) > 1:
            where.write(b"PAR1 half a file")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(table, where, *args, **kwargs)

    f.monkeypatch.setattr(pq, "write_table", write_table)


def full_disk_at(name: str, first: tuple[str, ...] = ()):
    """Files named ``name`` that synthbench.core.atomic writes fill the disk after 10 bytes; the
    command ``first`` runs before (it writes what must survive)."""

    def setup(f: Folder) -> None:
        if first:
            assert invoke(*map(f.fill, first)).exit_code == 0

        def opener(path, mode="r", *args, **kwargs):
            handle = open(path, mode, *args, **kwargs)
            if str(path).endswith(name):
                real_write = handle.write

                def write(data):
                    real_write(data[:10])
                    raise OSError(errno.ENOSPC, "No space left on device")

                handle.write = write
            return handle

        f.monkeypatch.setattr(atomic, "open", opener, raising=False)

    return setup


def interrupted(f: Folder) -> None:
    """A Ctrl-C while the command works: a real SIGINT to this process (a KeyboardInterrupt
    raised without one is plugin code's, not the user's: synthbench/core/interrupts.py)."""

    def records(kind):
        os.kill(os.getpid(), signal.SIGINT)

    f.monkeypatch.setattr(interrupts, "_received", 0)  # counted for this test only
    f.monkeypatch.setattr(catalog, "_records", records)


def replace_file(mech: str, make: Callable[[bytes], bytes]):
    def setup(f: Folder) -> None:
        path = stored_file(f, mech)
        path.write_bytes(make(path.read_bytes()))

    return setup


def put(where: str, data: bytes | None = None, folder: bool = False):
    """A file (or a folder) at ``where``, as a user or another program left it."""

    def setup(f: Folder) -> None:
        path = Path(f.fill(where))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir() if folder else path.write_bytes(data or b"")

    return setup


def at_run_path(task: str, mech: str, data: bytes | None = None, folder: bool = False):
    def setup(f: Folder) -> None:
        path = run_path(f, task, mech)
        put(str(path), data, folder)(f)

    return setup


def newer_schema_at_run_path(f: Folder) -> None:
    table = pq.read_table(stored_file(f))
    metadata = {**table.schema.metadata, b"synthbench_schema_version": b"99"}
    path = run_path(f, "sort", "softmax")
    path.parent.mkdir(parents=True)
    pq.write_table(table.replace_schema_metadata(metadata), path)


def more_memory_than_the_machine(f: Folder) -> None:
    f.monkeypatch.setattr(limits, "machine_memory", lambda device: 8 * 2**30)


# -- plugins: files a user writes ----------------------------------------------------------

HEADER = """\
import torch
import torch.nn.functional as F

from synthbench import MECHANISMS, Mechanism
"""


def mechanism(name: str, output: str, init: str = "") -> str:
    """A plugin file registering mechanism ``name``, whose forward returns ``output`` and
    whose constructor also runs the statement ``init``."""
    return HEADER + textwrap.dedent(f"""

        @MECHANISMS.register("{name}", complexity="quadratic", family="t", reference="none")
        class M(Mechanism):
            def __init__(self, head_dim, n_heads):
                super().__init__(head_dim, n_heads)
                {init or "pass"}

            def forward(self, q, k, v, causal=True):
                return {output}
        """)


PLUGINS = {
    "raises.py": "raise RuntimeError('plugin boom')\n",
    "exits.py": "import sys\nsys.exit(0)\n",
    "syntax.py": "def broken(:\n",
    "nothing.py": "x = 1\n",
    "clash.py": mechanism("softmax", "v"),
    "lookahead.py": mechanism("r-lookahead", "v + torch.roll(v, -1, dims=2)"),
    "batch-leak.py": mechanism("r-batch-leak", "v + v.mean(0, keepdim=True)"),
    "shape.py": mechanism("r-shape", "v[:, :, :-1]"),
    "builds-badly.py": mechanism("r-builds-badly", "v", "raise RuntimeError('no')"),
    # a gate that is 0 as built (causal then) and opens in training: the next position leaks
    "learned-leak.py": mechanism(
        "r-learned-leak",
        "F.scaled_dot_product_attention(q, k, v, is_causal=causal)"
        " + self.gate * torch.roll(v, -1, dims=2)",
        "self.gate = torch.nn.Parameter(torch.zeros(()))",
    ),
    "nan.py": mechanism("r-nan", "v * float('nan')"),
}


def plugin(name: str):
    def setup(f: Folder) -> None:
        (f.tmp / name).write_text(PLUGINS[name])

    return setup


@pytest.fixture(autouse=True)
def _plugins_forgotten(forget_plugins):
    """What the rows' plugin files register is forgotten after each (tests/conftest.py)."""
    yield


# -- the faults ----------------------------------------------------------------------------


# fmt: off
FAULTS = [
    # names: each unknown one, with the close matches
    fault("task-typo-in-a-list", *RUN[:2], "copy,srot", *RUN[3:], code=2,
          message="unknown task 'srot'; did you mean sort?"),
    fault("task-set-typo", *RUN[:2], "extnded", *RUN[3:], code=2,
          message="unknown task 'extnded'; did you mean extended? (known: all, extended, "),
    fault("mech-typo", *RUN, "--mech", "sofmax", code=2,
          message="unknown mechanism 'sofmax'; did you mean softmax?"),
    fault("mech-empty", *RUN, "--mech", "", code=2, message="--mech names no mechanism"),
    fault("protocol-typo", *RUN, "--protocol", "smoek", code=2,
          message="unknown protocol 'smoek'; did you mean smoke, smoke-block?"),
    fault("category-typo", *RUN, "--category", "memry", code=2,
          message="unknown category 'memry'; did you mean Memory? (categories: Basic, "),
    fault("pos-typo", *RUN, "--pos", "rop", code=2,
          message="unknown positional encoding 'rop'; did you mean rope?"),
    fault("device-typo", *RUN, "--device", "cdua", code=2, message="unknown device 'cdua'"),
    fault("executor-typo", *RUN, "--executor", "rya", code=2,
          message="unknown executor 'rya'; did you mean ray? (local, ray)"),
    fault("report-metric-typo", "report", "--results", "{results}", "--out", "{tmp}/o",
          "--metric", "acc", code=2,
          message="unknown metric 'acc'; did you mean token_acc? (target, token_acc"),
    fault("report-format-empty", "report", "--results", "{results}", "--out", "{tmp}/o",
          "--format", "", code=2,
          message="--format names no format (got ''); choose from md, tex, html, png, pdf"),
    fault("report-compare-typo", "report", "--results", "{results}", "--out", "{tmp}/o",
          "--compare", "slay", code=2,
          message="unknown comparison 'slay'; did you mean slay-paper?"),
    fault("check-typo", "check", "sofmax", code=2,
          message="unknown mechanism 'sofmax'; did you mean softmax?"),
    fault("audit-difficulty-typo", "audit", "copy", "--difficulty", "hardd", code=2,
          message="task copy has no difficulty 'hardd'; did you mean hard? (presets: default,"),
    fault("list-typo", "list", "taks", code=2, message="cannot list 'taks'; did you mean task"),
    fault("bench-budget-typo", "bench", "fidelity", "--budget", "huge", "--bench-results",
          "{tmp}/b", code=2, message="unknown budget 'huge' (known: small, medium, large)"),
    fault("results-task-typo", "results", "--results", "{results}", "--task", "cpy", code=2,
          message="unknown task 'cpy'; did you mean copy"),
    fault("results-mech-typo", "results", "--results", "{results}", "--mech", "sofmax",
          code=2, message="unknown mechanism 'sofmax'; did you mean softmax?"),
    fault("results-status-typo", "results", "--results", "{results}", "--status", "okk",
          code=2, message="unknown status 'okk'; did you mean ok? (known: diverged, error, "),
    fault("results-protocol-typo", "results", "--results", "{results}", "--protocol",
          "smoek", code=2, message="unknown protocol 'smoek'; did you mean smoke, smoke-block?"),
    # click's own parse errors, as one line too
    fault("seeds-not-a-number", *RUN, "--seeds", "abc", code=2,
          message="Invalid value for '--seeds': "),
    fault("unknown-option", "run", "--bogus", code=2,
          message="No such option: --bogus"),
    fault("option-without-value", "run", "--task", code=2,
          message="Option '--task' requires an argument."),
    fault("unknown-command", "lst", code=2, message="No such command 'lst'. Did you mean 'list'?"),
    fault("missing-argument", "show-task", code=2, message="Missing argument 'name'."),
    fault("flag-with-a-value", "run", "--force=yes", code=2,
          message="Option '--force' does not take a value."),
    # numbers out of range
    fault("cpus-per-run-inf", *RUN, "--cpus-per-run", "inf", code=2,
          message="--cpus-per-run must be > 0 and finite, got inf"),
    fault("gpus-per-run-nan", *RUN, "--gpus-per-run", "nan", code=2,
          message="--gpus-per-run must be >= 0 and finite, got nan"),
    fault("threads-huge", *RUN, "--threads", "100000", code=2,
          message="--threads must be in [1, 1024], got 100000"),
    fault("show-task-seed-negative", "show-task", "copy", "--seed", "-1", code=2,
          message="Invalid value for '--seed': "),
    fault("check-length-0", "check", "softmax", "--length", "0", code=2,
          message="--length must be in [1, 1000000], got 0"),
    fault("bench-steps-1", "bench", "train", "--steps", "1", "--bench-results", "{tmp}/b",
          code=2, message="--steps must be >= 2, got 1"),
    fault("bench-heads-not-dividing", "bench", "scaling", "--d-model", "30", "--heads", "8",
          "--bench-results", "{tmp}/b", code=2,
          message="--d-model 30 is not divisible by --heads 8"),
    fault("show-task-length-huge", "show-task", "copy", "--param", "n=100000000", code=2,
          message="task copy (n=100000000, vocab=32): sequences of 200,000,000 tokens, more "
          "than the 1,000,000"),
    fault("mech-features-huge", *RUN, "--mech", "rewa-rff", "--mech-param",
          "nb_features=100000000", code=2,
          message="holds 12.7 GiB of parameters and buffers per layer, more than the 1 GiB"),
    fault("memory-beyond-the-machine", *RUN, "--task-param", "n=300000", code=2,
          setup=more_memory_than_the_machine,
          message="task copy (n=300000, vocab=32) with softmax under protocol smoke needs about "
          "112.3 GiB of memory (batch 16 at length 600000; estimate: docs/RUNNING.md, Limits), "
          "more than this machine's 8.0 GiB"),
    # KEY=VALUE
    fault("param-without-value", *RUN, "--task-param", "n", code=2,
          message="parameter 'n' is not of the form key=value"),
    fault("param-without-key", *RUN, "--task-param", "=3", code=2,
          message="parameter '=3' is not of the form key=value"),
    fault("param-empty-value", *RUN, "--task-param", "n=", code=2,
          message="task copy parameter n must be int, got ''"),
    fault("mech-param-unknown", *RUN, "--mech", "linear", "--mech-param", "bogus=1", code=2,
          message="mechanism linear has no parameter bogus (parameters: eps, chunk_size)"),
    fault("mech-param-out-of-range", *RUN, "--mech", "performer", "--mech-param",
          "nb_features=0", code=2, message="mechanism performer: nb_features must be an integer "
          ">= 1, got 0"),
    fault("pos-param-out-of-range", *RUN, "--pos", "rope", "--pos-param", "rotate_fraction=2",
          code=2, message="pos rope: rotate_fraction must be in (0, 1]"),
    # plugins: broken files, and mechanisms that must never be ranked
    fault("plugin-raises", *RUN, "--plugin", "{tmp}/raises.py", code=2, setup=plugin("raises.py"),
          message="plugin file {tmp}/raises.py failed to import: RuntimeError: plugin boom"),
    fault("plugin-exits", *RUN, "--plugin", "{tmp}/exits.py", code=2, setup=plugin("exits.py"),
          message="plugin file {tmp}/exits.py called sys.exit(0) while being imported"),
    fault("plugin-syntax-error", "list", "mechs", "--plugin", "{tmp}/syntax.py", code=2,
          setup=plugin("syntax.py"), message="failed to import: SyntaxError at {tmp}/syntax.py:1"),
    fault("plugin-takes-a-builtin-name", *RUN, "--plugin", "{tmp}/clash.py", code=2,
          setup=plugin("clash.py"), message="cannot register mechanism 'softmax' (plugin file"),
    fault("plugin-registers-nothing", *RUN, "--plugin", "{tmp}/nothing.py", code=0,
          setup=plugin("nothing.py"),
          message="plugin file {tmp}/nothing.py registers no task, mechanism or fact"),
    fault("plugin-is-a-folder", *RUN, "--plugin", "{tmp}", code=2,
          message="plugin {tmp} is a directory, not a Python file"),
    fault("plugin-path-empty", *RUN, "--plugin", "", code=2, message="--plugin is empty"),
    fault("plugin-constructor-raises", *RUN, "--plugin", "{tmp}/builds-badly.py", "--mech",
          "r-builds-badly", code=2, setup=plugin("builds-badly.py"),
          message="mechanism r-builds-badly cannot be built: RuntimeError: no"),
    fault("plugin-looks-ahead", *RUN, "--plugin", "{tmp}/lookahead.py", "--mech", "r-lookahead",
          code=1, setup=plugin("lookahead.py"),
          grows=("results/protocol=smoke/task=copy/mechanism=r-lookahead/*.parquet",),
          message="refused: mechanism r-lookahead is not causal (causality: outputs at positions"),
    fault("plugin-mixes-the-batch", *RUN, "--plugin", "{tmp}/batch-leak.py", "--mech",
          "r-batch-leak", code=1, setup=plugin("batch-leak.py"),
          grows=("results/protocol=smoke/task=copy/mechanism=r-batch-leak/*.parquet",),
          message="batch item 0's outputs depend on v of batch item 1"),
    fault("plugin-wrong-shape", *RUN, "--plugin", "{tmp}/shape.py", "--mech", "r-shape",
          code=1, setup=plugin("shape.py"),
          grows=("results/protocol=smoke/task=copy/mechanism=r-shape/*",),
          message="(layout: output of shape (2, 2, 63, 16) for inputs of shape (2, 2, 64, 16)"),
    fault("plugin-leak-learned-in-training", *RUN, "--plugin", "{tmp}/learned-leak.py",
          "--mech", "r-learned-leak", code=1, setup=plugin("learned-leak.py"),
          grows=("results/protocol=smoke/task=copy/mechanism=r-learned-leak/*.parquet",),
          message="1 run not causal after training: stored with status leaky, never ranked"),
    fault("plugin-outputs-nan", *RUN, "--plugin", "{tmp}/nan.py", "--mech", "r-nan", code=0,
          setup=plugin("nan.py"),
          grows=("results/protocol=smoke/task=copy/mechanism=r-nan/*.parquet",),
          message="diverged: non-finite loss at step 0"),
    # where results and reports go: checked before any work
    fault("results-is-a-file", *RUN[:-1], "{afile}", code=2,
          message="--results {afile} is a file, not a folder"),
    fault("results-under-a-file", *RUN[:-1], "{afile}/sub", code=2,
          message="--results {afile}/sub: {afile} is a file, not a folder"),
    fault("results-read-only", *RUN, code=2, setup=read_only("{results}"),
          message="--results {results} is not writable by this user"),
    fault("results-new-under-a-read-only-folder", *RUN[:-1], "{tmp}/ro/new/results", code=2,
          setup=read_only("{tmp}/ro"), message="{tmp}/ro is not writable by this user"),
    fault("partition-folder-read-only", *RUN, "--mech", "softmax", code=2,
          setup=read_only("{results}/protocol=smoke/task=copy/mechanism=softmax"),
          message="{results}/protocol=smoke/task=copy/mechanism=softmax is not writable by this "
          "user"),
    fault("folder-named-like-a-run-file", *RUN[:2], "sort", *RUN[3:], code=2,
          setup=at_run_path("sort", "softmax", folder=True),
          message="is a folder, where a run's results file goes: move it away"),
    fault("file-named-like-a-partition-folder", *RUN[:2], "sort", *RUN[3:], code=2,
          setup=put("{results}/protocol=smoke/task=sort", b"in the way\n"),
          message="{results}/protocol=smoke/task=sort is a file, where a folder of the results "
          "tree goes"),
    fault("run-results-empty", *RUN[:-1], "", code=2, setup=chdir,
          message="--results is empty: give a path"),
    fault("results-results-empty", "results", "--results", "", code=2, setup=chdir,
          message="--results is empty: give a path"),
    fault("report-results-empty", "report", "--results", "", code=2, setup=chdir,
          message="--results is empty: give a path"),
    fault("results-reads-a-file", "results", "--results", "{afile}", code=2,
          message="--results {afile} is not a folder"),
    fault("report-reads-a-file", "report", "--results", "{afile}", code=2,
          message="--results {afile} is not a folder"),
    fault("results-reads-nothing-there", "results", "--results", "{tmp}/nowhere", code=2,
          message="no results under {tmp}/nowhere/: the folder does not exist"),
    fault("report-out-is-a-file", "report", "--results", "{results}", "--out", "{afile}",
          code=2, message="--out {afile} is a file, not a folder"),
    fault("report-out-under-a-file", "report", "--results", "{results}", "--out",
          "{afile}/reports", code=2,
          message="--out {afile}/reports: {afile} is a file, not a folder"),
    fault("report-out-read-only", "report", "--results", "{results}", "--out", "{tmp}/reports",
          code=2, setup=read_only("{tmp}/reports"),
          message="--out {tmp}/reports is not writable by this user"),
    fault("report-out-empty", "report", "--results", "{results}", "--out", "", code=2,
          message="--out is empty"),
    fault("report-file-named-like-a-folder", "report", "--results", "{results}", "--out",
          "{tmp}/reports", "--format", "md", code=1,
          setup=put("{tmp}/reports/leaderboard.md", folder=True),
          grows=("reports/smoke/*",),  # the protocol's tables, written before the leaderboard
          message="cannot write the reports: {tmp}/reports/leaderboard.md: Is a directory"),
    fault("csv-is-a-folder", "results", "--results", "{results}", "--csv", "{tmp}", code=2,
          message="--csv {tmp} is a folder, not a file"),
    fault("csv-under-a-file", "results", "--results", "{results}", "--csv", "{afile}/rows.csv",
          code=2, message="--csv {afile}/rows.csv: {afile} is a file"),
    fault("csv-read-only", "results", "--results", "{results}", "--csv", "{tmp}/ro/rows.csv",
          code=2, setup=read_only("{tmp}/ro"),
          message="--csv {tmp}/ro/rows.csv: {tmp}/ro is not writable"),
    fault("csv-and-json", "results", "--results", "{results}", "--csv", "{tmp}/x.csv",
          "--json", code=2, message="--csv and --json both say where the rows go"),
    # what the results tree holds: read around (named), moved aside or refused, never lost
    fault("truncated-file", "results", "--results", "{results}", code=0,
          setup=replace_file("softmax", lambda data: data[:500]),
          message="skipping {results}/protocol=smoke/task=copy/mechanism=softmax/"),
    fault("random-bytes", "report", "--results", "{results}", "--out", "{tmp}/o", "--format",
          "md", code=0, setup=replace_file("linear", lambda data: bytes(range(256)) * 8),
          grows=("o/*.md", "o/smoke/*.md", "o/smoke/*.csv", "o/smoke/target/*.md"),
          message="skipping {results}/protocol=smoke/task=copy/mechanism=linear/"),
    fault("stray-text-file", "results", "--results", "{results}", "--json", code=0,
          setup=put("{results}/notes.txt", b"my notes\n"),
          message="skipping {results}/notes.txt: not a Parquet file"),
    fault("unreadable-file-at-a-runs-path", *RUN[:2], "sort", *RUN[3:], code=0,
          setup=at_run_path("sort", "softmax", b"not parquet"),
          # its result: in place
          grows=("results/protocol=smoke/task=sort/mechanism=softmax/.*.unreadable-*",),
          message="could not be read (unreadable Parquet (ArrowInvalid: Parquet magic bytes not "
          "found in footer. Either the file is corrupted or this is not a parquet file.)); "
          "moved it to {results}/protocol=smoke/task=sort/mechanism=softmax/"
          ".6eddacd127a03d51.parquet.unreadable-"),
    fault("newer-schema-at-a-runs-path", *RUN[:2], "sort", *RUN[3:], code=1,
          setup=newer_schema_at_run_path,
          message="1 run refused: their files are of a newer schema version"),
    # the operating system fails while working: one line, what was stored stays whole
    fault("full-disk-mid-suite", *RUN[:2], "sort", *RUN[3:], "--mech", "softmax,linear",
          code=1, setup=full_disk_at_second_results_file,
          grows=("results/protocol=smoke/task=sort/*/*",),
          # the file it was writing named
          message="/mechanism=linear/2500e53b75f934d4.parquet: No space left on device; what was "
          "stored before is intact"),
    fault("full-disk-writing-a-report", "report", "--results", "{results}", "--out",
          "{tmp}/reports", "--format", "md", code=1,
          setup=full_disk_at("summary.md", ("report", "--results", "{results}", "--out",
                                            "{tmp}/reports", "--format", "md")),
          message="cannot write the reports: {tmp}/reports/smoke/target/summary.md: No space "
          "left on device"),
    fault("full-disk-writing-the-leaderboard-page", "report", "--results", "{results}",
          "--out", "{tmp}/reports", "--format", "html", code=1,
          setup=full_disk_at("leaderboard.html", ("report", "--results", "{results}", "--out",
                                                  "{tmp}/reports", "--format", "html")),
          message="cannot write the reports: {tmp}/reports/leaderboard.html: No space left"),
    fault("full-disk-writing-a-figure", "report", "--results", "{results}", "--out",
          "{tmp}/reports", "--format", "png", code=1,
          setup=full_disk_at("heatmap.png", ("report", "--results", "{results}", "--out",
                                             "{tmp}/reports", "--format", "png")),
          message="cannot write the reports: {tmp}/reports/smoke/target/heatmap.png: No space "
          "left on device"),
    fault("full-disk-writing-csv", "results", "--results", "{results}", "--csv",
          "{tmp}/rows.csv", code=1, setup=full_disk_at("rows.csv"),
          message="{tmp}/rows.csv: No space left on device"),
    fault("ctrl-c-in-a-command", "list", "tasks", code=130, setup=interrupted,
          message="interrupted"),
]
# fmt: on


@pytest.mark.parametrize("case", FAULTS)
def test_a_fault_ends_cleanly_and_loses_nothing(case: Fault, results, afile, tmp_path,
                                                monkeypatch):  # fmt: skip
    folder = Folder(tmp_path, results, afile, monkeypatch)
    if case.setup:
        case.setup(folder)
    store = ResultStore(results)
    before, unreadable = tree(tmp_path), {str(p) for p, _ in store.load(warn=False).skipped}

    result = invoke(*map(folder.fill, case.args))

    message = folder.fill(case.message)
    if case.code == 0:
        assert result.exit_code == 0, result.output
        assert "Traceback" not in result.output and result.exception is None
        assert "error:" not in result.stderr
        assert message in result.output  # a warning, or the line of a run
    else:
        assert_error(result, case.code, message)
    monkeypatch.undo()  # the store below reads with the real functions
    assert_nothing_lost(before, tree(tmp_path), case.grows)
    assert {str(p) for p, _ in store.load(warn=False).skipped} <= unreadable


def assert_nothing_lost(before: dict, after: dict, grows: tuple[str, ...], each=True) -> None:
    """Every file as it was, or its bytes moved aside to a new file; the new files those of
    the ``grows`` globs, each glob matched (unless not ``each``)."""
    new = sorted(set(after) - set(before))
    kept = {after[name] for name in new}
    for name, digest in before.items():
        assert after.get(name) == digest or digest in kept, f"{name} lost or overwritten"
    for name in new:
        assert any(fnmatch.fnmatch(name, g) for g in grows), f"unexpected new file {name}"
    for glob in grows if each else ():
        assert any(fnmatch.fnmatch(name, glob) for name in new), f"no new file {glob}"


# -- signals: a real process, stopped while it writes a results file ----------------------

# synthbench whose second results file is written half, then the process waits for its
# signal; a marker file says when it is there
PAUSE_IN_THE_SECOND_WRITE = """
import pathlib, sys, time
import pyarrow.parquet as pq
real, calls = pq.write_table, []
def write_table(table, where, *args, **kwargs):
    calls.append(where)
    if len(calls) < 2:
        return real(table, where, *args, **kwargs)
    where.write(b"PAR1 half a file")
    where.flush()
    pathlib.Path(marker).touch()
    time.sleep(120)
pq.write_table = write_table
marker, sys.argv = sys.argv[1], ["synthbench", *sys.argv[2:]]
from synthbench.cli import main
main()
"""

SIGNALS = [
    pytest.param(signal.SIGKILL, -signal.SIGKILL, "", id="sigkill-during-a-write"),
    pytest.param(
        signal.SIGINT,
        130,
        "error: interrupted; finished trainings are stored, run the same command to resume",
        id="ctrl-c-during-a-write",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("signo, code, stderr", SIGNALS)
def test_a_signal_during_a_write_leaves_complete_files_and_the_command_resumes(
    signo, code, stderr, results, tmp_path
):
    args = ["run", "--task", "sort", "--mech", "softmax,linear", *SMOKE, "--results", results]
    before = tree(results)
    marker = tmp_path / "writing"
    process = subprocess.Popen(
        [sys.executable, "-c", PAUSE_IN_THE_SECOND_WRITE, marker, *map(str, args)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=SUBPROCESS_ENV, cwd=tmp_path,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # not inherited ignored
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert process.poll() is None, process.stderr.read().decode()
            assert time.monotonic() < deadline, "the second write never came"
            time.sleep(0.01)
        process.send_signal(signo)
        assert process.wait(timeout=60) == code
    finally:
        process.kill()
        process.wait()
    assert process.stderr.read().decode().strip() == stderr

    # only complete files: the first run stored whole, the half file never visible
    store = ResultStore(results)
    assert store.load(warn=False).skipped == []
    assert len(store.files()) == len(before) + 1
    # a killed command leaves its temporary file and its claim, hidden from every reader
    left = (
        "protocol=smoke/task=sort/*/*.parquet",
        "protocol=smoke/task=sort/*/.tmp-*",
        ".claims/*",
    )
    assert_nothing_lost(before, tree(results), left, each=False)

    again = invoke(*args)  # the same command: does what is missing, cleans up after the kill
    assert again.exit_code == 0, again.output
    assert "2 runs (1 task x 2 mechanisms x 1 seed" in again.stdout
    assert "1 already stored, 1 to run" in again.stdout
    after = tree(results)
    assert_nothing_lost(
        before,
        after,
        (
            "protocol=smoke/task=sort/mechanism=softmax/*.parquet",
            "protocol=smoke/task=sort/mechanism=linear/*.parquet",
        ),
    )
    assert store.load(warn=False).skipped == [] and len(store.files()) == len(before) + 2
