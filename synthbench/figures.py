"""Report figures (matplotlib, no display needed): a task x mechanism heatmap, category bars
with error bars over seeds, accuracy against evaluation length, and learning curves."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no screen on CI or a server

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from synthbench.atomic import atomic_output  # noqa: E402
from synthbench.curves import THRESHOLD  # noqa: E402
from synthbench.report import Grid, Stat, sort_tasks  # noqa: E402


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


def heatmap(
    full: Grid, title: str, stem: Path, suffixes: list[str], label: str = "accuracy"
) -> list[Path]:
    """Tasks (grouped by category) x mechanisms, colour and text the seed mean; a missing
    cell is grey with ``--``, never drawn as 0. The colours span [0, 1] (``label`` names the
    colour bar): a chance-normalised score below 0 takes the colour of 0, its text says."""
    means = np.array(
        [[v.mean if isinstance(v, Stat) else np.nan for v in row] for row in full.cells]
    )
    n_tasks, n_mechs = means.shape
    task_labels = [f"{task}  ({cat})" for cat, task in full.rows]
    # margins in inches from the label lengths: an automatic layout draws the figure once
    # more per format, which doubles the time of a large heatmap
    left = 0.3 + CHAR_INCHES * max(map(len, task_labels))
    bottom = 0.3 + 0.7 * CHAR_INCHES * max(map(len, full.columns))  # names at 40 degrees
    right, top = 1.0, 0.4  # the colour bar, the title
    width, height = left + right + 0.6 * n_mechs, bottom + top + 0.3 * n_tasks
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes(
        (left / width, bottom / height, 0.6 * n_mechs / width, 0.3 * n_tasks / height)
    )
    bar = fig.add_axes(
        ((width - right + 0.15) / width, bottom / height, 0.15 / width, 0.3 * n_tasks / height)
    )
    ax.set_facecolor("#dddddd")
    image = ax.imshow(np.ma.masked_invalid(means), cmap="viridis", vmin=0, vmax=1, aspect="auto")
    for i in range(n_tasks):
        for j in range(n_mechs):
            value = means[i, j]
            text = "--" if np.isnan(value) else f"{value:.2f}"
            colour = "black" if np.isnan(value) or value > 0.6 else "white"
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color=colour)
    ax.set_xticks(range(n_mechs), full.columns, rotation=40, ha="right", fontsize=8)
    ax.set_yticks(range(n_tasks), task_labels, fontsize=8)
    categories = [cat for cat, _ in full.rows]
    for i in range(1, n_tasks):  # a line between categories
        if categories[i] != categories[i - 1]:
            ax.axhline(i - 0.5, color="white", linewidth=2)
    fig.colorbar(image, cax=bar).set_label(label, fontsize=8)
    ax.set_title(title, fontsize=9)
    return _save(fig, stem, suffixes)


def category_bars(
    summary: list[Grid], title: str, stem: Path, suffixes: list[str], label: str = "accuracy"
) -> list[Path]:
    """Category averages, one bar per mechanism, error bars one std over seeds; ``label``
    names the y axis."""
    columns = [c for grid in summary for c in grid.columns if c != "average"]
    mechanisms = [m for (m,) in summary[0].rows] if summary else []
    stats: dict[tuple[str, str], Stat] = {}
    for grid in summary:
        for (m,), row in zip(grid.rows, grid.cells, strict=True):
            for c, v in zip(grid.columns, row, strict=True):
                if isinstance(v, Stat):
                    stats[m, c] = v
    ncol = min(6, max(1, len(mechanisms)))
    legend_inches = 0.2 * -(-len(mechanisms) // ncol) + 0.2
    height = 3.4 + legend_inches
    fig, ax = plt.subplots(figsize=(1.5 + 1.1 * len(columns), height))
    fig.subplots_adjust(bottom=(0.3 + legend_inches) / height, top=1 - 0.35 / height)
    width = 0.8 / max(1, len(mechanisms))
    x = np.arange(len(columns))
    colours = plt.get_cmap("tab10" if len(mechanisms) <= 10 else "tab20")
    for k, m in enumerate(mechanisms):
        mean = [stats[m, c].mean if (m, c) in stats else np.nan for c in columns]
        std = [stats[m, c].std if (m, c) in stats else 0.0 for c in columns]
        offset = (k - (len(mechanisms) - 1) / 2) * width
        ax.bar(x + offset, mean, width, yerr=std, label=m, capsize=2, color=colours(k % colours.N))
    ax.set_xticks(x, columns, fontsize=8)
    # a chance-normalised average may fall below 0 (worse than chance): keep it in view
    lowest = min((s.mean - s.std for s in stats.values()), default=0.0)
    ax.set_ylim(min(0.0, lowest - 0.05), 1.05)
    if lowest < 0:
        ax.axhline(0, color="black", linewidth=0.6)
    ax.set_ylabel(f"mean {label}", fontsize=8)
    fig.legend(fontsize=7, ncol=ncol, loc="lower center")
    ax.set_title(title, fontsize=9)
    return _save(fig, stem, suffixes)


def length_curves(points: pd.DataFrame, title: str, stem: Path, suffixes: list[str]):
    """``points``: task, mechanism, mult (1 = trained length), mean, std. One panel per task,
    one line per mechanism, accuracy against the evaluation length multiple."""
    tasks = sorted(points["task"].unique())
    columns = min(3, len(tasks))
    rows = -(-len(tasks) // columns)
    fig, axes = plt.subplots(
        rows,
        columns,
        figsize=(3.4 * columns, 0.6 + 2.6 * rows),
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
                yerr=line["std"],
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
    fig.legend(
        list(legend.values()),
        list(legend),
        fontsize=7,
        loc="outside lower center",
        ncol=min(5, max(1, len(legend))),
    )
    fig.suptitle(title, fontsize=9)
    return _save(fig, stem, suffixes)


def learning_curves(curves: pd.DataFrame, title: str, stem: Path, suffixes: list[str]):
    """``curves``: category, task, mechanism, step, mean (``curves.mean_curves``). One small
    panel per task, in the tables' order, validation accuracy against step, one line per
    mechanism in the same colour in every panel, the 0.9 level dotted."""
    order = sort_tasks(curves)
    tasks = [t for _, t in order]
    category = dict((t, c) for c, t in order)
    mechanisms = sorted(curves["mechanism"].unique())
    colours = plt.get_cmap("tab10" if len(mechanisms) <= 10 else "tab20")
    colour = {m: colours(i % colours.N) for i, m in enumerate(mechanisms)}
    columns = min(4, len(tasks))
    rows = -(-len(tasks) // columns)
    legend_rows = -(-len(mechanisms) // min(6, len(mechanisms)))
    fig, axes = plt.subplots(
        rows,
        columns,
        figsize=(2.6 * columns, 0.5 + 0.25 * legend_rows + 1.9 * rows),
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
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # steps
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
    fig.legend(
        handles,
        mechanisms,
        fontsize=7,
        loc="outside lower center",
        ncol=min(6, len(mechanisms)),
    )
    fig.suptitle(title, fontsize=9)
    return _save(fig, stem, suffixes)
