"""What `synthbench run` says its plan will cost (synthbench/run/cost.py): the arithmetic,
where each per-step figure comes from, the pairs it cannot price, the shipped table and the
documentation's table drawn from it, and the line the command prints."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from clitools import SMOKE, invoke

from synthbench.core.text import duration
from synthbench.run import cost, cost_lines, cost_table
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.runner import Unit
from synthbench.run.spec import RunSpec

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "PROTOCOLS.md"
REFERENCE = REPO / "synthbench" / "data" / "reference" / "quick.parquet"


def table(*figures) -> pd.DataFrame:
    """A table of (protocol, task, mechanism, step_seconds[, trainings_per_run, steps_frac])."""
    rows = []
    for protocol, task, mech, seconds, *factors in figures:
        runs, frac = factors or (None, None)
        rows.append({"protocol": protocol, "task": task, "mechanism": mech,
                     "step_seconds": seconds, "source": "measured",
                     "trainings_per_run": runs, "steps_frac": frac})  # fmt: skip
    return pd.DataFrame(rows).reindex(columns=cost.TABLE_COLUMNS)


def quick(task: str, mech: str, lrs: int = 2) -> cost.Training:
    return cost.Training("quick", task, mech, 1000, lrs, adaptive=True)


def test_the_arithmetic_of_a_hand_computed_plan():
    """copy: 0.01 s a step, runs trained 3 trainings each, half their steps; sort: 0.02 s,
    no runs of its own (the protocol's average factors); smoke's copy: 0.005 s, exact. On
    top of the warm per-step figures: a process's first training, its first of each task."""
    shipped = table(
        ("quick", "copy", "softmax", 0.01, 3.0, 0.5),
        ("quick", "sort", "softmax", 0.02),
        ("quick", "reverse", "linear", 0.04, 2.0, 1.0),
        ("smoke", "copy", "softmax", 0.005),
    )
    plan = [quick("copy", "softmax")] * 4 + [quick("sort", "softmax")] * 2
    est = cost.estimate(plan, cost.table_costs(shipped), cost.protocol_factors(shipped))
    # one process: its first training, and its first of copy and of sort
    startup = cost.FIRST_TRAINING_S + 2 * cost.FIRST_OF_TASK_S
    assert est.startup == pytest.approx(startup)
    # 4 x 1000 x 0.01 + 2 x 1000 x 0.02: every planned training at its whole schedule
    assert est.seconds == pytest.approx(80.0 + startup)
    assert est.longest == pytest.approx(20.0 + cost.FIRST_TRAINING_S + cost.FIRST_OF_TASK_S)
    assert (est.trainings, est.covered, est.steps, est.exact) == (6, 6, (1000,), False)
    # copy: 10 s x 0.5 x 3 / 2 lrs = 7.5 s a training; sort: the mean factors of quick's
    # figures that have them, (3 + 2) / 2 = 2.5 runs and (0.5 + 1) / 2 = 0.75: 20 x 0.75 x 1.25
    assert est.expected == pytest.approx(4 * 7.5 + 2 * 18.75 + startup)
    assert est.trainings_per_run == pytest.approx((4 * 3 + 2 * 2.5) / 6)
    assert est.sources == {"table": 6} and est.unknown == {}
    # two at once, in worker processes: two first trainings, each task's first on both
    two = cost.estimate(
        plan, cost.table_costs(shipped), cost.protocol_factors(shipped), capacity=2, workers=True
    )
    startup2 = 2 * cost.FIRST_TRAINING_S + 4 * cost.FIRST_OF_TASK_S
    expected = 4 * 7.5 + 2 * 18.75 + startup2
    assert two.expected == pytest.approx(expected)
    command = cost.COMMAND_START_S + cost.LEAK_CHECK_S + cost.WORKER_START_S  # one mechanism
    assert two.command == pytest.approx(command)
    assert two.wall(expected) == pytest.approx(command + expected / 2)
    # what the progress bar's ETA starts from: a training's expected time and its share of
    # the start-up
    each = [two.training_seconds(t) for t in plan]
    assert each[0] == pytest.approx(10 * 0.5 + startup2 / 6)  # copy: stopped at half its steps
    # sort: no measured share of its own, its whole schedule
    assert each[-1] == pytest.approx(20 + startup2 / 6)
    assert two.training_seconds(quick("copy", "unpriced")) is None
    first, second = cost_lines.lines(two)
    assert first.startswith(
        f"estimated training time: {duration(80 + startup2)} at most for the first lr "
        "round (the trainings' wall seconds summed, as `results` lists them; 6 trainings"
    )
    assert "x 1000 steps; grown or refined lrs add trainings, early stopping removes steps" in first
    assert "per-step costs measured on a 2-core CPU, 1 thread; 4 s of it fresh processes'" in first
    assert second.startswith(f"expected: ~{duration(expected)} training time (as quick's")
    assert second.endswith(
        f"; the command: ~{duration(command + expected / 2)} wall with 2 at once, its "
        "start and leak checks included"
    )
    # a protocol that neither grows its grid nor stops early: what it trains, exactly
    smoke = [cost.Training("smoke", "copy", "softmax", 20, 1, adaptive=False)] * 3
    est = cost.estimate(smoke, cost.table_costs(shipped))
    startup = cost.FIRST_TRAINING_S + cost.FIRST_OF_TASK_S
    assert est.exact and est.seconds == pytest.approx(0.3 + startup) == est.expected
    (line,) = cost_lines.lines(est)
    assert line.startswith(
        f"estimated training time: {duration(0.3 + startup)} (the trainings' wall "
        "seconds summed, as `results` lists them; 3 trainings x 20 steps: smoke neither"
    )
    wall = cost.COMMAND_START_S + cost.LEAK_CHECK_S + 0.3 + startup  # one at a time
    assert line.endswith(f"; the command: ~{duration(wall)} wall, its start and leak "
                         "checks included")  # fmt: skip


def test_a_smoke_training_is_priced_with_what_a_fresh_process_pays():
    """The issue: one smoke training was estimated at "<1 s" (its warm steps alone) and
    took seconds (a fresh process's first training; the command's start). The training
    time now holds the first training's cost, the command's wall its start and checks."""
    shipped = cost.read_table()
    one = [cost.Training("smoke", "addition", "softmax", 20, 1, adaptive=False)]
    est = cost.estimate(one, cost.table_costs(shipped))
    warm = float(
        shipped.query("protocol == 'smoke' and task == 'addition' and mechanism == 'softmax'")[
            "step_seconds"
        ].iloc[0]
    ) * 20  # fmt: skip
    assert warm < 0.5  # what the estimate said before: "<1 s"
    assert est.seconds == pytest.approx(warm + cost.FIRST_TRAINING_S + cost.FIRST_OF_TASK_S)
    assert duration(est.seconds) == "2 s"
    assert est.wall(est.seconds) == pytest.approx(
        cost.COMMAND_START_S + cost.LEAK_CHECK_S + est.seconds
    )
    # in two worker processes: each pays its start, and its first training
    pool = cost.estimate(one * 4, cost.table_costs(shipped), capacity=2, workers=True)
    assert pool.startup == pytest.approx(2 * (cost.FIRST_TRAINING_S + cost.FIRST_OF_TASK_S))
    assert pool.command == pytest.approx(
        cost.COMMAND_START_S + cost.LEAK_CHECK_S + cost.WORKER_START_S
    )


def test_the_command_never_takes_longer_than_its_trainings_one_after_another():
    """The dry run that said "~27 s CPU, ~2 min wall with 2 at once": the wall time was the
    longest training at its cap, longer than every training's expected time together."""
    shipped = table(("quick", "copy", "softmax", 0.04, 1.0, 0.05))  # stopped at 5% of steps
    plan = [cost.Training("quick", "copy", "softmax", 1000, 1, True, max_steps=3000)] * 2
    est = cost.estimate(plan, cost.table_costs(shipped), capacity=2, workers=True)
    assert est.longest > est.expected  # the cap's bound, above what the runs are expected at
    # both trainings one after another at most: not the cap's longest training
    assert est.wall(est.expected) == pytest.approx(est.command + est.expected)
    _, expected = cost_lines.lines(est)
    said = duration(est.wall(est.expected))
    assert f"the command: ~{said} wall with 2 at once" in expected


def test_the_estimate_the_run_line_and_results_measure_one_thing(tmp_path, monkeypatch):
    """The estimate names what it sums (the trainings' wall seconds, as `results` lists
    them), the run's line says its training's wall seconds, and `results` lists that row's
    wall_seconds as wall_s: the same figure, named the same."""
    monkeypatch.chdir(tmp_path)
    results = tmp_path / "results"
    run = invoke("run", "--task", "copy", "--mech", "softmax", *SMOKE, "--results", results)
    assert run.exit_code == 0, run.output
    lines = run.stdout.splitlines()
    assert "(the trainings' wall seconds summed, as `results` lists them;" in lines[1]
    (row,) = pq.read_table(next(results.rglob("*.parquet"))).to_pylist()
    said = f"({row['wall_seconds']:.1f} s wall); 1/1 trainings"
    assert lines[2].startswith("ok copy") and said in lines[2], lines[2]
    listing = invoke("results", "--results", results).stdout.splitlines()
    header, line = listing[0].split(), listing[1].split()
    assert line[header.index("wall_s")] == f"{row['wall_seconds']:.1f}"


@pytest.mark.parametrize(
    "seconds, said",
    [
        (0.2, "<1 s"),
        (40, "40 s"),
        (600, "10 min"),
        (4680, "78 min"),
        (5400, "1.5 h"),
        (3 * 86400, "3.0 days"),
    ],  # fmt: skip
)
def test_durations_as_people_say_them(seconds, said):
    assert duration(seconds) == said


def test_an_adaptive_protocol_without_measured_runs_gives_the_bound_alone():
    shipped = table(("standard", "copy", "softmax", 0.2))
    plan = [cost.Training("standard", "copy", "softmax", 4000, 3, adaptive=True)] * 3
    est = cost.estimate(plan, cost.table_costs(shipped), cost.protocol_factors(shipped), 2)
    assert est.seconds == pytest.approx(2400 + est.startup) and est.expected is None
    first, second = cost_lines.lines(est)
    assert first.endswith("; the command: at most ~20 min wall with 2 at once, its start and "
                          "leak checks included")  # fmt: skip
    assert second.startswith("expected: not known (no measured runs of standard v")


def test_unknown_pairs_are_named_with_how_to_measure_them():
    shipped = table(("quick", "copy", "softmax", 0.01, 2.0, 1.0))
    plan = [quick("copy", "softmax")] * 2 + [quick("copy", "mymech")] * 2
    plan += [quick(t, "other") for t in ("copy", "sort", "stack", "parity")]
    est = cost.estimate(plan, cost.table_costs(shipped))
    assert (est.covered, est.trainings) == (2, 8)
    assert est.unknown == {"mymech": ("copy",), "other": ("copy", "parity", "sort", "stack")}
    assert est.seconds == pytest.approx(20 + cost.FIRST_TRAINING_S + cost.FIRST_OF_TASK_S)
    line = cost_lines.lines(est)[-1]
    assert line == (
        "estimate covers 2 of 8 trainings; unknown: mymech on copy; other (no measured cost: "
        "run `synthbench bench train --protocol quick --mech mymech,other`)"
    )
    nothing = cost.estimate([quick("copy", "mymech")], {})
    assert cost_lines.lines(nothing) == [
        "estimated training time: not known; unknown: mymech on copy (no measured cost: run "
        "`synthbench bench train --protocol quick --mech mymech`)"
    ]


def store_rows(root: Path, protocol, task, mech, name, rows) -> None:
    folder = root / f"protocol={protocol}" / f"task={task}" / f"mechanism={mech}"
    folder.mkdir(parents=True, exist_ok=True)
    base = {"run_id": name, "status": "ok", "steps": 1000, "threads": 1, "device": "cpu"}
    pq.write_table(pa.Table.from_pylist([base | r for r in rows]), folder / f"{name}.parquet")


def test_stored_rows_beat_bench_rows_which_beat_the_table(tmp_path):
    results, bench = tmp_path / "results", tmp_path / "bench-results"
    copy, sort, stack = (("quick", t, "softmax") for t in ("copy", "sort", "stack"))
    # copy: three ok rows (median 0.03 s a step) and three that must not count
    store_rows(results, *copy, "a", [
        {"wall_seconds": 10.0, "steps_done": 1000}, {"wall_seconds": 15.0, "steps_done": 500},
        {"wall_seconds": 50.0, "steps_done": 1000},
        {"wall_seconds": 99.0, "steps_done": 1000, "status": "diverged"},
        {"wall_seconds": 99.0, "steps_done": 1000, "threads": 2},
        {"wall_seconds": 99.0, "steps_done": 1000, "device": "NVIDIA H100"},
    ])  # fmt: skip
    (tmp_path / "results" / "protocol=quick" / "task=sort").mkdir()
    (bench / "train").mkdir(parents=True)
    older = {"mechanism": "softmax", "protocol": "quick", "status": "ok", "device": "cpu"}
    pq.write_table(
        pa.Table.from_pylist(
            [older | {"task": "copy", "run_s": 1.0}, older | {"task": "sort", "run_s": 1000.0}]
        ),  # fmt: skip
        bench / "train" / "20260101-000000-aaaaaa.parquet",
    )
    pq.write_table(  # newer: wins
        pa.Table.from_pylist([older | {"task": "sort", "run_s": 50.0}]),
        bench / "train" / "20260102-000000-bbbbbb.parquet",
    )
    (bench / "train" / "junk.parquet").write_text("not parquet")  # passed over
    shipped = table((*copy, 0.5, 3.0, 0.5), (*sort, 0.5), (*stack, 0.07))
    plan = [quick("copy", "softmax"), quick("sort", "softmax"), quick("stack", "softmax")]
    est = cost.plan_estimate(plan, results, bench, 1, "cpu", shipped)
    # copy 0.03 x 1000 (stored), sort 50 / 1000 x 1000 (bench), stack 0.07 x 1000 (table)
    assert est.seconds - est.startup == pytest.approx(30 + 50 + 70)
    assert est.sources == {"stored": 1, "bench": 1, "table": 1}
    costs = cost.choose(
        [copy], cost.stored_costs(results, [copy], 1, "cpu"), cost.table_costs(shipped)
    )
    # a stored figure keeps the table's measured factors for the expected figure
    assert costs[copy] == cost.Cost(0.03, "stored", 3.0, 0.5)
    first = cost_lines.lines(est)[0]
    assert (
        "per-step costs from stored rows (1), `bench train` rows (1), the shipped table " in first
    )
    # on a GPU: the GPU's rows alone
    gpu = cost.stored_costs(results, [copy], 1, "NVIDIA H100")
    assert gpu == {copy: cost.Cost(0.099, "stored", 1.0, 1.0)}


def test_runs_stored_here_say_what_to_expect_where_the_table_cannot(tmp_path):
    """A protocol whose table figures carry no trainings per run (the block track's, scaled
    from quick): a pair with stored runs trains as they did, one without as the plan's stored
    pairs did on average; the table's factors, where it has them, come first."""
    results = tmp_path / "results"
    kv, sort = ("quick", "kv_recall", "deltanet"), ("quick", "sort", "deltanet")
    # kv_recall: one run grown to 4 trainings, each stopped at half its steps
    store_rows(results, *kv, "a", [{"wall_seconds": 20.0, "steps_done": 500}] * 4)
    # sort: two runs of 2 trainings at every step
    store_rows(results, *sort, "b", [{"wall_seconds": 40.0, "steps_done": 1000}] * 2)
    store_rows(results, *sort, "c", [{"wall_seconds": 40.0, "steps_done": 1000}] * 2)
    stack = ("quick", "stack", "deltanet")
    shipped = table((*kv, 0.5), (*sort, 0.5), (*stack, 0.01))  # no factors anywhere
    plan = [quick(t, "deltanet") for t in ("kv_recall", "sort", "stack")]
    est = cost.plan_estimate(plan, results, tmp_path / "bench", 1, "cpu", shipped)
    # kv_recall: 0.04 x 1000 x 0.5 x 4 / 2; sort: 0.04 x 1000 x 1 x 2 / 2;
    # stack: 0.01 x 1000 x (mean of 0.5 and 1) x (mean of 4 and 2) / 2
    assert est.expected - est.startup == pytest.approx(40 + 40 + 10 * 0.75 * 3 / 2)
    assert "expected: ~" in cost_lines.lines(est)[1]
    # what is left once those runs are done: stack alone, as every pair stored here went
    # (runs of another protocol, of another device or thread count tell nothing)
    row = {"wall_seconds": 9.0, "steps_done": 10}
    store_rows(results, "other", "copy", "deltanet", "d", [row] * 9)
    store_rows(results, "quick", "copy", "linear", "e", [row | {"threads": 2}] * 9)
    store_rows(results, "quick", "parity", "linear", "f", [row | {"device": "gpu"}])
    est = cost.plan_estimate(plan[2:], results, tmp_path / "bench", 1, "cpu", shipped)
    assert est.expected - est.startup == pytest.approx(10 * 0.75 * 3 / 2)
    with_factors = table((*kv, 0.5, 3.0, 1.0), (*sort, 0.5), (*stack, 0.01))
    est = cost.plan_estimate(plan, results, tmp_path / "bench", 1, "cpu", with_factors)
    # kv_recall at the table's factors; stack at the table's protocol average (its only pair)
    assert est.expected - est.startup == pytest.approx(40 * 1.0 * 3 / 2 + 40 + 10 * 1.0 * 3 / 2)


def test_the_shipped_table_prices_every_builtin_task_under_every_protocol():
    shipped = cost.read_table()
    tasks = cost_table.builtin_tasks()  # the default suite's (the State tasks are not priced)
    assert list(shipped.columns) == cost.TABLE_COLUMNS
    assert set(shipped["source"]) <= set(cost.TABLE_SOURCES)
    assert (shipped["step_seconds"] > 0).all() and shipped["step_seconds"].map(math.isfinite).all()
    modern = ("sliding-window", "retnet", "gla", "deltanet", "mamba2", "based")
    for protocol in PROTOCOLS.names():
        mine = shipped[shipped["protocol"] == protocol]
        mechanisms = ("softmax", "linear", "performer", "cosformer", "slay", "none")
        if protocol != "slay-paper":  # a paper's attention-only setup
            mechanisms += modern
        for mech in mechanisms:
            assert sorted(mine[mine["mechanism"] == mech]["task"]) == tasks, (protocol, mech)
    assert not shipped.duplicated(["protocol", "task", "mechanism"]).any()


def test_a_scaled_figure_is_its_quick_figure_times_one_ratio_per_mechanism():
    """standard and the block track's quick-block and standard-block, on the pairs the shipped
    reference does not hold in them: the pair's quick figure times the median ratio of step
    times measured for the mechanism (benchmarks/step_costs.py)."""
    shipped = cost.read_table()
    quick = shipped[shipped["protocol"] == "quick"].set_index(["task", "mechanism"])
    for protocol in ("standard", "quick-block", "standard-block"):
        mine = shipped[shipped["protocol"] == protocol].set_index(["task", "mechanism"])
        assert len(mine) and mine["source"].isin(["scaled", "reference"]).all(), protocol
        scaled = mine[mine["source"] == "scaled"]
        assert len(scaled) or protocol == "quick-block", protocol  # the reference holds no standard
        assert (scaled.groupby(level="mechanism")["scale"].nunique() == 1).all(), protocol
        expected = quick.loc[scaled.index, "step_seconds"] * scaled["scale"]
        assert ((scaled["step_seconds"] / expected - 1).abs() < 1e-4).all(), protocol
        # measured at this version, or at one whose steps cost the same (cost.SAME_STEPS)
        versions = {PROTOCOLS.get(protocol).version, *cost.SAME_STEPS.get(protocol, ())}
        assert mine["protocol_version"].isin(versions).all(), protocol


def test_the_reference_figures_are_its_rows_medians():
    """Every figure taken from the shipped reference (quick's, and the block track's where it
    holds quick-block) is its protocol's CPU rows' median wall / steps_done; a quick one scaled
    to today's layout of its task keeps the rows' factors and says its scale."""
    rows = pd.read_parquet(REFERENCE)
    rows = rows[rows["device"] == "cpu"]  # a lent GPU's rows never price the CPU
    key = ["protocol", "task", "mechanism"]
    derived = cost.figures_of_rows(rows).set_index(key)
    shipped = cost.read_table().set_index(key)
    for source in ("reference", "layout"):
        mine = shipped[(shipped["source"] == source) & shipped.index.isin(derived.index)]
        expected = derived.loc[mine.index, "step_seconds"]
        if source == "layout":
            expected = expected * mine["scale"]
        assert ((mine["step_seconds"] / expected - 1).abs() < 1e-4).all(), source
        theirs = derived.loc[mine.index]
        assert (mine["rows"] == theirs["rows"]).all()
        assert ((mine["trainings_per_run"] - theirs["trainings_per_run"]).abs() < 1e-4).all()
    held = shipped[shipped["source"] == "reference"]
    assert len(held) and held.index.isin(derived.index).all()  # none from elsewhere


def test_the_docs_table_matches_the_shipped_figures():
    table = cost_table.markdown_table()
    assert table in DOC.read_text(), "regenerate docs/PROTOCOLS.md's cost table"


def test_run_prints_the_estimate_before_it_trains(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no bench-results of the checkout's
    results = tmp_path / "results"
    args = ["run", "--task", "copy", "--mech", "softmax", *SMOKE, "--results", results]
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    lines = first.stdout.splitlines()
    assert lines[0].startswith("1 run (1 task x 1 mechanism x 1 seed, protocol smoke")
    assert lines[1].startswith("estimated training time: ")
    assert "; 1 training x 20 steps: smoke neither grows its lr grid nor stops early; " in lines[1]
    assert "per-step costs measured on a 2-core CPU, 1 thread; 2 s of it fresh" in lines[1]
    assert lines[1].endswith("wall, its start and leak checks included")
    assert lines[2].startswith("ok copy")
    # run again: nothing to train, nothing to estimate; forced: the stored row's own cost
    assert "estimated" not in invoke(*args).stdout
    again = invoke(*args, "--force")
    assert "per-step costs from stored rows; " in again.stdout.splitlines()[1], again.stdout
    # another size: the figures are the default size's, and the line says so
    resized = invoke(*args, "--task-param", "n=8").stdout.splitlines()[1]
    assert "stored rows; at the default sizes, which this grid changes; " in resized, resized


def test_the_estimate_counts_what_the_runner_plans(tmp_path):
    """The units of a plan become its trainings: every lr a run starts with, a grown lr's
    step budget as its steps."""
    from synthbench.run.lr_selection import Budget

    quick = PROTOCOLS.get("quick")
    spec = RunSpec.resolve("copy", "linear", quick, 0)
    units = [*(Unit(spec, lr) for lr in quick.lrs), Unit(spec, 3.3e-2, Budget(steps=300))]
    trainings = cost.trainings_of(units)
    assert [t.steps for t in trainings] == [quick.steps] * len(quick.lrs) + [300]
    assert {(t.protocol, t.task, t.mechanism, t.lrs, t.adaptive) for t in trainings} == {
        ("quick", "copy", "linear", len(quick.lrs), True)
    }
    smoke = RunSpec.resolve("copy", "linear", PROTOCOLS.get("smoke"), 0)
    assert not cost.trainings_of([Unit(smoke, 1e-3)])[0].adaptive


PLUGIN = """
import torch.nn.functional as F
from synthbench import MECHANISMS, FeatureMapMechanism


@MECHANISMS.register(
    "cost-test-relu", complexity="linear", family="feature-map", reference="a test"
)
class ReLULinear(FeatureMapMechanism):
    def feature_map(self, x, is_query):
        return F.relu(x) + 1e-2

    @property
    def feature_dim(self):
        return self.head_dim
"""


def test_run_names_a_plugin_mechanism_it_cannot_price(tmp_path, monkeypatch, forget_plugins):
    monkeypatch.chdir(tmp_path)
    plugin = tmp_path / "plugin.py"
    plugin.write_text(PLUGIN)
    args = ["run", "--task", "copy", "--mech", "softmax,cost-test-relu", *SMOKE]
    result = invoke(*args, "--results", tmp_path / "results", "--plugin", plugin)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[1].startswith("estimated training time: 2 s (the trainings' wall seconds")
    assert "; 1 training x 20 steps" in lines[1]
    assert lines[2] == (
        "estimate covers 1 of 2 trainings; unknown: cost-test-relu on copy (no measured cost: "
        f"run `synthbench bench train --protocol smoke --mech cost-test-relu --plugin {plugin}`)"
    )


def test_a_dry_run_says_the_plan_and_its_cost_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    results = tmp_path / "results"
    args = ["run", "--mech", "softmax", *SMOKE, "--results", results]
    dry = invoke(*args, "--task", "copy", "--dry-run")
    assert dry.exit_code == 0, dry.output
    lines = dry.stdout.splitlines()
    assert lines[0].startswith("1 run (1 task x 1 mechanism x 1 seed, protocol smoke")
    assert "0 already stored, 1 to run (1 training)" in lines[0]
    assert lines[1].startswith("estimated training time: ")
    assert lines[-1] == "dry run: nothing trained or written"
    assert not [p for p in results.rglob("*") if p.is_file()]
    assert invoke(*args, "--task", "copy").exit_code == 0
    (stored,) = results.rglob("*.parquet")
    # a complete run whose selection was never marked (an interrupted write): a real run
    # marks it, a dry run counts it as stored and leaves the file as it is
    rows = pq.read_table(stored)
    at = rows.schema.get_field_index("selected")
    assert any(rows["selected"].to_pylist())
    unmarked = pa.array([False] * rows.num_rows, rows.schema.field(at).type)
    pq.write_table(rows.set_column(at, rows.schema.field(at), unmarked), stored)
    before = stored.read_bytes()
    dry = invoke(*args, "--task", "copy,sort", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "1 already stored, 1 to run (1 training)" in dry.stdout.splitlines()[0]
    assert stored.read_bytes() == before
    assert [p.name for p in results.rglob("*.parquet")] == [stored.name]
    # the same plan from a sweep file
    sweep = tmp_path / "sweep.toml"
    sweep.write_text('task = "copy,sort"\nmech = "softmax"\nprotocol = "smoke"\nseeds = 1\n')
    dry = invoke("sweep", sweep, "--jobs", "1", "--results", results, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "1 already stored, 1 to run (1 training)" in dry.stdout.splitlines()[0]
    assert stored.read_bytes() == before


def test_stored_rows_the_readers_leave_out_price_nothing(tmp_path):
    """A corrupt row (steps_done infinite: a per-step cost of 0) is left out by the readers'
    checks (run/row_checks.py) here too, so the figure is the sound row's alone."""
    key = ("quick", "copy", "softmax")
    folder = tmp_path / "protocol=quick" / "task=copy" / "mechanism=softmax"
    folder.mkdir(parents=True)
    sound = {"run_id": "a", "status": "ok", "wall_seconds": 30.0, "steps_done": 1000,
             "steps": 1000, "threads": 1, "device": "cpu"}  # fmt: skip
    corrupt = sound | {"run_id": "b", "steps_done": math.inf}
    for row in (sound, corrupt):
        pq.write_table(pa.Table.from_pylist([row]), folder / f"{row['run_id']}.parquet")
    (figure,) = cost.stored_costs(tmp_path, [key], 1, "cpu").values()
    assert figure.step_seconds == pytest.approx(0.03)
