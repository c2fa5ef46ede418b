"""Learning curves: steps to 0.9 and the area under the validation curve, an early-stopped
run held at its last value, and the tables, against hand computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_report import frame, row

from synthbench.report.curves import curve_grids, held_curve, mean_curves, run_curves, steps_to
from synthbench.report.formats import to_markdown
from synthbench.report.tables import MISSING, Stat
from synthbench.run.protocols import curve_points

POINTS = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]  # a 100-step training's curve points


def curved(task, mech, seed, values, steps=100, **more):
    """A row whose curve is ``values`` at the first len(values) of a ``steps``-step
    training's curve points (fewer than all: stopped early)."""
    points = curve_points(steps)[: len(values)]
    return row(
        task,
        mech,
        seed,
        values[-1],
        steps=steps,
        curve_steps=points,
        curve_val_token_acc=list(values),
        **more,
    )


def test_the_protocol_curve_points():
    assert curve_points(100) == POINTS


def test_area_of_a_full_curve_is_its_mean():
    values = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    assert held_curve(POINTS, values, 100).mean() == pytest.approx(0.55)
    assert steps_to(POINTS, values) == 90  # the first point at or above 0.9


def test_an_early_stopped_curve_is_held_at_its_last_value():
    """Stopped after 30 steps at 0.99 (stop_at reached): the 7 points it did not measure
    take 0.99, so the area is (0.5 + 0.95 + 8 x 0.99) / 10 = 0.937."""
    curve = held_curve([10, 20, 30], [0.5, 0.95, 0.99], 100)
    assert curve.tolist() == [0.5, 0.95, *[0.99] * 8]
    assert curve.mean() == pytest.approx(0.937)
    assert steps_to([10, 20, 30], [0.5, 0.95, 0.99]) == 20


def test_a_curve_that_never_reaches_the_level():
    assert math.isnan(steps_to(POINTS, [0.5] * 10))
    assert steps_to(POINTS, [0.5] * 9 + [0.9]) == 100  # at the level counts


def test_run_curves_per_selected_run():
    rows = frame(
        curved("copy", "softmax", 0, [0.5, 0.95, 0.99]),
        curved("copy", "softmax", 0, [0.1] * 10, lr=3e-3, selected=False),  # not selected
        curved("copy", "linear", 0, [0.2] * 10),
        row("copy", "none", 0, 0.1, steps=100, curve_steps=None, curve_val_token_acc=None),
    )
    runs = run_curves(rows).set_index("mechanism")
    assert sorted(runs.index) == ["linear", "softmax"]  # none has no curve (schema < 4)
    assert runs.loc["softmax", "area"] == pytest.approx(0.937)
    assert runs.loc["softmax", "steps_to"] == 20 and math.isnan(runs.loc["linear", "steps_to"])
    assert runs.loc["softmax", "points"] == POINTS and len(runs.loc["softmax", "curve"]) == 10


def test_mean_curves_average_the_held_curves_over_seeds():
    rows = frame(
        curved("copy", "softmax", 0, [0.5, 0.95, 0.99]),
        curved("copy", "softmax", 1, [0.3] * 10),
    )
    means = mean_curves(run_curves(rows)).set_index("step")["mean"]
    assert list(means.index) == POINTS
    assert means[10] == pytest.approx(0.4) and means[100] == pytest.approx((0.99 + 0.3) / 2)


def test_curve_tables_by_hand():
    """softmax reaches 0.9 at 20 and 40 (seeds 0, 1); linear at 60 on seed 0 and never on
    seed 1; none never."""
    rows = frame(
        curved("copy", "softmax", 0, [0.5, 0.95, 0.99]),
        curved("copy", "softmax", 1, [0.2, 0.4, 0.6, 0.9, 0.99]),
        curved("copy", "linear", 0, [0.1, 0.2, 0.3, 0.4, 0.5, 0.9, 0.9, 0.9, 0.9, 0.9]),
        curved("copy", "linear", 1, [0.1] * 10),
        curved("copy", "none", 0, [0.05] * 10),
        curved("copy", "none", 1, [0.05] * 10),
        curved("kv_recall", "softmax", 0, [0.5] * 10),
    )
    steps, area = curve_grids(run_curves(rows), "smoke", 1)
    assert steps.columns == ["linear", "none", "softmax"]
    assert steps.rows == [("Basic", "copy"), ("Memory", "kv_recall")]
    (lin, none, soft), kv = steps.cells
    assert soft == f"30 ± {np.std([20, 40], ddof=1):.0f}"  # "30 ± 14"
    assert lin == "60 (1 never)"  # one seed reached: its step alone, no spread
    assert none == "never"
    assert kv == [MISSING, MISSING, "never (n=1)"]
    md = to_markdown(steps)
    assert "30 ± 14" in md and "4 runs in all" in md  # linear seed 1, none, kv_recall
    # area: softmax (0.937 + (0.2 + 0.4 + 0.6 + 0.9 + 6 x 0.99) / 10) / 2
    soft_area = area.cells[0][2]
    seed1 = (0.2 + 0.4 + 0.6 + 0.9 + 6 * 0.99) / 10
    assert soft_area.mean == pytest.approx((0.937 + seed1) / 2)
    assert soft_area.std == pytest.approx(abs(0.937 - seed1) / math.sqrt(2))  # ddof 1
    assert area.cells[0][1] == Stat(pytest.approx(0.05), pytest.approx(0.0), 2)
    assert area.best_cells() == {(0, 2)}  # kv_recall's softmax has one seed: never bold
    assert area.cells[1][:2] == [None, None]


def test_no_curves_gives_no_runs():
    assert run_curves(frame(row("copy", "softmax", 0, 0.5))).empty


def test_a_curve_past_the_schedule_spans_its_cell_and_keeps_the_schedules_area():
    """Recipe v2: softmax seed 0 went on to 150 steps (its curve still rising at 100), seed
    1 settled at 100. The cell's curves span 150, seed 1 held at its last value; steps to
    0.9 may lie past the schedule; the area stays the mean over the protocol's 10 points
    (where both trained on the same schedule). Another cell keeps its own points."""
    extended = [k / 16 for k in range(1, 16)]  # 0.875 at 140, 0.9375 at 150
    rows = frame(
        row(
            "copy",
            "softmax",
            0,
            extended[-1],
            steps=100,
            curve_steps=curve_points(100, horizon=150),
            curve_val_token_acc=extended,
        ),
        curved("copy", "softmax", 1, [0.3] * 10),
        curved("copy", "linear", 0, [0.2] * 10),
    )
    runs = run_curves(rows).set_index(["mechanism", "seed"])
    longer = [*POINTS, 110, 120, 130, 140, 150]
    assert runs.loc[("softmax", 0), "points"] == runs.loc[("softmax", 1), "points"] == longer
    assert runs.loc[("linear", 0), "points"] == POINTS
    assert runs.loc[("softmax", 0), "curve"] == pytest.approx(extended)
    assert runs.loc[("softmax", 1), "curve"] == pytest.approx([0.3] * 15)
    assert runs.loc[("softmax", 0), "steps_to"] == 150
    assert runs.loc[("softmax", 0), "area"] == pytest.approx(sum(range(1, 11)) / 160)
    assert runs.loc[("softmax", 1), "area"] == pytest.approx(0.3)
    means = mean_curves(run_curves(rows))
    softmax = means[means["mechanism"] == "softmax"].set_index("step")["mean"]
    assert list(softmax.index) == longer
    assert softmax[150] == pytest.approx((0.9375 + 0.3) / 2)
