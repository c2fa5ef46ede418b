"""Seeds where they disagree (recipe v2): the rule (synthbench/run/seeds.py) on hand-made
rows, the runner growing a cell by runs as it grows a sweep by lrs, and what the command
line says about it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from clitools import assert_error, invoke

from synthbench.cli.common import out
from synthbench.cli.progress import RunView
from synthbench.core.task import LADDER, TASKS
from synthbench.run import provenance, runner, seeds
from synthbench.run.executors import InProcess
from synthbench.run.planning import plan
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.runner import Events, Unit
from synthbench.run.seeds import Growth, levels_out_of_order, run_score, seeds_to_add
from synthbench.run.spec import RunSpec
from synthbench.run.store import ResultStore
from synthbench.run.train import blank_row

pytestmark = pytest.mark.usefixtures("single_thread")

CPU = torch.device("cpu")
SMOKE = PROTOCOLS.get("smoke")
# a cell of 2 seeds grows to 4 where its scores lie more than 0.5 apart
GROWING = dataclasses.replace(SMOKE, name="smoke-seeds-test", max_seeds=4, seed_spread=0.5)


@pytest.fixture(scope="module", autouse=True)
def growing_protocol():
    """GROWING registered for this module's tests only (the command line's --protocol): a
    registration at import would show in every test of the worker that collects this file."""
    PROTOCOLS.add(GROWING.name, GROWING)
    yield
    PROTOCOLS._remove(GROWING.name)


def row(score: float, metric: str | None = "token_acc", **values) -> dict:
    """A selected row scoring ``score`` on ``metric`` (token_acc where it is null), every
    other test metric 0 unless given."""
    scored = metric if isinstance(metric, str) else "token_acc"
    base = {"token_acc": 0.0, "exact_match": 0.0, "free_token_acc": 0.0}
    return {**base, "target_metric": metric, scored: score, **values}


# -- the rule -------------------------------------------------------------------------------


def test_seeds_that_disagree_get_seeds_up_to_max_seeds():
    protocol = dataclasses.replace(SMOKE, max_seeds=5, seed_spread=0.2)
    cell = {0: row(0.1), 1: row(0.9), 2: row(0.5)}
    assert seeds_to_add(protocol, cell) == [3, 4]  # all at once


@pytest.mark.parametrize("high", [0.3, 0.29])
def test_seeds_within_the_spread_get_none(high):
    protocol = dataclasses.replace(SMOKE, max_seeds=5, seed_spread=0.2)
    assert seeds_to_add(protocol, {0: row(0.1), 1: row(high)}) == []  # at most 0.2 apart


def test_max_seeds_zero_a_single_seed_or_a_full_cell_get_none():
    off = dataclasses.replace(SMOKE, max_seeds=0, seed_spread=0.0)
    assert seeds_to_add(off, {0: row(0.0), 1: row(1.0)}) == []
    protocol = dataclasses.replace(SMOKE, max_seeds=3, seed_spread=0.0)
    assert seeds_to_add(protocol, {0: row(0.0)}) == []
    assert seeds_to_add(protocol, {0: row(0.0), 1: row(1.0), 2: row(0.5)}) == []  # grown once


def test_a_run_without_a_selected_row_does_not_count_but_keeps_its_seed():
    protocol = dataclasses.replace(SMOKE, max_seeds=4, seed_spread=0.2)
    assert seeds_to_add(protocol, {0: row(0.1), 1: None}) == []  # one score: no spread
    assert seeds_to_add(protocol, {0: row(0.1), 1: None, 2: row(0.9)}) == [3]


def test_the_lowest_seeds_a_cell_lacks_are_added():
    protocol = dataclasses.replace(SMOKE, max_seeds=4, seed_spread=0.2)
    assert seeds_to_add(protocol, {0: row(0.1), 2: row(0.9)}) == [1, 3]


def test_a_run_scores_its_target_metric():
    assert run_score(row(0.7, "free_token_acc", token_acc=0.9)) == 0.7
    assert run_score(row(0.4, "exact_match", token_acc=0.9)) == 0.4
    assert run_score(row(0.6, None)) == 0.6  # null (schema < 5): token_acc
    assert run_score(row(0.6, float("nan"))) == 0.6  # null as a data frame reads it
    assert run_score(None) is None and run_score(row(float("nan"))) is None
    # seeds are compared on the task's target metric, not on token_acc
    protocol, free = dataclasses.replace(SMOKE, max_seeds=3, seed_spread=0.2), "free_token_acc"
    disagree = {0: row(0.1, free, token_acc=0.9), 1: row(0.9, free, token_acc=0.9)}
    assert seeds_to_add(protocol, disagree) == [2]
    agree = {0: row(0.5, free, token_acc=0.0), 1: row(0.5, free, token_acc=1.0)}
    assert seeds_to_add(protocol, agree) == []


def test_levels_out_of_order_are_those_of_a_harder_level_above_an_easier_one():
    protocol = dataclasses.replace(SMOKE, max_seeds=5, seed_spread=0.5)

    def ladder(*values):
        return [(f"L{i}", {i: None if v is None else row(v)}) for i, v in enumerate(values, 1)]

    assert levels_out_of_order(protocol, ladder(0.9, 0.5, 0.1)) == {}  # in order
    assert levels_out_of_order(protocol, ladder(0.1, 0.9, 0.2)) == {"L1": 0.1, "L2": 0.9}
    assert levels_out_of_order(protocol, ladder(0.1, 0.5, 0.7)) == {"L1": 0.1, "L3": 0.7}
    assert levels_out_of_order(protocol, ladder(0.1, 0.6, 0.6)) == {}  # 0.5 apart: not more
    assert levels_out_of_order(protocol, ladder(None, 0.05, 0.9)) == {"L2": 0.05, "L3": 0.9}
    # a level's mean over its seeds
    two = [("L1", {0: row(0.0), 3: row(0.2)}), ("L2", {1: row(0.7)})]
    assert levels_out_of_order(protocol, two) == {"L1": 0.1, "L2": 0.7}
    off = dataclasses.replace(protocol, max_seeds=0)
    assert levels_out_of_order(off, ladder(0.0, 1.0)) == {}


# -- the runner -----------------------------------------------------------------------------


def kv(seed=0, mech="linear", protocol=GROWING) -> RunSpec:
    return RunSpec.resolve("kv_recall", mech, protocol, seed, {"pairs": 4, "queries": 2})


def fake_row(spec: RunSpec, lr: float, acc: float, status: str = "ok") -> dict:
    """A complete row as a training would return it, with chosen metrics."""
    made = blank_row(spec, lr)
    if status == "ok":
        made.update(token_acc=acc, exact_match=0.0, val_token_acc=acc, val_exact_match=0.0,
                    final_loss=1.0, n_params=1, steps_done=spec.protocol.steps)  # fmt: skip
    return {**made, "status": status, **provenance.stamp(CPU)}


def split(spec: RunSpec) -> float:
    """linear: seed 0 scores 1, every other 0 (its seeds disagree); softmax: 0.5 (agree)."""
    return (1.0 if spec.seed == 0 else 0.0) if spec.mechanism == "linear" else 0.5


class FakeExecutor:
    """Trains nothing: a unit's row scores ``accuracy(spec)``, with ``status(spec)``. Takes
    packs too (``submitted``: the seeds of each submission)."""

    capacity = 1

    def __init__(self, accuracy=split, status=lambda spec: "ok"):
        self.accuracy, self.status = accuracy, status
        self.queue, self.trained, self.submitted = [], [], []

    def submit(self, work):
        units = list(getattr(work, "units", [work]))
        self.submitted.append([u.spec.seed for u in units])
        self.queue += units

    def wait(self):
        unit = self.queue.pop(0)
        self.trained.append((unit.spec.mechanism, unit.spec.seed))
        spec = unit.spec
        return unit, fake_row(spec, unit.lr, self.accuracy(spec), self.status(spec))

    def close(self):
        pass


class Seen(Events):
    def __init__(self):
        self.said = []

    def seeded(self, growth, units):
        self.said.append(("seeded", [s.seed for s in growth.added], growth.scores, len(units)))

    def planned(self, runs, stored, units, capacity):
        self.said.append(("planned", runs, stored, len(units)))


def stored_seeds(root: Path) -> dict[str, list[int]]:
    rows = ResultStore(root).load(warn=False).rows
    return {mech: sorted(set(part["seed"])) for mech, part in rows.groupby("mechanism")}


def test_a_cell_whose_seeds_disagree_grows_once_and_its_seeds_train_next(tmp_path):
    store, seen = ResultStore(tmp_path), Seen()
    specs = [kv(0), kv(1), kv(0, "softmax"), kv(1, "softmax")]
    executor = FakeExecutor()
    outcome = runner.execute(specs, store, lambda n: executor, events=seen, more_seeds=True)
    # linear's seeds 2 and 3 train as soon as its cell completes, before softmax's
    assert executor.trained == [("linear", 0), ("linear", 1), ("linear", 2), ("linear", 3),
                                ("softmax", 0), ("softmax", 1)]  # fmt: skip
    assert seen.said == [("planned", 4, 0, 4), ("seeded", [2, 3], {0: 1.0, 1: 0.0}, 2)]
    assert outcome.runs == 6 and outcome.statuses == {"ok": 6} and outcome.trainings == 6
    assert stored_seeds(tmp_path) == {"linear": [0, 1, 2, 3], "softmax": [0, 1]}

    made = []  # the same command again: the grown cell is planned from the store, all stored
    again = runner.execute(specs, store, made.append, more_seeds=True)
    assert made == [] and again.runs == 6 and again.stored == 6


def test_the_added_seeds_are_packed_like_any_seeds_of_a_cell(tmp_path):
    executor = FakeExecutor()
    runner.execute([kv(0), kv(1)], ResultStore(tmp_path), lambda n: executor, pack=4,
                   more_seeds=True)  # fmt: skip
    assert executor.submitted == [[0, 1], [2, 3]]


def test_without_more_seeds_or_max_seeds_no_cell_grows(tmp_path):
    executor = FakeExecutor()
    runner.execute([kv(0), kv(1)], ResultStore(tmp_path), lambda n: executor)
    off = dataclasses.replace(GROWING, name="smoke", max_seeds=0)
    runner.execute(
        [kv(0, protocol=off), kv(1, protocol=off)], ResultStore(tmp_path / "off"),
        lambda n: executor, more_seeds=True,
    )  # fmt: skip
    assert len(executor.trained) == 4
    assert stored_seeds(tmp_path) == {"linear": [0, 1]}


def test_a_stored_cell_whose_seeds_disagree_gets_its_seeds_at_start_up(tmp_path):
    store = ResultStore(tmp_path)
    specs = [kv(0), kv(1)]
    runner.execute(specs, store, lambda n: FakeExecutor())  # stored whole, grown by none

    seen = Seen()
    runner.dry_run(specs, store, lambda n: 1, events=seen, more_seeds=True)
    assert seen.said == [("seeded", [2, 3], {0: 1.0, 1: 0.0}, 2), ("planned", 4, 2, 2)]
    assert stored_seeds(tmp_path) == {"linear": [0, 1]}  # a dry run writes nothing

    seen, executor = Seen(), FakeExecutor()
    outcome = runner.execute(specs, store, lambda n: executor, events=seen, more_seeds=True)
    assert seen.said == [("seeded", [2, 3], {0: 1.0, 1: 0.0}, 2), ("planned", 4, 2, 2)]
    assert executor.trained == [("linear", 2), ("linear", 3)]
    assert outcome.runs == 4 and outcome.stored == 2 and outcome.statuses == {"ok": 2}


def test_a_failed_run_does_not_count_towards_the_spread(tmp_path):
    executor = FakeExecutor(status=lambda spec: "diverged" if spec.seed == 1 else "ok")
    runner.execute([kv(0), kv(1)], ResultStore(tmp_path), lambda n: executor, more_seeds=True)
    assert executor.trained == [("linear", 0), ("linear", 1)]  # one score: nothing to compare


def test_seeds_already_stored_are_resumed_not_retrained(tmp_path):
    store = ResultStore(tmp_path)
    runner.execute([kv(2)], store, lambda n: FakeExecutor())  # stored by an earlier command
    executor = FakeExecutor()
    outcome = runner.execute([kv(0), kv(1)], store, lambda n: executor, more_seeds=True)
    assert executor.trained == [("linear", 0), ("linear", 1), ("linear", 3)]
    assert outcome.runs == 4 and outcome.stored == 1 and outcome.statuses == {"ok": 3}


def ladder_specs(seeds=3) -> list[RunSpec]:
    """kv_recall's ladder for linear under GROWING, its seeds dealt to the levels."""
    return plan(["kv_recall"], ["linear"], GROWING, seeds, difficulties=[LADDER])


def level(spec: RunSpec) -> str:
    return TASKS.get("kv_recall").level_of(spec.task_params)


def stored_levels(root: Path) -> dict[str, int]:
    """Level -> how many runs of it the tree holds."""
    rows = ResultStore(root).load(warn=False).rows.drop_duplicates("run_id")
    found = [TASKS.get("kv_recall").level_of(json.loads(p)) for p in rows["task_params"]]
    return {name: found.count(name) for name in sorted(set(found))}


def out_of_order(spec: RunSpec) -> float:
    """L1 fails at its first seed and learns at every other; L2 learns; L3 fails: L1 (0.0)
    below L2 (0.9) by more than the spread, L3 (0.2) in order."""
    first = TASKS.get("kv_recall").ladder.first_seed("kv_recall", level(spec))
    return {"L1": 0.0 if spec.seed == first else 1.0, "L2": 0.9, "L3": 0.2}[level(spec)]


def test_a_ladders_levels_out_of_order_get_a_second_seed_then_the_seed_rule(tmp_path):
    """Each level one seed: L1 below L2 gives both a second seed; L1's two then disagree
    (0.0 and 1.0) and the seed rule grows it to max_seeds, L2's agree; L3 is left alone."""
    specs, seen, executor = ladder_specs(), Seen(), FakeExecutor(accuracy=out_of_order)
    outcome = runner.execute(specs, ResultStore(tmp_path), lambda n: executor, events=seen,
                             more_seeds=True)  # fmt: skip
    assert stored_levels(tmp_path) == {"L1": 4, "L2": 2, "L3": 1}
    first = {
        name: TASKS.get("kv_recall").ladder.first_seed("kv_recall", name)
        for name in "L1 L2".split()
    }
    second = {name: min({0, 1} - {seed}) for name, seed in first.items()}  # the lowest lacking
    assert seen.said == [
        ("planned", 3, 0, 3),
        ("seeded", [second["L1"], second["L2"]], {"L1": 0.0, "L2": 0.9}, 2),
        ("seeded", [2, 3], {first["L1"]: 0.0, second["L1"]: 1.0}, 2),
    ]
    assert outcome.runs == 7 and outcome.statuses == {"ok": 7}

    made = []  # the same command again: judged from the store alike, everything stored
    again = runner.execute(specs, ResultStore(tmp_path), made.append, more_seeds=True)
    assert made == [] and again.runs == 7 and again.stored == 7


def test_a_ladder_in_order_or_of_one_level_gets_nothing(tmp_path):
    in_order = FakeExecutor(accuracy=lambda spec: {"L1": 0.9, "L2": 0.5, "L3": 0.1}[level(spec)])
    runner.execute(ladder_specs(), ResultStore(tmp_path), lambda n: in_order, more_seeds=True)
    assert len(in_order.trained) == 3
    one = plan(["kv_recall"], ["linear"], GROWING, 1, difficulties=["L3"])
    executor = FakeExecutor(accuracy=lambda spec: 1.0)
    runner.execute(one, ResultStore(tmp_path / "one"), lambda n: executor, more_seeds=True)
    assert len(executor.trained) == 1


def test_cells_judge_a_stored_ladder_then_the_cells_it_grew(tmp_path):
    """As benchmarks/build_reference.py counts what the runner adds: the same Cells."""
    executor = FakeExecutor(accuracy=out_of_order)
    runner.execute(ladder_specs(), ResultStore(tmp_path), lambda n: executor, more_seeds=True)
    rows = ResultStore(tmp_path).load(warn=False).rows
    cells = seeds.Cells(enabled=True)
    specs = ladder_specs()
    cells.plan(specs)
    records = {run_id: part.to_dict("records") for run_id, part in rows.groupby("run_id")}
    for spec in specs:
        cells.complete(spec, records[spec.run_id])
    grown = cells.grow(specs)
    assert [g.ladder for g in grown] == [True] and len(grown[0].added) == 2
    for spec in grown[0].added:
        cells.complete(spec, records[spec.run_id])
    (then,) = cells.grow(grown[0].added)
    assert not then.ladder and len(then.added) == 2  # L1 to max_seeds 4


def test_real_trainings_grow_the_cell_that_disagrees(tmp_path, monkeypatch):
    """Real smoke trainings in this process; the score of a run is forced: linear seed 0
    scores 1, every other run 0.5 or 0 (as ``split``)."""
    specs = {kv(s, m).run_id: kv(s, m) for m in ("linear", "softmax") for s in range(4)}
    monkeypatch.setattr(seeds, "run_score", lambda selected: split(specs[selected["run_id"]]))
    planned = [kv(0), kv(1), kv(0, "softmax"), kv(1, "softmax")]
    store = ResultStore(tmp_path)
    outcome = runner.execute(planned, store, lambda n: InProcess(CPU), more_seeds=True)
    assert outcome.runs == 6 and outcome.statuses == {"ok": 6}
    assert stored_seeds(tmp_path) == {"linear": [0, 1, 2, 3], "softmax": [0, 1]}
    rows = store.load(warn=False).rows
    assert rows.groupby("run_id")["selected"].sum().eq(1).all()

    made = []
    again = runner.execute(planned, store, made.append, more_seeds=True)
    assert made == [] and again.runs == 6 and again.stored == 6


# -- the command line -----------------------------------------------------------------------


def test_the_progress_says_when_a_cell_gets_more_seeds(tmp_path):
    specs = [kv(0), kv(1)]
    view = RunView(specs, tmp_path, "device cpu", False)
    added = [kv(2), kv(3)]
    with out.capture() as captured:
        # before the plan's line (the store held the cell complete): said at once
        view.seeded(Growth(added, {0: 0.02, 1: 0.98}), [Unit(spec, 1e-3) for spec in added])
        view.planned(4, 2, [], 0)
    lines = captured.get().splitlines()
    said = "kv_recall / linear: seeds disagree (0.02 .. 0.98): 2 more seeds, up to 4"
    assert lines[0].strip() == said
    assert lines[1].startswith("4 runs (1 task x 1 mechanism x 4 seeds,")


def test_the_progress_says_when_a_ladders_levels_are_out_of_order(tmp_path):
    specs = ladder_specs()
    view = RunView(specs, tmp_path, "device cpu", False)
    added = [specs[0].with_seed(5), specs[2].with_seed(5)]
    with out.capture() as captured:
        units = [Unit(spec, 1e-3) for spec in added]
        view.seeded(Growth(added, {"L1": 0.05, "L3": 0.91}, ladder=True), units)
    said = "kv_recall / linear: levels out of order (L1 0.05, L3 0.91): a second seed at 2 of them"
    assert captured.get().strip() == said


def test_a_dry_run_says_cells_may_get_more_seeds(tmp_path):
    result = invoke("run", "--task", "kv_recall", "--mech", "linear", "--protocol", GROWING.name,
                    "--seeds", "2", "--dry-run", "--results", tmp_path)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "cells whose seeds disagree (scores more than 0.5 apart) may get up to 4 seeds" in (
        result.output.replace("\n", " ")
    )


def test_a_dry_run_says_which_one_seed_cells_may_grow(tmp_path):
    """Under the ladder each level of kv_recall holds one of the 3 seeds: the seed rule
    cannot judge a cell of one seed, the ladder's order can; a task at one setting and one
    seed (--seeds 1, no ladder) never grows."""
    result = invoke("run", "--task", "kv_recall", "--mech", "linear", "--protocol", GROWING.name,
                    "--seeds", "3", "--difficulty", "ladder", "--dry-run",
                    "--results", tmp_path)  # fmt: skip
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "may get up to" not in said and "never get more" not in said
    assert (
        "3 ladder levels of one seed may get a second, where a harder level of their ladder "
        "scores more than 0.5 above an easier one"
    ) in said
    result = invoke("run", "--task", "kv_recall", "--mech", "linear", "--protocol", GROWING.name,
                    "--seeds", "1", "--dry-run", "--results", tmp_path)  # fmt: skip
    said = " ".join(result.output.split())
    assert "1 cell of one seed cannot disagree and never get more" in said
    assert "ladder level" not in said


def test_more_seeds_than_max_seeds_is_one_line(tmp_path):
    result = invoke("run", "--task", "kv_recall", "--protocol", GROWING.name, "--seeds", "5",
                    "--results", tmp_path)  # fmt: skip
    assert_error(result, 2, "--seeds 5 is more than protocol smoke-seeds-test's max_seeds 4")
    result = invoke("run", "--task", "kv_recall", "--protocol-param", "max_seeds=1",
                    "--results", tmp_path)  # fmt: skip
    assert_error(result, 2, "max_seeds")
