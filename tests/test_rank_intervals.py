"""The leaderboard's rank intervals and tiers (synthbench/report/rank_intervals.py), checked
against the procedure of docs/REPORTS.md redone here in a plain loop on hand-made rows: the
same draws from the same seed, the same ranks, intervals and tiers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from synthbench.report import rank_intervals
from synthbench.report.leaderboard import CONFIDENCE, ONE_SEED_NOTE, build, to_latex, to_markdown

# the tasks in the board's order: categories in the suite's order, tasks by name in each
TASKS = [("Basic", "copy"), ("Basic", "sort"), ("Memory", "kv_recall"), ("Memory", "retrieval"),
         ("Memory", "selective_copy")]  # fmt: skip


def runs(values: dict[tuple[str, str, str], list[float]], seeds=None) -> pd.DataFrame:
    """{(category, task, mechanism): per-seed scores} -> the runs frame build() takes;
    ``seeds``: {(task, mechanism): the seed numbers} where they are not 0, 1, ..."""
    return pd.DataFrame(
        [
            {"category": c, "task": t, "mechanism": m, "seed": s, "score": v}
            for (c, t, m), values_ in values.items()
            for s, v in zip((seeds or {}).get((t, m), range(len(values_))), values_, strict=True)
        ]
    )


def five_mechanisms() -> pd.DataFrame:
    """a leads clearly; b and c are close; d has one seed on kv_recall and two on sort (so
    one seed with a run on every task: the t-test cannot tell it from its neighbours); e
    trails far behind."""
    rng = np.random.default_rng(7)
    level = {"a": 0.9, "b": 0.62, "c": 0.58, "d": 0.4, "e": 0.1}
    values = {}
    for c, t in TASKS:
        for m, base in level.items():
            n = 1 if (m, t) == ("d", "kv_recall") else 2 if (m, t) == ("d", "sort") else 3
            spread = 0.1 if m in "bc" else 0.05
            values[c, t, m] = list(np.clip(base + rng.normal(0, spread, n), 0, 1))
    return runs(values)


def plain_bootstrap(frame: pd.DataFrame, order: list[str], groups: dict[str, int]):
    """The procedure of docs/REPORTS.md, "Rank intervals and tiers", one draw, position,
    mechanism and seed at a time: per mechanism (in ``order``) the draw scores and ranks."""
    draws, tie = rank_intervals.DRAWS, rank_intervals.TIE
    cell = {
        (m, t): part.sort_values("seed")["score"].tolist()
        for (m, t), part in frame.groupby(["mechanism", "task"])
    }
    tasks = [t for _, t in TASKS if any((m, t) in cell for m in order)]
    category = {t: c for c, t in TASKS}
    of_category = {c: [t for t in tasks if category[t] == c] for c in category.values()}
    most = max(len(v) for v in cell.values())
    rng = np.random.default_rng(rank_intervals.SEED)
    task_u = rng.random((draws, len(tasks)))
    seed_u = rng.random((draws, len(tasks), len(order), most))  # one call: the chunks' stream
    scores = np.zeros((draws, len(order)))
    ranks = np.zeros((draws, len(order)), dtype=int)
    for b in range(draws):
        for i, m in enumerate(order):
            by_category = {}
            for p, position_task in enumerate(tasks):
                same = of_category[category[position_task]]
                drawn = same[math.floor(task_u[b, p] * len(same))]
                values = cell[m, drawn]
                picked = [values[math.floor(seed_u[b, p, i, j] * len(values))]
                          for j in range(len(values))]  # fmt: skip
                by_category.setdefault(category[position_task], []).append(np.mean(picked))
            scores[b, i] = np.mean([np.mean(v) for v in by_category.values()])
        for i, m in enumerate(order):
            above = sum(groups[o] < groups[m] for o in order)
            above += sum(
                groups[o] == groups[m] and scores[b, k] > scores[b, i] + tie
                for k, o in enumerate(order)
                if o != m
            )
            ranks[b, i] = 1 + above
    return scores, ranks


def test_the_intervals_and_tiers_are_the_documented_bootstrap():
    frame = five_mechanisms()
    board = build(frame, "quick", 2, "target")
    table = board.table.set_index("mechanism")
    order = table.index.tolist()
    assert order[0] == "a" and order[3:] == ["d", "e"] and board.draws == rank_intervals.DRAWS
    scores, ranks = plain_bootstrap(frame, order, dict.fromkeys(order, 0))
    for i, m in enumerate(order):
        low, high = np.quantile(ranks[:, i], [0.025, 0.975], method="inverted_cdf")
        assert (table.loc[m, "rank_low"], table.loc[m, "rank_high"]) == (low, high), m
    # tiers: a new one below a step that fewer than 50 of the 2000 draws reverse, and that
    # the paired t-test over seeds (no ≈) separates too
    tiers, tier = [], 1
    for i, m in enumerate(order):
        tiers.append(tier)
        if i + 1 < len(order):
            reversed_draws = int((scores[:, i] - scores[:, i + 1] <= 1e-9).sum())
            tier += reversed_draws < 50 and not table.loc[m, "same_as_next"]
    assert table["tier"].tolist() == tiers
    # the case is worth checking: a stands apart; b and c do not; d stands far above e, but
    # with one complete seed the t-test cannot call it (≈), so e shares its tier
    assert tiers == [1, 2, 2, 2, 2] and table.loc["a", "rank_high"] == 1
    assert table.loc[order[1], "rank_high"] >= 3 and table.loc[order[2], "rank_low"] <= 2
    assert table.loc["d", "same_as_next"] and (scores[:, 3] > scores[:, 4]).all()
    md = to_markdown(board)
    assert "| 1 [1, 1]        | 1      | a " in md
    assert "2,000 draws, numpy default_rng(0)" in md and "50th to the 1,950th" in md
    assert "One seed on some task (d)" in md  # d's kv_recall: its seed spread is not drawn


def test_the_bootstrap_is_reproducible():
    first, second = (build(five_mechanisms(), "q", 1, "target").table for _ in range(2))
    pd.testing.assert_frame_equal(first, second)


def test_one_seed_gives_no_intervals_and_says_why_in_one_line():
    board = build(
        runs({("Basic", "copy", "a"): [0.9], ("Basic", "copy", "b"): [0.1],
              ("Basic", "sort", "a"): [0.8], ("Basic", "sort", "b"): [0.2]}),
        "q", 1, "target",
    )  # fmt: skip
    assert board.draws == 0
    assert board.table[["rank_low", "rank_high", "tier"]].isna().all().all()
    md = to_markdown(board)
    assert md.count(ONE_SEED_NOTE) == 1 and "Rank [95% CI]:" not in md
    assert "| 1               |        | a ≈" in md  # a rank, no interval, no tier
    assert ONE_SEED_NOTE.startswith("One seed: no interval (score or rank) and no tiers")


@pytest.mark.parametrize("n_tasks", [1, 2])
def test_a_mechanism_with_a_single_task_never_raises(n_tasks):
    """One task in the whole board (every draw draws it), or a mechanism with one task of
    two (unranked: not drawn), beside one with a single seed."""
    values = {("Basic", "copy", "a"): [0.9, 0.8, 0.85], ("Basic", "copy", "b"): [0.3],
              ("Basic", "copy", "c"): [0.5, 0.52, 0.49]}  # fmt: skip
    if n_tasks == 2:
        values |= {("Basic", "sort", "a"): [0.7, 0.7, 0.7], ("Basic", "sort", "c"): [0.4] * 3}
    table = build(runs(values), "q", 1, "target").table.set_index("mechanism")
    if n_tasks == 1:  # the task drawn every time: only seeds move the ranks
        assert table["rank_low"].tolist() == [1, 2, 3] and table["rank_high"].tolist() == [1, 2, 3]
    else:
        assert pd.isna(table.loc["b", "rank"]) and pd.isna(table.loc["b", "rank_low"])
        assert table.loc[["a", "c"], "rank_low"].tolist() == [1, 2]
    one = build(runs({("Basic", "copy", "a"): [0.9, 0.8]}), "q", 1, "target").table
    assert (one.loc[0, "rank_low"], one.loc[0, "rank_high"], one.loc[0, "tier"]) == (1, 1, 1)


def test_tiers_need_both_tests():
    """a - b per seed is 0.5, 0.01, 0.01: every bootstrap draw has a above b (b's best seed
    is below a's worst), but the paired t over three seeds cannot call it (≈): one tier.
    c and d swap places between two tasks, the same on every seed: the t-test separates
    them, but a quarter of the draws (those that draw sort twice) reverse them: one tier."""
    a, b = [0.9, 0.52, 0.52], [0.4, 0.51, 0.51]
    first = build(runs({("Basic", "copy", "a"): a, ("Basic", "copy", "b"): b}), "q", 1, "target")
    assert first.table["same_as_next"].tolist() == [True, False]
    assert first.table["tier"].tolist() == [1, 1]
    alone = rank_intervals.draw_ranks([[np.array(a)], [np.array(b)]], ["Basic"], [0, 0])
    assert rank_intervals.step_significant(alone.scores[:, 0], alone.scores[:, 1], CONFIDENCE)
    second = build(
        runs({("Basic", "copy", "c"): [0.9, 0.91, 0.9], ("Basic", "sort", "c"): [0.2, 0.2, 0.21],
              ("Basic", "copy", "d"): [0.3, 0.31, 0.3], ("Basic", "sort", "d"): [0.7, 0.7, 0.71]}),
        "q", 1, "target",
    )  # fmt: skip
    assert second.table["mechanism"].tolist() == ["c", "d"]
    assert second.table["same_as_next"].tolist() == [False, False]
    assert second.table["tier"].tolist() == [1, 1]
    swapped = rank_intervals.draw_ranks(
        [[np.array([0.9, 0.91, 0.9]), np.array([0.2, 0.2, 0.21])],
         [np.array([0.3, 0.31, 0.3]), np.array([0.7, 0.7, 0.71])]], ["Basic", "Basic"], [0, 0],
    )  # fmt: skip
    reversed_share = (swapped.scores[:, 0] <= swapped.scores[:, 1]).mean()
    assert 0.2 < reversed_share < 0.3  # sort drawn twice: a quarter of the draws
    third = build(
        runs({("Basic", "copy", "a"): [0.9, 0.92, 0.91], ("Basic", "copy", "b"): [0.4, 0.42, 0.4]}),
        "q", 1, "target",
    )  # fmt: skip
    assert third.table["tier"].tolist() == [1, 2]


def test_a_mechanism_with_diverged_runs_ranks_below_in_every_draw():
    """x diverged on sort (scored 0 there) yet scores above y; the board ranks it below y,
    and so does every draw: its interval starts below y's place."""
    frame = runs(
        {("Basic", "copy", "x"): [1.0, 1.0, 1.0], ("Basic", "sort", "x"): [0.9, 0.9],
         ("Basic", "copy", "y"): [0.3, 0.3, 0.31], ("Basic", "sort", "y"): [0.3, 0.3, 0.3]}
    ).assign(chance=0.0)  # fmt: skip
    diverged = pd.DataFrame([{"category": "Basic", "task": "sort", "mechanism": "x", "seed": 2}])
    table = build(frame, "q", 1, "target", diverged=diverged).table.set_index("mechanism")
    assert table.index.tolist() == ["y", "x"] and table.loc["x", "score"] > 0.75
    assert (table.loc["x", "rank_low"], table.loc["x", "rank_high"]) == (2, 2)
    assert (table.loc["y", "rank_low"], table.loc["y", "rank_high"]) == (1, 1)


def test_the_percentile_interval_is_the_inverted_cdf():
    rng = np.random.default_rng(3)
    for n in (1, 7, 40, 41, 100, 2000):
        ranks = rng.integers(1, 9, n)
        low, high = np.quantile(ranks, [0.025, 0.975], method="inverted_cdf")
        assert rank_intervals.rank_interval(ranks, CONFIDENCE) == (low, high)
    assert rank_intervals.rank_interval(np.arange(1, 2001), 0.95) == (50, 1950)


def test_the_latex_board_rules_off_each_tier():
    tex = to_latex(build(five_mechanisms(), "quick", 2, "target"))
    body = tex[tex.index(r"\midrule") : tex.index(r"\bottomrule")]
    rows = [line for line in body.splitlines() if line.endswith(r"\\")]
    assert [r.split(" & ")[1] for r in rows] == ["1", "2", "2", "2", "2"]  # a tier each row
    assert body.count(r"\midrule") == 2  # under the header, then before tier 2
    assert r"\footnotesize" in tex and "Tier: a new tier begins" in tex
