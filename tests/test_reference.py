"""The reference baselines shipped with synthbench (synthbench/report/reference.py): loading and
validation, the reference beside a user's rows in `report` (marked, the user's run winning),
`--no-reference`, and `reproduce` end to end on a tiny reference made here
(``SYNTHBENCH_REFERENCE``), never on the shipped file's contents; plus checks of the shipped
file itself and of benchmarks/build_reference.py."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from clitools import assert_error, invoke, load_script

from synthbench.cli.reproduce import _sample
from synthbench.core.task import TASKS
from synthbench.report import reference, reproduction
from synthbench.report.leaderboard import ONE_SEED_NOTE
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.schema import COLUMNS
from synthbench.run.spec import SUITE_VERSION
from synthbench.run.store import ResultStore

pytestmark = pytest.mark.usefixtures("single_thread")


SMOKE_V = PROTOCOLS.get("smoke").version


def stored_rows(root: Path) -> pd.DataFrame:
    return ResultStore(root).load(warn=False).rows


@pytest.fixture(scope="module")
def reference_tree(smoke_tree) -> pd.DataFrame:
    """The rows of copy x (softmax, linear), smoke, seed 0 (tests/conftest.py), as a
    reference."""
    return stored_rows(smoke_tree)


@pytest.fixture(scope="module")
def two_track_tree(smoke_tree, tmp_path_factory) -> Path:
    """The smoke tree and its block-track twin: copy x (softmax, linear), seed 0, of smoke
    and of smoke-block (40 steps), as the reference's quick and quick-block are."""
    root = tmp_path_factory.mktemp("two_track_tree") / "results"
    shutil.copytree(smoke_tree, root)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # as single_thread: tiny models
    args = ["--protocol", "smoke-block", "--seeds", "1", "--jobs", "1", "--results", root]
    result = invoke("run", "--task", "copy", "--mech", "softmax,linear", *args)
    torch.set_num_threads(previous)
    assert result.exit_code == 0, result.output
    return root


@pytest.fixture
def tiny_reference(reference_tree, tmp_path, monkeypatch) -> Path:
    """A reference file of the smoke tree's runs, what every command here reads."""
    path = tmp_path / "reference" / "tiny.parquet"
    reference.write(reference_tree, path, {"what": "a test's"})
    monkeypatch.setenv(reference.ENV, str(path))
    return path


def user_tree(smoke_tree, tmp_path, mechanisms=("softmax",)) -> Path:
    """A results tree holding only the smoke tree's runs of ``mechanisms``."""
    root = tmp_path / "results"
    shutil.copytree(smoke_tree, root)
    for folder in (root / "protocol=smoke" / "task=copy").iterdir():
        if folder.name.split("=", 1)[1] not in mechanisms:
            shutil.rmtree(folder)
    return root


# -- loading and validation -----------------------------------------------------------------


def test_load_reads_back_what_was_written(tiny_reference, reference_tree):
    loaded = reference.load()  # from $SYNTHBENCH_REFERENCE
    assert loaded.usable and loaded.problem is None
    assert loaded.where == str(tiny_reference) and loaded.info == {"what": "a test's"}
    assert list(loaded.rows.columns) == COLUMNS
    assert sorted(loaded.rows["run_id"]) == sorted(reference_tree["run_id"])
    assert loaded.protocols == {"smoke"}
    # the same rows give the same bytes
    again = tiny_reference.with_name("again.parquet")
    reference.write(reference_tree, again, {"what": "a test's"})
    assert again.read_bytes() == tiny_reference.read_bytes()


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"suite_version": SUITE_VERSION - 1}, f"is for suite v{SUITE_VERSION - 1}"),
        ({"protocol_version": 99}, f"is for protocol smoke v99; this synthbench's is v{SMOKE_V}"),
        ({"protocol": "nope"}, "holds protocol nope, unknown"),
        ({"schema_version": 99}, "is of schema version 99"),
    ],
)
def test_another_version_is_not_shown(reference_tree, tmp_path, change, problem):
    path = tmp_path / "other.parquet"
    reference.write(reference_tree.assign(**change), path)
    loaded = reference.load(path)
    assert not loaded.usable and loaded.rows.empty
    assert loaded.problem.startswith(f"the reference {path} ") and problem in loaded.problem


def test_absent_and_unreadable_files(tmp_path):
    assert reference.load(tmp_path / "none.parquet").problem.endswith("does not exist")
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet")
    assert "cannot read" in reference.load(junk).problem


def test_report_warns_once_about_a_reference_of_another_suite_version(
    smoke_tree, reference_tree, tmp_path, monkeypatch
):
    path = tmp_path / "old.parquet"
    reference.write(reference_tree.assign(suite_version=SUITE_VERSION - 1), path)
    monkeypatch.setenv(reference.ENV, str(path))
    results = user_tree(smoke_tree, tmp_path)
    out = tmp_path / "reports"
    result = invoke("report", "--results", results, "--out", out, "--format", "md")
    assert result.exit_code == 0, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("warning: the reference") and f"suite v{SUITE_VERSION - 1}" in line
    assert line.endswith("reference runs not shown")
    assert "(reference)" not in (out / "smoke" / "target" / "full.md").read_text()


# -- beside the user's rows -----------------------------------------------------------------


def test_with_reference_adds_marked_runs_and_the_users_run_wins(reference_tree):
    user = reference_tree[reference_tree["mechanism"] == "softmax"]
    rows, added = reference.with_reference(user, reference_tree)
    assert set(added["mechanism"]) == {"linear"}  # softmax: the user has the same run id
    assert sorted(rows["mechanism"].unique()) == ["linear (reference)", "softmax"]
    assert len(rows) == len(reference_tree)
    # filters, protocols and tasks of the user's rows only
    assert reference.with_reference(user, reference_tree, mechanisms=["softmax"])[1].empty
    assert reference.with_reference(user, reference_tree, tasks=["sort"])[1].empty
    assert reference.with_reference(user.assign(protocol="quick"), reference_tree)[1].empty
    assert reference.with_reference(user.assign(task="sort"), reference_tree)[1].empty


def test_replaced_runs_are_the_reference_runs_yours_have(reference_tree):
    user = reference_tree[reference_tree["mechanism"] == "softmax"]
    replaced = reference.replaced_runs(user, reference_tree)
    assert list(replaced.columns) == reference.REPLACED_COLUMNS
    assert replaced[["task", "mechanism", "seed"]].values.tolist() == [["copy", "softmax", 0]]
    # another run id, a filtered-out mechanism: nothing replaced
    assert reference.replaced_runs(user.assign(run_id="mine"), reference_tree).empty
    assert reference.replaced_runs(user, reference_tree, mechanisms=["linear"]).empty
    found = reference.for_report(user, path=None)  # $SYNTHBENCH_REFERENCE unset: shipped
    assert isinstance(found, reference.ForReport) and len(found) == 4


def test_with_reference_drops_names_unknown_here(reference_tree):
    user = reference_tree[reference_tree["mechanism"] == "softmax"].assign(run_id="mine")
    foreign = reference_tree.assign(mechanism="gone-mechanism", run_id="gone")
    rows, added = reference.with_reference(user, pd.concat([reference_tree, foreign]))
    assert sorted(added["mechanism"].unique()) == ["linear", "softmax"]
    assert "gone-mechanism (reference)" not in set(rows["mechanism"])
    only_foreign = reference.with_reference(user, foreign)
    assert only_foreign[1].empty and only_foreign[0] is user


def test_report_marks_reference_runs_everywhere(smoke_tree, tiny_reference, tmp_path):
    results = user_tree(smoke_tree, tmp_path)
    out = tmp_path / "reports"
    result = invoke("report", "--results", results, "--out", out, "--format", "md,html")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    (line,) = [s for s in result.stdout.splitlines() if "reference run" in s]
    assert line.startswith(
        f"1 run of yours beside 1 reference run of linear (protocol smoke v{SMOKE_V}"
    )
    assert "--no-reference" in line
    full = (out / "smoke" / "target" / "full.md").read_text()
    header = next(s for s in full.splitlines() if s.startswith("| category"))
    assert [c.strip() for c in header.strip("|").split("|")][2:] == [
        "linear (reference)",
        "softmax",
    ]
    board = (out / "leaderboard.md").read_text()
    assert "linear (reference)" in board and "softmax (reference)" not in board
    # your softmax run has the reference's run id: it replaced it, and the board says so
    assert line.endswith("; 1 run of yours replaces the reference's of the same configuration "
                         "(the leaderboard names them)")  # fmt: skip
    assert "Replaced: 1 run of yours has the configuration (the run id)" in board
    assert "softmax on copy (seed 0)." in board
    assert "softmax on copy (seed 0)." in (out / "leaderboard.html").read_text()
    # a tree of one seed: no rank interval, and one line says why
    assert board.count(ONE_SEED_NOTE) == 1 and "Rank [95% CI]:" not in board
    assert "linear (reference)" in (out / "leaderboard.html").read_text()
    for name in ("summary.md", "category-basic.md", "curves.md"):
        assert "linear (reference)" in (out / "smoke" / "target" / name).read_text()
    assert "linear (reference)" in (out / "smoke" / "lrs.md").read_text()


def test_no_reference_and_filters(smoke_tree, tiny_reference, tmp_path):
    results = user_tree(smoke_tree, tmp_path)
    out = tmp_path / "reports"
    for args in (["--no-reference"], ["--mech", "softmax"]):
        result = invoke("report", "--results", results, "--out", out, "--format", "md", *args)
        assert result.exit_code == 0, result.output
        assert "reference run" not in result.stdout
        assert "(reference)" not in (out / "smoke" / "target" / "full.md").read_text()


def test_reference_of_another_protocol_is_named(smoke_tree, reference_tree, tmp_path, monkeypatch):
    """A reference of quick only beside rows of smoke only: a line says why none is shown."""
    path = tmp_path / "quick.parquet"
    version = PROTOCOLS.get("quick").version
    reference.write(reference_tree.assign(protocol="quick", protocol_version=version), path)
    monkeypatch.setenv(reference.ENV, str(path))
    out = tmp_path / "reports"
    result = invoke("report", "--results", smoke_tree, "--out", out, "--format", "md")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    why = (
        f"no shipped reference runs beside protocol smoke v{SMOKE_V}: the reference holds quick "
        f"v{version}"
    )
    assert why in result.stdout


def test_report_without_results_hints_at_a_first_run(tmp_path):
    for root in (tmp_path / "none", tmp_path / "empty"):
        if root.name == "empty":
            root.mkdir()
        result = invoke("report", "--results", root, "--out", tmp_path / "r")
        assert_error(result, 2, f"no results under {root}/")
        assert "(run something first, e.g. `synthbench run --task copy`; the shipped " in (
            result.stderr
        )
        bare = invoke("report", "--results", root, "--out", tmp_path / "r", "--no-reference")
        assert_error(bare, 2, f"no results under {root}/")
        assert "run something first" not in bare.stderr


# -- reproduce ------------------------------------------------------------------------------


def test_reproduce_trains_again_and_finds_it_identical(tiny_reference, tmp_path):
    results = tmp_path / "again"
    result = invoke("reproduce", "--mech", "linear", "--runs", 5, "--results", results, "--jobs", 1)
    assert result.exit_code == 0, result.output
    assert "reproducing 1 reference run of 1 (sample seed " in result.stdout
    assert "identical results expected" in result.stdout
    (line,) = [s for s in result.stdout.splitlines() if s.startswith("copy ")]
    assert line.split()[:4] == ["copy", "linear", "seed", "0"]
    assert line.endswith("identical")
    assert "the run reproduces" in result.stdout
    assert len(ResultStore(results).files()) == 1  # the run, stored where --results says


@pytest.mark.parametrize(
    "made, why",
    [
        ({"torch_version": "1.0.0-elsewhere"}, "torch 1.0.0-elsewhere made it, 2.13.0"),
        ({"cpu_isa": "NEON"}, "made on a CPU with NEON, here "),
        ({"cpu_isa": None}, "the reference does not record its CPU's instruction set"),
        (
            {"cpu_model": "AuthenticAMD 25/17/1 AMD EPYC 9654"},
            "made on AuthenticAMD 25/17/1 AMD EPYC 9654, here on ",
        ),
        ({"cpu_model": None}, "the reference does not record its CPU model"),
    ],  # fmt: skip
)
def test_reproduce_in_another_setting_is_within_the_tolerance(
    reference_tree, tmp_path, monkeypatch, made, why
):
    """A reference made with another torch build or on a CPU with another vector
    instruction set or of another model (its rows say so), or one that does not say which:
    trained again here,
    the result need not be identical, only within the tolerance, and the command says why.
    The reference's token accuracy is moved by 0.001 so that it is not identical."""
    path = tmp_path / "other-setting.parquet"
    moved = reference_tree.assign(token_acc=reference_tree["token_acc"] + 0.001, **made)
    reference.write(moved, path)
    monkeypatch.setenv(reference.ENV, str(path))
    result = invoke("reproduce", "--mech", "linear", "--results", tmp_path / "r", "--jobs", 1)
    assert result.exit_code == 0, result.output
    assert "results within a tolerance expected, not bit for bit: " + why in result.stdout
    (line,) = [s for s in result.stdout.splitlines() if s.startswith("copy ")]
    # one seed, no spread: 1 / smoke's 64 test examples
    assert " within 0.0156: not bit-identical: " + why in line


def test_reproduce_samples_repeatably(tiny_reference, results):
    def picked(seed):
        # stored there already: compared as stored, nothing trained
        result = invoke("reproduce", "--runs", 1, "--sample-seed", seed, "--results", results)
        assert result.exit_code == 0, result.output
        return [s.split()[1] for s in result.stdout.splitlines() if s.startswith("copy ")]

    draws = {seed: picked(seed) for seed in range(6)}
    assert all(len(d) == 1 for d in draws.values())
    assert {d[0] for d in draws.values()} == {"softmax", "linear"}
    assert picked(3) == draws[3]


def test_the_sample_takes_the_protocols_in_turn():
    """Round-robin over the protocols: n runs of two protocols hold n // 2 of each and one
    more of either, whatever the seed; the same seed, the same sample."""
    ids = [f"{p}-{i}" for p in ("a", "b") for i in range(5)]
    candidates = pd.DataFrame({"protocol": [i[0] for i in ids]}, index=ids)
    firsts = set()
    for seed in range(40):
        for runs in (1, 2, 3, 4, 10, 20):
            picked = _sample(candidates, runs, random.Random(seed))
            assert len(picked) == len(set(picked)) == min(runs, 10)
            counts = [sum(p.startswith(name) for p in picked) for name in ("a", "b")]
            assert sorted(counts) == [min(runs, 10) // 2, (min(runs, 10) + 1) // 2], (seed, runs)
        firsts.add(_sample(candidates, 1, random.Random(seed))[0][0])
        assert _sample(candidates, 3, random.Random(seed)) == _sample(
            candidates, 3, random.Random(seed)
        )
    assert firsts == {"a", "b"}  # either track may come first
    # one protocol: a plain random sample of its runs
    only_a = candidates[candidates["protocol"] == "a"]
    draws = {tuple(_sample(only_a, 2, random.Random(seed))) for seed in range(20)}
    assert len(draws) > 5 and all(set(d) <= set(only_a.index) for d in draws)


def test_reproduce_samples_across_both_tracks(two_track_tree, tmp_path, monkeypatch):
    """A reference of two protocols (smoke and its block twin smoke-block, as quick and
    quick-block): --runs 2 trains one run of each; --protocol keeps one."""
    path = tmp_path / "two-tracks.parquet"
    reference.write(stored_rows(two_track_tree), path)
    monkeypatch.setenv(reference.ENV, str(path))
    results = tmp_path / "results"
    shutil.copytree(two_track_tree, results)  # stored there already: compared as stored

    def picked(*args):
        result = invoke("reproduce", *args, "--results", results)
        assert result.exit_code == 0, result.output
        lines = [s.split() for s in result.stdout.splitlines() if s.startswith("copy ")]
        return [(line[4], line[1]) for line in lines]  # (protocol, mechanism)

    for seed in range(4):
        draw = picked("--runs", 2, "--sample-seed", seed)
        assert sorted(p for p, _ in draw) == ["smoke", "smoke-block"], (seed, draw)
        assert picked("--runs", 2, "--sample-seed", seed) == draw  # the same sample again
    block = picked("--runs", 9, "--protocol", "smoke-block")
    assert sorted(block) == [("smoke-block", "linear"), ("smoke-block", "softmax")]
    # the plan line names every protocol the sample spans
    both = invoke("reproduce", "--runs", 2, "--results", results).stdout
    assert "1 seed, protocols smoke, smoke-block, " in both
    one = invoke("reproduce", "--runs", 2, "--protocol", "smoke", "--results", results).stdout
    assert "1 seed, protocol smoke, " in one


def test_reproduce_leaves_out_names_unknown_here(reference_tree, results, tmp_path, monkeypatch):
    foreign = reference_tree.assign(mechanism="gone-mechanism", run_id="0123456789abcdef")
    path = tmp_path / "foreign.parquet"
    reference.write(pd.concat([reference_tree, foreign]), path)
    monkeypatch.setenv(reference.ENV, str(path))
    result = invoke("reproduce", "--runs", 9, "--results", results)
    assert result.exit_code == 0, result.output
    assert "reproducing 2 reference runs of 2 " in result.stdout
    assert "gone-mechanism" not in result.output


def test_reproduce_says_not_reproduced(reference_tree, results, tmp_path, monkeypatch):
    changed = reference_tree.copy()
    linear = changed["mechanism"] == "linear"
    changed.loc[linear, "token_acc"] = changed.loc[linear, "token_acc"] + 1e-12  # one bit or so
    path = tmp_path / "changed.parquet"
    reference.write(changed, path)
    monkeypatch.setenv(reference.ENV, str(path))
    result = invoke("reproduce", "--runs", 2, "--sample-seed", 0, "--results", results)
    assert_error(result, 1, "1 of 2 reference runs did not reproduce")
    lines = {s.split()[1]: s for s in result.stdout.splitlines() if s.startswith("copy ")}
    assert lines["softmax"].endswith("identical")
    assert "NOT reproduced: not identical: token_acc at lr " in lines["linear"]


def test_reproduce_refuses_a_stale_reference(reference_tree, tmp_path, monkeypatch):
    path = tmp_path / "stale.parquet"
    reference.write(reference_tree.assign(task_params=json.dumps({"n": 3, "vocab": 4})), path)
    monkeypatch.setenv(reference.ENV, str(path))
    result = invoke("reproduce", "--results", tmp_path / "r")
    assert_error(result, 1, "the reference is stale")
    assert "rebuild it (benchmarks/build_reference.py)" in result.stderr
    assert not (tmp_path / "r").exists() or not ResultStore(tmp_path / "r").files()
    # one of another suite version: stale as well
    reference.write(reference_tree.assign(suite_version=SUITE_VERSION + 1), path)
    result = invoke("reproduce")
    assert_error(result, 1, f"is for suite v{SUITE_VERSION + 1}")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--mech", "softmx"], "did you mean softmax"),
        (["--task", "copyy"], "did you mean copy"),
        (["--mech", "performer"], "no reference run matches the selection"),
        (["--max-seconds", "1e-9"], "no reference run of the selection took less than 1e-09 s"),
        (["--runs", "0"], "--runs must be >= 1"),
        (["--max-seconds", "0"], "--max-seconds must be > 0"),
    ],
)
def test_reproduce_errors(tiny_reference, tmp_path, args, message):
    assert_error(invoke("reproduce", *args, "--results", tmp_path / "r"), 2, message)


# -- the rule: identical, or within the tolerance ----------------------------------------------


XEON = "GenuineIntel 6/207/2 Intel(R) Xeon(R) Processor"


def run_rows(
    value, *, torch_version="2.13.0", threads=1, device="cpu", cpu_isa="AVX2", cpu_model=XEON,
    lr=1e-3, **more,
):  # fmt: skip
    """A run's rows: its selected lr at ``value`` and another lr below it."""
    common = {"torch_version": torch_version, "threads": threads, "device": device,
              "cpu_isa": cpu_isa, "cpu_model": cpu_model, "target_metric": "token_acc",
              "status": "ok"}  # fmt: skip
    return [
        {**common, "lr": lr, "selected": True, "token_acc": value, "final_loss": 0.5, **more},
        {**common, "lr": lr * 3, "selected": False, "token_acc": 0.1, "final_loss": 2.0},
    ]


def test_tolerance_is_three_seed_stds_at_least_one_test_example():
    assert reproduction.tolerance([0.5, 0.6, 0.7], 512) == pytest.approx(0.3)  # 3 x 0.1
    assert reproduction.tolerance([0.9, 0.9, 0.9], 512) == 1 / 512
    assert reproduction.tolerance([0.9], 64) == 1 / 64
    assert reproduction.tolerance([], 100) == 0.01


def test_a_cell_of_one_seed_takes_the_pooled_spread():
    assert reproduction.tolerance([0.9], 64, pooled=0.1) == pytest.approx(0.3)
    assert reproduction.tolerance([0.5, 0.6, 0.7], 512, pooled=0.5) == pytest.approx(0.3)  # own
    assert reproduction.tolerance([0.9], 64, pooled=0.001) == 1 / 64
    # sqrt((2 x 0.1^2 + 1 x 0.05^2) / 3): cells weighted by their degrees of freedom
    cells = [[0.5, 0.6, 0.7], [0.2, 0.25], [0.9], [], [float("nan"), 0.4]]
    std, n = reproduction.pooled_std(cells)
    assert n == 2 and std == pytest.approx(((2 * 0.01 + 0.05**2 / 2) / 3) ** 0.5)
    assert reproduction.pooled_std([[0.3], [None, 0.2]]) is None


def test_a_cell_is_the_runs_that_differ_only_in_their_seed():
    """A ladder's levels (other task parameters) are cells apart: their spread is the
    ladder's, not the seeds'."""
    config = {"task": "copy", "task_params": {"n": 8}, "seed": 0, "threads": 1}

    def key(**changes):
        return reproduction.cell_key({"config": json.dumps({**config, **changes})})

    assert key(seed=3) == key()
    assert key(task_params={"n": 16}) != key()
    assert key(threads=2) != key()


def test_reproduce_pools_the_spread_for_a_cell_of_one_seed(reference_tree, tmp_path, monkeypatch):
    """softmax's cell holds one seed: its tolerance is 3 x the pooled std of the cells of
    several seeds, here linear's three (values v, v + 0.1, v + 0.2: std 0.1), and its line
    says so."""
    linear = reference_tree[reference_tree["mechanism"] == "linear"]
    seeds = []
    for seed in (1, 2):
        config = json.loads(linear["config"].iloc[0]) | {"seed": seed}
        seeds.append(linear.assign(
            seed=seed, run_id=f"fake-linear-seed-{seed}", config=json.dumps(config),
            token_acc=linear["token_acc"] + 0.1 * seed,
        ))  # fmt: skip
    moved = pd.concat([reference_tree, *seeds], ignore_index=True).assign(
        torch_version="1.0.0-elsewhere"
    )
    softmax = moved["mechanism"] == "softmax"
    moved.loc[softmax, "token_acc"] += 0.001
    path = tmp_path / "pooled.parquet"
    reference.write(moved, path)
    monkeypatch.setenv(reference.ENV, str(path))
    result = invoke("reproduce", "--mech", "softmax", "--results", tmp_path / "r", "--jobs", 1)
    assert result.exit_code == 0, result.output
    (line,) = [s for s in result.stdout.splitlines() if s.startswith("copy ")]
    assert " within 0.3000: not bit-identical: " in line
    assert line.endswith("(its cell has one seed: the spread of 1 cell of smoke, pooled)")


def test_same_setting_must_be_identical_bit_for_bit():
    same = reproduction.compare(run_rows(0.3), run_rows(0.3), [0.3, 0.3, 0.3], 64)
    assert same.verdict == reproduction.IDENTICAL and same.ok and same.identical_expected
    # 0.1 + 0.2 is not 0.3 in binary: far within any tolerance, still not identical
    close = reproduction.compare(run_rows(0.3), run_rows(0.1 + 0.2), [0.0, 0.5, 1.0], 64)
    assert close.verdict == reproduction.NOT_REPRODUCED and not close.ok
    assert close.reason.startswith("not identical: token_acc at lr 0.001")
    other_lr = reproduction.compare(run_rows(0.3), run_rows(0.3, lr=3e-4), [0.3], 64)
    assert "lrs trained differ" in other_lr.reason
    loss = reproduction.compare(run_rows(0.3), run_rows(0.3, final_loss=0.25), [0.3], 64)
    assert "final_loss" in loss.reason
    # the device index does not matter, only its type; an int read back as a float is equal
    assert reproduction.compare(
        run_rows(0.3, device="cuda:0", n_params=10), run_rows(0.3, device="cuda:1", n_params=10.0),
        [0.3], 64,
    ).ok  # fmt: skip


@pytest.mark.parametrize(
    "setting, why",
    [
        ({"torch_version": "2.14.0"}, "torch 2.13.0 made it, 2.14.0 here"),
        ({"threads": 2}, "1 thread made it, 2 here"),
        ({"device": "cuda:0"}, "made on cpu, here on cuda:0"),
        ({"cpu_isa": "AVX512"}, "made on a CPU with AVX2, here AVX512"),
        # the same instruction set on another model: two AVX512 machines have differed
        (
            {"cpu_model": "AuthenticAMD 25/17/1 EPYC"},
            f"made on {XEON}, here on AuthenticAMD 25/17/1 EPYC",
        ),
    ],  # fmt: skip
)
def test_another_setting_must_be_within_the_tolerance(setting, why):
    seeds = [0.5, 0.6, 0.7]  # tolerance 0.3
    within = reproduction.compare(run_rows(0.6), run_rows(0.85, **setting), seeds, 64)
    assert within.verdict == reproduction.WITHIN and within.ok and not within.identical_expected
    assert within.tolerance == pytest.approx(0.3)
    assert within.reason == f"not bit-identical: {why}"
    off = reproduction.compare(run_rows(0.6), run_rows(0.95, **setting), seeds, 64)
    assert off.verdict == reproduction.NOT_REPRODUCED
    assert off.reason == f"off by 0.3500 > 0.3000 ({why})"
    failed = run_rows(None, **setting)
    failed[0]["status"] = "diverged"
    assert not reproduction.compare(run_rows(0.6), failed, seeds, 64).ok
    # bit for bit the same is a reproduction whatever the setting
    assert reproduction.compare(run_rows(0.6), run_rows(0.6, **setting), seeds, 64).verdict == (
        reproduction.IDENTICAL
    )


def test_a_reference_without_its_cpu_is_compared_within_the_tolerance():
    """Rows made before the CPU's instruction set was recorded (schema < 6): on a CPU,
    bit-identity cannot be asked for."""
    old = reproduction.compare(run_rows(0.6, cpu_isa=None), run_rows(0.61), [0.5, 0.6, 0.7], 64)
    assert old.verdict == reproduction.WITHIN
    assert (
        old.reason == "not bit-identical: the reference does not record its CPU's instruction set"
    )
    # rows of schema 6 record the instruction set but not the model
    older = reproduction.compare(run_rows(0.6, cpu_model=None), run_rows(0.61), [0.5, 0.6], 64)
    assert older.verdict == reproduction.WITHIN
    assert older.reason == "not bit-identical: the reference does not record its CPU model"


# -- the shipped file and its builder ---------------------------------------------------------


def test_the_shipped_reference_is_current(monkeypatch):
    monkeypatch.delenv(reference.ENV, raising=False)
    if not reference.shipped_file().is_file():
        pytest.skip("no shipped reference in this tree (benchmarks/build_reference.py)")
    loaded = reference.load()
    if loaded.outdated:
        # stale between a change of the suite or the recipe and the one rebuild that follows
        # it (recipe v2: issue 71): never shown, and the reason says so in one line
        assert loaded.problem and "this synthbench" in loaded.problem
        pytest.skip(f"the shipped reference is stale: {loaded.problem}")
    assert loaded.problem is None, loaded.problem
    rows = loaded.rows
    assert set(rows["suite_version"]) == {SUITE_VERSION}
    assert set(rows["protocol"]) <= set(reference.REFERENCE_PROTOCOLS)
    for name, rows_of in rows.groupby("protocol"):
        assert set(rows_of["protocol_version"]) == {PROTOCOLS.get(name).version}, name
        assert loaded.info["protocol_versions"][name] == PROTOCOLS.get(name).version
    # complete: every run today's rebuild plans (each ladder level, the seed rule's seeds),
    # and nothing else, each with its selected lr marked
    expected = load_builder().expected_runs(rows)
    assert set(rows["run_id"]) == set(expected)
    assert loaded.info["missing"] == []
    assert rows.groupby("run_id")["selected"].sum().eq(1).all()


def load_builder():
    return load_script("build_reference")


def test_the_builder_expects_every_ladder_level_and_the_state_tasks():
    """What `run --task extended --protocol quick` plans: a laddered task at each level of its
    ladder, the protocol's seeds dealt to the levels; a task without one (bigram, the State
    tasks) at its defaults, every seed."""
    builder = load_builder()
    quick = PROTOCOLS.get("quick")
    specs = [s for s in builder.planned_runs("quick") if s.mechanism == "gla"]
    by_task = {}
    for spec in specs:
        by_task.setdefault(spec.task, []).append(spec)
    assert {"mod_counting", "permutation", "kv_recall", "bigram"} <= set(by_task)
    for task, runs in by_task.items():
        ladder = TASKS.get(task).ladder
        assert sorted(s.seed for s in runs) == list(range(quick.seeds)), task
        if ladder is None:
            assert len({json.dumps(s.task_params, sort_keys=True) for s in runs}) == 1, task
            continue
        assert len(ladder.names) == quick.seeds  # one seed a level at quick's seeds
        held = [{k: s.task_params[k] for k in ladder.axis} for s in runs]
        levels = [{k: level[k] for k in ladder.axis} for level in ladder.levels.values()]
        assert sorted(map(str, held)) == sorted(map(str, levels)), task


def test_builder_keeps_only_current_reference_runs(two_track_tree, tmp_path, capsys):
    builder = load_builder()
    out = tmp_path / "quick.parquet"
    summary = builder.build([two_track_tree], out)
    printed = capsys.readouterr().out
    assert "dropped 2 runs: protocol smoke (smoke/copy/" in printed
    assert "dropped 2 runs: protocol smoke-block (smoke-block/copy/" in printed
    for name in reference.REFERENCE_PROTOCOLS:
        line = f"{name:<11} based            0 runs on  0 tasks; missing: every task (no run)"
        assert line in printed
        assert summary["protocol_versions"][name] == PROTOCOLS.get(name).version
        assert list(summary["mechanisms"][name]) == list(reference.REFERENCE_MECHANISMS)
        assert summary["mechanisms"][name]["softmax"] == {"runs": 0, "tasks": 0}
    assert summary["protocols"] == ["quick", "quick-block"]
    planned = [builder.planned_runs(name) for name in reference.REFERENCE_PROTOCOLS]
    assert len(summary["missing"]) == sum(map(len, planned))  # nothing of quick's held
    tasks = sorted(builder.builtin_tasks())
    assert summary["missing"][0] == ["quick", tasks[0], "softmax", 0]
    assert summary["missing"][-1][:3] == ["quick-block", tasks[-1], "based"]
    first = out.read_bytes()
    builder.build([two_track_tree], out)
    assert out.read_bytes() == first  # deterministic
    assert reference.load(out).rows.empty and reference.load(out).problem is None


def test_builder_keeps_the_block_track(two_track_tree, tmp_path, capsys, monkeypatch):
    """smoke-block stands for quick-block (whose sweeps take hours): its runs are kept, in
    the protocols' order, then the mechanisms' (not the names'); smoke's are dropped."""
    builder = load_builder()
    monkeypatch.setattr(builder, "REFERENCE_PROTOCOLS", ("quick", "smoke-block"))
    out = tmp_path / "block.parquet"
    summary = builder.build([two_track_tree], out)
    printed = capsys.readouterr().out
    assert "dropped 2 runs: protocol smoke (smoke/copy/" in printed
    assert "dropped 2 runs: protocol smoke-block" not in printed
    assert "smoke-block softmax          1 runs on  1 tasks; missing: " in printed
    assert summary["mechanisms"]["smoke-block"]["linear"] == {"runs": 1, "tasks": 1}
    assert summary["mechanisms"]["quick"]["linear"] == {"runs": 0, "tasks": 0}
    assert ["smoke-block", "copy", "softmax", 0] not in summary["missing"]
    assert ["smoke-block", "sort", "softmax", 0] in summary["missing"]  # smoke-block: 1 seed
    loaded = reference.load(out)
    assert loaded.usable and loaded.protocols == {"smoke-block"}
    assert list(dict.fromkeys(loaded.rows["mechanism"])) == ["softmax", "linear"]
    # both tracks held: the rows in the tuple's order, the block track first here
    monkeypatch.setattr(builder, "REFERENCE_PROTOCOLS", ("smoke-block", "smoke"))
    summary = builder.build([two_track_tree], out)
    rows = reference.load(out).rows
    # the block track's training seconds over the core track's, on the runs both hold
    seconds = rows.groupby(["mechanism", "protocol"])["wall_seconds"].sum()
    assert set(summary["track_cost"]) == {"softmax", "linear"}
    for mech, cost in summary["track_cost"].items():
        ratio = seconds[mech, "smoke-block"] / seconds[mech, "smoke"]
        assert list(cost) == ["cpu"]
        assert cost["cpu"]["runs"] == 1 and cost["cpu"]["ratio"] == round(ratio, 3)
    softmax = summary["track_cost"]["softmax"]["cpu"]
    assert (
        f"cost softmax        block/core {softmax['ratio']:.2f}x on 1 runs in both on cpu"
        in capsys.readouterr().out
    )
    assert list(dict.fromkeys(zip(rows["protocol"], rows["mechanism"], strict=True))) == [
        ("smoke-block", "softmax"), ("smoke-block", "linear"),
        ("smoke", "softmax"), ("smoke", "linear"),
    ]  # fmt: skip
    # a run of another protocol version is dropped, named by its protocol
    run = rows[rows["protocol"] == "smoke-block"].iloc[:1].assign(protocol_version=99)
    why = builder.why_dropped(run, builder.expected_runs(rows))
    assert why == f"protocol smoke-block v99 (today: v{PROTOCOLS.get('smoke-block').version})"


def test_a_cell_of_runs_on_more_than_one_kind_of_device_is_listed(
    two_track_tree, tmp_path, capsys, monkeypatch
):
    """Issue 71: the provenance of every row, and each cell (protocol, task, mechanism)
    whose runs mixed a CPU and a GPU named, in the printout and the file's summary; two GPUs
    of one kind (cuda:0, cuda:1) are not a mix."""
    builder = load_builder()

    def row(task, mech, run_id, device):
        return {"protocol": "quick", "task": task, "mechanism": mech, "run_id": run_id,
                "device": device}  # fmt: skip

    rows = pd.DataFrame([
        row("copy", "gla", "a", "cpu"), row("copy", "gla", "b", "cuda:0"),
        row("copy", "gla", "c", "cuda:1"), row("copy", "gla", "c", "cuda:1"),
        row("sort", "gla", "d", "cuda:0"), row("sort", "gla", "e", "cuda:1"),
        row("sort", "softmax", "f", "cpu"), row("sort", "softmax", "f", "cuda"),
    ])  # fmt: skip
    assert builder.mixed_devices(rows) == [
        ["quick", "copy", "gla", {"cpu": 1, "cuda": 2}],
        ["quick", "sort", "softmax", {"cpu": 1, "cuda": 1}],  # one run's lrs on both
    ]
    monkeypatch.setattr(builder, "REFERENCE_PROTOCOLS", ("smoke", "smoke-block"))
    summary = builder.build([two_track_tree], tmp_path / "one.parquet")  # every run a CPU's
    assert summary["mixed_devices"] == []
    assert reference.load(tmp_path / "one.parquet").info["mixed_devices"] == []
    assert "mixed devices" not in capsys.readouterr().out
    monkeypatch.setattr(
        builder, "mixed_devices", lambda rows: [["smoke", "copy", "gla", {"cpu": 1, "cuda": 2}]]
    )
    builder.build([two_track_tree], tmp_path / "two.parquet")
    assert "mixed devices: smoke copy gla (cpu 1 run, cuda 2 runs)" in capsys.readouterr().out


def test_track_costs_pair_runs_of_one_device_only(capsys):
    """A run trained on a GPU is paired only with the other track's run on a GPU: a cost
    ratio across two machines would measure the machines."""
    builder = load_builder()

    def row(protocol, task, device, seconds):
        return {"protocol": protocol, "mechanism": "softmax", "task": task, "seed": 0,
                "device": device, "wall_seconds": seconds}  # fmt: skip

    rows = pd.DataFrame([
        row("quick", "copy", "cpu", 10.0), row("quick-block", "copy", "cpu", 25.0),
        row("quick", "sort", "cuda:0", 2.0), row("quick-block", "sort", "cuda", 3.0),
        row("quick", "parity", "cpu", 10.0), row("quick-block", "parity", "cuda", 1.0),
    ])  # fmt: skip
    costs = builder.track_costs(rows)
    assert costs == {
        "softmax": {
            "cpu": {"runs": 1, "core_seconds": 10.0, "block_seconds": 25.0, "ratio": 2.5},
            "cuda": {"runs": 1, "core_seconds": 2.0, "block_seconds": 3.0, "ratio": 1.5},
        }
    }
    printed = capsys.readouterr().out
    assert "cost softmax        block/core 2.50x on 1 runs in both on cpu" in printed
    assert "block/core 1.50x on 1 runs in both on cuda" in printed


def test_a_gpu_is_never_asked_for_bit_identity():
    """On a GPU neither torch's deterministic mode nor a training's pack is fixed, so the
    same torch, threads and device type still only ask for the tolerance; a CPU with the
    same instruction set asks for identity."""
    made = {"torch_version": "2.11.0+cu130", "threads": 1, "device": "cuda:0", "cpu_isa": None}
    here = {**made, "device": "cuda:3"}
    why = reproduction.setting_difference(made, here)
    assert why == "on cuda, kernels need not repeat bit for bit"
    cpu = {**made, "device": "cpu", "cpu_isa": "AVX2", "cpu_model": XEON}
    assert reproduction.setting_difference(cpu, dict(cpu)) is None


def test_a_reference_of_an_earlier_recipe_or_suite_predates_this_synthbench():
    """``outdated`` (stale until its one rebuild) only for what an earlier synthbench made:
    an older protocol version or suite, never a newer one or an unknown protocol."""
    quick = PROTOCOLS.get("quick")

    def rows(version=quick.version, suite=SUITE_VERSION, protocol="quick"):
        return pd.DataFrame(
            {"protocol": [protocol], "protocol_version": [version], "suite_version": [suite]}
        )

    assert reference.predates(rows(version=quick.version - 1))
    assert reference.predates(rows(suite=SUITE_VERSION - 1))
    assert not reference.predates(rows())  # current: not stale at all
    assert not reference.predates(rows(version=quick.version + 1))
    assert not reference.predates(rows(suite=SUITE_VERSION + 1, version=quick.version - 1))
    assert not reference.predates(rows(protocol="no-such-protocol"))
