"""Everything ``synthbench report`` writes, regenerated from the stored rows:

    <out>/leaderboard.md, leaderboard.html          every protocol, one ranking each
    <out>/<protocol>/<metric>/full.{md,tex}          tasks by category x mechanisms
    <out>/<protocol>/<metric>/summary.{md,tex}       category averages, core and higher-level
    <out>/<protocol>/<metric>/category-<name>.{md,tex}
    <out>/<protocol>/<metric>/curves.{md,tex}        steps to 0.9 and learning-curve area
    <out>/<protocol>/<metric>/tables.tex             a standalone document with all of them
    <out>/<protocol>/<metric>/heatmap.{png,pdf}, categories.{png,pdf}, curves.{png,pdf},
                                                     length.{png,pdf}
    <out>/<protocol>/<metric>/compare-<name>.{md,tex} with --compare <a published table>
    <out>/published-lm-<protocol>.{md,tex}          with --compare published-lm: rank correlations
                                                     with published LM quality, for each protocol
                                                     with 3 mechanisms the published tables cover
                                                     (synthbench/report/published_lm.py)
    <out>/<protocol>/separation.{md,tex}             which pairs each task tells apart, and head
                                                     to head (always on the target metric)
    <out>/<protocol>/lrs.{md,tex}                    the lr each run selected
    <out>/tracks-<protocol>.{md,tex}                 a core protocol and its block twin side by
                                                     side, where the rows hold both
                                                     (synthbench/report/tracks.py)
    <out>/<protocol>/frontier.{md,tex}, frontier-<task>-<knob>.{png,pdf},
    state-<task>.{png,pdf}                           where the rows hold a grid of runs
                                                     (synthbench/report/frontier.py)

Nothing there is edited by hand. A metric other than the default (target) names its
leaderboard ``leaderboard-<metric>``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from synthbench.core.atomic import write_atomically
from synthbench.core.text import did_you_mean, plural
from synthbench.report import curves, frontier, leaderboard, published_lm, separation, tracks
from synthbench.report.aggregate import CHANCE_COLUMN, DEFAULT_METRIC, length_metric, length_points
from synthbench.report.compare import PUBLISHED, PUBLISHED_LM, check_comparison, comparison_grid
from synthbench.report.formats import latex_document, to_latex, to_markdown
from synthbench.report.tables import Grid, ReportTables, build_tables, lr_grid

FORMATS = ("md", "tex", "html", "png", "pdf")


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text.lower()).strip("-")


def _under(out: Path, *parts: str) -> Path:
    """The folder ``out/part/...``, refused (ValueError) unless it lies inside ``out`` once
    resolved: the parts are names read from the results tree (checked when loaded:
    synthbench/run/row_checks.py), and a link inside ``out`` may point anywhere."""
    folder = out.joinpath(*parts)
    if any(part in ("", ".", "..") or "/" in part or "\\" in part for part in parts) or not (
        folder.resolve().is_relative_to(out.resolve())
    ):
        raise ValueError(f"{folder} would lie outside --out {out}: no report written there")
    return folder


def _write(path: Path, text: str, written: list[Path]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, text)  # a full disk never leaves a truncated report
    written.append(path)


def _write_grids(folder: Path, stem: str, grids: list[Grid], formats, written) -> None:
    if "md" in formats:
        _write(folder / f"{stem}.md", "\n".join(to_markdown(g) for g in grids), written)
    if "tex" in formats:
        _write(folder / f"{stem}.tex", "\n\\bigskip\n\n".join(to_latex(g) for g in grids), written)


def _figures(
    tables: ReportTables, rows: pd.DataFrame, runs: pd.DataFrame, folder: Path, suffixes, written
) -> None:
    """The figures of one protocol: ``rows`` its stored rows, ``runs`` its ``run_curves``."""
    from synthbench.report import figures  # matplotlib is imported only when a figure is asked for

    where = f"protocol {tables.protocol} v{tables.protocol_version}"
    seeds = f"mean over {plural(tables.n_seeds, 'seed')}"
    normalised = tables.metric in CHANCE_COLUMN
    score = f"chance-normalised {tables.metric}" if normalised else tables.metric
    label = "(accuracy - chance) / (1 - chance)" if normalised else tables.metric
    title = f"{score}, {where}, {seeds}"
    written += figures.heatmap(tables.heat, title, folder / "heatmap", suffixes, label)
    if any(cell is not None for grid in tables.summary for row in grid.cells for cell in row):
        stem = folder / "categories"  # not for a protocol without any category average
        written += figures.category_bars(tables.summary, title, stem, suffixes, label)
    if len(runs):
        title = f"validation token accuracy, {where}, mean over seeds at each run's selected lr"
        written += figures.learning_curves(
            curves.mean_curves(runs), title, folder / "curves", suffixes
        )
    if "eval_length_mult" in rows and rows["eval_length_mult"].notna().any():
        points = length_points(rows, tables.metric)
        if not points.empty:
            title = f"{length_metric(tables.metric)}, {where}, {seeds}"
            written += figures.length_curves(points, title, folder / "length", suffixes)


def _frontiers(found, states, tables: ReportTables, out: Path, formats, suffixes, written):
    """The frontier table (and its figures) of one protocol version, where its rows hold a
    grid; returns the table, or None."""
    protocol, version = tables.protocol, tables.protocol_version
    mine = [line for line in found if (line.protocol, line.protocol_version) == (protocol, version)]
    if not mine:
        return None
    grid = frontier.frontier_grid(mine, protocol, version)
    folder = _under(out, protocol)
    _write_grids(folder, "frontier", [grid], formats, written)
    if not suffixes:
        return grid
    from synthbench.report import figures  # matplotlib only where a figure is asked for

    by_knob: dict[tuple[str, str], list] = {}
    for line in mine:
        by_knob.setdefault((line.task, line.knob.name), []).append(line)
    for (task, knob), knob_lines in by_knob.items():
        title = (
            f"{task}: target accuracy against {knob}\nprotocol {protocol} v{version}, mean "
            f"± std over seeds, each at its selected lr"
        )
        stem = folder / f"frontier-{_slug(task)}-{_slug(knob)}"
        written += figures.frontier_curves(knob_lines, frontier.THRESHOLD, title, stem, suffixes)
    for task in sorted({line.task for line in mine}):
        part = states[
            (states["protocol"] == protocol)
            & (states["protocol_version"] == version)
            & (states["task"] == task)
        ]
        if part.empty:
            continue
        context = frontier.task_knobs_varying(part, task)
        title = (
            f"{task}: target accuracy against declared state size\nprotocol {protocol} "
            f"v{version}, mean ± std over seeds, each at its selected lr"
        )
        stem = folder / f"state-{_slug(task)}"
        written += figures.state_curves(part, context, title, stem, suffixes)
    return grid


def write_reports(
    rows: pd.DataFrame,
    out: Path,
    metric: str = DEFAULT_METRIC,
    formats: tuple[str, ...] = FORMATS,
    compare: str | None = None,
) -> list[Path]:
    """Write the reports of ``rows`` (one version per protocol) under ``out``; returns the
    paths written."""
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        hint = did_you_mean(unknown[0], FORMATS) if len(unknown) == 1 else ""
        raise ValueError(f"unknown format {', '.join(unknown)}{hint} ({', '.join(FORMATS)})")
    if not formats:  # `--format ''`: nothing to write is not a success
        raise ValueError(f"no report format given ({', '.join(FORMATS)})")
    check_comparison(compare)
    paper = PUBLISHED.get(compare)  # a published table, beside ours; None: another comparison
    all_tables = build_tables(rows, metric)
    if paper is not None and paper.protocol not in {t.protocol for t in all_tables}:
        protocol = paper.protocol
        raise ValueError(
            f"--compare {compare} needs rows of protocol {protocol}: run "
            f"`synthbench run --task all --mech softmax,yat-spherical,performer,linear,slay "
            f"--protocol {protocol}`"
        )
    written: list[Path] = []
    boards = []
    separated = separation.separation(rows) if {"md", "tex"} & set(formats) else None
    # over every protocol at once, so that variants are named as in the tables
    all_curves = curves.run_curves(rows)
    # grids of runs (run with lists, sweep): on the target metric, whatever the report's
    grid_points = frontier.grid_runs(rows)
    found = frontier.lines(grid_points)
    states = frontier.state_points(grid_points) if found else None  # once, for every protocol
    frontier_grids: list[Grid] = []
    for tables in all_tables:
        mine = rows[rows["protocol"] == tables.protocol]
        folder = _under(out, tables.protocol, metric)
        _write_grids(folder, "full", [tables.full], formats, written)
        _write_grids(folder, "summary", tables.summary, formats, written)
        for category, grid in tables.categories.items():
            _write_grids(folder, f"category-{_slug(category)}", [grid], formats, written)
        grids = [tables.full, *tables.summary, *tables.categories.values()]
        runs = all_curves[all_curves["protocol"] == tables.protocol]
        if len(runs):
            curve_grids = curves.curve_grids(runs, tables.protocol, tables.protocol_version)
            _write_grids(folder, "curves", curve_grids, formats, written)
            grids += curve_grids
        if paper is not None and tables.protocol == paper.protocol:
            # on the paper's metric (teacher-forced token accuracy), whatever the report's
            paper_metric = paper.metric
            ours = tables
            if tables.metric != paper_metric:
                (ours,) = build_tables(rows[rows["protocol"] == tables.protocol], paper_metric)
            grid = comparison_grid(ours, compare)
            _write_grids(folder, f"compare-{compare}", [grid], formats, written)
            grids.append(grid)
        if "tex" in formats:
            _write(folder / "tables.tex", latex_document([to_latex(g) for g in grids]), written)
        if separated is not None and tables.protocol in set(separated.runs["protocol"]):
            # on the target metric, whatever the report's
            pair_grids = separation.grids(
                separated, tables.protocol, tables.protocol_version, tables.track
            )
            _write_grids(_under(out, tables.protocol), "separation", pair_grids, formats, written)
        if len(tables.runs):
            grid = lr_grid(tables.runs, tables.protocol, tables.protocol_version, tables.track)
            _write_grids(_under(out, tables.protocol), "lrs", [grid], formats, written)
        suffixes = [f".{f}" for f in ("png", "pdf") if f in formats]
        if suffixes:
            _figures(tables, mine, runs, folder, suffixes, written)
        frontier_grid = _frontiers(found, states, tables, out, formats, suffixes, written)
        if frontier_grid is not None:
            frontier_grids.append(frontier_grid)
        boards.append(
            leaderboard.build(
                tables.runs,
                tables.protocol,
                tables.protocol_version,
                metric,
                # every mechanism and task of the tables: those without a success are unranked
                tables.full.columns,
                tables.full.rows,
                tables.leaky_tasks,
                tables.diverged,
                tables.track,
            )
        )
    stem = "leaderboard" if metric == DEFAULT_METRIC else f"leaderboard-{metric}"
    suffix = "" if metric == DEFAULT_METRIC else f"-{metric}"
    if compare == PUBLISHED_LM:
        data = published_lm.load()
        for board in boards:  # each protocol, so each track, on its own
            lm_grids = published_lm.grids(board, data)  # [] below 3 mechanisms covered
            stem_lm = f"{PUBLISHED_LM}-{board.protocol}{suffix}"
            if lm_grids:
                _write_grids(out, stem_lm, lm_grids, formats, written)
    track_grids = [tracks.side_by_side(core, block) for core, block in tracks.twins(boards)]
    for grid, (core, _) in zip(track_grids, tracks.twins(boards), strict=True):
        _write_grids(out, f"tracks-{core.protocol}{suffix}", [grid], formats, written)
    if "md" in formats:
        text = "\n".join(
            f"## {b.protocol} ({b.track} track)\n\n{leaderboard.to_markdown(b)}" for b in boards
        )
        text += "".join(f"\n{to_markdown(g)}" for g in [*track_grids, *frontier_grids])
        _write(out / f"{stem}.md", f"# Leaderboard ({metric})\n\n{text}", written)
    if "html" in formats:
        from synthbench.report.page import to_html

        _write(out / f"{stem}.html", to_html(boards, frontiers=frontier_grids), written)
    return written
