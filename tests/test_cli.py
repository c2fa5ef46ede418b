"""The command line: run (resume, force, errors), list, results, report, SIGKILL resume."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from synthbench.cli import app
from synthbench.core.task import TASKS
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.schema import COLUMNS
from synthbench.run.spec import RunSpec
from synthbench.run.store import ResultStore

pytestmark = pytest.mark.usefixtures("single_thread")

RUN = ["run", "--task", "copy,kv_recall", "--mech", "softmax,linear", "--protocol", "smoke"]
# a wide console, so that rich never wraps or crops a name in a table or a message
ENV = {"COLUMNS": "250"}
SUBPROCESS_ENV = {**os.environ, **ENV, "OMP_NUM_THREADS": "1"}


def invoke(*args):
    result = CliRunner().invoke(app, [str(a) for a in args], env=ENV)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under root (hidden ones too) with size and mtime."""
    return {
        str(p.relative_to(root)): (p.stat().st_size if p.is_file() else -1, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


def parquet_files(root: Path) -> list[Path]:
    return [p for p in ResultStore(root).files() if p.suffix == ".parquet"]


def expected_run_ids(tasks, mechs, seeds) -> set[str]:
    smoke = PROTOCOLS.get("smoke")
    return {
        RunSpec.resolve(t, m, smoke, s).run_id for t in tasks for m in mechs for s in range(seeds)
    }


@pytest.fixture(scope="module")
def stored(tmp_path_factory, single_thread):
    """The 8 runs of 2 tasks x 2 mechanisms x 2 seeds, stored once for the module."""
    root = tmp_path_factory.mktemp("stored") / "results"
    result = invoke(*RUN, "--seeds", 2, "--results", root)
    return root, result


@pytest.fixture
def results(stored, tmp_path) -> Path:
    """A private copy of the stored tree (mtimes kept)."""
    root = tmp_path / "results"
    shutil.copytree(stored[0], root)
    return root


# -- run ----------------------------------------------------------------------------------


def test_run_writes_one_file_per_run(stored):
    root, result = stored
    assert result.exit_code == 0, result.output
    assert "8 runs (2 tasks x 2 mechanisms x 2 seeds" in result.stdout
    assert "0 already stored, 8 to run" in result.stdout
    assert "done: 8 ok" in result.stdout
    files = parquet_files(root)
    assert len(files) == 8
    report = ResultStore(root).load(warn=False)
    assert report.skipped == []
    assert len(report.rows) == 8
    assert set(report.rows["run_id"]) == expected_run_ids(
        ["copy", "kv_recall"], ["softmax", "linear"], 2
    )
    assert {p.stem for p in files} == set(report.rows["run_id"])
    assert (report.rows["status"] == "ok").all() and report.rows["selected"].all()
    assert result.stderr == ""


def test_run_again_stores_nothing_new(results):
    before = snapshot(results)
    result = invoke(*RUN, "--seeds", 2, "--results", results)
    assert result.exit_code == 0, result.output
    assert "8 already stored, 0 to run" in result.stdout
    assert "nothing new" in result.stdout
    assert "━" not in result.stdout  # no empty progress bar
    assert snapshot(results) == before


@pytest.mark.slow
def test_force_reruns_everything(results):
    before = snapshot(results)
    result = invoke(*RUN, "--seeds", 2, "--results", results, "--force")
    assert result.exit_code == 0, result.output
    assert "0 already stored, 8 to run" in result.stdout
    after = snapshot(results)
    assert set(after) == set(before)
    files = [k for k in before if k.endswith(".parquet")]
    assert len(files) == 8
    assert all(after[f][1] != before[f][1] for f in files)
    rows = ResultStore(results).load(warn=False).rows
    assert len(rows) == 8 and rows["run_id"].is_unique


def test_run_category_runs_only_that_category(tmp_path):
    root = tmp_path / "results"
    result = invoke(
        "run", "--task", "copy,sort,kv_recall,first_token", "--category", "memory",
        "--mech", "softmax", "--seeds", 1, "--protocol", "smoke", "--results", root,
        "--task-param", "n=8",
    )  # fmt: skip
    assert result.exit_code == 2  # kv_recall has no parameter n: refused before any run
    assert "no parameter n" in result.stderr and not root.exists()
    result = invoke(
        "run", "--task", "copy,sort,kv_recall", "--category", "memory",
        "--mech", "softmax", "--seeds", 1, "--protocol", "smoke", "--results", root,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "1 run (1 task x 1 mechanism x 1 seed" in result.stdout
    files = parquet_files(root)
    assert [p.relative_to(root).parts[:3] for p in files] == [
        ("protocol=smoke", "task=kv_recall", "mechanism=softmax")
    ]


def test_run_with_eval_length_mult_prints_and_stores_the_long_metrics(tmp_path):
    root = tmp_path / "results"
    result = invoke(
        "run", "--task", "copy", "--mech", "none", "--seeds", 1, "--protocol", "smoke",
        "--task-param", "n=4", "--eval-length-mult", 2, "--results", root,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "at 2x length" in result.stdout
    rows = ResultStore(root).load().rows
    assert rows["eval_length_mult"].tolist() == [2.0] and rows["long_token_acc"].notna().all()


def test_show_task_marks_the_answers():
    result = invoke("show-task", "copy", "--param", "n=5", "--seed", 1)
    assert result.exit_code == 0, result.output
    *_, sequence = result.stdout.strip().splitlines()
    words = sequence.split()
    assert len(words) == 11 and words[5] == "SEP"
    assert [w.strip("[]") for w in words[6:]] == words[:5]
    assert all(w.startswith("[") and w.endswith("]") for w in words[6:])
    assert not any(w.startswith("[") for w in words[:6])


@pytest.mark.parametrize("name", ["kv_recall", "stack", "addition", "histogram"])
def test_show_task_every_answer_is_marked_once(name):
    task = TASKS.get(name)()
    result = invoke("show-task", name)
    assert result.exit_code == 0, result.output
    sequence = result.stdout.strip().splitlines()[-1].split()
    assert len(sequence) == task.seq_len + 1
    batch = task.generate(1, torch.Generator().manual_seed(0))
    assert sum(w.startswith("[") for w in sequence) == int(batch.answer_mask.sum())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["show-task", "cpy"], "did you mean copy"),
        (["show-task", "copy", "--param", "n=0"], "copy needs n >= 1"),
        (["show-task", "copy", "--param", "m=3"], "no parameter m"),
        (["show-task", "copy", "--difficulty", "brutal"], "unknown difficulty 'brutal'"),
    ],
)
def test_show_task_errors(args, message):
    result = invoke(*args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_list_tasks_shows_22_tasks_in_7_categories():
    result = invoke("list", "tasks")
    assert result.exit_code == 0, result.output
    assert "22 tasks in 7 categories in the default suite (--task all)" in result.stdout
    # the State tasks are listed too, marked as outside the default suite
    assert "2 outside it, in --task extended: mod_counting, permutation" in result.stdout
    listed = {line.split()[0]: line.split() for line in result.stdout.splitlines() if line}
    assert "extended" in listed["permutation"] and "extended" not in listed["copy"]


def test_run_accepts_aliases_and_deduplicates(tmp_path, stored):
    """'mqar' and 'kv_recall' are one task; 'elu' is linear: the stored runs are found."""
    root = tmp_path / "results"
    shutil.copytree(stored[0], root)
    result = invoke(
        "run", "--task", "mqar,kv_recall", "--mech", "elu", "--seeds", 2,
        "--protocol", "smoke", "--results", root,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "2 runs (1 task x 1 mechanism x 2 seeds" in result.stdout
    assert "2 already stored, 0 to run" in result.stdout


BAD_RUNS = {
    "unknown-task": (["--task", "cpy"], "did you mean copy"),
    "unknown-task-in-list": (["--task", "copy,nope"], "'nope'"),
    "unknown-mech": (["--mech", "sofmax"], "'sofmax'"),
    "unknown-protocol": (["--protocol", "smoek"], "'smoek'"),
    "unknown-category": (["--category", "Memry"], "'Memry'"),
    "empty-selection": (["--category", "Arithmetic"], "no task matches"),
    "zero-seeds": (["--seeds", "0"], "--seeds"),
    "negative-seeds": (["--seeds", "-2"], "--seeds"),
    "bad-device": (["--device", "gpu"], "'gpu'"),
    "missing-plugin": (["--plugin", "no_such_plugin.py"], "no_such_plugin.py"),
    "zero-jobs": (["--jobs", "0"], "--jobs"),
    "zero-threads": (["--threads", "0"], "--threads"),
    "too-many-threads": (["--threads", "100000"], "--threads"),
    "unknown-executor": (["--executor", "dask"], "'dask'"),
    "zero-cpus-per-run": (["--executor", "ray", "--cpus-per-run", "0"], "--cpus-per-run"),
    "negative-gpus-per-run": (["--executor", "ray", "--gpus-per-run", "-1"], "--gpus-per-run"),
    "bad-device-index": (["--device", "cuda:x"], "'cuda:x'"),
    "absent-device": (["--device", "cuda"], "torch sees no cuda device"),
}


@pytest.mark.parametrize("case", list(BAD_RUNS))
def test_user_errors_exit_2_with_one_line(results, case):
    overrides, culprit = BAD_RUNS[case]
    args = dict(zip(RUN[1::2], RUN[2::2], strict=True)) | {"--seeds": "1"}
    args |= dict(zip(overrides[::2], overrides[1::2], strict=True))
    before = snapshot(results)
    result = invoke("run", *[x for kv in args.items() for x in kv], "--results", results)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error:")
    assert culprit in lines[0]
    assert result.stdout == ""
    assert snapshot(results) == before


def test_user_error_in_a_real_process(tmp_path):
    """Exit status and stderr as a shell sees them."""
    root = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "synthbench.cli", *RUN, "--task", "cpy", "--results", str(root)],
        capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "did you mean copy" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not root.exists()


def test_erroring_run_exits_1_and_is_stored(tmp_path):
    """A mechanism that raises: stored as status 'error' with its message; exit status 1."""
    plugin = tmp_path / "kaboom_plugin.py"
    plugin.write_text(
        "from synthbench.core.mechanism import MECHANISMS, Mechanism\n\n\n"
        "@MECHANISMS.register('kaboom', complexity='linear', family='test', reference='none')\n"
        "class Kaboom(Mechanism):\n"
        "    def forward(self, q, k, v, causal=True):\n"
        "        raise RuntimeError('kaboom')\n"
    )
    root = tmp_path / "results"
    args = ["run", "--task", "kv_recall", "--mech", "kaboom", "--seeds", "1"]
    args += ["--protocol", "smoke", "--results", str(root), "--plugin", str(plugin)]
    first = invoke(*args)
    assert first.exit_code == 1, first.output
    assert "raised" in first.stderr
    rows = ResultStore(root).load(warn=False).rows
    assert rows["status"].tolist() == ["error"]
    assert "RuntimeError: kaboom" in rows["error"].iloc[0]
    assert rows["token_acc"].isna().all()
    again = invoke(*args)  # it runs again next time
    assert "0 already stored, 1 to run" in again.stdout and again.exit_code == 1


# -- a corrupt file in the tree -----------------------------------------------------------


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_corrupt_file_is_reported_and_rerun(results, tmp_path):
    bad = parquet_files(results)[3]
    truncate(bad)

    # markdown only: the figures would take most of this test's time and test nothing here
    report = invoke("report", "--results", results, "--out", tmp_path / "reports", "--format", "md")
    assert report.exit_code == 0, report.output
    assert "warning" in report.stderr and str(bad) in report.stderr
    assert (tmp_path / "reports" / "smoke" / "target" / "full.md").exists()

    listing = invoke("results", "--results", results)
    assert listing.exit_code == 0, listing.output
    assert "warning" in listing.stderr and str(bad) in listing.stderr
    assert "7 rows" in listing.stdout

    before, truncated = snapshot(results), bad.read_bytes()
    rerun = invoke(*RUN, "--seeds", 2, "--results", results)
    assert rerun.exit_code == 0, rerun.output
    assert "7 already stored, 1 to run" in rerun.stdout
    assert str(bad) in rerun.stderr
    after = snapshot(results)
    changed = {k for k in after if after[k] != before.get(k) and after[k][0] >= 0}  # files
    # the unreadable file is kept, moved aside to a hidden name (docs/CLI.md, "Errors")
    (aside,) = [k for k in changed if ".unreadable-" in k]
    assert changed == {str(bad.relative_to(results)), aside}
    assert (results / aside).read_bytes() == truncated and str(results / aside) in rerun.stderr
    store = ResultStore(results)
    whole = store.load(warn=False)
    assert whole.skipped == [] and len(whole.rows) == 8
    assert set(whole.rows["run_id"]) == expected_run_ids(
        ["copy", "kv_recall"], ["softmax", "linear"], 2
    )


def test_warning_names_a_path_with_brackets(stored, tmp_path):
    """Paths are printed as they are, not read as rich markup ('[old]' must survive)."""
    root = tmp_path / "results[old]"
    shutil.copytree(stored[0], root)
    bad = parquet_files(root)[0]
    truncate(bad)
    listing = invoke("results", "--results", root)
    assert listing.exit_code == 0, listing.output
    assert str(bad) in listing.stderr, listing.stderr


# -- list, results, report ----------------------------------------------------------------


@pytest.mark.parametrize(
    "what,names",
    [
        ("tasks", ["copy", "kv_recall", "Basic", "Memory"]),
        ("mechs", ["softmax", "linear", "none", "quadratic", "state/head", "32,768"]),
        ("mechanisms", ["softmax", "linear"]),
        ("protocols", ["smoke", "quick", "standard", "slay-paper"]),
    ],
)
def test_list(what, names):
    result = invoke("list", what)
    assert result.exit_code == 0, result.output
    for name in names:
        assert name in result.stdout, name


def test_list_unknown_kind():
    result = invoke("list", "foo")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "foo" in lines[0]


def test_results_csv(stored, tmp_path):
    root, _ = stored
    out = tmp_path / "out.csv"
    result = invoke("results", "--results", root, "--csv", out)
    assert result.exit_code == 0, result.output
    assert f"8 rows -> {out}" in result.stdout
    table = pd.read_csv(out)
    assert list(table.columns) == COLUMNS
    assert len(table) == 8 and table["selected"].all()
    assert sorted(table["run_id"]) == sorted(p.stem for p in parquet_files(root))


def test_results_csv_to_stdout(stored):
    result = invoke("results", "--results", stored[0], "--csv", "-", "--task", "copy")
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[0].split(",")[:3] == COLUMNS[:3]
    assert len(lines) == 1 + 4


@pytest.mark.parametrize(
    "args,n",
    [
        ([], 8),
        (["--status", "ok"], 8),
        (["--status", "error"], 0),
        (["--task", "copy"], 4),
        (["--mech", "linear", "--task", "kv_recall"], 2),
        (["--protocol", "quick"], 0),
        (["--all-lrs"], 8),
    ],
)
def test_results_filters(stored, args, n):
    result = invoke("results", "--results", stored[0], *args)
    assert result.exit_code == 0, result.output
    assert f"{n} rows" in result.stdout.splitlines()[-1]


def test_results_show_the_selected_row_only(stored, tmp_path):
    """With an lr sweep, `results` shows the selected row unless --all-lrs."""
    root = tmp_path / "results"
    shutil.copytree(stored[0], root)
    path = parquet_files(root)[0]
    table = pq.read_table(path)
    rows = table.to_pandas()
    rows = pd.concat([rows, rows.assign(lr=9e-3, selected=False)])
    pq.write_table(pa.Table.from_pandas(rows, schema=table.schema, preserve_index=False), path)
    assert invoke("results", "--results", root).stdout.splitlines()[-1] == "8 rows"
    assert invoke("results", "--results", root, "--all-lrs").stdout.splitlines()[-1] == "9 rows"


def test_report_writes_tables(stored, tmp_path):
    out = tmp_path / "reports"
    result = invoke("report", "--results", stored[0], "--out", out)
    assert result.exit_code == 0, result.output
    md, tex = out / "smoke" / "target" / "full.md", out / "smoke" / "target" / "full.tex"
    assert md.is_file() and tex.is_file()
    text = md.read_text()
    for word in ("copy", "kv_recall", "softmax", "linear", "±", "protocol smoke"):
        assert word in text
    assert r"kv\_recall" in tex.read_text() and r"\toprule" in tex.read_text()
    for name in ("leaderboard.md", "leaderboard.html"):
        assert (out / name).is_file()
    assert (out / "smoke" / "target" / "heatmap.png").is_file()
    assert f"wrote {md}" in result.stdout
    assert "Core capabilities" in result.stdout  # the category averages are printed
    assert result.stderr == ""


def test_report_filters_and_formats(stored, tmp_path):
    out = tmp_path / "reports"
    result = invoke(
        "report",
        "--results",
        stored[0],
        "--out",
        out,
        "--mech",
        "standard",
        "--task",
        "kv_recall",
        "--format",
        "md",
    )
    assert result.exit_code == 0, result.output
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert written == [
        "leaderboard.md",
        "smoke/lrs.md",
        "smoke/separation.csv",  # every pair on every task: the data behind separation.md
        "smoke/separation.md",
        "smoke/target/category-memory.md",
        "smoke/target/curves.md",
        "smoke/target/full.md",
        "smoke/target/summary.md",
    ]
    full = (out / "smoke" / "target" / "full.md").read_text()
    assert "softmax" in full and "linear" not in full and "copy" not in full
    basic = invoke(
        "report", "--results", stored[0], "--out", out, "--category", "basic", "--format", "md"
    )
    assert basic.exit_code == 0 and "kv_recall" not in (out / "smoke/target/full.md").read_text()


@pytest.mark.parametrize(
    "args, message",
    [
        (("--metric", "loss"), "loss"),
        (("--format", "md,svg"), "unknown format svg"),
        (("--compare", "slay-paper"), "needs rows of protocol slay-paper"),
        (("--compare", "nope"), "unknown comparison"),
        (("--protocol", "standard"), "no results"),
        (("--mech", "softmx"), "softmax"),
        (("--category", "nope"), "unknown category"),
    ],
)
def test_report_errors(stored, tmp_path, args, message):
    result = invoke("report", "--results", stored[0], "--out", tmp_path / "r", *args)
    assert result.exit_code == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_report_without_results(tmp_path):
    empty = invoke("report", "--results", tmp_path / "none", "--out", tmp_path / "r")
    assert empty.exit_code == 2 and "no results" in empty.stderr


def test_run_with_task_and_mechanism_parameters_records_them(tmp_path):
    root = tmp_path / "results"
    result = invoke(
        "run", "--task", "copy", "--task-param", "n=8", "--mech", "linear",
        "--mech-param", "eps=1e-4", "--seeds", 1, "--protocol", "smoke", "--results", root,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = ResultStore(root).load(warn=False).rows
    assert json.loads(rows.loc[0, "task_params"])["n"] == 8
    assert json.loads(rows.loc[0, "mechanism_params"])["eps"] == 1e-4


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--task-param", "n=abc", "parameter n must be int"),
        ("--task-param", "size=3", "has no parameter size"),
        ("--mech-param", "eps=-1", "mechanism linear: eps must be >= 0"),
    ],
)
def test_run_with_invalid_parameters_exits_2(tmp_path, option, value, message):
    result = invoke(
        "run", "--task", "copy", "--mech", "linear", option, value, "--protocol", "smoke",
        "--results", tmp_path / "results",
    )  # fmt: skip
    assert result.exit_code == 2
    assert message in result.stderr
    assert not (tmp_path / "results").exists()
