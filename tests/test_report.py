"""Report tables from stored rows: aggregation over seeds, failures, Markdown and LaTeX."""

from __future__ import annotations

import math
import warnings

import pandas as pd
import pytest

from synthbench.report import (
    MISSING,
    aggregate,
    latest_versions,
    latex_escape,
    seed_tables,
    to_latex,
    to_markdown,
    write_reports,
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
):
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


def test_seed_table_cells(rows):
    (table,) = seed_tables(rows)
    assert table.protocol == "smoke" and table.metric == "token_acc"
    assert table.n_seeds == 3
    assert table.failed == {"diverged": 3, "error": 1}
    assert list(table.cells.columns) == ["linear", "softmax"]
    # categories in CATEGORIES order (Basic before Memory), then task
    assert list(table.cells.index) == [("Basic", "copy"), ("Memory", "kv_recall")]
    mean, std, n = table.cells.at[("Memory", "kv_recall"), "softmax"]
    assert (mean, std, n) == (pytest.approx(0.6), pytest.approx(0.1), 3)
    assert table.cells.at[("Memory", "kv_recall"), "linear"] is None


def test_categories_follow_the_suite_order_not_the_alphabet():
    rows = frame(row("copy", "softmax", 0, 0.5), row("add", "softmax", 0, 0.5))
    (table,) = seed_tables(rows)
    assert [c for c, _ in table.cells.index] == ["Basic", "Arithmetic"]


def test_markdown(rows):
    (table,) = seed_tables(rows)
    md = to_markdown(table)
    assert "0.600 ± 0.100" in md
    assert "1.000 ± 0.000" in md
    assert "0.300 ± 0.141 (n=2)" in md
    (kv_line,) = [line for line in md.splitlines() if "kv_recall" in line]
    cells = [c.strip() for c in kv_line.strip("|").split("|")]
    assert cells == ["Memory", "kv_recall", MISSING, "0.600 ± 0.100"]
    assert "0.000" not in kv_line
    assert "3 diverged" in md and "1 error" in md
    assert "protocol smoke v1" in md and "3 seeds" in md
    header = md.splitlines()[0]
    assert header.index("linear") < header.index("softmax")


def test_footnote_for_cells_not_run():
    rows = frame(row("copy", "softmax", 0, 0.5), row("kv_recall", "linear", 0, 0.5))
    md = to_markdown(seed_tables(rows)[0])
    assert f"{MISSING}: not run." in md
    assert "diverged" not in md and "error" not in md


def test_two_protocols_two_tables(rows, tmp_path):
    quick = frame(*(row("kv_recall", "softmax", s, 0.9, protocol="quick") for s in range(2)))
    both = pd.concat([rows, quick], ignore_index=True)
    tables = seed_tables(both)
    assert [t.protocol for t in tables] == ["quick", "smoke"]
    quick_table, smoke_table = tables
    assert quick_table.n_seeds == 2
    assert list(quick_table.cells.columns) == ["softmax"]
    assert quick_table.cells.at[("Memory", "kv_recall"), "softmax"][0] == pytest.approx(0.9)
    assert smoke_table.cells.at[("Memory", "kv_recall"), "softmax"][0] == pytest.approx(0.6)
    assert quick_table.failed == {"diverged": 0, "error": 0}
    assert "0.900" not in to_markdown(smoke_table)

    written = write_reports(both, tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == [
        "quick/tasks_token_acc.md",
        "quick/tasks_token_acc.tex",
        "smoke/tasks_token_acc.md",
        "smoke/tasks_token_acc.tex",
    ]
    assert "0.900 ± 0.000" in (tmp_path / "quick" / "tasks_token_acc.md").read_text()
    assert "0.600 ± 0.100" in (tmp_path / "smoke" / "tasks_token_acc.md").read_text()


def test_latex(rows):
    (table,) = seed_tables(rows)
    tex = to_latex(table)
    lines = tex.splitlines()
    assert lines[0] == r"\begin{tabular}{llcc}"
    assert lines[1] == r"\toprule" and lines[3] == r"\midrule"
    assert r"\bottomrule" in lines and r"\end{tabular}" in lines
    assert r"kv\_recall" in tex and "kv_recall" not in tex.replace(r"kv\_recall", "")
    assert r"0.600 $\pm$ 0.100" in tex
    (kv_line,) = [line for line in lines if "kv" in line and not line.startswith("%")]
    assert kv_line == r"Memory & kv\_recall & -- & 0.600 $\pm$ 0.100 \\"
    assert "±" not in tex
    assert any(line.startswith("%") and "3 diverged" in line for line in lines)


def test_latex_escape():
    assert latex_escape("a_b & 50% #1 $x$ {y} ~ ^ \\") == (
        r"a\_b \& 50\% \#1 \$x\$ \{y\} \textasciitilde{} \textasciicircum{} \textbackslash{}"
    )


def test_latex_escapes_mechanism_names():
    rows = frame(row("copy", "my_mech", 0, 0.5))
    tex = to_latex(seed_tables(rows)[0])
    assert r"my\_mech" in tex and "my_mech" not in tex


def test_write_reports_exact_match(rows, tmp_path):
    written = write_reports(rows, tmp_path, "exact_match")
    assert {p.name for p in written} == {"tasks_exact_match.md", "tasks_exact_match.tex"}
    assert "0.300 ± 0.050" in (tmp_path / "smoke" / "tasks_exact_match.md").read_text()


def test_aggregate_without_failures_warns_nothing():
    """No pandas deprecation on the common path (every run ok): fillna(0) on the empty,
    string-typed failure counts becomes an error in a future pandas."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        agg = aggregate(frame(row("copy", "softmax", 0, 0.8), row("copy", "softmax", 1, 0.6)))
    assert agg[["count", "diverged", "error"]].values.tolist() == [[2, 0, 0]]


def test_a_table_never_mixes_two_versions_of_a_protocol(rows):
    newer = frame(*(row("copy", "softmax", s, 0.2, version=2) for s in range(3)))
    both = pd.concat([rows, newer], ignore_index=True)
    with pytest.raises(ValueError, match="several versions of protocol smoke"):
        seed_tables(both)
    kept, left_out = latest_versions(both)
    assert left_out == {"smoke": [1]}
    (table,) = seed_tables(kept)
    assert table.protocol_version == 2
    assert table.cells.at[("Basic", "copy"), "softmax"] == pytest.approx((0.2, 0.0, 3))


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
    (t,) = seed_tables(frame(*rows))
    assert t.n_seeds == 2
