"""The leaderboard's ranking: scores, bootstrap intervals over seeds, ties between
neighbours, and mechanisms without a run on every task."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from synthbench.leaderboard import build, to_markdown


def runs(values: dict[tuple[str, str, str], list[float]]) -> pd.DataFrame:
    """{(category, task, mechanism): per-seed values} -> the runs frame build() takes."""
    return pd.DataFrame(
        [
            {"category": c, "task": t, "mechanism": m, "seed": s, "value": v}
            for (c, t, m), seeds in values.items()
            for s, v in enumerate(seeds)
        ]
    )


def test_score_is_the_mean_over_categories_of_task_means():
    board = build(
        runs(
            {
                ("Basic", "copy", "a"): [1.0, 1.0],
                ("Basic", "sort", "a"): [0.2, 0.4],  # Basic = (1.0 + 0.3) / 2 = 0.65
                ("Memory", "kv_recall", "a"): [0.5, 0.5],  # Memory = 0.5
            }
        ),
        "quick",
        2,
        "token_acc",
    )
    row = board.table.iloc[0]
    assert row["Basic"] == pytest.approx(0.65) and row["Memory"] == pytest.approx(0.5)
    # each category weighs the same, whatever its number of tasks
    assert row["score"] == pytest.approx(0.575)
    assert board.categories == ["Basic", "Memory"]
    assert board.tasks.loc[("Basic", "sort"), "a"] == pytest.approx(0.3)
    assert (board.n_seeds, row["n_tasks"], row["rank"]) == (2, 3, 1)


def test_interval_is_the_bootstrap_over_seeds():
    """One task, seeds 0, 0.5, 1: a resample is all zeros with probability 1/27 (3.7%),
    more than the 2.5% tail, so the interval is exactly [0, 1]; constant seeds give none."""
    board = build(
        runs({("Basic", "copy", "a"): [0.0, 0.5, 1.0], ("Basic", "copy", "b"): [0.4] * 3}),
        "quick",
        2,
        "token_acc",
    )
    table = board.table.set_index("mechanism")
    assert (table.loc["a", "ci_low"], table.loc["a", "ci_high"]) == (0.0, 1.0)
    assert table.loc["a", "score"] == pytest.approx(0.5)
    assert table.loc["b", "ci_low"] == pytest.approx(0.4) == table.loc["b", "ci_high"]


def test_interval_narrows_with_more_seeds_and_holds_the_score():
    rng = np.random.default_rng(0)
    widths = []
    for n in (3, 30):
        board = build(
            runs({("Basic", "copy", "a"): list(0.6 + 0.1 * rng.standard_normal(n))}),
            "q",
            1,
            "token_acc",
        )
        row = board.table.iloc[0]
        assert row["ci_low"] <= row["score"] <= row["ci_high"]
        widths.append(row["ci_high"] - row["ci_low"])
    assert widths[1] < widths[0]


def test_neighbours_that_overlap_are_marked_and_clear_gaps_are_not():
    board = build(
        runs(
            {
                ("Basic", "copy", "best"): [0.95, 0.96, 0.97],
                ("Basic", "copy", "close"): [0.60, 0.80, 0.70],
                ("Basic", "copy", "closer"): [0.62, 0.78, 0.69],
                ("Basic", "copy", "floor"): [0.01, 0.02, 0.03],
            }
        ),
        "quick",
        2,
        "token_acc",
    )
    table = board.table.set_index("mechanism")
    assert list(table.index) == ["best", "close", "closer", "floor"]
    assert list(table["rank"]) == [1, 2, 3, 4]
    assert table["same_as_next"].tolist() == [False, True, False, False]
    md = to_markdown(board)
    assert "close ≈" in md and "best ≈" not in md


def test_the_bootstrap_is_paired_by_seed():
    """b is a every seed minus 0.01: paired, it is always below a, though the seeds vary
    far more than the gap."""
    a = [0.2, 0.9, 0.5]
    board = build(
        runs({("Basic", "copy", "a"): a, ("Basic", "copy", "b"): [v - 0.01 for v in a]}),
        "quick",
        2,
        "token_acc",
    )
    assert board.table["same_as_next"].tolist() == [False, False]


def test_a_mechanism_without_every_task_is_not_ranked():
    board = build(
        runs(
            {
                ("Basic", "copy", "a"): [0.5],
                ("Memory", "kv_recall", "a"): [0.5],
                ("Basic", "copy", "partial"): [1.0],  # never ran kv_recall
            }
        ),
        "quick",
        2,
        "token_acc",
    )
    last = board.table.iloc[-1]
    assert last["mechanism"] == "partial" and pd.isna(last["rank"]) and not last["complete"]
    assert pd.isna(last["score"]) and pd.isna(last["Memory"])  # missing, never 0
    assert last["Basic"] == 1.0 and last["n_tasks"] == 1
    md = to_markdown(board)
    assert "Unranked" in md and "One seed" in md
    (line,) = [x for x in md.splitlines() if "partial" in x]
    assert "--" in line and "1/2" in line


def test_the_ranking_is_reproducible():
    values = runs({("Basic", "copy", m): [0.1, 0.5, 0.9] for m in ("a", "b")})
    first, second = (build(values, "q", 1, "token_acc").table for _ in range(2))
    pd.testing.assert_frame_equal(first, second)
