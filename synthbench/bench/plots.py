"""Figures and tables of the bench rows: scaling against length (001 Fig. 2), the quadrature
error against R (001 Fig. 9), and the fidelity table (001 Table 6) as Markdown and LaTeX."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.transforms import blended_transform_factory

from synthbench.bench.fidelity import fidelity_grid
from synthbench.report.figures import _save  # (importing figures selects the Agg backend)
from synthbench.report.formats import to_latex, to_markdown

SCALING_PANELS = (
    ("fwd_ms", "forward latency (ms)"),
    ("fwd_bwd_ms", "forward + backward latency (ms)"),
    ("peak_mb", "peak memory, forward + backward (MiB)"),
    ("tokens_per_s", "forward throughput (tokens/s)"),
)
FLOOR = 1e-17  # errors of exactly 0 on a log axis


def scaling_figure(rows: pd.DataFrame, stem: Path, suffixes: list[str]) -> list[Path]:
    """Log-log, one line per series over its successful lengths; an x at the top of each
    panel marks the length where the series ran out of memory or time."""
    labels = list(dict.fromkeys(rows["label"]))
    colours = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    fig, axes = plt.subplots(
        1, len(SCALING_PANELS), figsize=(4.2 * len(SCALING_PANELS), 4.2), layout="constrained"
    )
    for ax, (column, title) in zip(axes, SCALING_PANELS, strict=True):
        top = blended_transform_factory(ax.transData, ax.transAxes)
        for k, label in enumerate(labels):
            part = rows[rows["label"] == label].sort_values("seq_len")
            ok = part[part["status"] == "ok"]
            colour = colours(k % colours.N)
            ax.plot(ok["seq_len"], ok[column], marker="o", ms=3, color=colour, label=label)
            for length in part.loc[part["status"] != "ok", "seq_len"]:
                ax.plot([length], [0.97], marker="x", ms=8, mew=2, color=colour, transform=top)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
    first = rows.iloc[0]
    handles, names = axes[0].get_legend_handles_labels()
    handles.append(Line2D([], [], marker="x", mew=2, color="grey", linestyle=""))
    names.append("out of memory / time limit")
    fig.legend(handles, names, loc="outside lower center", ncol=min(8, len(names)), fontsize=8)
    fig.suptitle(
        f"one causal attention layer: d_model {first['d_model']}, {first['heads']} heads, "
        f"batch {first['batch']}, {first['device']}, torch {first['torch_version']} "
        f"({first['bench_id']})",
        fontsize=9,
    )
    return _save(fig, stem, suffixes)


def quadrature_figure(rows: pd.DataFrame, stem: Path, suffixes: list[str]) -> list[Path]:
    """The errors of the R-node Gauss-Laguerre kernel against R, log y."""
    fig, ax = plt.subplots(figsize=(5.5, 4), layout="constrained")
    rows = rows.sort_values("quad_nodes")
    for column, label in (
        ("max_abs_err", "max |error|, x in [-1, 1]"),
        ("mean_abs_err", "mean |error|, x in [-1, 1]"),
        ("max_abs_err_half", "max |error|, |x| <= 0.5"),
        ("median_rel_err", "median relative error"),
    ):
        ax.plot(rows["quad_nodes"], np.maximum(rows[column], FLOOR), marker="o", ms=3, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("quadrature nodes R")
    ax.set_ylabel("error of x^2 / (C - 2x)")
    ax.set_title(f"Gauss-Laguerre quadrature, eps {rows['eps'].iloc[0]:g}", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, stem, suffixes)


def fidelity_tables(rows: pd.DataFrame, out: Path) -> list[Path]:
    """fidelity.md and fidelity.tex (a booktabs tabular) through the report machinery."""
    grid = fidelity_grid(rows)
    out.mkdir(parents=True, exist_ok=True)
    markdown, latex = out / "fidelity.md", out / "fidelity.tex"
    markdown.write_text(to_markdown(grid))
    latex.write_text(to_latex(grid))
    return [markdown, latex]
