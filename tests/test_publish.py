"""What `synthbench report` writes: every table, figure and page from one set of rows; the
LaTeX compiles; the published SLAY numbers ship intact and sit beside ours."""

from __future__ import annotations

import shutil
import subprocess

import pandas as pd
import pytest
from test_report import frame, row

from synthbench.core.task import TASKS
from synthbench.report.compare import comparison_grid, published
from synthbench.report.formats import latex_document
from synthbench.report.publish import write_reports
from synthbench.report.reference import REPLACED_COLUMNS
from synthbench.report.tables import MISSING, Stat, build_tables
from synthbench.run.protocols import curve_points

PNG, PDF = b"\x89PNG\r\n\x1a\n", b"%PDF"


def learnt(task, mech, seed, acc, **more):
    """A smoke row (20 steps) with a learning curve rising linearly to ``acc`` and a
    standard error, so that curves and separation have something to show."""
    points = curve_points(20)
    curve = [acc * (i + 1) / len(points) for i in range(len(points))]
    return row(
        task,
        mech,
        seed,
        acc,
        steps=20,
        curve_steps=points,
        curve_val_token_acc=curve,
        token_acc_se=0.01,
        lr_edge=False,
        **more,
    )


@pytest.fixture
def rows() -> pd.DataFrame:
    return frame(
        *(learnt("copy", "softmax", s, 0.9 + s / 100) for s in range(3)),
        *(learnt("kv_recall", "softmax", s, 0.5 + s / 10) for s in range(3)),
        *(learnt("copy", "linear", s, 0.7) for s in range(3)),
        *(row("kv_recall", "linear", s, None, status="diverged") for s in range(3)),
        *(learnt("stack", "linear", s, 0.3, category="Reasoning") for s in range(3)),
    )


def relative(paths, root) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in paths)


def test_everything_is_written(rows, tmp_path):
    written = write_reports(rows, tmp_path)
    folder = "smoke/target"  # the default metric
    tables = [
        "full",
        "summary",
        "category-basic",
        "category-memory",
        "category-reasoning",
        "curves",
    ]
    figures = ("heatmap", "categories", "curves")
    assert relative(written, tmp_path) == sorted(
        [
            "leaderboard.md",
            "leaderboard.tex",
            "leaderboard.html",
            *(f"{folder}/{t}.{s}" for t in tables for s in ("md", "tex")),
            f"{folder}/tables.tex",
            *(f"{folder}/{f}.{s}" for f in figures for s in ("png", "pdf")),
            *(f"smoke/separation.{s}" for s in ("md", "tex", "csv", "png", "pdf")),
            "smoke/lrs.md",
            "smoke/lrs.tex",
        ]
    )
    for path in written:
        if path.suffix == ".png":
            assert path.read_bytes().startswith(PNG) and path.stat().st_size > 5000
        if path.suffix == ".pdf":
            assert path.read_bytes().startswith(PDF)
    summary = (tmp_path / folder / "summary.md").read_text()
    assert "Core capabilities" in summary and "Higher-level behaviour" in summary
    assert "Chance-normalised" in summary
    board = (tmp_path / "leaderboard.md").read_text()
    assert "## smoke" in board and "Unranked" in board  # stack never ran with softmax
    assert "# Leaderboard (target)" in board and "Student-t" in board
    assert "smoke" in (tmp_path / "leaderboard.html").read_text()
    curves = (tmp_path / folder / "curves.md").read_text()
    assert "Steps to 0.9 validation accuracy" in curves and "Learning-curve area" in curves
    separation = (tmp_path / "smoke" / "separation.md").read_text()
    # copy: softmax 0.91 on average, linear 0.70: beyond 2 SE on every seed; softmax is the
    # only ranked mechanism (linear diverged on kv_recall, never ran stack): no neighbours
    assert "Informative tasks (at least one pair separates): 1 of 3." in separation
    pairs = (tmp_path / "smoke" / "separation.csv").read_text().splitlines()
    assert "Basic,copy,linear,softmax,target,3,-0.21,True,softmax," in pairs


def test_formats_select_the_outputs(rows, tmp_path):
    written = write_reports(rows, tmp_path, formats=("md",))
    # separation.csv: the full data behind separation.md's short table, written beside it
    assert {p.suffix for p in written} == {".md", ".csv"}
    with pytest.raises(ValueError, match="unknown format svg"):
        write_reports(rows, tmp_path, formats=("md", "svg"))


def test_other_metric_names_its_leaderboard(rows, tmp_path):
    written = write_reports(rows, tmp_path, "exact_match", formats=("md",))
    assert "leaderboard-exact_match.md" in relative(written, tmp_path)
    assert "smoke/exact_match/full.md" in relative(written, tmp_path)
    # separation is on the target metric, whatever the report's: one file per protocol
    assert "smoke/separation.md" in relative(written, tmp_path)
    written = write_reports(rows, tmp_path, "token_acc", formats=("md",))
    assert "leaderboard-token_acc.md" in relative(written, tmp_path)


def test_length_figure_when_rows_were_evaluated_longer(rows, tmp_path):
    longer = rows.assign(eval_length_mult=2.0, long_token_acc=rows["token_acc"] / 2)
    written = write_reports(longer, tmp_path, formats=("png",))
    (length,) = [p for p in written if p.stem == "length"]
    assert length.read_bytes().startswith(PNG)


def test_two_protocols_are_reported_apart(rows, tmp_path):
    quick = frame(*(row("copy", "softmax", s, 0.123, protocol="quick") for s in range(2)))
    written = write_reports(pd.concat([rows, quick]), tmp_path, formats=("md",))
    assert "quick/target/full.md" in relative(written, tmp_path)
    assert "0.123" not in (tmp_path / "smoke" / "target" / "full.md").read_text()
    assert "quick/separation.md" in relative(written, tmp_path)
    board = (tmp_path / "leaderboard.md").read_text()
    assert board.index("## quick") < board.index("## smoke")


@pytest.mark.slow
def test_latex_compiles(rows, tmp_path):
    """Every table, an awkward mechanism name and the comparison included, through
    pdflatex (Debian's texlive-latex-base and texlive-latex-recommended, for booktabs)."""
    if shutil.which("pdflatex") is None:
        pytest.skip(
            "no LaTeX engine: install Debian's texlive-latex-base and "
            "texlive-latex-recommended to compile the tables"
        )
    rows = pd.concat([rows, frame(*(learnt("copy", "my_mech & 50%#", s, 0.5) for s in range(3)))])
    paper = frame(*(row("copy", "slay", s, 0.8, protocol="slay-paper") for s in range(3)))
    write_reports(pd.concat([rows, paper]), tmp_path, formats=("tex",), compare="slay-paper")
    board = (tmp_path / "leaderboard.tex").read_text()
    assert r"\midrule" in board and "Tier: a new tier" in board  # 3 seeds: tiers, notes
    for protocol in ("smoke", "slay-paper"):
        folder = tmp_path / protocol / "target"
        separation = (tmp_path / protocol / "separation.tex").read_text()
        (folder / "separation-doc.tex").write_text(latex_document([separation]))
        (folder / "leaderboard-doc.tex").write_text(latex_document([board]))
        for document in ("tables.tex", "separation-doc.tex", "leaderboard-doc.tex"):
            result = subprocess.run(
                ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", document],
                cwd=folder,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert result.returncode == 0, result.stdout[-2000:]
            pdf = folder / document.replace(".tex", ".pdf")
            assert pdf.read_bytes().startswith(PDF)


# -- the published SLAY numbers -------------------------------------------------------------

# 001 Table 3 (category averages, two decimals) as printed; our data file holds Table 8
TABLE_3 = {
    "softmax": (0.60, 0.54, 0.68, 0.73, 0.83, 0.56, 0.80),
    "yat-spherical": (0.52, 0.53, 0.68, 0.73, 0.81, 0.56, 0.80),
    "performer": (0.45, 0.57, 0.68, 0.73, 0.85, 0.56, 0.80),
    "linear": (0.44, 0.60, 0.67, 0.72, 0.85, 0.56, 0.80),
    "slay": (0.57, 0.57, 0.68, 0.73, 0.86, 0.57, 0.80),
}


def test_the_shipped_table_8_reproduces_the_papers_category_averages():
    paper = published("slay-paper")
    assert len(paper) == 21 * 5 and "bigram" not in set(paper["task"])
    assert set(paper["task"]) <= set(TASKS.names())
    paper["category"] = [TASKS.entry(t).metadata["category"] for t in paper["task"]]
    averages = paper.groupby(["mechanism", "category"])["mean"].mean()
    order = ("Basic", "Arithmetic", "Long-Range", "Memory", "Patterns", "Reasoning", "Robustness")
    for mechanism, printed in TABLE_3.items():
        for category, value in zip(order, printed, strict=True):
            # the paper rounds to two decimals: within half a unit of the last digit
            assert averages[mechanism, category] == pytest.approx(value, abs=0.0051)


def test_comparison_grid_puts_ours_beside_the_paper():
    ours = frame(
        *(row("copy", "softmax", s, 0.9, protocol="slay-paper") for s in range(3)),
        *(row("kv_recall", "slay", s, 0.52, protocol="slay-paper") for s in range(3)),
    )
    grid = comparison_grid(build_tables(ours)[0], "slay-paper")
    assert grid.columns[:3] == ["softmax ours", "softmax paper", "softmax Δ"]
    assert len(grid.columns) == 15
    cells = dict(zip((t for _, t in grid.rows), grid.cells, strict=True))
    assert ("Patterns", "bigram") not in grid.rows  # neither we nor the paper have it
    copy = cells["copy"]
    assert copy[0] == Stat(pytest.approx(0.9), 0.0, 3) and copy[1] == Stat(1.0, 0.0, 3)
    assert copy[2] == "-0.10"
    kv = cells["kv_recall"]
    slay = grid.columns.index("slay ours")
    assert kv[slay + 1] == Stat(0.02, 0.01, 3) and kv[slay + 2] == "+0.50"
    assert kv[0] is None and kv[2] == MISSING  # softmax never ran kv_recall here
    assert cells["sort"][1] == Stat(0.28, 0.02, 3)  # the paper's, with none of ours
    assert any("Table 8" in note for note in grid.notes)


def test_compare_needs_rows_of_its_protocol(rows, tmp_path):
    with pytest.raises(ValueError, match="protocol slay-paper"):
        write_reports(rows, tmp_path, compare="slay-paper")
    with pytest.raises(ValueError, match="unknown comparison"):
        write_reports(rows, tmp_path, compare="other-paper")
    assert not any(tmp_path.iterdir())  # nothing half-written


# -- what the figures are given ---------------------------------------------------------------


def test_figures_state_the_seeds_shown_and_follow_the_board(rows, tmp_path, monkeypatch):
    """Your one seed beside the reference's three: every title says so, never "3 seeds";
    the heatmap gets the board's order, ranks and your mechanisms to mark; the board names
    the reference run yours replaced."""
    from synthbench.report import figures

    mine = frame(*(learnt(t, "mine", 0, 0.8) for t in ("copy", "kv_recall")))
    ref = rows[rows["task"] != "stack"].assign(mechanism=rows["mechanism"] + " (reference)")
    titles, heat = {}, {}

    def record(name, original):
        def wrapper(*args, **kwargs):
            titles[name] = args[1]
            if name == "heatmap":
                heat.update(order=args[5], ranks=args[6], yours=args[7])
            return original(*args, **kwargs)

        return wrapper

    for name in ("heatmap", "category_bars", "learning_curves"):
        monkeypatch.setattr(figures, name, record(name, getattr(figures, name)))
    replaced = pd.DataFrame([("smoke", 1, "copy", "linear", 3)], columns=REPLACED_COLUMNS)
    write_reports(
        pd.concat([mine, ref], ignore_index=True), tmp_path, formats=("png", "md"),
        replaced=replaced,
    )  # fmt: skip
    both = "1 seed (yours), 3 seeds (reference)"
    assert f"mean over {both}, mechanisms by board rank, yours in red" in titles["heatmap"]
    assert f"mean ± std over {both}" in titles["category_bars"]
    assert f"mean over {both} at each run's selected lr" in titles["learning_curves"]
    # mine 0.8, softmax (0.91 + 0.6) / 2; linear diverged on kv_recall: last
    assert heat["order"] == ["mine", "softmax (reference)", "linear (reference)"]
    assert heat["ranks"] == {"mine": 1, "softmax (reference)": 2, "linear (reference)": 3}
    assert heat["yours"] == {"mine"}
    board = (tmp_path / "leaderboard.md").read_text()
    assert "hold fewer seeds: linear on copy (seed 3)." in board


def test_a_grid_over_a_knob_named_n_titles_its_seeds(tmp_path, monkeypatch):
    """copy's n swept (4, 6), two seeds: the frontier figure's title counts them; a knob
    named like a column of the counts ("n") never clashes with it."""
    from synthbench.report import figures

    titles = []
    original = figures.frontier_curves
    monkeypatch.setattr(
        figures, "frontier_curves", lambda *a, **k: titles.append(a[2]) or original(*a, **k)
    )
    rows = []
    for n, acc in ((4, 0.95), (6, 0.6)):
        for seed in range(2):
            for mechanism, lower in (("softmax", 0.0), ("linear", 0.1)):
                one = learnt("copy", mechanism, seed, acc - lower, task_params=f'{{"n": {n}}}')
                rows.append({**one, "run_id": f"{one['run_id']}-{n}"})
    written = write_reports(frame(*rows), tmp_path, formats=("png", "md"))
    assert "smoke/frontier-copy-n.png" in relative(written, tmp_path)
    (title,) = titles
    assert "copy: target accuracy against n, protocol smoke v1, mean ± std over 2 seeds" in title
