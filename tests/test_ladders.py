"""Suite v4's difficulty ladders and windows (issue 70, parts 1 and 2): every level of every
laddered task is a valid, well-posed preset; the default suite (``--difficulty ladder``)
deals a task's seeds to its levels; a report scores a complete ladder as the mean over its
levels and shows an incomplete one as variants; every recall task keeps its answers beyond
the reach of the windows of sliding-window and Based, checked on generated data by rules
that read the data, not the generators. The shortcut audit of every level is
tests/test_audit.py's (its cases are every preset, the levels among them)."""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from clitools import invoke

from synthbench.core.mechanism import MECHANISMS
from synthbench.core.task import (
    IGNORE,
    LADDER,
    TASKS,
    Ladder,
    check_ladder,
    in_default_suite,
    ladder_table,
    task_set,
)
from synthbench.report import informative
from synthbench.report.aggregate import LEVEL, aggregate, prepare_rows, selected_runs
from synthbench.run import limits
from synthbench.run.planning import plan, plan_size, suite_difficulties
from synthbench.run.protocols import PROTOCOLS

SMOKE = PROTOCOLS.get("smoke")
BUILTIN = [e.name for e in TASKS.entries() if e.source == "builtin"]
LADDERED = [name for name in BUILTIN if TASKS.get(name).ladder is not None]


def levels_of(name: str):
    cls = TASKS.get(name)
    return [(level, cls.from_difficulty(level)) for level in cls.ladder.names]


# -- declarations ----------------------------------------------------------------------------


def test_every_non_control_task_of_the_default_suite_and_no_other_has_a_ladder():
    for entry in TASKS.entries():
        if entry.source != "builtin":
            continue
        scored = in_default_suite(entry) and not entry.metadata.get("control")
        assert (entry.obj.ladder is not None) == scored, entry.name
    assert len(LADDERED) == 21


@pytest.mark.parametrize("name", LADDERED)
def test_every_level_is_a_well_posed_preset(name):
    """check_ladder passes; each level is a preset that builds, whose oracle answers its own
    data, whose parameters name it back, and that differs from the baseline only on the
    axis; the levels are distinct and grow harder along the axis."""
    cls = TASKS.get(name)
    check_ladder(cls)
    ladder = cls.ladder
    assert ladder.names == tuple(f"L{i}" for i in range(1, len(ladder.steps) + 2))
    assert set(ladder.names) <= set(cls.presets()) and ladder.source and ladder.axis
    baseline = cls(**ladder.baseline).param_dict()
    seen = set()
    for level, task in levels_of(name):
        assert task.param_dict() == cls(**ladder.levels[level]).param_dict()
        batch = task.generate(16, torch.Generator().manual_seed(3))
        assert batch.inputs.shape == (16, task.seq_len)
        assert torch.equal(task.solve(batch.inputs), batch.targets)
        assert batch.answer_mask.any(dim=1).all()  # every example asks something
        assert cls.level_of(task.param_dict()) == level
        moved = {k for k, v in task.param_dict().items() if baseline[k] != v}
        # kv_recall's queries follow its pairs (half of them): derived, not set
        assert moved <= set(ladder.axis) | ({"queries"} if name == "kv_recall" else set())
        seen.add(json.dumps(task.param_dict(), sort_keys=True))
    assert len(seen) == len(ladder.names)


def test_a_levels_parameters_are_not_any_other_presets_level():
    kv = TASKS.get("kv_recall")
    assert kv.level_of(kv().param_dict()) is None  # the default is no level of kv_recall
    assert kv.level_of({**kv.from_difficulty("L2").param_dict(), "values": 65}) is None
    assert TASKS.get("bigram").level_of(TASKS.get("bigram")().param_dict()) is None


def ladder_task(**ladder_fields):
    """A task class (unregistered: named Bad in messages) with kv_recall's knobs and the
    ladder ``ladder_fields`` make, over a valid one."""
    fields = dict(axis=("pairs",), source="test", baseline={"pairs": 8}, steps=({"pairs": 16},))
    return type("Bad", (TASKS.get("kv_recall"),), {"ladder": Ladder(**{**fields, **ladder_fields})})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"steps": ()}, r"^task Bad: a ladder needs a baseline and at least one step$"),
        ({"axis": ("pairz",)}, r"^task Bad: its ladder names 'pairz', not a parameter; did you"),
        ({"steps": ({"keys": 128},)}, r"^task Bad, ladder level L2: a step changes the axis "),
        ({"steps": ({"pairs": 4},)}, r"^task Bad, ladder level L2: pairs=4 is not harder than "),
        ({"steps": ({"pairs": 16}, {"pairs": 16})}, r"^task Bad, ladder level L3: pairs=16 is"),
        ({"steps": ({"pairs": 99},)}, r"^task Bad, ladder level L2: kv_recall needs 1 <= pairs"),
        ({"baseline": {"pairs": 8, "wobble": 1}}, r"^task Bad: its ladder names 'wobble'"),
    ],
)
def test_a_bad_ladder_is_one_line_naming_the_task_and_level(fields, message):
    with pytest.raises(ValueError, match=message) as raised:
        check_ladder(ladder_task(**fields))
    assert "\n" not in str(raised.value)


def test_a_preset_named_like_a_level_is_refused():
    Bad = type("Bad", (ladder_task(),), {"difficulties": {"L2": {"pairs": 4}}})
    with pytest.raises(ValueError, match=r"^task Bad: presets named like ladder levels: L2$"):
        check_ladder(Bad)


def test_an_unknown_level_names_the_presets():
    presets = r"\(presets: default, easy, hard, L1, L2, L3\)"
    with pytest.raises(
        ValueError, match=rf"unknown difficulty 'L7'; did you mean L3, L2, L1\? {presets}"
    ):
        TASKS.get("kv_recall").from_difficulty("L7")
    with pytest.raises(ValueError, match=r"^task kv_recall has no difficulty 'L7'; did you"):
        plan(["kv_recall"], ["softmax"], SMOKE, 1, difficulties=["L7"])


# -- the dealing of seeds --------------------------------------------------------------------


@pytest.mark.parametrize("name", LADDERED)
def test_seeds_are_dealt_to_the_levels_in_turn(name):
    ladder = TASKS.get(name).ladder
    n = len(ladder.names)
    first = [ladder.level_of_seed(name, s) for s in range(n)]
    assert sorted(first) == sorted(ladder.names)  # seeds 0..L-1: one level each
    for seed in range(5 * n):  # and then again, in the same order
        assert ladder.level_of_seed(name, seed) == first[seed % n]
    for level in ladder.names:
        assert ladder.level_of_seed(name, ladder.first_seed(name, level)) == level
        assert ladder.first_seed(name, level) < n


def test_the_dealing_starts_at_a_fixed_place_per_task_name():
    """Not all at L1: the suite's seed 0 holds a mix of levels (a hash of the task name, the
    same whatever else is registered)."""
    starts = {TASKS.get(name).ladder.level_of_seed(name, 0) for name in LADDERED}
    assert len(starts) == 3
    ladder = TASKS.get("kv_recall").ladder
    assert ladder.offset("kv_recall") == zlib.crc32(b"kv_recall") % 3


# -- planning --------------------------------------------------------------------------------


def level_of(spec) -> str | None:
    return TASKS.get(spec.task).level_of(spec.task_params)


@pytest.mark.parametrize("seeds", [3, 4, 7])
def test_the_ladder_suite_deals_every_tasks_seeds_and_counts_them_first(seeds):
    tasks = ["kv_recall", "copy", "bigram", "mod_counting"]
    specs = plan(tasks, ["softmax", "linear"], SMOKE, seeds, difficulties=[LADDER])
    assert plan_size(tasks, ["softmax", "linear"], SMOKE, seeds, difficulties=[LADDER]) == len(
        specs
    )
    assert len(specs) == len(tasks) * 2 * seeds  # the seeds a task has, spread over levels
    for name in ("kv_recall", "copy"):
        ladder = TASKS.get(name).ladder
        mine = [s for s in specs if s.task == name and s.mechanism == "softmax"]
        assert sorted(s.seed for s in mine) == list(range(seeds))
        for spec in mine:
            assert level_of(spec) == ladder.level_of_seed(name, spec.seed)
        held = [sum(level_of(s) == level for s in mine) for level in ladder.names]
        assert max(held) - min(held) <= 1 and min(held) >= 1
    for name in ("bigram", "mod_counting"):  # a control and an extended task: one setting
        mine = [s for s in specs if s.task == name and s.mechanism == "softmax"]
        assert {json.dumps(s.task_params) for s in mine} == {
            json.dumps(TASKS.get(name)().param_dict())
        }
        assert sorted(s.seed for s in mine) == list(range(seeds))


def test_a_ladder_with_fewer_seeds_than_levels_is_one_line():
    with pytest.raises(ValueError) as raised:
        plan(["kv_recall"], ["softmax"], SMOKE, 2, difficulties=[LADDER])
    assert str(raised.value) == (
        "the ladder of kv_recall has 3 levels, each run at a seed of its own: it needs at "
        "least 3 seeds, got 2"
    )
    with pytest.raises(ValueError, match="needs at least 3 seeds"):
        plan_size(["kv_recall"], ["softmax"], SMOKE, 1, difficulties=[LADDER])


def test_task_parameters_go_on_every_level_but_never_on_the_axis():
    specs = plan(["kv_recall"], ["softmax"], SMOKE, 3, difficulties=[LADDER],
                 task_params={"values": 96})  # fmt: skip
    assert {s.task_params["values"] for s in specs} == {96}
    assert sorted(s.task_params["pairs"] for s in specs) == [8, 16, 24]
    with pytest.raises(ValueError, match=r"^the ladder of kv_recall varies pairs: a task param"):
        plan(["kv_recall"], ["softmax"], SMOKE, 3, difficulties=[LADDER],
             task_params={"pairs": 12})  # fmt: skip


def test_one_setting_stays_what_it_says():
    """Without the ladder a task runs its defaults (or a preset, a level among them) at
    every seed; a protocol that pins a task's parameters runs its pinned layout alone."""
    default = plan(["kv_recall"], ["softmax"], SMOKE, 3)
    assert {json.dumps(s.task_params) for s in default} == {
        json.dumps(TASKS.get("kv_recall")().param_dict())
    }
    level = plan(["kv_recall"], ["softmax"], SMOKE, 2, difficulties=["L3"])
    assert [s.seed for s in level] == [0, 1] and {level_of(s) for s in level} == {"L3"}
    paper = PROTOCOLS.get("slay-paper")
    pinned = plan(["kv_recall", "copy"], ["softmax"], paper, 3, difficulties=[LADDER])
    kv = [s for s in pinned if s.task == "kv_recall"]
    assert {s.task_params["pairs"] for s in kv} == {8} and len(kv) == 3
    assert {level_of(s) for s in pinned if s.task == "copy"} == {"L1", "L2", "L3"}


def test_the_suite_is_scored_over_its_ladders_and_a_named_task_at_one_setting():
    """``run``'s rule (suite_difficulties): --task all or extended, without task parameters,
    with seeds for every level: the ladder; a named task, task parameters, a difficulty
    given, or one seed (smoke's wiring check): one setting, exactly what was asked."""
    assert suite_difficulties("all", {}, None, 3) == [LADDER]
    assert suite_difficulties("extended", None, None, 5) == [LADDER]
    assert suite_difficulties("all", {}, None, 1) is None
    assert suite_difficulties("all", {"vocab": 8}, None, 3) is None
    assert suite_difficulties("kv_recall", {}, None, 3) is None
    assert suite_difficulties("copy,sort", {}, None, 3) is None
    assert suite_difficulties("all", {}, ["hard"], 3) == ["hard"]
    assert suite_difficulties("kv_recall", {}, [LADDER], 3) == [LADDER]


def test_every_level_fits_the_memory_limit():
    """The levels' longer inputs (first_token's 513, long_copy's 512) are refused nowhere:
    each fits in 4 GiB at every protocol that compares, softmax's memory the largest."""
    for protocol in ("quick", "standard", "quick-block", "standard-block"):
        specs = plan(LADDERED, ["softmax", "based"], PROTOCOLS.get(protocol), 3,
                     difficulties=[LADDER])  # fmt: skip
        limits.check_runs(specs, torch.device("cpu"))
        assert max(limits.memory_needed(s)[0] for s in specs) < 4 * 2**30


def test_a_plugin_tasks_bad_ladder_stops_the_plan_in_one_line():
    Bad = ladder_task(steps=({"pairs": 4},))
    TASKS.add("bad-ladder", Bad, category="Memory", description="a ladder that gets easier")
    try:
        with pytest.raises(ValueError, match=r"^task bad-ladder, ladder level L2: pairs=4 is"):
            plan(["bad-ladder"], ["softmax"], SMOKE, 3, difficulties=[LADDER])
    finally:
        TASKS._remove("bad-ladder")  # the registry keeps no other way out


# -- reports ---------------------------------------------------------------------------------


def stored(task: str, mech: str, params: dict, seed: int, value: float, status="ok", se=0.0):
    """One stored row (one lr, selected) of a run of ``task`` at complete ``params``."""
    complete = TASKS.get(task)(**params).param_dict()
    return {
        "protocol": "quick",
        "protocol_version": 6,
        "category": TASKS.entry(task).metadata["category"],
        "task": task,
        "task_params": json.dumps(complete, sort_keys=True),
        "mechanism": mech,
        "mechanism_params": "{}",
        "config": "{}",
        "run_id": f"{task}-{mech}-{json.dumps(complete, sort_keys=True)}-{seed}",
        "seed": seed,
        "lr": 1e-3,
        "status": status,
        "selected": status == "ok",
        "target_metric": "token_acc",
        "token_acc": value if status == "ok" else np.nan,
        "token_acc_se": se,
        "chance_token_acc": 0.02,
        "chance_exact_match": 0.0,
    }


def ladder_rows(task: str, mech: str, values: dict[str, list[float]], se=0.0) -> list[dict]:
    """A mechanism's runs of ``task``'s ladder: level -> the values of its dealt seeds."""
    ladder, rows = TASKS.get(task).ladder, []
    for level, level_values in values.items():
        seeds = [s for s in range(40) if ladder.level_of_seed(task, s) == level]
        rows += [
            stored(task, mech, ladder.levels[level], seed, value, se=se)
            for seed, value in zip(seeds, level_values, strict=False)
        ]
    return rows


def test_a_complete_ladder_is_the_mean_over_its_levels():
    """softmax: one seed a level; linear: L2 has two seeds (0.2 and 0.4: its value 0.3); gla
    lacks L3 (its levels are variants, never kv_recall's score); a run at the defaults beside
    the ladder is its own variant."""
    rows = pd.DataFrame(
        ladder_rows("kv_recall", "softmax", {"L1": [1.0], "L2": [0.9], "L3": [0.5]})
        + ladder_rows("kv_recall", "linear", {"L1": [0.8], "L2": [0.2, 0.4], "L3": [0.1]})
        + ladder_rows("kv_recall", "gla", {"L1": [0.7], "L2": [0.6]})
        + [stored("kv_recall", "softmax", {}, 0, 0.25)]
    )
    table = aggregate(rows, "token_acc").set_index(["task", "mechanism"])
    assert table.loc[("kv_recall", "softmax"), "mean"] == pytest.approx((1.0 + 0.9 + 0.5) / 3)
    assert table.loc[("kv_recall", "linear"), "mean"] == pytest.approx((0.8 + 0.3 + 0.1) / 3)
    assert table.loc[("kv_recall", "linear"), "count"] == 3  # a value per level
    assert table.loc[("kv_recall", "softmax"), "std"] == pytest.approx(
        np.std([1.0, 0.9, 0.5], ddof=1)
    )
    assert ("kv_recall", "gla") not in table.index
    assert table.loc[("kv_recall (L1)", "gla"), "mean"] == pytest.approx(0.7)
    assert table.loc[("kv_recall (L2)", "gla"), "mean"] == pytest.approx(0.6)
    assert table.loc[("kv_recall (gap=0, pairs=24, queries=12)", "softmax"), "mean"] == 0.25
    alone = aggregate(rows[rows["mechanism"] != "gla"], "token_acc")
    assert set(alone["task"]) == {"kv_recall", "kv_recall (default)"}
    runs = selected_runs(prepare_rows(rows), "token_acc")
    ladder = TASKS.get("kv_recall").ladder
    linear = runs[(runs["task"] == "kv_recall") & (runs["mechanism"] == "linear")]
    assert dict(zip(linear[LEVEL], linear["seed"], strict=True)) == {
        level: ladder.first_seed("kv_recall", level) for level in ladder.names
    }


def test_a_levels_standard_error_and_a_diverged_level():
    """A level's test-set error is that of its runs' mean; a level whose run diverged counts
    under its level's seed, as its value would."""
    rows = pd.DataFrame(
        ladder_rows("copy", "linear", {"L1": [1.0], "L2": [0.5, 0.7], "L3": [0.2]}, se=0.03)
    )
    runs = selected_runs(prepare_rows(rows), "token_acc").set_index(LEVEL)
    assert runs.loc["L2", "se"] == pytest.approx(math.sqrt(2 * 0.03**2) / 2)
    assert runs.loc["L1", "se"] == pytest.approx(0.03)
    ladder = TASKS.get("copy").ladder
    seed = [s for s in range(9) if ladder.level_of_seed("copy", s) == "L3"][0]
    failed = rows[rows["seed"] != seed]
    failed = pd.concat(
        [failed, pd.DataFrame([stored("copy", "linear", ladder.levels["L3"], seed, 0, "diverged")])]
    )
    table = aggregate(failed, "token_acc").set_index(["task", "mechanism"])
    assert table.loc[("copy", "linear"), "diverged"] == 1
    assert table.loc[("copy", "linear"), "count"] == 2


def test_informativeness_reads_a_ladder_as_its_levels():
    """The cell's interval is the levels' (their spread and test sets), as the rule computes
    it over seeds; the hardest level's ceiling is counted apart."""
    # m0 at the ceiling everywhere, m2 on the hardest level alone (its mean 0.967)
    values = [(1.0, 1.0, 1.0), (1.0, 1.0, 0.5), (0.9, 1.0, 1.0), (0.8, 0.7, 0.6)]
    levels = {
        f"m{i}": {f"L{j + 1}": [v] for j, v in enumerate(row)} for i, row in enumerate(values)
    }
    rows = pd.DataFrame(
        [r for mech, v in levels.items() for r in ladder_rows("kv_recall", mech, v, se=0.01)]
    )
    table = informative.informativeness(rows).set_index("task")
    row = table.loc["kv_recall"]
    assert (row["mechanisms"], row["levels"], row["top_ceiling"], row["ceiling"]) == (4, 3, 2, 1)
    by_hand = {
        m: informative.interval(pd.Series(sum(v.values(), [])), pd.Series([0.01] * 3))
        for m, v in levels.items()
    }
    expected = sum(
        informative.separated(by_hand[a], by_hand[b])
        for i, a in enumerate(by_hand)
        for b in list(by_hand)[i + 1 :]
    )
    assert row["separated"] == expected


# -- windows below the recall distance ---------------------------------------------------------


def window_reach(protocol: str) -> dict[str, int]:
    """How far back two layers of each windowed mechanism's default window see, core and
    published layer: a token more than n_layers x (window - 1) back reaches no query."""
    layers = PROTOCOLS.get(protocol).n_layers
    reach = {}
    for name in ("sliding-window", "based"):
        cls = MECHANISMS.get(name)
        core = cls(16, 4).window
        layer = cls.layer(64, 4).window
        reach[name] = layers * (max(core, layer) - 1)
    return reach


RECALL = [name for name in LADDERED if levels_of(name)[0][1].recall_distance() is not None]


def test_the_recall_tasks_are_those_of_the_issue():
    assert set(RECALL) == {
        "kv_recall", "retrieval", "multihop", "first_token", "selective_copy", "distant_match"
    }  # fmt: skip


@pytest.mark.parametrize("name", RECALL)
def test_every_level_of_a_recall_task_lies_beyond_the_windows(name):
    for protocol in ("quick", "standard", "quick-block", "standard-block"):
        for mechanism, reach in window_reach(protocol).items():
            for level, task in levels_of(name):
                assert task.recall_distance() > reach, (protocol, mechanism, level)


def measured_distances(name: str, task, inputs: torch.Tensor, targets: torch.Tensor):
    """Per answer, the positions between where it is predicted and the token it recalls,
    found by reading the data: the answer's one occurrence in the context (a value, a
    marker's value, an edge's destination), the first token, the j-th data token, x_j."""
    x, found = inputs.numpy(), []
    for row, i in zip(*np.nonzero(targets.numpy() != IGNORE), strict=True):
        answer, p = int(targets[row, i]), task.params
        if name == "kv_recall":  # the value's place among the pairs
            source = int(np.nonzero(x[row, : 2 * p.pairs] == answer)[0][0])
        elif name == "retrieval":  # the queried marker's place in the haystack, plus one
            source = int(np.nonzero(x[row, : p.n] == x[row, i])[0][0]) + 1
        elif name == "multihop":  # the destination of the edge leaving the current node
            sources = x[row, 0 : 2 * p.pairs : 2]
            source = 2 * int(np.nonzero(sources == x[row, i])[0][0]) + 1
        elif name == "first_token":
            source = 0
        elif name == "selective_copy":  # the j-th data token of the prompt
            data = np.nonzero(x[row, : p.length] != p.vocab)[0]
            source = int(data[i - p.length])
        elif name == "distant_match":  # x_j, for the probe y_j at n + 2j - 1
            source = (i - p.n - 1) // 2
        found.append(i - source)
    return np.array(found)


@pytest.mark.parametrize("name", RECALL)
def test_a_recall_distance_holds_on_generated_data(name):
    """No answer lies nearer its source than the task declares; where every example reaches
    the bound (the first answer of the layouts that fix it), it is reached."""
    for level, task in levels_of(name):
        batch = task.generate(256, torch.Generator().manual_seed(11))
        distances = measured_distances(name, task, batch.inputs, batch.targets)
        assert distances.min() >= task.recall_distance(), level
        if name in ("first_token", "distant_match", "kv_recall"):
            assert distances.min() == task.recall_distance(), level


def test_a_recall_distance_check_fails_on_a_layout_without_the_gap():
    """The data rule tells apart the layout before the gap: queries right after the pairs."""
    task = TASKS.get("kv_recall")(pairs=8)  # gap 0
    batch = task.generate(256, torch.Generator().manual_seed(11))
    assert measured_distances("kv_recall", task, batch.inputs, batch.targets).min() == 2
    assert window_reach("quick")["sliding-window"] >= 2


@pytest.mark.parametrize("name", ["sliding-window", "based"])
@pytest.mark.parametrize("window", [0, -3, 2.5, True, "16"])
def test_a_window_out_of_range_is_one_line(name, window):
    cls = MECHANISMS.get(name)
    for build in (lambda: cls(16, 4, window=window), lambda: cls.layer(64, 4, window=window)):
        with pytest.raises(ValueError) as raised:
            build()
        assert str(raised.value).startswith("window must be an integer >= 1, got ")
        assert "\n" not in str(raised.value)


def test_the_windows_are_the_published_ratios_at_the_suites_scale():
    """Longformer's window of 512 in 4,096 tokens and Based's 64 in 2,048, at 128 tokens."""
    assert MECHANISMS.get("sliding-window")(16, 4).window == 128 * 512 // 4096
    assert MECHANISMS.get("based")(16, 4).window == 128 * 64 // 2048
    assert MECHANISMS.get("based").layer(64, 4).window == 128 * 64 // 2048


# -- the docs ----------------------------------------------------------------------------------


def test_the_docs_show_every_ladder():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "TASKS.md").read_text()
    assert ladder_table() in doc, "regenerate: python -c 'from synthbench.core.task import ...'"


def test_the_suites_plan_line_counts_its_settings(tmp_path):
    """`run` on its default says how many settings the ladders give (tasks have different
    numbers of levels: a per-task grid-point count would round them away)."""
    suite = [TASKS.get(name) for name in task_set("all")]
    settings = sum(len(t.ladder.names) if t.ladder else 1 for t in suite)
    result = invoke("run", "--dry-run", "--mech", "softmax", "--results", tmp_path / "r")
    assert result.exit_code == 0, result.output
    assert f"over {len(suite)} tasks at {settings} settings, 1 mechanism, 3 seeds" in result.output
