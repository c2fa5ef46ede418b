"""The learning-rate sweep of one run: what is still to train, when it grows, what it selects."""

from __future__ import annotations

import dataclasses
import functools
import random

import pytest

from synthbench.run.lr_selection import Budget, grown_past_an_edge, mark_selected, sweep_state
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.schema import lr_key

GRID = dataclasses.replace(PROTOCOLS.get("smoke"), lrs=(1e-3, 3e-3, 1e-2))
GROWING = dataclasses.replace(GRID, lr_extend=2)


def row(lr, acc=0.5, status="ok", exact=0.0):
    ok = status == "ok"
    return {
        "lr": lr,
        "status": status,
        "val_token_acc": acc if ok else None,
        "val_exact_match": exact if ok else None,
    }


def test_nothing_stored_needs_the_whole_grid():
    state = sweep_state(GRID, [])
    assert state.pending == (1e-3, 3e-3, 1e-2) and not state.complete
    assert state.selected is None


def test_only_the_missing_lrs_are_pending():
    state = sweep_state(GRID, [row(3e-3), row(1e-3, status="error")])
    assert state.pending == (1e-2,) and not state.complete


def test_complete_grid_selects_the_best_validation_lr():
    state = sweep_state(GRID, [row(1e-3, 0.2), row(3e-3, 0.9), row(1e-2, 0.4)])
    assert state.complete and state.pending == () and state.selected == 3e-3


def test_ties_select_the_lowest_lr():
    state = sweep_state(GRID, [row(1e-3, 0.2), row(3e-3, 0.9), row(1e-2, 0.9)])
    assert state.selected == 3e-3


def test_selection_uses_the_protocols_metric():
    rows = [row(1e-3, 0.9, exact=0.1), row(3e-3, 0.5, exact=0.4), row(1e-2, 0.1, exact=0.0)]
    assert sweep_state(GRID, rows).selected == 1e-3
    by_exact = dataclasses.replace(GRID, select_metric="exact_match")
    assert sweep_state(by_exact, rows).selected == 3e-3


def test_failed_lrs_are_never_selected_and_all_failed_selects_none():
    rows = [row(1e-3, status="diverged"), row(3e-3, 0.1), row(1e-2, status="error")]
    assert sweep_state(GRID, rows).selected == 3e-3
    failed = [row(lr, status="diverged") for lr in GRID.lrs]
    state = sweep_state(GRID, failed)
    assert state.complete and state.selected is None


def test_best_at_the_top_edge_grows_the_grid_one_step_at_a_time():
    rows = [row(1e-3, 0.1), row(3e-3, 0.5), row(1e-2, 0.8)]
    assert sweep_state(GRID, rows).selected == 1e-2  # no growth without lr_extend
    state = sweep_state(GROWING, rows)
    step = lr_key(1e-2 * 1e-2 / 3e-3)
    assert state.pending == (step,) and not state.complete
    rows.append(row(step, 0.9))  # best again: one more step, the last one allowed
    state = sweep_state(GROWING, rows)
    (second,) = state.pending
    assert second == lr_key(step * step / 1e-2)
    rows.append(row(second, 0.95))
    state = sweep_state(GROWING, rows)  # best at the edge again, but lr_extend is spent
    assert state.complete and state.selected == second


def test_best_at_the_bottom_edge_grows_downwards_and_stops_when_it_falls():
    rows = [row(1e-3, 0.8), row(3e-3, 0.5), row(1e-2, 0.1)]
    state = sweep_state(GROWING, rows)
    below = lr_key(1e-3 * 1e-3 / 3e-3)
    assert state.pending == (below,)
    rows.append(row(below, 0.3))  # worse: the optimum is inside, the sweep ends
    state = sweep_state(GROWING, rows)
    assert state.complete and state.selected == 1e-3


@pytest.mark.parametrize("accs", [(0.1, 0.8, 0.8), (1.0, 1.0, 1.0), (0.1, 0.9, 0.2)])
def test_no_growth_when_the_edge_is_not_alone_at_the_top(accs):
    rows = [row(lr, acc) for lr, acc in zip(GRID.lrs, accs, strict=True)]
    assert sweep_state(GROWING, rows).complete


def test_an_lr_read_back_from_a_file_matches_the_computed_step():
    step = 1e-2 * 1e-2 / 3e-3  # 0.0333...: float division
    stored = float(f"{lr_key(step)!r}")  # what Parquet gives back
    rows = [row(1e-3, 0.1), row(3e-3, 0.5), row(1e-2, 0.8), row(stored, 0.2)]
    state = sweep_state(GROWING, rows)
    assert state.complete and state.selected == 1e-2


def test_mark_selected_marks_exactly_the_selected_row_once_complete():
    rows = [row(1e-3, 0.2), row(3e-3, 0.9)]
    assert not mark_selected(GRID, rows)
    assert not any(r["selected"] for r in rows)  # incomplete: nothing selected yet
    rows.append(row(1e-2, 0.1))
    assert mark_selected(GRID, rows)
    assert [r["selected"] for r in rows] == [False, True, False]


# -- lr at the edge, and early stopping ----------------------------------------------------

STOPPING = dataclasses.replace(GRID, stop_at=0.99, steps=1000)


def stopped(lr, acc, steps_done):
    return {**row(lr, acc), "steps_done": steps_done}


def test_a_best_lr_alone_at_an_edge_is_marked_and_an_interior_one_is_not():
    assert sweep_state(GRID, [row(1e-3, 0.2), row(3e-3, 0.4), row(1e-2, 0.9)]).edge
    assert sweep_state(GRID, [row(1e-3, 0.9), row(3e-3, 0.4), row(1e-2, 0.2)]).edge
    assert not sweep_state(GRID, [row(1e-3, 0.2), row(3e-3, 0.9), row(1e-2, 0.4)]).edge
    # a plateau that reaches inside the grid: the optimum is not beyond it
    assert not sweep_state(GRID, [row(1e-3, 0.2), row(3e-3, 0.9), row(1e-2, 0.9)]).edge
    # a single lr cannot show that its optimum lies inside
    single = dataclasses.replace(GRID, lrs=(1e-3,))
    assert sweep_state(single, [row(1e-3, 0.9)]).edge


def test_growth_that_runs_out_leaves_the_edge_marked():
    once = dataclasses.replace(GRID, lr_extend=1)
    (added,) = sweep_state(once, [row(1e-3, 0.1), row(3e-3, 0.2), row(1e-2, 0.3)]).pending
    rows = [row(1e-3, 0.1), row(3e-3, 0.2), row(1e-2, 0.3), row(added, 0.4)]
    state = sweep_state(once, rows)
    assert state.complete and state.selected == added and state.edge
    rows[-1] = row(added, 0.25)  # the added lr is worse: 1e-2 is now interior
    state = sweep_state(once, rows)
    assert state.selected == 1e-2 and not state.edge


def test_every_lr_that_reached_stop_at_solved_and_the_fastest_is_selected():
    rows = [stopped(1e-3, 0.992, 700), stopped(3e-3, 1.0, 400), stopped(1e-2, 0.995, 300)]
    state = sweep_state(STOPPING, rows)
    assert state.selected == 1e-2  # 1.0 at 400 steps is no better than 0.995 at 300
    assert not state.edge  # every lr solved: a plateau, nothing to gain beyond the grid
    rows[2] = stopped(1e-2, 0.995, 400)  # the same step: a tie, the lowest lr
    assert sweep_state(STOPPING, rows).selected == 3e-3


def test_a_solve_alone_at_the_edge_grows_the_grid():
    rows = [stopped(1e-3, 0.6, 1000), stopped(3e-3, 0.9, 1000), stopped(1e-2, 0.995, 500)]
    state = sweep_state(dataclasses.replace(STOPPING, lr_extend=1), rows)
    assert not state.complete and len(state.pending) == 1 and state.pending[0] > 1e-2


def test_below_stop_at_the_validation_score_decides_not_the_steps():
    rows = [stopped(1e-3, 0.97, 1000), stopped(3e-3, 0.98, 1000), stopped(1e-2, 0.99, 900)]
    assert sweep_state(STOPPING, rows).selected == 1e-2
    rows[2] = stopped(1e-2, 0.5, 1000)
    assert sweep_state(STOPPING, rows).selected == 3e-3


def test_mark_selected_marks_the_edge_on_every_row_once_complete():
    rows = [row(1e-3, 0.2), row(3e-3, 0.4)]
    assert not mark_selected(GRID, rows)
    assert [r["lr_edge"] for r in rows] == [False, False]
    rows.append(row(1e-2, 0.9))
    assert mark_selected(GRID, rows)
    assert [r["lr_edge"] for r in rows] == [True, True, True]


# -- the step budget of an lr added past a solved edge --------------------------------------


def test_an_lr_added_past_a_solved_edge_trains_only_while_it_could_be_selected():
    grow = dataclasses.replace(STOPPING, lr_extend=1)
    state = sweep_state(grow, [stopped(1e-3, 0.6, 1000), stopped(3e-3, 0.9, 1000),
                               stopped(1e-2, 0.995, 500)])  # fmt: skip
    (added,) = state.pending
    # above the edge a tie in steps goes to the edge (the lower lr): it must solve sooner
    assert added > 1e-2 and state.budgets == {added: Budget(steps=400)}
    state = sweep_state(grow, [stopped(1e-3, 0.995, 500), stopped(3e-3, 0.9, 1000),
                               stopped(1e-2, 0.6, 1000)])  # fmt: skip
    (added,) = state.pending
    assert added < 1e-3 and state.budgets == {added: Budget(steps=500)}  # below: a tie goes to it
    # an edge that solved at the first curve point leaves nothing sooner: that one point
    state = sweep_state(grow, [stopped(1e-3, 0.6, 1000), stopped(3e-3, 0.9, 1000),
                               stopped(1e-2, 0.995, 100)])  # fmt: skip
    assert state.budgets == {state.pending[0]: Budget(steps=100)}
    # past an edge that did not solve, only the whole schedule can tell
    state = sweep_state(grow, [stopped(1e-3, 0.6, 1000), stopped(3e-3, 0.9, 1000),
                               stopped(1e-2, 0.95, 1000)])  # fmt: skip
    assert len(state.pending) == 1 and state.budgets == {}
    assert sweep_state(grow, []).budgets == {}  # the protocol's grid: the whole schedule


def _sweep(protocol, trainings, budgeted):
    """Run a sweep to the end on made-up trainings: ``trainings(lr)`` is (the step it
    solves at or None, its score at the end of the schedule, its score at any earlier
    stop). Returns (selected, edge, the lrs trained, how many trainings were cut short)."""
    rows, cut = [], 0
    while True:
        state = sweep_state(protocol, rows)
        if state.complete:
            return state.selected, state.edge, sorted(lr_key(r["lr"]) for r in rows), cut
        for lr in state.pending:
            solves_at, final, early = trainings(lr)
            budget = (state.budgets.get(lr, Budget()).steps if budgeted else None) or protocol.steps
            if solves_at is not None and solves_at <= budget:
                rows.append(stopped(lr, 0.995, solves_at))
            elif budget < protocol.steps:
                rows.append(stopped(lr, early, budget))
                cut += 1
            else:
                rows.append(stopped(lr, final, protocol.steps))


def _made_up_training(rng, outcomes, lr):
    if lr not in outcomes:
        solves_at = rng.choice([None, *range(100, 1001, 100)])
        outcomes[lr] = (solves_at, rng.choice([0.1, 0.5, 0.9, 0.98]), rng.random() * 0.98)
    return outcomes[lr]


def test_the_budget_changes_neither_the_selection_nor_the_grid():
    rng = random.Random(0)
    cut = 0
    for _ in range(2000):
        protocol = dataclasses.replace(STOPPING, lrs=(3e-3, 1e-2), lr_extend=rng.choice([1, 2, 3]))
        outcomes = {}  # one fixed made-up training per lr
        trainings = functools.partial(_made_up_training, rng, outcomes)
        *full, _ = _sweep(protocol, trainings, budgeted=False)
        *budgeted, cut_here = _sweep(protocol, trainings, budgeted=True)
        assert budgeted == full
        cut += cut_here
    assert cut > 100  # the budget did cut trainings short


# -- the pace an lr added past an edge must keep up with --------------------------------------


def curved(lr, acc, curve):
    return {**stopped(lr, acc, curve[-1][0]), "curve_steps": [s for s, _ in curve],
            "curve_val_token_acc": [v for _, v in curve]}  # fmt: skip


def test_an_lr_added_past_an_edge_gets_its_curve_as_pace():
    edge_curve = [(500, 0.4), (1000, 0.8)]
    rows = [curved(3e-3, 0.5, [(500, 0.3), (1000, 0.5)]), curved(1e-2, 0.8, edge_curve)]
    paced = dataclasses.replace(STOPPING, lrs=(3e-3, 1e-2), lr_extend=1, pace_margin=0.1)
    (added,) = sweep_state(paced, rows).pending
    assert sweep_state(paced, rows).budgets == {added: Budget(None, ((500, 0.4), (1000, 0.8)))}
    unpaced = dataclasses.replace(paced, pace_margin=0.0)
    assert sweep_state(unpaced, rows).budgets == {}  # no limit: the whole schedule
    rows[1] = {**rows[1], "curve_steps": None, "curve_val_token_acc": None}  # schema < 4
    assert sweep_state(paced, rows).budgets == {}


def test_falling_behind_the_pace_counts_from_half_the_schedule():
    paced = dataclasses.replace(STOPPING, pace_margin=0.1)
    budget = Budget(None, ((100, 0.9), (300, 0.95), (400, 0.995)))  # solved at 400
    assert not budget.falls_behind(paced, 400, 0.1)  # before half: never
    assert budget.falls_behind(paced, 500, 0.89)  # the edge held at 0.995 past its end
    assert not budget.falls_behind(paced, 500, 0.9)  # within the margin
    assert not budget.falls_behind(dataclasses.replace(paced, pace_margin=0.0), 500, 0.0)
    assert not Budget().falls_behind(paced, 1000, 0.0)  # no pace


# -- recipe v2: growth on a signal above noise, and the verdict's robustness to the lr -------

SIGNAL = dataclasses.replace(GROWING, lr_signal=0.05)


def charted(lr, acc, chance=0.1, status="ok"):
    """A row with the task's chance, as a training stores it."""
    return {**row(lr, acc, status), "chance_token_acc": chance, "chance_exact_match": 0.0}


def test_an_lr_that_learned_nothing_never_grows_the_grid():
    # the edge leads by 0.03 over chance 0.10, noise: without lr_signal the grid would grow
    rows = [charted(1e-3, 0.10), charted(3e-3, 0.11), charted(1e-2, 0.13)]
    assert sweep_state(GROWING, rows).pending  # today's rule follows the noise
    state = sweep_state(SIGNAL, rows)
    assert state.complete and state.selected == 1e-2 and not state.edge


def test_a_lead_within_noise_leaves_the_grid_and_is_no_edge():
    rows = [charted(1e-3, 0.50), charted(3e-3, 0.80), charted(1e-2, 0.83)]
    state = sweep_state(SIGNAL, rows)
    assert state.complete and state.selected == 1e-2 and not state.edge


def test_a_lead_above_noise_at_an_edge_grows_the_grid_both_ways():
    rows = [charted(1e-3, 0.50), charted(3e-3, 0.70), charted(1e-2, 0.90)]
    assert sweep_state(SIGNAL, rows).pending == (lr_key(1e-2 * 1e-2 / 3e-3),)
    rows = [charted(1e-3, 0.90), charted(3e-3, 0.70), charted(1e-2, 0.20)]
    assert sweep_state(SIGNAL, rows).pending == (lr_key(1e-3 * 1e-3 / 3e-3),)


def test_a_lead_above_noise_that_runs_out_of_growth_is_an_edge():
    once = dataclasses.replace(SIGNAL, lr_extend=1)
    step = lr_key(1e-2 * 1e-2 / 3e-3)
    rows = [charted(1e-3, 0.5), charted(3e-3, 0.6), charted(1e-2, 0.7), charted(step, 0.9)]
    state = sweep_state(once, rows)
    assert state.complete and state.selected == step and state.edge


@pytest.mark.parametrize(
    "accs, robustness, gap",
    [
        ((0.92, 0.96, 0.04), 2, 0.04),
        ((0.90, 0.96, 0.04), 1, 0.06),  # 0.90 trails by more than 0.05
        ((0.93, 0.96, 0.94), 3, 0.02),
        ((0.04, 0.96, 0.04), 1, 0.92),  # a knife-edge
    ],
)
def test_a_complete_sweep_records_its_robustness_to_the_lr(accs, robustness, gap):
    rows = [charted(lr, acc) for lr, acc in zip(GRID.lrs, accs, strict=True)]
    state = sweep_state(GRID, rows)
    assert state.robustness == robustness and state.gap == pytest.approx(gap)
    mark_selected(GRID, rows)
    assert {r["lr_robustness"] for r in rows} == {robustness}
    assert all(r["lr_gap"] == pytest.approx(gap) for r in rows)


def test_a_diverged_lr_scores_zero_in_the_gap_and_an_incomplete_sweep_has_no_marks():
    rows = [charted(1e-3, 0.5), charted(3e-3, 0.9), charted(1e-2, None, status="diverged")]
    state = sweep_state(GRID, rows)
    assert state.robustness == 1 and state.gap == pytest.approx(0.4)
    alone = [charted(3e-3, 0.9), charted(1e-2, None, status="diverged")]
    assert sweep_state(GRID, alone).robustness is None
    mark_selected(GRID, alone)
    assert all(r["lr_robustness"] is None and r["lr_gap"] is None for r in alone)
    only = dataclasses.replace(GRID, lrs=(3e-3,))
    assert sweep_state(only, [charted(3e-3, 0.9)]).gap is None


# -- recipe v2's refinement of a knife-edge ---------------------------------------------------

REFINING = dataclasses.replace(GRID, lr_refine=1)
LOW, HIGH = lr_key((1e-3 * 3e-3) ** 0.5), lr_key((3e-3 * 1e-2) ** 0.5)


def test_a_knife_edge_trains_the_midpoints_toward_the_neighbours_it_beats():
    """3e-3 beats both neighbours by more than 0.3: the geometric midpoints train too."""
    state = sweep_state(REFINING, [row(1e-3, 0.1), row(3e-3, 0.95), row(1e-2, 0.2)])
    assert not state.complete and state.pending == (LOW, HIGH)
    assert state.budgets == {}  # the whole schedule: a midpoint measures, it is not a bet


def test_only_the_side_beaten_by_more_than_the_margin_is_refined():
    state = sweep_state(REFINING, [row(1e-3, 0.1), row(3e-3, 0.95), row(1e-2, 0.7)])
    assert state.pending == (LOW,)


def test_no_knife_edge_no_refinement():
    rows = [row(1e-3, 0.7), row(3e-3, 0.95), row(1e-2, 0.66)]
    state = sweep_state(REFINING, rows)
    assert state.complete and state.selected == 3e-3 and state.gap == pytest.approx(0.25)
    assert sweep_state(GRID, [row(1e-3, 0.1), row(3e-3, 0.95), row(1e-2, 0.2)]).complete


def test_midpoints_that_learn_too_make_the_verdict_robust():
    rows = [row(1e-3, 0.1), row(3e-3, 0.95), row(1e-2, 0.2), row(LOW, 0.92), row(HIGH, 0.4)]
    state = sweep_state(REFINING, rows)
    assert state.complete and state.selected == 3e-3
    assert state.robustness == 2 and state.gap == pytest.approx(0.03)


def test_midpoints_that_do_not_learn_leave_a_knife_edge_and_one_round_is_all():
    rows = [row(1e-3, 0.1), row(3e-3, 0.95), row(1e-2, 0.2), row(LOW, 0.1), row(HIGH, 0.15)]
    state = sweep_state(REFINING, rows)
    assert state.complete and state.pending == () and state.selected == 3e-3
    assert state.robustness == 1 and state.gap == pytest.approx(0.75)


def test_a_midpoint_that_beats_the_grid_is_selected():
    rows = [row(1e-3, 0.1), row(3e-3, 0.9), row(1e-2, 0.2), row(LOW, 0.1), row(HIGH, 0.97)]
    state = sweep_state(REFINING, rows)
    assert state.complete and state.selected == HIGH and not state.edge


def test_a_diverged_neighbour_scores_zero_and_is_refined_toward():
    state = sweep_state(REFINING, [row(1e-3, 0.8), row(3e-3, 0.9), row(1e-2, status="diverged")])
    assert state.pending == (HIGH,)


def test_refinement_comes_after_the_grid_has_grown():
    """An edge that leads grows the grid first; the knife-edge is refined once it stops."""
    both = dataclasses.replace(SIGNAL, lr_extend=1, lr_refine=1)
    rows = [charted(1e-3, 0.1), charted(3e-3, 0.1), charted(1e-2, 0.9)]
    grown = lr_key(1e-2 * 1e-2 / 3e-3)
    assert sweep_state(both, rows).pending == (grown,)
    state = sweep_state(both, [*rows, charted(grown, 0.2)])
    assert state.pending == (HIGH, lr_key((1e-2 * grown) ** 0.5))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"lr_refine": -1}, "lr_refine must be >= 0"),
        ({"lr_refine": 1, "lrs": (1e-3,)}, r"needs at least 2 lrs \(a neighbour\)"),
    ],
)
def test_an_invalid_refinement_is_refused_naming_it(changes, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(GRID, **changes)


def test_an_lr_that_raised_is_no_neighbour_to_refine_toward():
    state = sweep_state(REFINING, [row(1e-3, 0.8), row(3e-3, 0.9), row(1e-2, status="error")])
    assert state.complete and state.selected == 3e-3


def test_an_added_lr_is_told_grown_past_an_edge_or_a_midpoint():
    """What `run` says of an lr a sweep adds: the growth chain past either edge, or not."""
    up = lr_key(1e-2 * 1e-2 / 3e-3)
    up2, down = lr_key(up * up / 1e-2), lr_key(1e-3 * 1e-3 / 3e-3)
    for lr in (up, up2, down):
        assert grown_past_an_edge(GROWING, lr)
    for lr in (LOW, HIGH, lr_key((1e-2 * up) ** 0.5), 1e-3):
        assert not grown_past_an_edge(GROWING, lr)
    assert not grown_past_an_edge(GRID, up)  # a grid that never grows
