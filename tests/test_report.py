"""Report tables from stored rows: aggregation over seeds, failures, the full, per-category
and category-average tables, checked cell by cell; Markdown and LaTeX."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pandas as pd
import pytest

from synthbench.core.task import TASKS
from synthbench.report.aggregate import (
    DEFAULT_METRIC,
    METRICS,
    aggregate,
    label_variants,
    latest_versions,
    length_points,
    metric_values,
    normalise,
    selected_runs,
)
from synthbench.report.formats import latex_escape, to_latex, to_markdown
from synthbench.report.tables import (
    MISSING,
    Stat,
    build_tables,
    category_scores,
    lr_grid,
    seeds_text,
)

NAN = float("nan")


def row(
    task,
    mech,
    seed,
    acc,
    *,
    protocol="smoke",
    version=1,
    category=None,
    lr=1e-3,
    selected=True,
    status="ok",
    exact=None,
    chance=0.0,
    **more,
):
    """One stored row; chance 0 unless given, so the chance-normalised score is the value
    itself; ``more`` sets or adds columns (e.g. free_token_acc, token_acc_se, lr_edge)."""
    category = category or {"kv_recall": "Memory", "copy": "Basic", "add": "Arithmetic"}[task]
    ok = status == "ok"
    return {
        "protocol": protocol,
        "protocol_version": version,
        "category": category,
        "task": task,
        "mechanism": mech,
        "run_id": f"{protocol}{version}-{task}-{mech}-{seed}",
        "seed": seed,
        "lr": lr,
        "selected": selected and ok,
        "status": status,
        "token_acc": acc if ok else NAN,
        "exact_match": (acc / 2 if exact is None else exact) if ok else NAN,
        "target_metric": "token_acc",
        "chance_token_acc": chance,
        "chance_exact_match": chance,
        **more,
    }


def frame(*rows) -> pd.DataFrame:
    return pd.DataFrame(list(rows))


@pytest.fixture
def rows() -> pd.DataFrame:
    return frame(
        # kv_recall / softmax: three seeds, 0.5 0.6 0.7, each with a worse, unselected lr row
        *(row("kv_recall", "softmax", s, a) for s, a in enumerate((0.5, 0.6, 0.7))),
        *(row("kv_recall", "softmax", s, 0.99, lr=3e-3, selected=False) for s in range(3)),
        # kv_recall / linear: every seed diverged
        *(row("kv_recall", "linear", s, None, status="diverged") for s in range(3)),
        # copy / softmax: 1.0 for all seeds
        *(row("copy", "softmax", s, 1.0) for s in range(3)),
        # copy / linear: two seeds ok (0.2, 0.4), one raised
        row("copy", "linear", 0, 0.2),
        row("copy", "linear", 1, 0.4),
        row("copy", "linear", 2, None, status="error"),
    )


def cell(agg: pd.DataFrame, task: str, mech: str) -> pd.Series:
    (index,) = agg.index[(agg["task"] == task) & (agg["mechanism"] == mech)]
    return agg.loc[index]


def test_aggregate_mean_std_count(rows):
    agg = aggregate(rows)
    assert len(agg) == 4
    c = cell(agg, "kv_recall", "softmax")
    assert c["mean"] == pytest.approx(0.6)
    assert c["std"] == pytest.approx(0.1)  # ddof 1
    assert (c["count"], c["diverged"], c["error"]) == (3, 0, 0)
    c = cell(agg, "copy", "linear")
    assert c["mean"] == pytest.approx(0.3)
    assert c["std"] == pytest.approx(math.sqrt(0.02))
    assert (c["count"], c["diverged"], c["error"]) == (2, 0, 1)
    c = cell(agg, "kv_recall", "linear")
    assert c["count"] == 0 and c["diverged"] == 3 and c["error"] == 0
    assert pd.isna(c["mean"])  # never 0


def test_aggregate_other_metric(rows):
    c = cell(aggregate(rows, "exact_match"), "kv_recall", "softmax")
    assert c["mean"] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="metric"):
        aggregate(rows, "loss")


def test_aggregate_single_seed_has_std_zero():
    agg = aggregate(frame(row("copy", "softmax", 0, 0.8)))
    assert agg.loc[0, "std"] == 0.0 and agg.loc[0, "mean"] == pytest.approx(0.8)


def test_aggregate_all_ok_and_all_failed():
    ok = aggregate(frame(row("copy", "softmax", 0, 0.8), row("copy", "softmax", 1, 0.6)))
    assert ok[["count", "diverged", "error"]].values.tolist() == [[2, 0, 0]]
    failed = aggregate(frame(row("copy", "softmax", 0, None, status="error")))
    assert failed[["count", "diverged", "error"]].values.tolist() == [[0, 0, 1]]


def test_run_with_one_failed_lr_counts_as_ok():
    """A sweep where one lr diverged and another succeeded is a successful run."""
    agg = aggregate(
        frame(
            row("copy", "softmax", 0, None, status="diverged", lr=3e-3),
            row("copy", "softmax", 0, 0.7, lr=1e-3),
        )
    )
    assert agg[["mean", "count", "diverged", "error"]].values.tolist() == [[0.7, 1, 0, 0]]


def test_unselected_rows_are_ignored():
    agg = aggregate(
        frame(
            row("copy", "softmax", 0, 0.5),
            row("copy", "softmax", 0, 0.9, lr=3e-3, selected=False),
        )
    )
    assert agg.loc[0, "mean"] == pytest.approx(0.5) and agg.loc[0, "count"] == 1


# -- the tables, cell by cell ----------------------------------------------------------------


def test_full_table_cells(rows):
    (tables,) = build_tables(rows)
    full = tables.full
    assert (tables.protocol, tables.protocol_version, tables.n_seeds) == ("smoke", 1, 3)
    assert full.columns == ["linear", "softmax"]
    # categories in the suite's order (Basic before Memory), then task
    assert full.rows == [("Basic", "copy"), ("Memory", "kv_recall")]
    (copy_linear, copy_softmax), (kv_linear, kv_softmax) = full.cells
    assert copy_linear == Stat(pytest.approx(0.3), pytest.approx(math.sqrt(0.02)), 2)
    assert copy_softmax == Stat(1.0, 0.0, 3)
    assert kv_linear is None  # diverged everywhere: missing, never 0
    assert kv_softmax == Stat(pytest.approx(0.6), pytest.approx(0.1), 3)
    # mechanisms are columns: the best per task (row) is bold, a lone survivor included
    assert full.best_cells() == {(0, 1), (1, 1)}


def test_category_tables_have_mechanisms_as_rows(rows):
    (tables,) = build_tables(rows)
    assert list(tables.categories) == ["Basic", "Memory"]
    memory = tables.categories["Memory"]
    assert memory.rows == [("linear",), ("softmax",)] and memory.columns == ["kv_recall"]
    assert memory.cells == [[None], [Stat(pytest.approx(0.6), pytest.approx(0.1), 3)]]
    assert memory.best_cells() == {(1, 0)}


def two_task_rows():
    """Basic = copy + sort, Memory = kv_recall; per-seed values chosen so that every
    category average is known."""
    values = {
        ("copy", "softmax"): (1.0, 0.8),
        ("sort", "softmax"): (0.6, 0.4),
        ("kv_recall", "softmax"): (0.5, 0.7),
        ("copy", "linear"): (0.2, 0.4),
        ("sort", "linear"): (0.0, None),  # seed 1 diverged: no Basic average for that seed
        ("kv_recall", "linear"): (0.9, 0.9),
    }
    rows = []
    for (task, mech), accs in values.items():
        category = "Memory" if task == "kv_recall" else "Basic"
        for seed, acc in enumerate(accs):
            status = "ok" if acc is not None else "diverged"
            rows.append(row(task, mech, seed, acc, category=category, status=status))
    return frame(*rows)


def test_category_scores_per_seed():
    scores = category_scores(selected_runs(two_task_rows())).set_index(
        ["mechanism", "category", "seed"]
    )["score"]
    assert scores[("softmax", "Basic", 0)] == pytest.approx(0.8)
    assert scores[("softmax", "Basic", 1)] == pytest.approx(0.6)
    assert scores[("linear", "Basic", 0)] == pytest.approx(0.1)
    assert ("linear", "Basic", 1) not in scores.index  # sort diverged on seed 1
    assert scores[("linear", "Memory", 1)] == pytest.approx(0.9)


def test_summary_table_cells():
    (tables,) = build_tables(two_task_rows())
    (core,) = tables.summary  # no higher-level category in these rows
    assert core.title == "Core capabilities"
    assert core.columns == ["Basic", "Memory", "average"]
    assert core.rows == [("linear",), ("softmax",)]
    (lin_basic, lin_memory, lin_avg), (sm_basic, sm_memory, sm_avg) = core.cells
    assert sm_basic == Stat(pytest.approx(0.7), pytest.approx(math.sqrt(0.02)), 2)
    assert sm_memory == Stat(pytest.approx(0.6), pytest.approx(math.sqrt(0.02)), 2)
    # per seed (0.8 + 0.5) / 2 and (0.6 + 0.7) / 2
    assert sm_avg == Stat(pytest.approx(0.65), pytest.approx(0.0), 2)
    assert lin_basic == Stat(pytest.approx(0.1), 0.0, 1)  # only seed 0 has both tasks
    assert lin_memory == Stat(pytest.approx(0.9), 0.0, 2)
    assert lin_avg == Stat(pytest.approx(0.5), 0.0, 1)
    assert "(n=1)" in to_markdown(core)


def test_summary_splits_core_and_higher_level():
    rows = frame(
        row("copy", "softmax", 0, 0.5),
        row("stack", "softmax", 0, 0.25, category="Reasoning"),
    )
    (tables,) = build_tables(rows)
    core, higher = tables.summary
    assert (core.title, core.columns) == ("Core capabilities", ["Basic", "average"])
    assert (higher.title, higher.columns) == ("Higher-level behaviour", ["Reasoning", "average"])
    assert higher.cells == [[Stat(0.25, 0.0, 1), Stat(0.25, 0.0, 1)]]


def test_categories_follow_the_suite_order_not_the_alphabet():
    rows = frame(row("copy", "softmax", 0, 0.5), row("add", "softmax", 0, 0.5))
    (tables,) = build_tables(rows)
    assert [c for c, _ in tables.full.rows] == ["Basic", "Arithmetic"]
    assert list(tables.categories) == ["Basic", "Arithmetic"]


def test_markdown(rows):
    (tables,) = build_tables(rows)
    md = to_markdown(tables.full)
    assert "**1.000 ± 0.000**" in md and "**0.600 ± 0.100**" in md
    assert "0.300 ± 0.141 (n=2)" in md
    (kv_line,) = [line for line in md.splitlines() if "kv_recall" in line]
    cells = [c.strip() for c in kv_line.strip("|").split("|")]
    assert cells == ["Memory", "kv_recall", MISSING, "**0.600 ± 0.100**"]
    assert "0.000" not in kv_line
    assert "Failed runs left out: 3 diverged, 1 raised." in md
    assert f"{MISSING}: no successful run (1 cell); never counted as 0." in md
    assert "protocol smoke v1" in md and "3 seeds" in md
    header = next(line for line in md.splitlines() if line.startswith("|"))
    assert header.index("linear") < header.index("softmax")


def test_footnote_for_cells_not_run():
    rows = frame(row("copy", "softmax", 0, 0.5), row("kv_recall", "linear", 0, 0.5))
    md = to_markdown(build_tables(rows)[0].full)
    assert f"{MISSING}: no successful run (2 cells, 2 of them not run)" in md
    assert "diverged" not in md and "raised" not in md


def test_best_is_bold_for_every_tie_and_not_in_a_single_column_table():
    rows = frame(
        *(row("copy", "softmax", s, 0.5) for s in range(2)),
        *(row("copy", "linear", s, 0.5) for s in range(2)),
        *(row("copy", "yat", s, 0.4) for s in range(2)),
    )
    full = build_tables(rows)[0].full
    assert full.columns == ["linear", "softmax", "yat"]
    assert full.best_cells() == {(0, 0), (0, 1)}
    single = build_tables(frame(row("copy", "softmax", 0, 0.5)))[0].full
    assert single.best_cells() == set()


def test_a_cell_with_one_seed_is_never_bold_and_shows_no_spread():
    """yours (one seed, 1.0) beside a reference cell of three (0.8 ± 0.1): the one-seed cell
    is plain "1.000 (n=1)", never bold nor "± 0.000"; the best of the cells with 2 seeds
    or more is bold, and the note says so. A table of one seed throughout has no bold."""
    rows = frame(
        row("copy", "mine", 0, 1.0),
        *(row("copy", "softmax (reference)", s, v) for s, v in enumerate((0.7, 0.8, 0.9))),
        *(row("copy", "linear (reference)", s, 0.5) for s in range(3)),
    )
    (tables,) = build_tables(rows)
    md, tex = to_markdown(tables.full), to_latex(tables.full)
    (line,) = [x for x in md.splitlines() if "| copy" in x]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[2:] == ["0.500 ± 0.000", "1.000 (n=1)", "**0.800 ± 0.100**"]
    assert "1.000 $\\pm$" not in tex and "\\textbf{1.000" not in tex and "1.000 (n=1)" in tex
    assert "best in bold (of the cells with 2 seeds or more)" in md
    alone = build_tables(frame(row("copy", "a", 0, 0.9), row("copy", "b", 0, 0.5)))[0]
    md = to_markdown(alone.full)
    assert "**" not in md.split("\n\n")[1] and "± " not in md.split("\n\n")[1]
    assert "best in bold" not in md and "one seed (no spread to show)" in md
    summary = to_markdown(alone.summary[0])
    assert "0.900 " in summary and "0.900 ±" not in summary


def test_two_protocols_two_sets_of_tables(rows):
    quick = frame(*(row("kv_recall", "softmax", s, 0.9, protocol="quick") for s in range(2)))
    both = pd.concat([rows, quick], ignore_index=True)
    quick_tables, smoke_tables = build_tables(both)
    assert (quick_tables.protocol, smoke_tables.protocol) == ("quick", "smoke")
    assert quick_tables.n_seeds == 2
    assert quick_tables.full.columns == ["softmax"]
    assert quick_tables.full.cells == [[Stat(pytest.approx(0.9), 0.0, 2)]]
    assert smoke_tables.full.cells[1][1].mean == pytest.approx(0.6)
    assert "0.900" not in to_markdown(smoke_tables.full)


def test_latex(rows):
    (tables,) = build_tables(rows)
    tex = to_latex(tables.full)
    lines = tex.splitlines()
    assert lines[1] == r"\begin{tabular}{llcc}"
    assert lines[2] == r"\toprule" and lines[4] == r"\midrule"
    assert r"\bottomrule" in lines and r"\end{tabular}" in lines
    assert r"kv\_recall" in tex and "kv_recall" not in tex.replace(r"kv\_recall", "")
    (kv_line,) = [line for line in lines if "kv" in line and not line.startswith("%")]
    assert kv_line == r"Memory & kv\_recall & -- & \textbf{0.600 $\pm$ 0.100} \\"
    assert "±" not in tex
    assert any("3 diverged" in line and r"\multicolumn{4}" in line for line in lines)


def test_latex_prints_a_group_label_once_with_a_rule_between_groups():
    rows = frame(
        row("copy", "softmax", 0, 0.5),
        row("sort", "softmax", 0, 0.5, category="Basic"),
        row("kv_recall", "softmax", 0, 0.5),
    )
    lines = to_latex(build_tables(rows)[0].full).splitlines()
    body = lines[lines.index(r"\midrule") + 1 : lines.index(r"\bottomrule")]
    assert body[0].startswith("Basic & copy") and body[1].startswith(" & sort")
    assert body[2] == r"\midrule" and body[3].startswith("Memory & kv")


def test_latex_escape():
    assert latex_escape("a_b & 50% #1 $x$ {y} ~ ^ \\") == (
        r"a\_b \& 50\% \#1 \$x\$ \{y\} \textasciitilde{} \textasciicircum{} \textbackslash{}"
    )


def test_latex_escapes_mechanism_names():
    rows = frame(row("copy", "my_mech", 0, 0.5))
    tex = to_latex(build_tables(rows)[0].full)
    assert r"my\_mech" in tex and "my_mech" not in tex


def test_exact_match_tables(rows):
    (tables,) = build_tables(rows, "exact_match")
    assert tables.full.cells[1][1] == Stat(pytest.approx(0.3), pytest.approx(0.05), 3)


def test_a_table_never_mixes_two_versions_of_a_protocol(rows):
    newer = frame(*(row("copy", "softmax", s, 0.2, version=2) for s in range(3)))
    both = pd.concat([rows, newer], ignore_index=True)
    with pytest.raises(ValueError, match="several versions of protocol smoke"):
        build_tables(both)
    kept, left_out = latest_versions(both)
    assert left_out == {"smoke": [1]}
    (tables,) = build_tables(kept)
    assert tables.protocol_version == 2
    assert tables.full.cells == [[Stat(pytest.approx(0.2), 0.0, 3)]]


def test_a_task_run_with_two_parameter_sets_gives_two_rows():
    rows = []
    for hops, accs in ((1, (0.9, 0.7)), (2, (0.2, 0.4))):
        for seed, acc in enumerate(accs):
            r = row("copy", "softmax", seed, acc)
            r["run_id"] += f"-h{hops}"
            r["task_params"] = f'{{"hops": {hops}, "pairs": 16}}'
            rows.append(r)
    rows.append({**row("kv_recall", "softmax", 0, 0.5), "task_params": '{"pairs": 8}'})
    table = aggregate(frame(*rows)).set_index("task")
    assert sorted(table.index) == ["copy (hops=1)", "copy (hops=2)", "kv_recall"]
    assert table.loc["copy (hops=1)", "mean"] == pytest.approx(0.8)
    assert table.loc["copy (hops=2)", "mean"] == pytest.approx(0.3)
    assert table.loc["copy (hops=1)", "count"] == 2
    assert build_tables(frame(*rows))[0].n_seeds == 2


def with_config(r, pos="learned", pos_params=None, **mechanism_params):
    config = {"protocol": {"pos": pos}, **({"pos_params": pos_params} if pos_params else {})}
    return {
        **r,
        "run_id": f"{r['run_id']}-{pos}-{pos_params}-{sorted(mechanism_params.items())}",
        "mechanism_params": json.dumps(mechanism_params),
        "config": json.dumps(config),
    }


def test_mechanism_variants_and_positions_are_labelled():
    rows = frame(
        with_config(row("copy", "slay", 0, 0.5), eps=1e-3),
        with_config(row("copy", "slay", 0, 0.7), eps=1e-4),
        with_config(row("copy", "softmax", 0, 0.9)),
        # --pos rope: the protocol's (smoke) own pos is learned, so the rope rows say so
        with_config(row("copy", "softmax", 0, 0.8), pos="rope"),
        with_config(row("copy", "linear", 0, 0.6), pos="rope"),
    )
    labelled = label_variants(rows)
    assert list(labelled["mechanism"]) == [
        "slay (eps=0.001)",
        "slay (eps=0.0001)",
        "softmax (pos=learned)",
        "softmax (pos=rope)",
        "linear (pos=rope)",
    ]
    (tables,) = build_tables(rows)
    assert "softmax (pos=rope)" in tables.full.columns
    assert tables.full.cells[0][tables.full.columns.index("slay (eps=0.0001)")].mean == 0.7


def test_length_points():
    rows = []
    for seed, (short, long) in enumerate(((1.0, 0.5), (0.8, 0.3))):
        for mult, value in ((2.0, long), (4.0, long / 2)):
            r = row("copy", "softmax", seed, short)
            r.update(run_id=f"{r['run_id']}-{mult}", eval_length_mult=mult)
            r["long_token_acc"] = value
            rows.append(r)
    rows.append({**row("kv_recall", "softmax", 0, 0.5), "eval_length_mult": None})
    points = length_points(frame(*rows)).set_index("mult")
    assert list(points.index) == [1.0, 2.0, 4.0] and set(points["task"]) == {"copy"}
    assert points.loc[1.0, "mean"] == pytest.approx(0.9)
    assert points.loc[2.0, "mean"] == pytest.approx(0.4)
    assert points.loc[4.0, "mean"] == pytest.approx(0.2)
    assert points.loc[2.0, "std"] == pytest.approx(math.sqrt(0.02))
    assert points["n"].tolist() == [2, 2, 2]  # the seeds behind each point, for the title


def test_a_figure_title_states_the_seeds_it_shows():
    def counts(*pairs):
        return pd.DataFrame(pairs, columns=["mechanism", "seeds"])

    assert seeds_text(counts(("a", 3), ("b", 3))) == "mean over 3 seeds"
    assert seeds_text(counts(("a", 1))) == "mean over 1 seed"
    assert seeds_text(counts(("a", 1), ("b", 3))) == "mean over 1 to 3 seeds"
    yours_and_reference = counts(("mine", 1), ("softmax (reference)", 2), ("linear (reference)", 3))
    assert seeds_text(yours_and_reference, "mean ± std") == (
        "mean ± std over 1 seed (yours), 2 to 3 seeds (reference)"
    )
    assert seeds_text(counts(("a (reference)", 3))) == "mean over 3 seeds"  # the reference alone


def test_aggregate_without_failures_warns_nothing():
    """No pandas deprecation on the common path (every run ok): fillna(0) on the empty,
    string-typed failure counts becomes an error in a future pandas."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        agg = aggregate(frame(row("copy", "softmax", 0, 0.8), row("copy", "softmax", 1, 0.6)))
    assert agg[["count", "diverged", "error"]].values.tolist() == [[2, 0, 0]]


def test_rotation_parameters_tell_variants_apart():
    half, full = {"rotate_fraction": 0.5, "base": 1e4}, {"rotate_fraction": 1.0, "base": 1e4}
    rows = frame(
        with_config(row("copy", "softmax", 0, 0.5), pos="rope", pos_params=half),
        with_config(row("copy", "softmax", 0, 0.7), pos="rope", pos_params=full),
        with_config(row("copy", "linear", 0, 0.6), pos="rope", pos_params=full),
        with_config(row("copy", "linear", 0, 0.6)),  # learned: no rotation parameters
    )
    assert list(label_variants(rows)["mechanism"]) == [
        "softmax (pos=rope, rotate_fraction=0.5)",
        "softmax (pos=rope, rotate_fraction=1.0)",
        "linear (pos=rope)",
        "linear (pos=learned)",
    ]


def test_runs_differing_only_in_eval_length_count_as_one_seed():
    rows = []
    for mult, acc in ((2.0, 1.0), (4.0, 0.8)):  # the same training, evaluated twice
        r = row("copy", "softmax", 0, acc)
        rows.append({**r, "run_id": f"{r['run_id']}-{mult}", "eval_length_mult": mult})
    (tables,) = build_tables(frame(*rows))
    assert tables.n_seeds == 1
    assert tables.full.cells == [[Stat(pytest.approx(0.9), 0.0, 1)]]


# -- target: each task's own metric --------------------------------------------------------


def test_target_is_the_default_and_reads_each_rows_target_metric():
    assert METRICS[0] == DEFAULT_METRIC == "target"
    rows = frame(
        row("copy", "softmax", 0, 0.8, free_token_acc=0.3),
        row("add", "softmax", 0, 0.9, free_token_acc=0.4, target_metric="free_token_acc"),
    )
    agg = aggregate(rows).set_index("task")  # the default: target
    assert agg.loc["copy", "mean"] == pytest.approx(0.8)  # token_acc
    assert agg.loc["add", "mean"] == pytest.approx(0.4)  # free_token_acc
    runs = selected_runs(rows, "target").set_index("task")
    assert (
        runs.loc["add", "metric"] == "free_token_acc" and runs.loc["copy", "metric"] == "token_acc"
    )
    assert aggregate(rows, "token_acc").set_index("task").loc["add", "mean"] == pytest.approx(0.9)
    assert aggregate(rows, "free_token_acc").set_index("task").loc["copy", "mean"] == 0.3
    (tables,) = build_tables(rows)
    assert "target: free_token_acc on add; token_acc on the others." in tables.full.notes


def test_a_null_target_metric_comes_from_the_registered_task():
    """Rows of older schemas: multihop (registered, a chain of steps) is scored free-running,
    a task not registered here by token accuracy."""
    assert TASKS.get("multihop")().target_metric == "free_token_acc"
    rows = frame(
        row("copy", "softmax", 0, 0.8, target_metric=None, free_token_acc=0.1, category="Basic"),
        row(
            "multihop",
            "softmax",
            0,
            0.8,
            target_metric=None,
            free_token_acc=0.2,
            category="Long-Range",
        ),  # fmt: skip
        row("mine", "softmax", 0, 0.8, target_metric=None, free_token_acc=0.3, category="Basic"),
    )
    values = dict(zip(rows["task"], metric_values(rows, "target"), strict=True))
    assert values == {"copy": 0.8, "multihop": 0.2, "mine": 0.8}


# -- chance-normalised scores --------------------------------------------------------------


def test_normalise_puts_chance_at_0_and_perfect_at_1():
    assert normalise(0.25, 0.25) == 0.0 and normalise(1.0, 0.25) == 1.0
    assert normalise(0.625, 0.25) == pytest.approx(0.5)  # (0.625 - 0.25) / 0.75
    assert normalise(0.1, 0.25) == pytest.approx(-0.2)  # worse than chance
    assert np.isnan(normalise(0.5, NAN)) and np.isnan(normalise(1.0, 1.0))


def chance_rows():
    """copy (chance 0.25): chancy at chance, perfect at 1, half at 0.625; kv_recall
    (chance 0.5, exact match chance 0.1): 0.5, 1.0 and 0.75."""
    values = {"chancy": (0.25, 0.5), "perfect": (1.0, 1.0), "half": (0.625, 0.75)}
    rows = []
    for mech, (copy, kv) in values.items():
        for seed in range(2):
            rows.append(row("copy", mech, seed, copy, chance=0.25))
            rows.append({**row("kv_recall", mech, seed, kv, chance=0.5), "chance_exact_match": 0.1})
    return frame(*rows)


def test_category_averages_are_chance_normalised_and_the_full_table_is_raw():
    (tables,) = build_tables(chance_rows())
    (core,) = tables.summary
    assert core.columns == ["Basic", "Memory", "average"]
    stats = {m: cells for (m,), cells in zip(core.rows, core.cells, strict=True)}
    assert [c.mean for c in stats["chancy"]] == [0.0, 0.0, 0.0]
    assert [c.mean for c in stats["perfect"]] == [1.0, 1.0, 1.0]
    assert [c.mean for c in stats["half"]] == pytest.approx([0.5, 0.5, 0.5])
    assert any("Chance-normalised: (accuracy - chance) / (1 - chance)" in n for n in core.notes)
    raw = dict(zip(tables.full.columns, tables.full.cells[0], strict=True))  # copy
    assert raw["chancy"].mean == 0.25 and raw["half"].mean == 0.625
    assert any(n.startswith("Raw accuracy, not chance-normalised") for n in tables.full.notes)
    heat = dict(zip(tables.heat.columns, tables.heat.cells[1], strict=True))  # kv_recall
    assert heat["chancy"].mean == 0.0 and heat["half"].mean == pytest.approx(0.5)


def test_exact_match_is_normalised_by_its_own_chance():
    runs = selected_runs(chance_rows(), "exact_match").set_index(["task", "mechanism"])
    # kv_recall / perfect: exact match 0.5 (the row helper's acc / 2), chance 0.1
    assert runs.loc[("kv_recall", "perfect"), "chance"].tolist() == [0.1, 0.1]
    assert runs.loc[("kv_recall", "perfect"), "score"].tolist() == pytest.approx([0.4 / 0.9] * 2)


def test_long_metrics_stay_raw_and_say_so():
    rows = frame(*(row("copy", "softmax", s, 0.9, chance=0.5) for s in range(2)))
    rows = rows.assign(eval_length_mult=2.0, long_token_acc=[0.3, 0.5])
    runs = selected_runs(rows, "long_token_acc")
    assert runs["score"].tolist() == [0.3, 0.5] and runs["chance"].isna().all()
    (tables,) = build_tables(rows, "long_token_acc")
    assert "Raw long_token_acc, not chance-normalised" in " ".join(tables.summary[0].notes)


def test_a_null_chance_comes_from_the_audit_and_an_unknown_one_is_nan():
    from synthbench.integrity.audit import chance

    expected = chance(TASKS.get("copy")(n=8))
    rows = frame(
        row("copy", "softmax", 0, 0.9, chance=None, task_params='{"n": 8}'),
        row("mine", "softmax", 0, 0.9, chance=None, category="Basic"),  # not registered
    )
    runs = selected_runs(rows).set_index("task")
    assert runs.loc["copy", "chance"] == pytest.approx(expected.token_acc)
    assert runs.loc["copy", "score"] == pytest.approx(
        (0.9 - expected.token_acc) / (1 - expected.token_acc)
    )
    assert np.isnan(runs.loc["mine", "chance"]) and np.isnan(runs.loc["mine", "score"])
    assert runs.loc["mine", "value"] == 0.9  # the raw value is kept
    (tables,) = build_tables(rows)
    (core,) = tables.summary
    assert core.cells == [[None, None]]  # Basic has no average without mine's chance
    assert any("no known chance" in n for n in core.notes)
    assert tables.full.cells[1][0].mean == 0.9  # the raw table shows it


def test_selected_runs_carry_the_standard_error_and_lr_edge():
    rows = frame(
        row("copy", "softmax", 0, 0.9, token_acc_se=0.01, lr_edge=True),
        row(
            "add",
            "softmax",
            0,
            0.9,
            free_token_acc=0.5,
            free_token_acc_se=0.03,
            target_metric="free_token_acc",
            lr_edge=None,
        ),  # fmt: skip
    )
    runs = selected_runs(rows).set_index("task")
    assert runs.loc["copy", "se"] == 0.01 and runs.loc["add", "se"] == 0.03
    assert runs.loc["copy", "lr_edge"] and not runs.loc["add", "lr_edge"]  # null: not known


def test_the_lr_table_shows_each_seeds_selected_lr_in_seed_order():
    rows = frame(
        row("copy", "softmax", 1, 0.9, lr=0.01),
        row("copy", "softmax", 0, 0.8, lr=0.003, lr_edge=True),
        row("copy", "softmax", 0, 0.7, lr=0.01, selected=False),
        row("copy", "linear", 0, 0.5, lr=0.0333),
        row("kv_recall", "linear", 0, 0.5, lr=0.01),
    )
    grid = lr_grid(selected_runs(rows), "smoke", 1)
    assert grid.columns == ["linear", "softmax"]
    assert grid.rows == [("Basic", "copy"), ("Memory", "kv_recall")]
    assert grid.cells == [["0.033", "0.003*, 0.01"], ["0.01", None]]
    assert "| copy" in to_markdown(grid) and "0.003*, 0.01" in to_latex(grid)


def test_the_lr_table_marks_an_unknown_lr():
    rows = frame(row("copy", "softmax", 0, 0.9)).drop(columns="lr")
    assert lr_grid(selected_runs(rows), "smoke", 1).cells == [["?"]]
