"""Task knobs that move together get one frontier line (issue 32): a sweep over kv_recall's
pairs moves queries with it (its default is half the pairs), and each knob used to be the
other's context, which left no line at all."""

from __future__ import annotations

import itertools

import pandas as pd
from clitools import invoke

from synthbench.report import frontier


def grid(points: list[dict], mechanisms=("softmax", "linear"), seeds=2) -> pd.DataFrame:
    """Rows as ``frontier.grid_runs`` gives them: kv_recall at each point, every mechanism
    and seed, accuracy falling as pairs grow."""
    rows = [
        {"protocol": "quick", "protocol_version": 2, "task": "kv_recall", "mechanism": m,
         "seed": s, "value": 1.0 - point["pairs"] / 100 - 0.01 * s, "state": float("nan"),
         "keys": 64, "values": 64, "d_model": 64, "difficulty": None, **point}
        for point in points for m in mechanisms for s in range(seeds)
    ]  # fmt: skip
    return pd.DataFrame(rows, dtype=object).astype({"value": float, "state": float})


def test_knobs_that_move_together_give_one_line_along_the_first():
    runs = grid([{"pairs": p, "queries": p // 2} for p in (4, 8, 16, 32)])
    found = frontier.lines(runs)
    assert [(line.mechanism, line.knob.name, line.follows, line.context) for line in found] == [
        ("linear", "pairs", ("queries",), ""),
        ("softmax", "pairs", ("queries",), ""),
    ]
    assert list(found[0].points["value"]) == [4, 8, 16, 32]
    table = frontier.frontier_grid(found, "quick", 2)
    assert table.rows[0][1] == "pairs (larger; queries follows)"
    assert [cells[0] for cells in table.cells] == ["8", "8"]  # 1 - 16/100 < 0.9 from 16 on
    assert any(note.startswith("K follows") for note in table.notes)


def test_knobs_swept_independently_are_each_others_context():
    runs = grid([{"pairs": p, "queries": q} for p, q in itertools.product((8, 16), (2, 4))])
    found = frontier.lines(runs)
    assert {(line.knob.name, line.context) for line in found} == {
        ("pairs", "queries=2"), ("pairs", "queries=4"),
        ("queries", "pairs=8"), ("queries", "pairs=16"),
    }  # fmt: skip
    assert not any(line.follows for line in found)


def test_knobs_that_move_together_only_in_part_are_not_merged():
    runs = grid(
        [{"pairs": 8, "queries": 2}, {"pairs": 8, "queries": 4}, {"pairs": 16, "queries": 4}]
    )
    assert not any(line.follows for line in frontier.lines(runs))


def test_the_readmes_sweep_gets_its_frontier(tmp_path):
    results, out = tmp_path / "results", tmp_path / "reports"
    args = ["run", "--task", "kv_recall", "--mech", "softmax", "--task-param", "pairs=4,8"]
    args += ["--protocol", "smoke", "--seeds", 1, "--jobs", 1, "--results", results]
    assert invoke(*args).exit_code == 0
    report = invoke("report", "--results", results, "--out", out, "--format", "md",
                    "--no-reference")  # fmt: skip
    assert report.exit_code == 0, report.output
    text = (out / "smoke" / "frontier.md").read_text()
    assert "pairs (larger; queries follows)" in text
    assert "pairs (larger; queries follows)" in (out / "leaderboard.md").read_text()
