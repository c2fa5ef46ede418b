"""Report figures (matplotlib, no display needed): a task x mechanism heatmap, category bars
with error bars over seeds, accuracy against evaluation length, and learning curves."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no screen on CI or a server

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from synthbench.core.atomic import atomic_output  # noqa: E402
from synthbench.report.curves import THRESHOLD  # noqa: E402
from synthbench.report.frontier import sort_key, value_text  # noqa: E402
from synthbench.report.tables import Grid, Stat, sort_tasks  # noqa: E402


def _save(fig, stem: Path, suffixes: list[str]) -> list[Path]:
    stem.parent.mkdir(parents=True, exist_ok=True)
    written = []
    try:
        for suffix in suffixes:
            path = stem.with_suffix(suffix)
            with atomic_output(path) as handle:  # a full disk never leaves a truncated figure
                fig.savefig(handle, dpi=150, format=suffix[1:])
            written.append(path)
    finally:
        plt.close(fig)
    return written


CHAR_INCHES = 0.065  # the width of a character of the 8-point tick labels, about
TITLE_SIZE = 9  # points
TITLE_MARGIN = 0.15  # inches: the least room left between a title and each side of its figure


def _wrap(title: str, chars: int) -> list[str]:
    """``title`` in lines of at most ``chars`` characters, broken after its commas where it
    can (a title is a list of parts: "metric, protocol quick v4, mean over 3 seeds"), else
    at spaces; a word longer than a line stays whole."""
    lines: list[str] = []
    for part in re.split(r"(?<=,) ", title):
        if lines and len(lines[-1]) + 1 + len(part) <= chars:
            lines[-1] += " " + part
        else:
            lines += textwrap.wrap(part, chars, break_long_words=False) or [""]
    return lines


def fit_title(text: matplotlib.text.Text) -> int:
    """Wrap the figure title ``text`` until its width, measured as drawn, leaves
    ``TITLE_MARGIN`` on either side of its figure (a longer title is cut at both edges);
    returns its number of lines. Measures the text alone: no figure is drawn."""
    fig = text.figure
    room = (fig.get_figwidth() - 2 * TITLE_MARGIN) * fig.dpi
    renderer = fig.canvas.get_renderer()
    title = text.get_text()
    lines, chars = [title], len(title)
    while True:
        text.set_text("\n".join(lines))
        if text.get_window_extent(renderer).width <= room or chars <= 1:
            return len(lines)  # fits, or is a word too long for any line
        chars = min(chars, max(map(len, lines))) - 1
        lines = _wrap(title, chars)


LEGEND_ROW = 0.2  # inches: one row of a 7-point legend under the panels


def add_legend(fig, handles, labels, most_columns: int = 6) -> int:
    """One legend under the panels, in as many columns (at most ``most_columns``) as the
    figure's width holds, measured as drawn: a legend wider than its figure is cut at both
    sides. Returns its number of rows, for the figure's height."""
    room = (fig.get_figwidth() - 2 * TITLE_MARGIN) * fig.dpi
    renderer = fig.canvas.get_renderer()
    for columns in range(max(1, min(most_columns, len(labels))), 0, -1):
        legend = fig.legend(handles, labels, fontsize=7, loc="outside lower center", ncol=columns)
        if columns == 1 or legend.get_window_extent(renderer).width <= room:
            return -(-len(labels) // columns)
        legend.remove()
    return 0


def _grow_for_legend(fig, rows: int) -> None:
    """Add ``rows`` legend rows to the figure's height (the panels keep theirs)."""
    width, height = fig.get_size_inches()
    fig.set_size_inches(width, height + LEGEND_ROW * rows)


def heatmap(
    full: Grid,
    title: str,
    stem: Path,
    suffixes: list[str],
    label: str = "accuracy",
    order: list[str] | None = None,
    ranks: dict[str, int] | None = None,
    yours: frozenset[str] = frozenset(),
) -> list[Path]:
    """Tasks (grouped by category) x mechanisms, colour and text the seed mean; a missing
    cell is grey with ``--``, never drawn as 0. The colours span [0, 1] (``label`` names the
    colour bar): a chance-normalised score below 0 takes the colour of 0, its text says.
    ``order``: the mechanisms left to right (the board's rank order; default the grid's),
    each named with its rank in ``ranks``; the columns of ``yours`` are marked apart."""
    figure = heatmap_figure(full, title, label, order, ranks, yours)
    return _save(figure, stem, suffixes)


YOURS_COLOUR = "#c0392b"  # a user's mechanism beside the reference's: its labels and frame


def heatmap_figure(
    full: Grid,
    title: str,
    label: str = "accuracy",
    order: list[str] | None = None,
    ranks: dict[str, int] | None = None,
    yours: frozenset[str] = frozenset(),
):
    """The figure of ``heatmap``, not saved."""
    order = list(full.columns) if order is None else order
    at = {m: j for j, m in enumerate(full.columns)}
    means = np.array(
        [[v.mean if isinstance(v, Stat) else np.nan for v in row] for row in full.cells]
    ).reshape(len(full.rows), len(full.columns))[:, [at[m] for m in order]]
    texts = [["--" if np.isnan(v) else f"{v:.2f}" for v in row] for row in means]
    categories = [cat for cat, _ in full.rows]
    fig, ax = _matrix_figure(
        means,
        texts,
        [f"{task}  ({cat})" for cat, task in full.rows],
        _ranked_labels(order, ranks),
        title,
        label,
        "viridis",
        [j for j, m in enumerate(order) if m in yours],
    )
    for i in range(1, len(full.rows)):  # a line between categories
        if categories[i] != categories[i - 1]:
            ax.axhline(i - 0.5, color="white", linewidth=2)
    return fig


def _ranked_labels(mechanisms: list[str], ranks: dict[str, int] | None) -> list[str]:
    """The mechanisms' names, each after its board rank where it has one: "3. linear"."""
    ranks = ranks or {}
    return [f"{ranks[m]}. {m}" if m in ranks else m for m in mechanisms]


def _matrix_figure(values, texts, row_labels, column_labels, title, label, cmap, marked=(),
                   axes_names=("", "")):  # fmt: skip
    """A matrix of coloured cells in [0, 1] with its text in each (a NaN cell grey), rows and
    columns named, a colour bar named ``label``, the title above; the columns (and, for a
    square matrix, the rows) at the indices ``marked`` are framed and named in
    ``YOURS_COLOUR``; ``axes_names``: what the columns and the rows are (x and y labels).
    The margins come from the label lengths: an automatic layout draws the figure once more
    per format, which doubles the time of a large matrix."""
    n_rows, n_columns = values.shape
    named = 0.25  # inches: an axis name's line, beyond its tick labels
    left = 0.3 + CHAR_INCHES * max(map(len, row_labels)) + (named if axes_names[1] else 0)
    # the first name, at 40 degrees, reaches left of its column by about 0.77 of its length
    left = max(left, 0.77 * CHAR_INCHES * len(column_labels[0]) - 0.2)
    bottom = 0.3 + 0.7 * CHAR_INCHES * max(map(len, column_labels))  # names at 40 degrees
    bottom += named if axes_names[0] else 0
    right = 1.0  # the colour bar
    width = left + right + 0.6 * n_columns
    fig = plt.figure(figsize=(width, 1))
    # the title over the whole figure, wrapped to its width; the top margin grows with it
    heading = fig.suptitle(title, fontsize=TITLE_SIZE, va="top")
    top = 0.25 + fit_title(heading) * 1.25 * TITLE_SIZE / 72
    # a row 0.3 inches high; a few rows stand taller, so that the colour bar beside them
    # holds its label
    plot = max(0.3 * n_rows, CHAR_INCHES * len(label))
    height = bottom + top + plot
    fig.set_size_inches(width, height)
    heading.set_y(1 - 0.1 / height)
    ax = fig.add_axes((left / width, bottom / height, 0.6 * n_columns / width, plot / height))
    ax.set_xlabel(axes_names[0], fontsize=8)
    ax.set_ylabel(axes_names[1], fontsize=8)
    bar = fig.add_axes(
        ((width - right + 0.15) / width, bottom / height, 0.15 / width, plot / height)
    )
    ax.set_facecolor("#dddddd")
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=0, vmax=1, aspect="auto")
    light = cmap != "viridis"  # a light low end: dark text there, white on the dark high end
    for i in range(n_rows):
        for j in range(n_columns):
            value = values[i, j]
            dark_cell = not np.isnan(value) and (value > 0.6 if light else value <= 0.6)
            ax.text(j, i, texts[i][j], ha="center", va="center", fontsize=7,
                    color="white" if dark_cell else "black")  # fmt: skip
    ax.set_xticks(range(n_columns), column_labels, rotation=40, ha="right", fontsize=8)
    ax.set_yticks(range(n_rows), row_labels, fontsize=8)
    ticks = [ax.get_xticklabels()] + ([ax.get_yticklabels()] if n_rows == n_columns else [])
    for j in marked:
        frame = plt.Rectangle((j - 0.5, -0.5), 1, n_rows, fill=False, edgecolor=YOURS_COLOUR,
                              linewidth=1.5, clip_on=False)  # fmt: skip
        ax.add_patch(frame)
        for labels in ticks:
            labels[j].set(color=YOURS_COLOUR, fontweight="bold")
    fig.colorbar(image, cax=bar).set_label(label, fontsize=8)
    return fig, ax


def pairs_matrix(
    ahead: np.ndarray,
    tested: np.ndarray,
    mechanisms: list[str],
    title: str,
    stem: Path,
    suffixes: list[str],
    ranks: dict[str, int] | None = None,
    yours: frozenset[str] = frozenset(),
) -> list[Path]:
    """Separation head to head (synthbench/report/separation.py ``head_to_head``): in row a,
    column b, on how many tasks a is ahead of b and the pair separates, of the tasks the
    rules could test them on, coloured by that share (grey, ``--``: none could); the
    mechanisms in the board's order, named with their ``ranks``, ``yours`` marked apart."""
    return _save(pairs_figure(ahead, tested, mechanisms, title, ranks, yours), stem, suffixes)


def pairs_figure(ahead, tested, mechanisms, title, ranks=None, yours=frozenset()):
    """The figure of ``pairs_matrix``, not saved."""
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(tested > 0, ahead / tested, np.nan)
    texts = [
        ["" if i == j else f"{ahead[i, j]}/{tested[i, j]}" if tested[i, j] else "--"
         for j in range(len(mechanisms))]
        for i in range(len(mechanisms))
    ]  # fmt: skip
    labels = _ranked_labels(mechanisms, ranks)
    label = "share of the tested tasks on which the row is ahead"
    marked = [j for j, m in enumerate(mechanisms) if m in yours]
    names = ("behind: the column's mechanism", "ahead: the row's mechanism")
    return _matrix_figure(share, texts, labels, labels, title, label, "Blues", marked, names)[0]


def category_bars(
    summary: list[Grid], title: str, stem: Path, suffixes: list[str], label: str = "accuracy"
) -> list[Path]:
    """Category averages, one bar per mechanism, error bars one std over seeds (clipped to
    the axis: never above 1); ``label`` names the y axis."""
    return _save(category_figure(summary, title, label), stem, suffixes)


LEGEND_ROWS = 15  # mechanisms per legend column beside the bars: the axes' height holds them


def category_figure(summary: list[Grid], title: str, label: str = "accuracy"):
    """The figure of ``category_bars``, not saved."""
    columns = [c for grid in summary for c in grid.columns if c != "average"]
    mechanisms = [m for (m,) in summary[0].rows] if summary else []
    stats: dict[tuple[str, str], Stat] = {}
    for grid in summary:
        for (m,), row in zip(grid.rows, grid.cells, strict=True):
            for c, v in zip(grid.columns, row, strict=True):
                if isinstance(v, Stat):
                    stats[m, c] = v
    # the legend right beside the axes, top-aligned: a column per LEGEND_ROWS mechanisms
    ncol = max(1, -(-len(mechanisms) // LEGEND_ROWS))
    longest = max(map(len, mechanisms), default=0)
    legend_inches = ncol * (0.45 + 0.9 * CHAR_INCHES * longest)  # 7-point names
    fig, ax = plt.subplots(
        figsize=(1.0 + 1.1 * len(columns) + legend_inches, 3.4), layout="constrained"
    )
    width = 0.8 / max(1, len(mechanisms))
    x = np.arange(len(columns))
    # a chance-normalised average may fall below 0 (worse than chance): keep it in view
    lowest = min((s.mean - s.std for s in stats.values()), default=0.0)
    floor = min(0.0, lowest - 0.05)
    colours = plt.get_cmap("tab10" if len(mechanisms) <= 10 else "tab20")
    for k, m in enumerate(mechanisms):
        mean = np.array([stats[m, c].mean if (m, c) in stats else np.nan for c in columns])
        std = np.array([stats[m, c].std if (m, c) in stats else 0.0 for c in columns])
        # Clipped, not dropped: every score is at most 1 (perfect), so the part of mean ± std
        # above 1 is no value a seed could have had, only the symmetric summary's artefact
        # (a category at 0.99 ± 0.02 would draw a bar to 1.01); the part below the mean still
        # shows the spread over seeds. The lower end is clipped to the axis' floor alike.
        below = np.where(np.isnan(mean), 0.0, np.clip(mean - std, floor, 1.0))
        above = np.where(np.isnan(mean), 0.0, np.clip(mean + std, floor, 1.0))
        yerr = np.array([np.nan_to_num(mean - below), np.nan_to_num(above - mean)]).clip(0)
        offset = (k - (len(mechanisms) - 1) / 2) * width
        ax.bar(x + offset, mean, width, yerr=yerr, label=m, capsize=2, color=colours(k % colours.N))
    ax.set_xticks(x, columns, fontsize=8)
    ax.set_ylim(floor, 1.05)
    if lowest < 0:
        ax.axhline(0, color="black", linewidth=0.6)
    ax.set_ylabel(f"mean {label}", fontsize=8)
    if mechanisms:  # beside the axes, its top at theirs, below the title
        ax.legend(
            fontsize=7, ncol=ncol, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0
        )
    fit_title(fig.suptitle(title, fontsize=TITLE_SIZE))
    return fig


def length_curves(points: pd.DataFrame, title: str, stem: Path, suffixes: list[str]):
    """``points``: task, mechanism, mult (1 = trained length), mean, std. One panel per task,
    one line per mechanism, accuracy against the evaluation length multiple, error bars one
    std over seeds clipped to [0, 1] (as ``category_figure``'s: accuracy is at most 1)."""
    return _save(length_figure(points, title), stem, suffixes)


def length_figure(points: pd.DataFrame, title: str):
    """The figure of ``length_curves``, not saved."""
    tasks = sorted(points["task"].unique())
    columns = min(3, len(tasks))
    rows = -(-len(tasks) // columns)
    fig, axes = plt.subplots(
        rows,
        columns,
        figsize=(max(4.5, 3.4 * columns), 0.6 + 2.6 * rows),  # one panel: room for the title
        squeeze=False,
        layout="constrained",
    )
    for ax, task in zip(axes.flat, tasks, strict=False):
        part = points[points["task"] == task]
        for mechanism, line in part.groupby("mechanism"):
            line = line.sort_values("mult")
            ax.errorbar(
                line["mult"],
                line["mean"],
                yerr=_clipped_spread(line["mean"], line["std"]),
                marker="o",
                ms=3,
                capsize=2,
                label=mechanism,
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(part["mult"].unique()))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.set_ylim(0, 1.05)
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("evaluation length / trained length", fontsize=8)
    for ax in list(axes.flat)[len(tasks) :]:
        ax.axis("off")
    axes.flat[0].set_ylabel("accuracy")
    legend = {}  # every mechanism once, whichever panel it first appears in
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    _grow_for_legend(fig, add_legend(fig, list(legend.values()), list(legend), 5))
    _grow_for_legend(fig, fit_title(fig.suptitle(title, fontsize=TITLE_SIZE)) - 1)
    return fig


def learning_curves(curves: pd.DataFrame, title: str, stem: Path, suffixes: list[str]):
    """``curves``: category, task, mechanism, step, mean (``curves.mean_curves``). One small
    panel per task, in the tables' order, validation accuracy against step, one line per
    mechanism in the same colour in every panel, the 0.9 level dotted."""
    return _save(learning_figure(curves, title), stem, suffixes)


def learning_figure(curves: pd.DataFrame, title: str):
    """The figure of ``learning_curves``, not saved."""
    order = sort_tasks(curves)
    tasks = [t for _, t in order]
    category = dict((t, c) for c, t in order)
    mechanisms = sorted(curves["mechanism"].unique())
    colours = plt.get_cmap("tab10" if len(mechanisms) <= 10 else "tab20")
    colour = {m: colours(i % colours.N) for i, m in enumerate(mechanisms)}
    columns = min(4, len(tasks))
    rows = -(-len(tasks) // columns)
    fig, axes = plt.subplots(
        rows,
        columns,
        figsize=(max(4.5, 2.6 * columns), 0.5 + 1.9 * rows),
        squeeze=False,
        sharex=True,
        sharey=True,
        layout="constrained",
    )
    for ax, task in zip(axes.flat, tasks, strict=False):
        part = curves[curves["task"] == task]
        ax.axhline(THRESHOLD, color="grey", linestyle=":", linewidth=0.8)
        for mechanism, line in part.groupby("mechanism"):
            line = line.sort_values("step")
            ax.plot(
                line["step"], line["mean"], color=colour[mechanism], linewidth=1.2, label=mechanism
            )
        ax.set_title(f"{task}  ({category[task]})", fontsize=8, pad=2)
        ax.tick_params(labelsize=7)
        # steps: at most 5 intervals, so that "900" and "1000" do not run together
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(nbins=5, integer=True))
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3, linewidth=0.5)
    for i, ax in enumerate(axes.flat):
        if i >= len(tasks):  # an empty panel: the one above it carries the step axis
            ax.axis("off")
            ax = axes.flat[i - columns]
            ax.xaxis.set_tick_params(labelbottom=True)
        if i >= len(tasks) or i >= len(tasks) - columns:
            ax.set_xlabel("step", fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("val. accuracy", fontsize=7)
    handles = [plt.Line2D([], [], color=colour[m], linewidth=1.5) for m in mechanisms]
    _grow_for_legend(fig, add_legend(fig, handles, mechanisms))
    _grow_for_legend(fig, fit_title(fig.suptitle(title, fontsize=TITLE_SIZE)) - 1)
    return fig


def _mechanism_colours(mechanisms) -> dict:
    colours = plt.get_cmap("tab10" if len(mechanisms) <= 10 else "tab20")
    return {m: colours(i % colours.N) for i, m in enumerate(sorted(mechanisms))}


def _clipped_spread(mean, std) -> np.ndarray:
    """Error bar lengths (below, above) of mean ± std, clipped to [0, 1]: an accuracy."""
    mean, std = np.asarray(mean, float), np.asarray(std, float)
    return np.vstack([mean - np.clip(mean - std, 0, 1), np.clip(mean + std, 0, 1) - mean])


def _panels(n: int, width: float = 2.8, height: float = 2.2):
    columns = min(4, n)
    rows = -(-n // columns)
    fig, axes = plt.subplots(
        rows,
        columns,
        figsize=(0.4 + width * columns, 0.9 + height * rows),
        squeeze=False,
        sharey=True,
        layout="constrained",
    )
    for ax in axes.flat[n:]:
        ax.axis("off")
    return fig, axes


def _accuracy_line(ax, x, mean, std, colour) -> None:
    """Mean accuracy with its seed spread (clipped to [0, 1]), markers at the points."""
    yerr = _clipped_spread(mean, std)
    ax.errorbar(x, mean, yerr=yerr, color=colour, marker="o", markersize=3, linewidth=1.2,
                capsize=2)  # fmt: skip


def _finish_accuracy_panels(fig, axes, colour: dict, title: str, stem: Path, suffixes):
    """Shared by the frontier and state figures: the y label, 0 to 1 with the 0.9 level, a
    grid, one legend of the mechanisms under the panels, the title, saved."""
    for ax in axes.flat:
        if ax.axison:
            ax.axhline(0.9, color="grey", linestyle=":", linewidth=0.8)
            ax.tick_params(labelsize=7)
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3, linewidth=0.5)
    for ax in axes[:, 0]:
        ax.set_ylabel("target accuracy", fontsize=7)
    handles = [plt.Line2D([], [], color=colour[m], marker="o", markersize=3) for m in colour]
    _grow_for_legend(fig, add_legend(fig, handles, list(colour)))
    _grow_for_legend(fig, fit_title(fig.suptitle(title, fontsize=TITLE_SIZE)) - 1)
    return _save(fig, stem, suffixes)


def frontier_curves(lines, threshold: float, title: str, stem: Path, suffixes: list[str]):
    """``lines`` (synthbench.report.frontier.Line) of one task and knob: accuracy against the knob's
    values, easiest on the left, one panel per context, one line per mechanism with its seed
    spread (std, clipped to [0, 1]); the 0.9 threshold dotted."""
    contexts = list(dict.fromkeys(line.context for line in lines))  # lines come sorted
    colour = _mechanism_colours({line.mechanism for line in lines})
    fig, axes = _panels(len(contexts))
    knob_text = lines[0].knob_label("harder to the right")  # with the knobs that follow it
    for ax, context in zip(axes.flat, contexts, strict=False):
        here = [line for line in lines if line.context == context]
        labels = list(dict.fromkeys(value_text(v) for line in here for v in line.points["value"]))
        for line in here:
            x = [labels.index(value_text(v)) for v in line.points["value"]]
            _accuracy_line(ax, x, line.points["mean"], line.points["std"], colour[line.mechanism])
        ax.set_xticks(range(len(labels)), labels)
        ax.set_xlabel(knob_text, fontsize=7)
        ax.set_title(context or "", fontsize=8, pad=2)
    return _finish_accuracy_panels(fig, axes, colour, title, stem, suffixes)


def state_curves(points: pd.DataFrame, context_keys: list[str], title: str, stem: Path,
                 suffixes: list[str]):  # fmt: skip
    """``points`` (synthbench.report.frontier.state_points) of one task: accuracy against declared
    state size (log scale), one panel per value of ``context_keys`` (the task knobs that vary),
    one line per mechanism from its smallest state to its largest."""
    if context_keys:  # one panel per combination, in numeric order (pairs 4 before 16)
        keys = points[context_keys].apply(lambda r: tuple(sort_key(v) for v in r), axis=1)
        groups = [(key, points[keys == key]) for key in sorted(set(keys))]
    else:
        groups = [((), points)]
    colour = _mechanism_colours(set(points["mechanism"]))
    fig, axes = _panels(len(groups))
    for ax, (_, part) in zip(axes.flat, groups, strict=False):
        for mechanism, line in part.groupby("mechanism"):
            line = line.sort_values("state")
            _accuracy_line(ax, line["state"], line["mean"], line["std"], colour[mechanism])
        ax.set_xscale("log", base=2)
        first = part.iloc[0]
        ax.set_title(" ".join(f"{k}={value_text(first[k])}" for k in context_keys), fontsize=8,
                     pad=2)  # fmt: skip
        ax.set_xlabel("state size (numbers)", fontsize=7)
    return _finish_accuracy_panels(fig, axes, colour, title, stem, suffixes)
