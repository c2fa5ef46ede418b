"""Bad inputs and operating-system faults through the real command line (issue 14, items 3
to 5) that do not fit the table of tests/test_reliability.py, where each fault is one row
(its message, exit status and the tree unchanged): what a run or a report writes when it
survives a fault, the limits' timing and estimate, `list` and `results` output, a closed
pipe and Ctrl-C at start-up (real processes).

In-process through typer's CliRunner where the CLI allows it; a subprocess where a signal or
a closed pipe is the fault. The results tree of two smoke runs: tests/conftest.py.
"""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from clitools import SMOKE, SUBPROCESS_ENV, assert_error, command_line, invoke, tree

from synthbench.cli import catalog, common
from synthbench.core.mechanism import MECHANISMS
from synthbench.core.task import TASKS
from synthbench.run import limits
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.schema import COLUMNS
from synthbench.run.spec import RunSpec
from synthbench.run.store import ResultStore
from synthbench.run.train import failed_row

pytestmark = pytest.mark.usefixtures("single_thread")


def spec(task: str, mech: str, protocol: str = "smoke") -> RunSpec:
    return RunSpec.resolve(task, mech, PROTOCOLS.get(protocol), 0)


# -- where results and reports go: checked before any work ------------------------------


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only folder")
def test_run_results_chmod_read_only(results):
    before = tree(results)
    results.chmod(0o555)
    try:
        result = invoke("run", "--task", "sort", *SMOKE, "--results", results)
    finally:
        results.chmod(0o755)
    assert_error(result, 2, f"--results {results} is not writable by this user")
    assert tree(results) == before


def test_results_csv_into_a_new_folder_is_written_whole(results, tmp_path):
    path = tmp_path / "new" / "rows.csv"
    result = invoke("results", "--results", results, "--csv", path)
    assert result.exit_code == 0, result.output
    assert path.read_text().count("\n") == 3  # the header and two runs
    assert [p.name for p in path.parent.iterdir()] == ["rows.csv"]  # no temporary left


# -- unbounded values: refused before anything runs -----------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seeds", "1000000000000"], "--seeds must be in [1, 1000], got 1000000000000"),
        (["--seeds", "0"], "--seeds must be in [1, 1000], got 0"),
        (["--eval-length-mult", "inf"], "must be > 0 and finite, got inf"),
        (["--eval-length-mult", "nan"], "must be > 0 and finite, got nan"),
        (["--eval-length-mult", "-2"], "must be > 0 and finite, got -2.0"),
        (["--eval-length-mult", "1e300"], "sequences of about 10^301 tokens, more than the"),
        (["--eval-length-mult", "1e6"], "at 1e+06x length: sequences of 64,000,000 tokens"),
        (["--task-param", "n=10000000"], "sequences of 20,000,000 tokens, more than the 1,000,000"),
    ],
    ids=[
        "seeds-huge",
        "seeds-0",
        "mult-inf",
        "mult-nan",
        "mult-negative",
        "mult-1e300",
        "mult-1e6",
        "n-huge",
    ],  # fmt: skip
)
def test_unbounded_values(args, message, tmp_path):
    started = time.monotonic()
    result = invoke("run", "--task", "copy", *SMOKE, *args, "--results", tmp_path / "r")
    assert_error(result, 2, message)
    assert time.monotonic() - started < 20  # refused up front, not after minutes
    assert not (tmp_path / "r").exists()


def test_executor_ray_without_ray_is_one_line_naming_its_extra(monkeypatch, tmp_path):
    """`--executor ray` where Ray is not installed (the README's set-up leaves it out):
    refused before any run, naming the extra to install."""
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    results = tmp_path / "results"
    result = invoke("run", "--task", "copy", *SMOKE, "--executor", "ray", "--results", results)
    assert_error(result, 2, 'the ray executor needs Ray: pip install "synthbench[ray]"')
    assert not list(results.rglob("*.parquet"))


def test_memory_estimate_by_hand():
    """The formula of synthbench/run/limits.py on copy n=1000 (L 2000, vocab 33) under smoke
    (B 16, E 256, D 32, H 2, N 1, val 32, test 64); yat holds its L x L matrices."""
    L, V, D, H, N, B, E = 2000, 33, 32, 2, 1, 16, 256
    parameters = 16 * (2 * V * D + V + L * D + 4 * N * D * D)
    data = 16 * L * (32 + 64 + B)
    training = 4 * B * L * (12 * N * D + 3 * V)
    evaluation = 4 * E * L * (4 * D + 2 * V)
    softmax = RunSpec.resolve("copy", "softmax", PROTOCOLS.get("smoke"), 0, {"n": 1000})
    assert limits.memory_needed(softmax)[0] == parameters + data + max(training, evaluation)
    yat = RunSpec.resolve("copy", "yat", PROTOCOLS.get("smoke"), 0, {"n": 1000})
    quadratic = max(training + 4 * 4 * N * B * H * L**2, evaluation + 4 * 2 * E * H * L**2)
    assert limits.memory_needed(yat)[0] == parameters + data + quadratic


def test_the_built_in_suite_fits_in_4_gib():
    """Every task at its protocol's settings, the three kinds of mechanism: never refused on
    a small machine (the estimate must not be too cautious)."""
    from synthbench.run import runner

    for protocol in ("quick", "standard"):
        specs = runner.plan(TASKS.names(), ["softmax", "linear", "yat"], PROTOCOLS.get(protocol), 1)
        limits.check_runs(specs, torch.device("cpu"))
        assert max(limits.memory_needed(s)[0] for s in specs) < 4 * 2**30


# -- the report and the leaderboard -----------------------------------------------------------


def store_failed(root: Path, task: str, mech: str, protocol: str) -> None:
    run = spec(task, mech, protocol)
    row = failed_row(run, run.protocol.lrs[0], torch.device("cpu"), "RuntimeError: boom")
    ResultStore(root).write([row])


def test_report_with_a_protocol_and_a_mechanism_without_any_success(results, tmp_path):
    store_failed(results, "copy", "softmax", "quick")  # quick: no successful run at all
    store_failed(results, "copy", "yat", "smoke")  # yat: none in smoke
    before = tree(results)
    out = tmp_path / "reports"
    # without the shipped reference, which has quick successes of its own
    result = invoke(
        "report", "--results", results, "--out", out, "--format", "md,html", "--no-reference"
    )
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    board = (out / "leaderboard.md").read_text()
    quick = board.split("## quick")[1].split("## smoke")[0]
    assert "|        | softmax     | --               | --      | 0/1     |" in quick
    assert "No successful run: nothing is ranked." in quick
    smoke = board.split("## smoke")[1]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in smoke.splitlines()
            if line.startswith("| ") and not line.startswith("| rank")]  # fmt: skip
    ranks = {row[2]: (row[0], row[3]) for row in rows}  # mechanism -> (rank, score)
    assert "1" in {rank for rank, _ in ranks.values()}
    assert ranks["yat"] == ("", "--")  # listed, unranked
    full = (out / "quick" / "target" / "full.md").read_text()
    assert "| Basic      | copy   | --        |" in full
    assert "no successful run; protocol quick" in full
    summary = (out / "quick" / "target" / "summary.md").read_text()
    assert "| softmax     | --      | --        |" in summary
    assert (out / "leaderboard.html").stat().st_size > 0
    assert tree(results) == before


def rewrite(path: Path, dest: Path, **columns) -> None:
    """Copy the results file ``path`` to ``dest`` with some columns replaced (a file edited by
    hand), keeping its schema and metadata."""
    table = pq.read_table(path)
    for name, value in columns.items():
        index = table.schema.get_field_index(name)
        table = table.set_column(index, name, pa.array([value] * table.num_rows, pa.string()))
    dest.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, dest)


def test_malformed_json_cell_skips_the_row_naming_its_file(results, tmp_path):
    (path,) = (results / "protocol=smoke" / "task=copy" / "mechanism=linear").glob("*.parquet")
    rewrite(path, path, task_params='{"n": 32,')
    before = tree(results)
    out = tmp_path / "reports"
    result = invoke("report", "--results", results, "--out", out, "--format", "md")
    assert result.exit_code == 0, result.output
    line = f"warning: skipping the row of {path}: task_params '{{\"n\": 32,' is not a JSON object"
    assert line in result.stderr
    assert "linear" not in (out / "smoke" / "target" / "full.md").read_text()
    listing = invoke("results", "--results", results)
    assert f"skipping the row of {path}: task_params" in listing.stderr
    assert listing.stdout.splitlines()[-1] == "1 row"
    assert tree(results) == before


def test_markdown_escapes_values_from_the_results_tree(results, tmp_path):
    (path,) = (results / "protocol=smoke" / "task=copy" / "mechanism=linear").glob("*.parquet")
    run_id = "0123456789abcdef"
    odd = results / "protocol=smoke" / "task=copy" / "mechanism=linear" / f"{run_id}.parquet"
    vocab = "3|2<img src=x onerror=alert(1)>*_x_*"
    rewrite(path, odd, run_id=run_id, task_params=json.dumps({"n": 32, "vocab": vocab}))
    out = tmp_path / "reports"
    result = invoke("report", "--results", results, "--out", out, "--format", "md,html,tex")
    assert result.exit_code == 0, result.output
    full = (out / "smoke" / "target" / "full.md").read_text()
    assert r"vocab=3\|2&lt;img src=x onerror=alert(1)&gt;\*\_x\_\*" in full
    for report in out.rglob("*.md"):
        text = report.read_text()
        assert "<img" not in text and "3|2" not in text, report
    for text in (full, (out / "leaderboard.md").read_text()):
        table = [line for line in text.splitlines() if line.startswith("|")]
        # as many cell borders (| not escaped) on every line as in the header
        borders = {line.replace("\\|", "").count("|") for line in table}
        assert len(borders) == 1, table
    assert "<img" not in (out / "leaderboard.html").read_text()  # JSON: \u003c
    tex = (out / "smoke" / "target" / "full.tex").read_text()
    assert r"3\textbar{}2\textless{}img" in tex and "3|2" not in tex


def test_rows_with_names_that_are_not_names_are_left_out(results, tmp_path):
    (path,) = (results / "protocol=smoke" / "task=copy" / "mechanism=linear").glob("*.parquet")
    run_id = "0123456789abcdef"
    odd = results / "protocol=smoke" / "task=copy" / "mechanism=<img src=x>" / f"{run_id}.parquet"
    rewrite(path, odd, run_id=run_id)
    out = tmp_path / "reports"
    result = invoke("report", "--results", results, "--out", out, "--format", "md,html")
    assert result.exit_code == 0, result.output
    assert f"warning: skipping the row of {odd}: mechanism '<img src=x>' is not a name" in (
        result.stderr
    )
    assert not any("<img" in p.read_text() for p in out.rglob("*.*"))


def test_duplicate_run_ids_load_once_naming_both(results):
    (original,) = (results / "protocol=smoke" / "task=copy" / "mechanism=softmax").glob("*.parquet")
    # sorts before: read first
    copy = results / "protocol=smoke" / "task=copy" / "mechanism=aaa" / original.name
    copy.parent.mkdir()
    shutil.copy(original, copy)
    result = invoke("results", "--results", results, "--json")
    assert result.exit_code == 0, result.output
    assert (
        f"warning: skipping {copy}: run {original.stem} is also stored at {original} (kept)"
        in result.stderr
    )
    rows = json.loads(result.stdout)
    assert sorted(r["mechanism"] for r in rows) == ["linear", "softmax"]


# -- list and results: whole names, JSON, validated filters -------------------------------


def test_list_piped_prints_whole_names():
    result = invoke("list", "mechs")
    assert result.exit_code == 0 and "…" not in result.stdout
    firsts = [line.split()[0] for line in result.stdout.splitlines()[1:]]
    assert firsts == MECHANISMS.names()


def test_list_in_an_80_column_terminal_cuts_no_name(monkeypatch):
    terminal = io.StringIO()
    console = common._Stdout(file=terminal, force_terminal=True, width=80, color_system=None)
    monkeypatch.setattr(catalog, "out", console)
    for what, registry in (("mechs", MECHANISMS), ("tasks", TASKS), ("protocols", PROTOCOLS)):
        terminal.seek(0)
        terminal.truncate()
        assert invoke("list", what).exit_code == 0
        text = terminal.getvalue()
        assert "…" not in text and max(map(len, text.splitlines())) <= 80
        words = set(text.replace(",", " ").split())
        for entry in registry.entries():
            assert {entry.name, *entry.aliases} <= words


@pytest.mark.parametrize("what", ["tasks", "mechs", "protocols"])
def test_list_json(what):
    result = invoke("list", what, "--json")
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)
    assert all(list(r) == list(catalog.LISTINGS[what]) for r in records)
    registry = {"tasks": TASKS, "mechs": MECHANISMS, "protocols": PROTOCOLS}[what]
    assert sorted(r["name"] for r in records) == sorted(registry.names())


def test_results_json(results):
    result = invoke("results", "--results", results, "--json", "--mech", "softmax")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert list(row) == COLUMNS
    assert row["mechanism"] == "softmax" and row["config"]["task"] == "copy"
    assert row["curve_steps"] == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]
    assert (
        json.loads(invoke("results", "--results", results, "--json", "--task", "sort").stdout) == []
    )


def test_results_filters_take_aliases_and_stored_names(results):
    result = invoke("results", "--results", results, "--mech", "elu", "--protocol", "smoke")
    assert result.exit_code == 0 and result.stdout.splitlines()[-1] == "1 row"


# -- signals and pipes: a real process --------------------------------------------------------


def test_closed_stdout_exits_quietly(tmp_path):
    """`synthbench run ... | head -1`: the reader goes away after the first line."""
    process = subprocess.Popen(
        command_line("run", "--task", "copy", *SMOKE, "--results", tmp_path / "r"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=SUBPROCESS_ENV,
    )  # fmt: skip
    process.stdout.readline()
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == common.CLOSED_PIPE, stderr
    assert stderr == ""


def test_closed_stdout_of_a_listing():
    process = subprocess.Popen(
        command_line("list", "tasks", "--json"), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    process.stdout.close()
    assert process.wait(timeout=60) == common.CLOSED_PIPE
    assert process.stderr.read() == b""


def importing_torch(pid: int) -> bool:
    """Whether the process has mapped a file of torch: the command line's imports are under
    way (its Ctrl-C hook set before them), none of its commands has started."""
    try:
        return "torch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:  # not started yet, or gone
        return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux's /proc")
def test_ctrl_c_during_start_up_is_one_line(tmp_path):
    process = subprocess.Popen(
        command_line("run", "--task", "copy", *SMOKE, "--results", tmp_path / "r"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=SUBPROCESS_ENV,
        # the default handler: a background child may inherit SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not importing_torch(process.pid) and time.monotonic() < deadline:
        time.sleep(0.002)
    process.send_signal(signal.SIGINT)  # inside the imports (about 1.5 s of torch and pandas)
    stdout, stderr = process.communicate(timeout=60)
    # killed by SIGINT once the message is out (as Python exits on Ctrl-C), or exit 130
    assert process.returncode in (-signal.SIGINT, common.INTERRUPTED), (stderr, stdout)
    assert "Traceback" not in stderr.decode()
    assert stderr.decode().startswith("error: interrupted")


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_ctrl_c_under_the_progress_bar_starts_its_own_line(tmp_path):
    """In a terminal, Ctrl-C while a training runs: the bar's line ends first, so the one
    error line starts a line of its own (not after the bar on the bar's line)."""
    leader, follower = pty.openpty()
    env = {**SUBPROCESS_ENV, "TERM": "xterm", "COLUMNS": "150"}
    env.pop("NO_COLOR", None)
    process = subprocess.Popen(
        command_line("run", "--task", "kv_recall", "--mech", "softmax", "--seeds", "1",
                     "--protocol", "quick", "--jobs", "1", "--results", tmp_path / "r"),
        stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    os.close(follower)
    seen, deadline = b"", time.monotonic() + 120
    try:
        while b"now kv_recall softmax seed 0" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if ready:
                seen += os.read(leader, 65536)
        assert b"now kv_recall softmax seed 0" in seen, seen  # the bar says what trains
        assert b"checking softmax for causality" in seen, seen  # and what comes before it
        process.send_signal(signal.SIGINT)
        while process.poll() is None or select.select([leader], [], [], 0.5)[0]:
            try:
                seen += os.read(leader, 65536)
            except OSError:  # the terminal closed with the process
                break
    finally:
        process.kill()
        process.wait(timeout=60)
        os.close(leader)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode(errors="replace"))  # no colours
    lines = text.replace("\r\n", "\n").split("\n")
    errors = [line for line in lines if "interrupted" in line]
    assert len(errors) == 1, (process.returncode, text[-3000:])  # what it printed last
    (error,) = errors
    assert error.lstrip("\r").startswith("error: interrupted; finished trainings are stored")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["results", "--csv", "/proc/rows.csv"], "--csv"),
        (["report", "--out", "/proc/reports"], "--out"),
        (["run", "--task", "copy", "--results", "/proc/results"], "--results"),
    ],
)
def test_a_place_no_file_can_be_made_in_is_refused_up_front(results, args, option):
    """/proc passes access() for root, who may write anywhere else: only making a file there
    tells, and the refusal is the documented exit 2, before any work."""
    if args[0] != "run":
        args = [*args, "--results", results]
    assert_error(invoke(*args), 2, f"{option} /proc/")
