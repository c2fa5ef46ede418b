"""What a reader sees: figure titles whole, error bars within the score's range, the legend
beside the bars, "best in bold" only under a table with a bold cell, counts in correct
singular and plural."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from test_report import frame, row  # noqa: E402  (tests/test_report.py, beside this file)

from synthbench.core.text import noun, plural  # noqa: E402
from synthbench.report import figures  # noqa: E402
from synthbench.report.curves import curve_grids  # noqa: E402
from synthbench.report.formats import to_latex, to_markdown
from synthbench.report.tables import BEST_IN_BOLD, Grid, Stat, build_tables

TITLE = "chance-normalised target, protocol quick v4, mean over 3 seeds"
LABEL = "(accuracy - chance) / (1 - chance)"
LONG = "slay-tensorsketch (eps=0.0001, pos=rope)"  # a long variant name


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def drawn_texts(fig) -> list[Text]:
    """Every visible, non-empty text of ``fig``, after drawing it."""
    fig.canvas.draw()
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def assert_inside(fig, artist, slack: float = 1.0) -> None:
    """``artist``'s drawn extent lies inside the figure (``slack`` pixels of rounding)."""
    box, page = artist.get_window_extent(), fig.bbox
    assert box.x0 >= page.x0 - slack and box.x1 <= page.x1 + slack, (artist, box, page)
    assert box.y0 >= page.y0 - slack and box.y1 <= page.y1 + slack, (artist, box, page)


def assert_all_inside(fig) -> None:
    """Everything drawn (titles, tick labels, legends, colour bar labels) lies inside the
    figure: nothing is cut at its edges."""
    fig.canvas.draw()
    box = fig.get_tightbbox(fig.canvas.get_renderer())  # inches
    slack = 1 / fig.dpi
    assert box.x0 >= -slack and box.y0 >= -slack, box
    assert box.x1 <= fig.get_figwidth() + slack and box.y1 <= fig.get_figheight() + slack, box


def title_of(fig) -> Text:
    return fig._suptitle


def heat_grid(tasks: list[str], mechanisms: list[str]) -> Grid:
    return Grid(
        "All tasks",
        ["category", "task"],
        [("Memory", t) for t in tasks],
        mechanisms,
        [[Stat(0.5, 0.1, 3) for _ in mechanisms] for _ in tasks],
        3,
        best="row",
    )


def summary_grid(cells: dict[str, list[Stat | None]], columns: list[str]) -> Grid:
    return Grid(
        "Core capabilities",
        ["mechanism"],
        [(m,) for m in cells],
        columns,
        list(cells.values()),
        3,
    )


# -- titles --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tasks, mechanisms",
    [
        (["kv_recall"], ["softmax"]),  # the narrowest heatmap: the title once ran off it
        (["kv_recall", "retrieval", "first_token"], ["softmax", LONG]),
        ([f"task{i}" for i in range(22)], ["cosformer", "linear", "none", "softmax"]),
    ],
)
def test_heatmap_title_and_every_label_lie_inside_the_figure(tasks, mechanisms):
    fig = figures.heatmap_figure(heat_grid(tasks, mechanisms), TITLE, LABEL)
    texts = drawn_texts(fig)
    assert_all_inside(fig)  # the title, tick labels, cell values, the colour bar's label
    title = title_of(fig)
    assert title in texts and title.get_text().replace("\n", " ") == TITLE  # wrapped, not cut
    # the title stands above the cells
    (ax, _bar) = fig.axes
    assert title.get_window_extent().y0 >= ax.get_window_extent().y1


def test_a_title_wraps_at_its_commas():
    assert figures._wrap(TITLE, 45) == [
        "chance-normalised target, protocol quick v4,",
        "mean over 3 seeds",
    ]
    assert figures._wrap("a b c", 100) == ["a b c"]
    # a part longer than a line breaks at its spaces, a word longer than a line stays whole
    assert figures._wrap("validation token accuracy, x", 12) == [
        "validation",
        "token",
        "accuracy, x",
    ]
    assert figures._wrap("supercalifragilistic", 5) == ["supercalifragilistic"]
    # a title that cannot fit (one long word in a narrow figure) ends, whole
    fig = plt.figure(figsize=(1, 1))
    word = "x" * 60
    assert figures.fit_title(fig.suptitle(f"{word} a b")) == 3
    assert fig._suptitle.get_text() == f"{word}\na\nb"


def test_titles_of_the_curve_figures_lie_inside_them():
    steps = [100, 200, 300]
    learning = pd.DataFrame(
        {
            "category": "Memory",
            "task": "kv_recall",
            "mechanism": "softmax",
            "step": steps,
            "mean": [0.1, 0.5, 0.99],
        }
    )
    long_title = "validation token accuracy, protocol quick v4, mean over seeds at each run's lr"
    fig = figures.learning_figure(learning, long_title)
    assert_all_inside(fig)
    assert title_of(fig).get_text().replace("\n", " ") == long_title
    points = pd.DataFrame(
        {
            "task": "copy",
            "mechanism": "softmax",
            "mult": [1.0, 2.0],
            "mean": [0.99, 0.6],
            "std": [0.05, 0.3],
        }
    )
    fig = figures.length_figure(points, TITLE)
    assert_all_inside(fig)
    # error bars end within [0, 1] here too
    (ax, *_) = fig.axes
    ends = [y for line in ax.lines for y in line.get_ydata()]
    tops = [seg[:, 1].max() for c in ax.collections for seg in c.get_segments()]
    assert max(tops) <= 1.0 and max(ends) <= 1.0


# -- the category chart ----------------------------------------------------------------------


def bars_figure(mechanisms: list[str], columns=("Basic", "Memory")):
    cells = {m: [Stat(0.99, 0.05, 3), Stat(0.98, 0.08, 3)][: len(columns)] for m in mechanisms}
    cells[mechanisms[-1]] = [Stat(-0.2, 0.1, 3), None][: len(columns)]  # below chance, missing
    return figures.category_figure([summary_grid(cells, list(columns))], TITLE, LABEL)


def error_bar_ends(ax) -> list[float]:
    """The y of both ends of every error bar of the chart."""
    ends = []
    for container in ax.containers:
        if not isinstance(container, ErrorbarContainer):
            continue  # the bars
        for collection in container.lines[2]:
            for segment in collection.get_segments():
                ends += list(np.reshape(segment, (-1, 2))[:, 1])  # empty: a missing cell
    return ends


def test_category_error_bars_never_pass_one():
    fig = bars_figure(["linear", "softmax", "yat"])
    (ax,) = fig.axes
    ends = error_bar_ends(ax)
    assert ends and max(ends) <= 1.0  # 0.99 ± 0.05 is drawn to 1.0, not 1.04
    assert min(ends) >= ax.get_ylim()[0]  # and never below the axis either
    assert min(ends) == pytest.approx(-0.3)  # -0.2 ± 0.1: a spread below 1 is drawn whole


@pytest.mark.parametrize(
    "mechanisms, columns",
    [
        (["softmax"], ("Memory",)),  # one bar: the narrowest chart
        (["cosformer", "linear", "none", "softmax"], ("Basic", "Memory")),
        ([f"{LONG}-{i}" for i in range(20)], ("Basic", "Memory")),  # two legend columns
    ],
)
def test_category_legend_sits_beside_the_axes_and_everything_inside(mechanisms, columns):
    fig = bars_figure(mechanisms, columns)
    fig.canvas.draw()
    (ax,) = fig.axes
    legend = ax.get_legend()
    frame_, box = ax.get_window_extent(), legend.get_window_extent()
    assert box.x0 >= frame_.x1  # beside, not over the bars
    assert box.x0 - frame_.x1 <= 0.2 * fig.dpi  # close: within a fifth of an inch
    assert box.y1 == pytest.approx(frame_.y1, abs=2)  # its top at the axes' top
    assert_inside(fig, legend)
    assert_all_inside(fig)
    title = title_of(fig)
    assert title.get_text().replace("\n", " ") == TITLE
    assert title.get_window_extent().y0 >= box.y1  # the title above the legend, never over it


# -- "best in bold" ----------------------------------------------------------------------------


def test_best_in_bold_is_said_only_where_a_cell_is_bold():
    single = build_tables(frame(row("copy", "softmax", 0, 0.5), row("copy", "softmax", 1, 0.7)))
    (tables,) = single
    for grid in (tables.full, *tables.categories.values()):
        assert grid.best_cells() == set()
        for text in (to_markdown(grid), to_latex(grid)):
            assert BEST_IN_BOLD not in text and "**" not in text.split("\n", 2)[2]
            assert "protocol smoke v1 (core track)." in text  # the sentence still ends
    (two,) = build_tables(
        frame(*(row("copy", m, s, v) for m, v in (("softmax", 0.5), ("linear", 0.4))
                for s in range(2)))
    )  # fmt: skip
    assert two.full.best_cells() == {(0, 1)}
    assert f"protocol smoke v1 (core track); {BEST_IN_BOLD}." in to_markdown(two.full)
    assert "best in bold" in to_latex(two.full)


def test_no_value_no_bold_note():
    notes = [f"head; {BEST_IN_BOLD}.", "other."]
    empty = Grid("t", ["task"], [("copy",)], ["a", "b"], [[None, None]], 1, "row", notes)
    assert empty.shown_notes() == ["head.", "other."]
    assert to_markdown(empty).endswith("head.\nother.\n")
    assert "head." in to_latex(empty) and BEST_IN_BOLD not in to_latex(empty)
    # a lone survivor among two is bold, and the note stays; of one seed it never is
    survivor = Grid(
        "t", ["task"], [("copy",)], ["a", "b"], [[None, Stat(0.4, 0, 2)]], 2, "row", notes
    )
    assert survivor.shown_notes() == notes
    single = Grid("t", ["task"], [("copy",)], ["a", "b"], [[None, Stat(0.4, 0, 1)]], 1, "row",
                  notes)  # fmt: skip
    assert single.shown_notes() == ["head.", "other."]


def test_curve_area_table_of_one_mechanism_says_no_bold():
    curves = pd.DataFrame(
        {
            "protocol": "smoke",
            "category": "Basic",
            "task": "copy",
            "mechanism": "softmax",
            "seed": [0, 1],
            "steps_to": [200.0, None],
            "area": [0.8, 0.7],
        }
    )
    _steps, area = curve_grids(curves, "smoke", 1)
    md = to_markdown(area)
    assert BEST_IN_BOLD not in md and "mean ± std over seeds. --: no run" in md
    assert "over 2 seeds" in md and "(1 run in all)" in to_markdown(_steps)


# -- singular and plural ---------------------------------------------------------------------


def test_plural():
    assert plural(1, "seed") == "1 seed"
    assert plural(3, "seed") == "3 seeds"
    assert plural(0, "run") == "0 runs"
    assert plural(1, "category", "categories") == "1 category"
    assert plural(7, "category", "categories") == "7 categories"
    assert noun(1, "seed") == "seed" and noun(2, "seed") == "seeds"


def test_report_footnotes_count_in_words():
    (tables,) = build_tables(
        frame(row("copy", "softmax", 0, 0.5), row("kv_recall", "linear", 0, 0.5))
    )
    md = to_markdown(tables.full)
    assert "one seed (no spread to show)" in md and "seed(s)" not in md
    assert "(2 cells, 2 of them not run)" in md and "cell(s)" not in md
    (one,) = build_tables(
        frame(
            row("copy", "softmax", 0, 0.5),
            row("copy", "linear", 0, 0.5),
            row("kv_recall", "linear", 0, 0.5),
        )
    )
    assert "no successful run (1 cell, not run); never counted as 0." in to_markdown(one.full)


# -- legends, board order, the pairs matrix ---------------------------------------------------

REFERENCE_NAMES = [f"{m} (reference)" for m in ("gated-deltanet", "sliding-window", "cosformer",
                   "performer", "deltanet", "mamba2", "retnet", "softmax", "linear", "based",
                   "slay", "none", "gla")]  # fmt: skip


def test_the_curves_legend_fits_its_figure_whatever_the_names():
    """Three tasks and 15 mechanisms, long names: the trial's curves.png cut its legend at
    both sides; the legend takes the columns the figure's width holds."""
    mechanisms = [*REFERENCE_NAMES, "softmax", LONG]
    learning = pd.DataFrame(
        [
            {"category": "Basic", "task": t, "mechanism": m, "step": s, "mean": 0.5}
            for t in ("copy", "modular", "parity")
            for m in mechanisms
            for s in (100, 200)
        ]
    )
    fig = figures.learning_figure(learning, "validation token accuracy, protocol quick v6")
    assert_all_inside(fig)
    (legend,) = fig.legends
    assert_inside(fig, legend)
    assert len(legend.get_texts()) == len(mechanisms)
    points = pd.DataFrame(
        [{"task": "copy", "mechanism": m, "mult": x, "mean": 0.5, "std": 0.1}
         for m in mechanisms for x in (1.0, 2.0)]
    )  # fmt: skip
    fig = figures.length_figure(points, TITLE)
    assert_all_inside(fig)
    assert_inside(fig, fig.legends[0])


def test_the_heatmap_follows_the_board_and_marks_yours():
    """Columns in the board's order, each named with its rank; your mechanism (not marked
    "(reference)") framed and named in red; the cells follow their columns."""
    grid = Grid(
        "All tasks", ["category", "task"], [("Basic", "copy")], ["a (reference)", "mine", "z"],
        [[Stat(0.2, 0.0, 3), Stat(0.9, 0.0, 1), Stat(0.5, 0.0, 3)]], 3,
    )  # fmt: skip
    order = ["mine", "z", "a (reference)"]
    fig = figures.heatmap_figure(
        grid, TITLE, LABEL, order, {"mine": 1, "z": 2, "a (reference)": 3}, frozenset({"mine"})
    )
    assert_all_inside(fig)
    ax = fig.axes[0]
    labels = ax.get_xticklabels()
    assert [t.get_text() for t in labels] == ["1. mine", "2. z", "3. a (reference)"]
    assert labels[0].get_color() == figures.YOURS_COLOUR and labels[0].get_fontweight() == "bold"
    assert labels[1].get_color() != figures.YOURS_COLOUR
    cells = [t.get_text() for t in ax.texts]
    assert cells == ["0.90", "0.50", "0.20"]
    red = matplotlib.colors.to_rgb(figures.YOURS_COLOUR)
    (frame_,) = [p for p in ax.patches if p.get_edgecolor()[:3] == red]
    assert frame_.get_x() == pytest.approx(-0.5)  # around the first column: yours


def test_the_pairs_matrix_is_readable_with_every_reference_mechanism():
    names = [*REFERENCE_NAMES, LONG]
    n = len(names)
    ahead = np.arange(n * n).reshape(n, n) % 5
    np.fill_diagonal(ahead, 0)
    tested = np.full((n, n), 22)
    tested[:, -1] = tested[-1, :] = 0  # yours: one seed, nothing testable
    np.fill_diagonal(tested, 0)
    ranks = {m: i + 1 for i, m in enumerate(names[:-1])}
    fig = figures.pairs_figure(ahead, tested, names, TITLE, ranks, frozenset({LONG}))
    assert_all_inside(fig)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert texts[1] == f"{ahead[0, 1]}/22" and texts[n - 1] == "--" and texts[0] == ""
    assert [t.get_text() for t in ax.get_yticklabels()][:2] == [
        "1. gated-deltanet (reference)",
        "2. sliding-window (reference)",
    ]
    assert ax.get_yticklabels()[-1].get_color() == figures.YOURS_COLOUR
