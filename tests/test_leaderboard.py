"""The leaderboard's ranking: scores, Student-t intervals over seeds, paired ties between
neighbours, and mechanisms without a score on every task. The critical values are typed in
from a printed t table (no scipy)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from synthbench.report.formats import latex_escape
from synthbench.report.leaderboard import build, t_critical, to_latex, to_markdown

# two-sided 95% critical values of Student's t, from a printed table: df -> t
T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 9: 2.262, 10: 2.228, 30: 2.042}
T2 = 4.302653  # df 2 to more digits (3 seeds), for the hand-computed intervals


def runs(values: dict[tuple[str, str, str], list[float]]) -> pd.DataFrame:
    """{(category, task, mechanism): per-seed scores} -> the runs frame build() takes."""
    return pd.DataFrame(
        [
            {"category": c, "task": t, "mechanism": m, "seed": s, "score": v}
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


def test_t_critical_matches_the_printed_table():
    for df, t in T_TABLE.items():
        assert t_critical(df) == pytest.approx(t, abs=5e-4)
    assert t_critical(2) == pytest.approx(T2, abs=1e-6)


def test_interval_is_the_t_interval_of_the_per_seed_score():
    """Basic = copy, Memory = kv_recall; per seed the score is (copy + kv) / 2: 0.4, 0.5,
    0.75; mean 0.55, sd sqrt(0.0325), half width t(2) sd / sqrt(3)."""
    board = build(
        runs(
            {
                ("Basic", "copy", "a"): [0.2, 0.4, 0.6],
                ("Memory", "kv_recall", "a"): [0.6, 0.6, 0.9],
                ("Basic", "copy", "b"): [0.4] * 3,
                ("Memory", "kv_recall", "b"): [0.4] * 3,
            }
        ),
        "quick",
        2,
        "target",
    )
    assert board.per_seed["a"].tolist() == pytest.approx([0.4, 0.5, 0.75])
    table = board.table.set_index("mechanism")
    half = T2 * math.sqrt(0.0325) / math.sqrt(3)  # 0.447834
    assert table.loc["a", "score"] == pytest.approx(0.55)
    assert table.loc["a", "ci_low"] == pytest.approx(0.55 - half)
    assert table.loc["a", "ci_high"] == pytest.approx(0.55 + half)
    assert table.loc["a", "ci_seeds"] == 3
    # constant seeds: an interval of no width
    assert table.loc["b", "ci_low"] == pytest.approx(0.4) == table.loc["b", "ci_high"]
    assert "0.550 [0.102, 0.998]" in to_markdown(board)


def test_interval_uses_the_seeds_with_a_run_on_every_task():
    """Seed 2 of kv_recall diverged: the interval is over seeds 0 and 1 (t with 1 degree of
    freedom), centred on the score, which still uses every seed of copy."""
    values = runs(
        {("Basic", "copy", "a"): [0.2, 0.4, 0.6], ("Memory", "kv_recall", "a"): [0.6, 0.8]}
    )
    board = build(values, "quick", 2, "target")
    row = board.table.iloc[0]
    assert row["score"] == pytest.approx((0.4 + 0.7) / 2)
    per_seed = [0.4, 0.6]  # (0.2 + 0.6) / 2, (0.4 + 0.8) / 2
    half = T_TABLE[1] * np.std(per_seed, ddof=1) / math.sqrt(2)
    assert row["ci_seeds"] == 2
    assert row["score"] - row["ci_low"] == pytest.approx(half, rel=1e-4)
    assert row["ci_high"] == 1.0  # score + half is 1.82: cut to the score's range


def test_the_interval_stays_within_the_scores_range():
    """A score is at most 1, and at least what no right answer scores: -c / (1 - c) for a
    score normalised by chance c (here 0.5 on both tasks: -1)."""
    frame = runs(
        {("Basic", "copy", "a"): [1.0, 1.0, 0.4], ("Memory", "kv_recall", "a"): [1.0, 0.9, 1.0],
         ("Basic", "copy", "b"): [-0.9, -1.0, 0.2], ("Memory", "kv_recall", "b"): [-1.0] * 3}
    ).assign(chance=0.5)  # fmt: skip
    table = build(frame, "quick", 2, "target").table.set_index("mechanism")
    assert table.loc["a", "ci_high"] == 1.0 and table.loc["a", "ci_low"] < 1.0
    assert table.loc["b", "ci_low"] == -1.0 and table.loc["b", "ci_high"] > -1.0
    # raw accuracy (no chance): at least 0
    raw = build(frame.assign(score=frame["score"].abs()), "quick", 2, "long_token_acc")
    assert (raw.table["ci_low"] >= 0).all() and (raw.table["ci_high"] <= 1).all()


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


def test_the_comparison_is_paired_by_seed():
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


def test_the_paired_t_interval_by_hand():
    """a - b per seed: 0.05, 0.08, 0.02: mean 0.05, sd 0.03, half width t(2) 0.03 / sqrt(3)
    = 0.0745 > 0.05: the interval reaches 0, so a ≈ b. a - c: 0.2, 0.25, 0.15: mean 0.2,
    sd 0.05, half width 0.124 < 0.2: a is above c."""
    assert T2 * 0.03 / math.sqrt(3) > 0.05 and T2 * 0.05 / math.sqrt(3) < 0.2
    a = [0.5, 0.7, 0.9]
    b = [0.45, 0.62, 0.88]
    c = [0.3, 0.45, 0.75]
    board = build(
        runs({("Basic", "copy", "a"): a, ("Basic", "copy", "b"): b, ("Basic", "copy", "c"): c}),
        "quick",
        2,
        "token_acc",
    )
    table = board.table.set_index("mechanism")
    assert list(table.index) == ["a", "b", "c"]
    assert table["same_as_next"].tolist() == [True, False, False]
    # b - c: 0.15, 0.17, 0.13: mean 0.15, sd 0.02: above
    two = build(
        runs({("Basic", "copy", "a"): a, ("Basic", "copy", "c"): c}), "quick", 2, "token_acc"
    )
    assert two.table["same_as_next"].tolist() == [False, False]


def test_one_seed_has_no_interval_and_tells_no_neighbours_apart():
    board = build(
        runs({("Basic", "copy", "a"): [0.9], ("Basic", "copy", "b"): [0.1]}), "q", 1, "target"
    )
    assert board.table["ci_low"].isna().all() and board.table["ci_high"].isna().all()
    assert board.table["same_as_next"].tolist() == [True, False]
    md = to_markdown(board)
    (line,) = [x for x in md.splitlines() if "| a" in x]
    cells = [c.strip() for c in line.strip("|").split("|")]
    # no rank interval, no tier; a: no registered state
    assert cells == ["1", "", "a ≈", "0.900", "0.900", "1/1", "--"]
    assert "One seed: no interval" in md


def test_a_score_without_a_chance_is_listed_unranked():
    """A NaN score (no known chance to normalise by) counts as missing: listed, not ranked,
    never dropped."""
    board = build(
        runs({("Basic", "copy", "a"): [0.5, 0.6], ("Basic", "copy", "b"): [np.nan, np.nan]}),
        "q",
        1,
        "target",
    )
    table = board.table.set_index("mechanism")
    assert table.loc["a", "rank"] == 1 and pd.isna(table.loc["b", "rank"])
    assert table.loc["b", "n_tasks"] == 0 and not table.loc["b", "complete"]
    assert "no known chance" in to_markdown(board)


def test_markdown_says_what_is_normalised():
    values = runs({("Basic", "copy", "a"): [0.5, 0.6]})
    assert "Chance-normalised" in to_markdown(build(values, "q", 1, "target"))
    assert "Raw long_token_acc" in to_markdown(build(values, "q", 1, "long_token_acc"))
    assert "Student-t" in to_markdown(build(values, "q", 1, "target"))


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


def test_the_board_quotes_each_registered_mechanisms_declared_state():
    """Beside the score: the state per head at L 1024 and the protocol's head size, as the
    mechanism declares it (softmax's KV cache grows with L, linear's state does not)."""
    board = build(
        runs({("Basic", "copy", "softmax"): [0.9], ("Basic", "copy", "linear (reference)"): [0.8],
              ("Basic", "copy", "linear (eps=0.1)"): [0.7]}),
        "quick", 1, "target",
    )  # fmt: skip
    md = to_markdown(board)
    cells = {
        c[2]: c[-1]
        for c in ([x.strip() for x in line.strip("|").split("|")] for line in md.splitlines())
        if len(c) > 2
    }
    head = 64 // 4  # quick: d_model 64, 4 heads
    assert cells["softmax ≈"] == f"{2 * 1024 * head:,}"
    assert cells["linear (reference) ≈"] == f"{head * (head + 1):,}"
    assert cells["linear (eps=0.1)"] == "--"  # another parameter set: not the default's figure
    assert "state/head: the numbers a head carries" in md


def test_the_block_board_quotes_each_layers_whole_state():
    """In the block track the state column is per layer: a published layer's own declared
    state (deltanet's convolution windows and its heads' S), and an attention-family core's
    per-head state times the heads."""
    board = build(
        runs({("Basic", "copy", "softmax"): [0.9], ("Basic", "copy", "deltanet"): [0.8]}),
        "quick-block", 1, "target", track="block",
    )  # fmt: skip
    md = to_markdown(board)
    header = next(line for line in md.splitlines() if line.startswith("| rank"))
    assert header.rstrip(" |").endswith("state/layer")
    cells = {
        c[2].removesuffix(" ≈"): c[-1]
        for c in ([x.strip() for x in line.strip("|").split("|")] for line in md.splitlines())
        if len(c) > 2
    }
    heads, head = 4, 64 // 4  # quick-block: d_model 64, 4 heads
    assert cells["softmax"] == f"{heads * 2 * 1024 * head:,}"
    conv = 3 * (4 - 1) * 64  # q, k and v windows of a kernel-4 convolution, d_model wide
    assert cells["deltanet"] == f"{conv + heads * head * head:,}"
    assert "state/layer: the numbers one layer carries" in md


def test_the_board_names_the_reference_runs_yours_replaced():
    """A run of yours with a reference run's run id replaces it: the board says which
    cells of the reference lack which seeds, in its notes (Markdown and LaTeX alike)."""
    replaced = pd.DataFrame(
        [("copy", "softmax", 0), ("sort", "softmax", 0), ("sort", "softmax", 1)],
        columns=["task", "mechanism", "seed"],
    )
    values = runs({("Basic", "copy", "softmax (reference)"): [0.9, 0.8]})
    board = build(values, "quick", 6, "target", replaced=replaced)
    line = (
        "Replaced: 3 runs of yours have the configuration (the run id) of a shipped reference "
        "run; yours are shown and the reference's left out, so its cells there hold fewer "
        "seeds: softmax on copy (seed 0), sort (seeds 0, 1)."
    )
    assert f"- {line}" in to_markdown(board)
    assert latex_escape(line) in to_latex(board)
    assert "Replaced" not in to_markdown(build(values, "quick", 6, "target"))
    one = build(values, "quick", 6, "target", replaced=replaced[:1])
    assert "Replaced: 1 run of yours has the configuration" in to_markdown(one)
    assert "yours is shown" in to_markdown(one)
