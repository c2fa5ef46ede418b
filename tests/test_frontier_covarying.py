"""Task knobs that move together get one frontier line (issue 32): a sweep over kv_recall's
pairs moves queries with it (its default is half the pairs), and each knob used to be the
other's context, which left no line at all."""

from __future__ import annotations

import itertools

import pandas as pd
from clitools import SMOKE, invoke

from synthbench.core.task import TASKS
from synthbench.report import frontier
from synthbench.report.formats import to_markdown
from synthbench.run import grid
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.spec import RunSpec

QUICK = PROTOCOLS.get("quick")


def runs(points: list[dict], mechanisms=("softmax", "linear"), seeds=2) -> pd.DataFrame:
    """``frontier.grid_runs`` of stored-like kv_recall rows at quick: each point's task
    parameters (``d_model`` a protocol field), every mechanism and seed, accuracy falling as
    pairs grow. A parameter left out takes the task's default (queries: half the pairs)."""
    rows = []
    for point, mechanism, seed in itertools.product(points, mechanisms, range(seeds)):
        task_params = {k: v for k, v in point.items() if k != "d_model"}
        protocol = grid.protocol_points(QUICK, {"d_model": point.get("d_model", QUICK.d_model)})[0]
        spec = RunSpec.resolve("kv_recall", mechanism, protocol, seed, task_params)
        value = 1.0 - task_params["pairs"] / 100 - 0.02 * seed  # mean: 0.01 less
        rows.append({**spec.row_fields(), "status": "ok", "selected": True, "lr": 1e-2,
                     "token_acc": value, "lr_edge": False})  # fmt: skip
    return frontier.grid_runs(pd.DataFrame(rows))


def summary(found: list[frontier.Line]) -> set[tuple]:
    return {(line.knob.name, line.follows, line.context) for line in found}


def test_knobs_that_move_together_give_one_line_along_the_first():
    found = frontier.lines(runs([{"pairs": p} for p in (4, 8, 16, 32)]))
    assert [(line.mechanism, line.knob.name, line.follows, line.context) for line in found] == [
        ("linear", "pairs", ("queries",), ""),
        ("softmax", "pairs", ("queries",), ""),
    ]
    assert list(found[0].points["value"]) == [4, 8, 16, 32]
    table = frontier.frontier_grid(found, "quick", QUICK.version)
    assert table.rows[0][1] == "pairs (larger; queries follows)"
    assert [cells[0] for cells in table.cells] == ["8", "8"]  # 1 - 16/100 < 0.9 from 16 on
    assert any(note.startswith("K follows") for note in table.notes)
    text = to_markdown(table)
    assert "| kv_recall | pairs (larger; queries follows) | -" in text
    assert "4: 0.95, 8: 0.91, 16: 0.83, 32: 0.67" in text


def test_a_sweep_through_two_presets_is_still_the_knobs_line():
    """pairs 24 and 32 (queries 12 and 16) are kv_recall's default and hard presets: the
    sweep passes through them, and one knob (with the one that follows it) moved, so it is
    the pairs line, not a ladder from default to hard."""
    found = frontier.lines(runs([{"pairs": p} for p in (8, 16, 24, 32)]))
    assert summary(found) == {("pairs", ("queries",), "")}
    assert list(found[0].points["value"]) == [8, 16, 24, 32]


def test_a_ladder_of_presets_is_still_one_ladder_line():
    presets = TASKS.get("kv_recall").difficulties
    found = frontier.lines(runs([presets["easy"], {"pairs": 24}, presets["hard"]]))
    assert summary(found) == {("difficulty", (), "")}
    assert list(found[0].points["value"]) == ["easy", "default", "hard"]


def test_a_third_knob_is_the_context_and_names_both_that_moved_together():
    points = [{"pairs": p, "d_model": d} for p in (4, 8) for d in (32, 64)]
    assert summary(frontier.lines(runs(points))) == {
        ("pairs", ("queries",), "d_model=32"), ("pairs", ("queries",), "d_model=64"),
        ("d_model", (), "pairs=4 queries=2"), ("d_model", (), "pairs=8 queries=4"),
    }  # fmt: skip


def test_knobs_swept_independently_are_each_others_context():
    points = [{"pairs": p, "queries": q} for p, q in itertools.product((8, 16), (2, 4))]
    assert summary(frontier.lines(runs(points))) == {
        ("pairs", (), "queries=2"), ("pairs", (), "queries=4"),
        ("queries", (), "pairs=8"), ("queries", (), "pairs=16"),
    }  # fmt: skip


def test_knobs_that_move_together_only_in_part_are_not_merged():
    points = [{"pairs": 8, "queries": 2}, {"pairs": 8, "queries": 4}, {"pairs": 16, "queries": 4}]
    assert summary(frontier.lines(runs(points))) == {
        ("pairs", (), "queries=4"), ("queries", (), "pairs=8")
    }  # fmt: skip


def test_the_readmes_sweep_gets_its_frontier(tmp_path):
    results, out = tmp_path / "results", tmp_path / "reports"
    args = ["run", "--task", "kv_recall", "--mech", "softmax", "--task-param", "pairs=4,8"]
    assert invoke(*args, *SMOKE, "--results", results).exit_code == 0
    report = invoke("report", "--results", results, "--out", out, "--format", "md",
                    "--no-reference")  # fmt: skip
    assert report.exit_code == 0, report.output
    text = (out / "smoke" / "frontier.md").read_text()
    assert "pairs (larger; queries follows)" in text
    assert "pairs (larger; queries follows)" in (out / "leaderboard.md").read_text()
