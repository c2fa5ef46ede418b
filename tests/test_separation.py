"""The separation table: which pairs of mechanisms a task tells apart, on the target metric
(mean difference, same sign on every seed, beyond twice the standard error, no lr at an
edge) and on the learning-curve area, against hand computations."""

from __future__ import annotations

import io

import pandas as pd
import pytest
from test_report import frame, row

from synthbench.report.formats import to_markdown
from synthbench.report.separation import (
    CLOSE,
    CSV_COLUMNS,
    EDGE,
    FLIP,
    NO_SE,
    NOISE,
    SEEDS,
    csv_text,
    grids,
    head_to_head,
    separation,
)
from synthbench.run.protocols import curve_points

POINTS = curve_points(100)


def cell(task, mech, values, se=0.01, edge=(), category="Basic", curve=None, **more):
    """One (task, mechanism) cell: seed s has token accuracy values[s] with standard error
    ``se`` (None: not stored); the seeds in ``edge`` have lr_edge; ``curve``: per seed, its
    validation curve (a flat curve at the value when not given)."""
    rows = []
    for seed, value in enumerate(values):
        points = curve[seed] if curve else [value] * len(POINTS)
        rows.append(
            row(
                task,
                mech,
                seed,
                value,
                category=category,
                token_acc_se=se,
                lr_edge=seed in edge,
                steps=100,
                curve_steps=POINTS[: len(points)],
                curve_val_token_acc=points,
                **more,
            )
        )
    return rows


def pairs_of(rows) -> pd.DataFrame:
    return separation(frame(*rows)).pairs.set_index(["task", "measure"])


def test_a_pair_that_separates():
    """a - b per seed: 0.40, 0.37, 0.35: mean 0.3733, all positive, each beyond
    2 sqrt(0.01^2 + 0.01^2) = 0.0283."""
    pairs = pairs_of([*cell("copy", "a", [0.9, 0.92, 0.95]), *cell("copy", "b", [0.5, 0.55, 0.6])])
    target = pairs.loc[("copy", "target")]
    assert (target["a"], target["b"], target["seeds"]) == ("a", "b", 3)
    assert target["difference"] == pytest.approx((0.40 + 0.37 + 0.35) / 3)
    assert target["separated"] and target["ahead"] == "a" and pd.isna(target["reason"])
    # the flat curves sit at the values: the area separates by the same amounts
    area = pairs.loc[("copy", "area")]
    assert area["separated"] and area["difference"] == pytest.approx(target["difference"])


def test_the_one_behind_can_be_either():
    pairs = pairs_of([*cell("copy", "a", [0.5, 0.55, 0.6]), *cell("copy", "b", [0.9, 0.92, 0.95])])
    target = pairs.loc[("copy", "target")]
    assert target["separated"] and target["ahead"] == "b" and target["difference"] < 0


@pytest.mark.parametrize(
    "a, b, se, edge, reason",
    [
        # differences 0.10, -0.15, 0.30: mean 0.083 >= 0.05, but the signs disagree
        ([0.6, 0.4, 0.9], [0.5, 0.55, 0.6], 0.01, (), FLIP),
        # 0.08 on every seed, but 2 sqrt(0.05^2 + 0.05^2) = 0.141 > 0.08
        ([0.58, 0.63, 0.68], [0.5, 0.55, 0.6], 0.05, (), NOISE),
        # 0.03 on every seed: below 0.05
        ([0.53, 0.58, 0.63], [0.5, 0.55, 0.6], 0.001, (), CLOSE),
        # a clear gap, but b's seed 1 picked an lr alone at the edge of its grid
        ([0.9, 0.92, 0.95], [0.5, 0.55, 0.6], 0.01, (1,), EDGE),
        # a clear gap, no standard error stored (rows of an older schema)
        ([0.9, 0.92, 0.95], [0.5, 0.55, 0.6], None, (), NO_SE),
        # one seed in common
        ([0.9], [0.5, 0.55, 0.6], 0.01, (), SEEDS),
    ],
)
def test_pairs_that_do_not_separate(a, b, se, edge, reason):
    pairs = pairs_of([*cell("copy", "a", a, se=se), *cell("copy", "b", b, se=se, edge=edge)])
    target = pairs.loc[("copy", "target")]
    assert not target["separated"] and pd.isna(target["ahead"])
    assert target["reason"] == reason


def test_a_difference_of_exactly_the_threshold_separates():
    pairs = pairs_of(
        [*cell("copy", "a", [0.75, 0.75], se=0.001), *cell("copy", "b", [0.70, 0.70], se=0.001)]
    )
    assert pairs.loc[("copy", "target"), "separated"]


def test_noise_is_per_seed_and_strict():
    """Seed 0: 0.10 against 2 sqrt(0.03^2 + 0.04^2) = 0.10: not beyond; the rest are."""
    a = cell("copy", "a", [0.6, 0.9], se=0.03)
    b = cell("copy", "b", [0.5, 0.5], se=0.04)
    assert pairs_of([*a, *b]).loc[("copy", "target"), "reason"] == NOISE


def test_the_target_metric_and_its_standard_error_are_used():
    """add is scored free-running: token accuracy separates a from b, free_token_acc does
    not (0.02 apart), and its standard error is free_token_acc_se."""
    free = {"target_metric": "free_token_acc", "category": "Arithmetic"}
    a = cell("add", "a", [0.9, 0.9], free_token_acc=0.52, free_token_acc_se=0.001, **free)
    b = cell("add", "b", [0.5, 0.5], free_token_acc=0.50, free_token_acc_se=0.001, **free)
    target = pairs_of([*a, *b]).loc[("add", "target")]
    assert target["difference"] == pytest.approx(0.02) and target["reason"] == CLOSE
    # far apart free-running, but free_token_acc_se is not stored: no call
    a = cell("add", "a", [0.9, 0.9], free_token_acc=0.9, **free)
    b = cell("add", "b", [0.5, 0.5], free_token_acc=0.5, **free)
    assert pairs_of([*a, *b]).loc[("add", "target"), "reason"] == NO_SE


def test_area_needs_the_mean_and_the_sign_only():
    """Equal final accuracy (the target does not separate), but a learns faster: areas
    0.9 and 0.5 on seed 0, 0.8 and 0.6 on seed 1: mean 0.3, same sign. b against c: 0.2
    and -0.05, a mean of 0.075 whose sign flips."""
    fast = [[0.9] * 10, [0.8] * 10]
    slow = [[0.5] * 10, [0.6] * 10]
    flip = [[0.3] * 10, [0.65] * 10]
    pairs = pairs_of(
        [
            *cell("copy", "a", [0.95, 0.95], curve=fast),
            *cell("copy", "b", [0.95, 0.95], curve=slow),
            *cell("copy", "c", [0.95, 0.95], curve=flip),
        ]
    ).reset_index()
    by_pair = pairs.set_index(["a", "b", "measure"])
    assert by_pair.loc[("a", "b", "target"), "reason"] == CLOSE
    area = by_pair.loc[("a", "b", "area")]
    assert area["separated"] and area["difference"] == pytest.approx(0.3)
    assert by_pair.loc[("b", "c", "area"), "reason"] == FLIP
    # an lr at the edge stops the area too
    edge = pairs_of(
        [
            *cell("copy", "a", [0.95, 0.95], curve=fast, edge=(0,)),
            *cell("copy", "b", [0.95, 0.95], curve=slow),
        ]
    )
    assert edge.loc[("copy", "area"), "reason"] == EDGE


def test_the_area_of_an_early_stopped_run_is_held():
    """a stopped at step 20 at 0.99: held, its area is (0.5 + 9 x 0.99) / 10 = 0.941;
    b's flat 0.6 curve: a difference of 0.341 on both seeds."""
    stopped = [[0.5, 0.99], [0.5, 0.99]]
    pairs = pairs_of(
        [*cell("copy", "a", [0.99, 0.99], curve=stopped), *cell("copy", "b", [0.6, 0.6])]
    )
    assert pairs.loc[("copy", "area"), "difference"] == pytest.approx(0.341)


def informative_rows():
    """copy separates (a ahead), sort flips, reverse is within noise, kv_recall has an lr at
    the edge; stack was run by a alone."""
    return frame(
        *cell("copy", "a", [0.9, 0.92, 0.95]),
        *cell("copy", "b", [0.5, 0.55, 0.6]),
        *cell("sort", "a", [0.6, 0.4, 0.9]),
        *cell("sort", "b", [0.5, 0.55, 0.6]),
        *cell("reverse", "a", [0.58, 0.63, 0.68], se=0.05),
        *cell("reverse", "b", [0.5, 0.55, 0.6], se=0.05),
        *cell("kv_recall", "a", [0.9, 0.92, 0.95], edge=(2,), category="Memory"),
        *cell("kv_recall", "b", [0.5, 0.55, 0.6], category="Memory"),
        *cell("stack", "a", [0.5, 0.5, 0.5], category="Reasoning"),
    )


def test_the_count_of_informative_tasks():
    result = separation(informative_rows())
    counts = result.counts.set_index("measure")
    assert counts.loc["target", "tasks"] == 5
    assert counts.loc["target", "informative"] == 1
    assert counts.loc["target", "silent"] == ["reverse", "sort", "kv_recall", "stack"]
    # flat curves: the area separates copy and reverse (0.08 each seed, no SE asked)
    assert counts.loc["area", "informative"] == 2
    assert counts.loc["area", "silent"] == ["sort", "kv_recall", "stack"]


def test_the_decisive_pairs_tables():
    """b, a and c in the board's order: b against a, then a against c. Target: copy
    separates a (ahead) from b, sort flips, reverse is within noise, kv_recall has an lr at
    the edge (untested), stack was run by a alone; c ran copy alone, a ahead of it there."""
    rows = pd.concat(
        [informative_rows(), frame(*cell("copy", "c", [0.5, 0.55, 0.6], se=0.01))],
        ignore_index=True,
    )
    target, area = grids(separation(rows), "smoke", 1, ranked=["b", "a", "c"])
    assert target.columns == ["ranks", "tasks apart", "upper ahead on", "lower ahead on"]
    assert target.rows == [("b vs a",), ("a vs c",)]
    assert target.cells == [
        ["1-2", "1/4 (1 untested)", "none", "copy"],
        ["2-3", "1/1", "copy", "none"],
    ]
    # flat curves: the area separates copy and reverse (0.08 each seed, no SE asked)
    assert area.cells[0] == ["1-2", "2/4 (1 untested)", "none", "copy, reverse"]
    md = to_markdown(target)
    assert "Informative tasks (at least one pair separates): 1 of 5." in md
    assert "Separating nothing: reverse, sort, kv_recall, stack." in md
    assert "target: token_acc on every task." in md
    assert "Pairs of mechanisms told apart by at least one task: 2 of 3." in md
    assert "separation.csv" in md and "&lt;" not in md and "n<2" not in md
    assert "Informative tasks (at least one pair separates): 2 of 5." in to_markdown(area)
    # by default every mechanism, by name
    default, _ = grids(separation(rows), "smoke", 1)
    assert default.rows == [("a vs b",), ("b vs c",)]


def test_a_long_list_of_tasks_is_cut():
    tasks = [f"t{i}" for i in range(9)]
    rows = frame(*(r for t in tasks for m, v in (("a", [0.9, 0.92]), ("b", [0.5, 0.55]))
                   for r in cell(t, m, v)))  # fmt: skip
    target, _ = grids(separation(rows), "smoke", 1, ranked=["a", "b"])
    assert target.cells[0][1:3] == ["9/9", "t0, t1, t2, t3, t4, t5 (+3 more)"]


def test_head_to_head_counts_only_tested_tasks():
    """c copies b on copy: a is ahead of both there, b and c are never told apart, c ran
    copy alone; kv_recall (lr at an edge) tests nothing."""
    rows = pd.concat(
        [informative_rows(), frame(*cell("copy", "c", [0.5, 0.55, 0.6], se=0.01))],
        ignore_index=True,
    )
    result = separation(rows)
    target = result.pairs[result.pairs["measure"] == "target"]
    ahead, tested = head_to_head(target, ["a", "b", "c"])
    assert ahead.tolist() == [[0, 1, 1], [0, 0, 0], [0, 0, 0]]
    assert tested.tolist() == [[0, 3, 1], [3, 0, 1], [1, 1, 0]]


def test_the_csv_holds_every_pair():
    result = separation(informative_rows())
    table = pd.read_csv(io.StringIO(csv_text(result, "smoke")))
    assert list(table.columns) == CSV_COLUMNS
    assert len(table) == 4 * 2  # 4 tasks both ran, 2 measures; stack was a's alone
    copy = table[(table["task"] == "copy") & (table["measure"] == "target")].iloc[0]
    assert copy["separated"] and copy["ahead"] == "a"
    assert copy["difference"] == pytest.approx((0.40 + 0.37 + 0.35) / 3, abs=1e-5)
    sort = table[(table["task"] == "sort") & (table["measure"] == "target")].iloc[0]
    assert sort["reason"] == FLIP and pd.isna(sort["ahead"])


def test_protocols_are_separated_apart():
    quick = [
        {**r, "protocol": "quick", "run_id": "q" + r["run_id"]}
        for r in cell("copy", "a", [0.1, 0.1])
    ]
    result = separation(pd.concat([informative_rows(), frame(*quick)], ignore_index=True))
    counts = result.counts.set_index(["protocol", "measure"])
    assert counts.loc[("quick", "target"), "tasks"] == 1
    assert counts.loc[("quick", "target"), "informative"] == 0
    assert counts.loc[("smoke", "target"), "tasks"] == 5
    quick_target, _ = grids(result, "quick", 1)
    assert quick_target.rows == [] and "Fewer than 2 ranked mechanisms" in to_markdown(quick_target)
    assert csv_text(result, "quick").strip() == ",".join(CSV_COLUMNS)
