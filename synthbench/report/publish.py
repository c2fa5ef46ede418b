"""Everything ``synthbench report`` writes, regenerated from the stored rows:

    <out>/leaderboard.md, .tex, .html                every protocol, one ranking each, with
                                                     rank intervals and tiers
    <out>/<protocol>/<metric>/full.{md,tex}          tasks by category x mechanisms
    <out>/<protocol>/<metric>/summary.{md,tex}       category averages, core and higher-level
    <out>/<protocol>/<metric>/category-<name>.{md,tex}
    <out>/<protocol>/<metric>/curves.{md,tex}        steps to 0.9 and learning-curve area
    <out>/<protocol>/<metric>/tables.tex             a standalone document with all of them
    <out>/<protocol>/<metric>/heatmap.{png,pdf}, categories.{png,pdf}, curves.{png,pdf},
                                                     length.{png,pdf}
    <out>/<protocol>/<metric>/compare-<name>.{md,tex} with --compare <a published table>
    <out>/published-lm-<protocol>.{md,tex}          with --compare published-lm: rank correlations
                                                     with published LM quality and the share of
                                                     published orderings reproduced, for each
                                                     protocol with 3 mechanisms the published
                                                     tables cover (report/published_lm.py,
                                                     report/published_orderings.py)
    <out>/<protocol>/separation.{md,tex}             the tasks that tell the board's neighbours
                                                     apart (always on the target metric)
    <out>/<protocol>/separation.csv                  every pair of mechanisms on every task
    <out>/<protocol>/separation.{png,pdf}            every pair head to head, in board order
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
from synthbench.core.paths import OutsideRoot, path_under
from synthbench.core.text import did_you_mean
from synthbench.report import curves, frontier, leaderboard, published_lm, separation, tracks
from synthbench.report.aggregate import CHANCE_COLUMN, DEFAULT_METRIC, length_metric, length_points
from synthbench.report.compare import PUBLISHED, PUBLISHED_LM, check_comparison, comparison_grid
from synthbench.report.formats import latex_document, to_latex, to_markdown
from synthbench.report.reference import SUFFIX as REFERENCE_SUFFIX
from synthbench.report.tables import (
    Grid,
    ReportTables,
    build_tables,
    lr_grid,
    seeds_text,
    track_text,
)

FORMATS = ("md", "tex", "html", "png", "pdf")


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text.lower()).strip("-")


def _under(out: Path, *parts: str) -> Path:
    """The folder ``out/part/...``, refused (ValueError) unless each part is one plain name
    (core/paths.py's ``path_under``, as every path built from stored names) and the folder
    still lies inside ``out`` once resolved: a link inside ``out`` may point anywhere."""
    try:
        folder = path_under(out, *parts)
    except OutsideRoot:
        folder = None
    if folder is None or not folder.resolve().is_relative_to(out.resolve()):
        raise ValueError(
            f"{out.joinpath(*parts)} would lie outside --out {out}: no report written there"
        )
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


def _cell_seeds(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (task, mechanism) of ``runs`` (one row per run): mechanism and seeds, for
    ``seeds_text``."""
    return runs.groupby(["task", "mechanism"])["seed"].nunique().rename("seeds").reset_index()


def _yours(mechanisms) -> frozenset[str]:
    """The user's mechanisms, marked apart in the figures where the reference's are beside
    them (with nothing of the reference's, nothing needs telling apart)."""
    mechanisms = [str(m) for m in mechanisms]
    if not any(m.endswith(REFERENCE_SUFFIX) for m in mechanisms):
        return frozenset()
    return frozenset(m for m in mechanisms if not m.endswith(REFERENCE_SUFFIX))


def _ranks(board: leaderboard.Leaderboard) -> dict[str, int]:
    table = board.table.dropna(subset=["rank"])
    return {str(m): int(r) for m, r in zip(table["mechanism"], table["rank"], strict=True)}


def _figures(
    tables: ReportTables,
    board: leaderboard.Leaderboard,
    rows: pd.DataFrame,
    runs: pd.DataFrame,
    folder: Path,
    suffixes,
    written,
) -> None:
    """The figures of one protocol: ``rows`` its stored rows, ``runs`` its ``run_curves``;
    each title states the seeds its values are taken over (``seeds_text``)."""
    from synthbench.report import figures  # matplotlib is imported only when a figure is asked for

    where = f"protocol {tables.protocol} v{tables.protocol_version}"
    normalised = tables.metric in CHANCE_COLUMN
    score = f"chance-normalised {tables.metric}" if normalised else tables.metric
    label = "(accuracy - chance) / (1 - chance)" if normalised else tables.metric
    shown = list(tables.heat.columns)
    order = [m for m in board.table["mechanism"] if m in shown]
    order += [m for m in shown if m not in order]
    yours = _yours(order)
    marked = ", yours in red" if yours else ""
    title = (
        f"{score}, {where}, {seeds_text(_cell_seeds(tables.runs))}, mechanisms by board "
        f"rank{marked}"
    )
    written += figures.heatmap(
        tables.heat, title, folder / "heatmap", suffixes, label, order, _ranks(board), yours
    )
    stats = [
        {"mechanism": m, "seeds": cell.n}
        for grid in tables.summary
        for (m,), row in zip(grid.rows, grid.cells, strict=True)
        for cell in row
        if cell is not None
    ]
    if stats:  # not for a protocol without any category average
        seeds = seeds_text(pd.DataFrame(stats), "mean ± std")
        stem = folder / "categories"
        written += figures.category_bars(
            tables.summary, f"{score}, {where}, {seeds}", stem, suffixes, label
        )
    if len(runs):
        counts = runs.groupby(["task", "mechanism"]).size().rename("seeds").reset_index()
        title = (
            f"validation token accuracy, {where}, {seeds_text(counts)} at each run's selected lr"
        )
        written += figures.learning_curves(
            curves.mean_curves(runs), title, folder / "curves", suffixes
        )
    if "eval_length_mult" in rows and rows["eval_length_mult"].notna().any():
        points = length_points(rows, tables.metric)
        if not points.empty:
            seeds = seeds_text(points.rename(columns={"n": "seeds"}))
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
        counts = pd.DataFrame(
            [{"mechanism": line.mechanism, "seeds": n} for line in knob_lines
             for n in line.points["n"]]
        )  # fmt: skip
        title = (
            f"{task}: target accuracy against {knob}, protocol {protocol} v{version}, "
            f"{seeds_text(counts, 'mean ± std')}, each at its selected lr"
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
        seeds = seeds_text(part.rename(columns={"n_seeds": "seeds"}), "mean ± std")
        title = (
            f"{task}: target accuracy against declared state size, protocol {protocol} "
            f"v{version}, {seeds}, each at its selected lr"
        )
        stem = folder / f"state-{_slug(task)}"
        written += figures.state_curves(part, context, title, stem, suffixes)
    return grid


def _target_board(
    separated: separation.Separation, tables: ReportTables
) -> leaderboard.Leaderboard:
    """The board of one protocol on the target metric, its order alone (no bootstrap): what
    separation, which is always on the target metric, names its pairs of neighbours by."""
    runs = separated.runs[separated.runs["protocol"] == tables.protocol]
    return leaderboard.build(
        runs, tables.protocol, tables.protocol_version, DEFAULT_METRIC, tables.full.columns,
        tables.full.rows, tables.leaky_tasks, tables.diverged, tables.track, intervals=False,
    )  # fmt: skip


def _separation(separated, tables: ReportTables, board, out: Path, formats, suffixes, written):
    """separation.{md,tex,csv} and the pairs figure of one protocol (on the target metric,
    whatever the report's), its pairs of neighbours those of the target board."""
    protocol, version = tables.protocol, tables.protocol_version
    if separated is None or protocol not in set(separated.runs["protocol"]):
        return
    folder = _under(out, protocol)
    if board.metric != DEFAULT_METRIC:
        board = _target_board(separated, tables)
    order = [str(m) for m in board.table["mechanism"]]
    ranked = order[: int(board.table["rank"].notna().sum())]
    if {"md", "tex"} & set(formats):
        grids = separation.grids(separated, protocol, version, tables.track, ranked)
        if "md" in formats:
            _write(folder / "separation.md", "\n".join(to_markdown(g) for g in grids), written)
        if "tex" in formats:
            text = "\n\\bigskip\n\n".join(to_latex(g, notes_below=True) for g in grids)
            _write(folder / "separation.tex", text, written)
        _write(folder / "separation.csv", separation.csv_text(separated, protocol), written)
    if suffixes:
        from synthbench.report import figures  # matplotlib only where a figure is asked for

        pairs = separated.pairs
        mine = pairs[(pairs["protocol"] == protocol) & (pairs["measure"] == "target")]
        present = set(separated.runs.loc[separated.runs["protocol"] == protocol, "mechanism"])
        order = [m for m in order if m in present] + sorted(present - set(order))
        ahead, tested = separation.head_to_head(mine, order)
        title = (
            f"Head to head on the target metric, {track_text(protocol, version, tables.track)}: "
            "in row a, column b, on how many tasks a is ahead of b and the pair separates, of "
            "the tasks both ran that the rules could test (--: none; separation.md)"
        )
        written += figures.pairs_matrix(
            ahead, tested, order, title, folder / "separation", suffixes, _ranks(board),
            _yours(order),
        )  # fmt: skip


def write_reports(
    rows: pd.DataFrame,
    out: Path,
    metric: str = DEFAULT_METRIC,
    formats: tuple[str, ...] = FORMATS,
    compare: str | None = None,
    replaced: pd.DataFrame | None = None,
) -> list[Path]:
    """Write the reports of ``rows`` (one version per protocol) under ``out``; returns the
    paths written. ``replaced``: the reference runs the user's runs replaced (the same run
    id; ``reference.replaced_runs``), which each board names."""
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
    suffixes = [f".{f}" for f in ("png", "pdf") if f in formats]
    wants_pairs = {"md", "tex"} & set(formats) or suffixes
    separated = separation.separation(rows) if wants_pairs else None
    # over every protocol at once, so that variants are named as in the tables
    all_curves = curves.run_curves(rows)
    # grids of runs (run with lists, sweep): on the target metric, whatever the report's
    grid_points = frontier.grid_runs(rows)
    found = frontier.lines(grid_points)
    states = frontier.state_points(grid_points) if found else None  # once, for every protocol
    frontier_grids: list[Grid] = []
    for tables in all_tables:
        mine = rows[rows["protocol"] == tables.protocol]
        board = leaderboard.build(
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
            _of_protocol(replaced, tables),
            states=tables.states,
        )
        boards.append(board)
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
        _separation(separated, tables, board, out, formats, suffixes, written)
        if len(tables.runs):
            grid = lr_grid(tables.runs, tables.protocol, tables.protocol_version, tables.track)
            _write_grids(_under(out, tables.protocol), "lrs", [grid], formats, written)
        if suffixes:
            _figures(tables, board, mine, runs, folder, suffixes, written)
        frontier_grid = _frontiers(found, states, tables, out, formats, suffixes, written)
        if frontier_grid is not None:
            frontier_grids.append(frontier_grid)
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
    if "tex" in formats:
        text = "\n\\bigskip\n\n".join(leaderboard.to_latex(b) for b in boards)
        _write(out / f"{stem}.tex", text, written)
    if "html" in formats:
        from synthbench.report.page import to_html

        _write(out / f"{stem}.html", to_html(boards, frontiers=frontier_grids), written)
    return written


def _of_protocol(replaced: pd.DataFrame | None, tables: ReportTables) -> pd.DataFrame | None:
    """The replaced reference runs of one protocol version (``write_reports``)."""
    if replaced is None or replaced.empty:
        return None
    here = (replaced["protocol"] == tables.protocol) & (
        replaced["protocol_version"].astype(int) == tables.protocol_version
    )
    return replaced[here]
