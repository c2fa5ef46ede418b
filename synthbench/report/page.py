"""The leaderboard as one static, self-contained HTML page.

The page fetches nothing: no CDN, no web fonts, no images. Its CSS and vanilla JS are inline
and the boards travel as JSON in a ``<script type="application/json">`` element, which the
script reads and draws with ``textContent`` (never ``innerHTML``), so a mechanism or task
name is always shown as text, whatever characters it holds.

One table shows one protocol; with several boards a selector switches between them. The
columns sort on a click on their header (a second click reverses), and a category filter
shows that category's per-task columns.
"""

from __future__ import annotations

import html
import json
import math

import pandas as pd

from synthbench.core.text import noun
from synthbench.report.leaderboard import (
    CONFIDENCE,
    DIVERGED_NOTE,
    LEAKY_NOTE,
    ONE_SEED_NOTE,
    Leaderboard,
    interval_notes,
    replaced_note,
)
from synthbench.report.tables import score_note

_CSS = """
:root {
  color-scheme: light dark;
  --fg: #1d2127; --muted: #69707a; --bg: #ffffff; --zebra: #f3f5f8;
  --line: #d8dce2; --accent: #2f5fc4; --head: #eef1f5;
}
@media (prefers-color-scheme: dark) {
  :root {
    --fg: #e4e7eb; --muted: #9aa3ad; --bg: #15171a; --zebra: #1d2024;
    --line: #343940; --accent: #86a8f5; --head: #22262b;
  }
}
body {
  font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial,
    sans-serif;
  color: var(--fg); background: var(--bg); line-height: 1.45;
  max-width: 80rem; margin: 1.5rem auto; padding: 0 1rem;
}
[hidden] { display: none !important; }  /* even where a rule below sets display */
h1 { font-size: 1.5rem; margin: 0 0 .25rem; }
h2 { font-size: 1.05rem; margin: 1.5rem 0 .4rem; }
#meta { color: var(--muted); margin: 0 0 1rem; }
#meta strong { color: var(--fg); }
.controls { display: flex; gap: 1.5rem; flex-wrap: wrap; margin-bottom: .75rem; }
.controls label { display: flex; gap: .4rem; align-items: center; }
select { font: inherit; padding: .15rem .3rem; }
.table-wrap { overflow-x: auto; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: .3rem .65rem; border-bottom: 1px solid var(--line); white-space: nowrap; }
thead th { background: var(--head); border-bottom: 2px solid var(--line);
  vertical-align: bottom; }
th button {
  font: inherit; font-weight: 600; color: inherit; background: none; border: 0;
  padding: 0; cursor: pointer; width: 100%; text-align: inherit;
}
th button:focus-visible { outline: 2px solid var(--accent); outline-offset: 2px; }
th .arrow { display: inline-block; min-width: 1em; margin: 0 .15em; color: var(--accent); }
th.task-col { font-weight: normal; font-style: italic; }
tbody tr:nth-child(even) { background: var(--zebra); }
.num { text-align: right; }
.text { text-align: left; }
.best { font-weight: 700; }
.ci { color: var(--muted); font-size: .85em; font-weight: normal; }
.missing { color: var(--muted); }
.tie { color: var(--accent); cursor: help; margin-left: .3em; font-weight: 700; }
tr.unranked td { color: var(--muted); }
tr.tier-start td { border-top: 2px solid var(--fg); }  /* a new tier, in the rank order */
tr.unranked td.mech { font-style: italic; }
#legend ul { margin: 0; padding-left: 1.2rem; color: var(--muted); }
#legend li { margin: .15rem 0; }
#legend b { color: var(--fg); }
.sr-only { position: absolute; width: 1px; height: 1px; overflow: hidden;
  clip: rect(0 0 0 0); white-space: nowrap; }
"""

# Built with createElement/textContent only: every name comes from the data, never markup.
_JS = """
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("leaderboard-data").textContent);
  var boards = data.boards;
  var CONFIDENCE = data.confidence;  // "95%"
  var state = { board: 0, category: "", key: "rank", dir: "asc" };
  var byId = function (id) { return document.getElementById(id); };
  var missing = function (v) { return v === null || v === undefined; };
  var fmt = function (v) { return missing(v) ? "--" : v.toFixed(3); };
  // synthbench/core/text.py's noun and plural: "1 seed", "3 seeds"
  var noun = function (n, word, many) { return n === 1 ? word : (many || word + "s"); };
  var plural = function (n, word, many) { return n + " " + noun(n, word, many); };
  var TIE = "not significantly above the next-ranked mechanism (paired t-interval of " +
    "the per-seed score differences)";
  var LEAKY = "refused on these tasks as leaky: its output at a position depends on later " +
    "positions (the causality check)";
  var DIVERGED = "runs that diverged at every lr: scored as no right answer, and ranked " +
    "below every mechanism without";

  function el(tag, text, cls) {
    var node = document.createElement(tag);
    if (text !== undefined) node.textContent = text;
    if (cls) node.className = cls;
    return node;
  }

  // The visible columns: the overall view, or one category with its tasks.
  function columns(board) {
    var cols = [
      { key: "rank", label: "rank [" + CONFIDENCE + " CI]", num: true, first: "asc",
        title: "the board's rank, with its " + CONFIDENCE + " interval from the bootstrap " +
          "over tasks and seeds", get: function (r) { return r.rank; } },
      { key: "tier", label: "tier", num: true, first: "asc",
        title: "a new tier begins below a significant step to the next mechanism",
        get: function (r) { return r.tier; } },
      { key: "mechanism", label: "mechanism", num: false, first: "asc",
        get: function (r) { return r.mechanism; } },
      { key: "score", label: "score [95% CI]", num: true, first: "desc", best: true,
        title: "mean over categories, with its Student-t 95% interval over seeds",
        get: function (r) { return r.score; } }
    ];
    board.categories.forEach(function (c, i) {
      if (state.category && state.category !== c) return;
      cols.push({ key: "cat:" + c, label: c, num: true, first: "desc", best: true,
        title: "mean over the " + c + " tasks", get: function (r) { return r.categories[i]; } });
      if (state.category !== c) return;
      board.tasks.forEach(function (t, j) {
        if (t[0] !== c) return;
        cols.push({ key: "task:" + c + "/" + t[1], label: t[1], num: true, first: "desc",
          best: true, cls: "task-col", category: c,
          title: c + " / " + t[1] + ": seed-mean score",
          get: function (r) { return r.tasks[j]; } });
      });
    });
    cols.push({ key: "n_tasks", label: "tasks", num: true, first: "desc",
      title: "tasks with a successful run, out of " + board.tasks.length,
      get: function (r) { return r.n_tasks; } });
    return cols;
  }

  // Missing values sort last in both directions; ties keep the rank order.
  function sorted(board, col, dir) {
    var items = board.rows.map(function (r, i) { return { r: r, i: i, v: col.get(r) }; });
    items.sort(function (a, b) {
      var ma = missing(a.v), mb = missing(b.v);
      if (ma || mb) return ma === mb ? a.i - b.i : (ma ? 1 : -1);
      var c = col.num ? a.v - b.v : String(a.v).localeCompare(String(b.v));
      if (dir === "desc") c = -c;
      return c || a.i - b.i;
    });
    return items.map(function (x) { return x.r; });
  }

  // Best as displayed (3 decimals), so equal-looking values are bold together.
  function bestOf(board, col) {
    var best = null;
    board.rows.forEach(function (r) {
      var v = col.get(r);
      if (missing(v)) return;
      var shown = Math.round(v * 1000);
      if (best === null || shown > best) best = shown;
    });
    return best;
  }

  function renderHead(cols) {
    var tr = byId("leaderboard").tHead.rows[0];
    tr.replaceChildren();
    cols.forEach(function (col) {
      var th = el("th", undefined, (col.num ? "num" : "text") + (col.cls ? " " + col.cls : ""));
      th.scope = "col";
      th.setAttribute("data-key", col.key);
      if (col.category) th.setAttribute("data-category", col.category);
      if (col.title) th.title = col.title;
      var sortedHere = state.key === col.key;
      var up = state.dir === "asc";
      if (sortedHere) th.setAttribute("aria-sort", up ? "ascending" : "descending");
      var button = el("button");
      button.type = "button";
      var arrow = el("span", sortedHere ? (up ? "\\u25B2" : "\\u25BC") : "", "arrow");
      arrow.setAttribute("aria-hidden", "true");
      if (col.num) button.append(arrow, el("span", col.label, "label"));
      else button.append(el("span", col.label, "label"), arrow);
      th.append(button);
      th.addEventListener("click", function () {
        if (state.key === col.key) state.dir = state.dir === "asc" ? "desc" : "asc";
        else { state.key = col.key; state.dir = col.first; }
        render();
      });
      tr.append(th);
    });
  }

  function cell(col, row, board, best) {
    var v = col.get(row);
    var td = el("td", undefined, col.num ? "num" : "text mech");
    td.setAttribute("data-key", col.key);
    td.setAttribute("data-value", missing(v) ? "" : String(v));
    if (col.key === "mechanism") {
      td.append(el("span", row.mechanism, "name"));
      if (row.same_as_next) {
        var tie = el("span", "\\u2248", "tie");
        tie.title = TIE;
        tie.setAttribute("aria-label", TIE);
        td.append(tie);
      }
    } else if (col.key === "rank") {
      td.textContent = missing(v) ? "--" : String(v);
      if (missing(v)) td.title = "unranked: no score on every task";
      if (!missing(row.rank_low)) {
        td.append(el("span", " [" + row.rank_low + ", " + row.rank_high + "]", "ci"));
      }
    } else if (col.key === "tier") {
      td.textContent = missing(v) ? "--" : String(v);
    } else if (col.key === "n_tasks") {
      td.textContent = v + "/" + board.tasks.length +
        (row.leaky_tasks ? ", " + row.leaky_tasks + " leaky" : "") +
        (row.diverged_runs ? ", " + plural(row.diverged_runs, "run") + " diverged" : "");
      if (row.leaky_tasks) td.title = LEAKY;
      if (row.diverged_runs) td.title = DIVERGED;
    } else {
      td.append(el("span", fmt(v), "value"));
      if (col.key === "score" && !missing(row.ci_low)) {
        td.append(el("span", " [" + fmt(row.ci_low) + ", " + fmt(row.ci_high) + "]", "ci"));
      }
    }
    if (missing(v)) td.classList.add("missing");
    if (col.best && !missing(v) && Math.round(v * 1000) === best) td.classList.add("best");
    return td;
  }

  function renderBody(board, cols) {
    var col = cols.filter(function (c) { return c.key === state.key; })[0];
    var best = cols.map(function (c) { return c.best ? bestOf(board, c) : null; });
    var body = byId("leaderboard").tBodies[0];
    body.replaceChildren();
    var inRankOrder = (state.key === "rank" || state.key === "tier") && state.dir === "asc";
    var tier = null;
    sorted(board, col, state.dir).forEach(function (row) {
      var tr = el("tr", undefined, row.complete ? "ranked" : "unranked");
      if (inRankOrder && tier !== null && row.tier !== tier) tr.classList.add("tier-start");
      tier = row.tier;
      tr.setAttribute("data-mechanism", row.mechanism);
      cols.forEach(function (c, i) { tr.append(cell(c, row, board, best[i])); });
      body.append(tr);
    });
  }

  function renderMeta(board) {
    byId("protocol-name").textContent = board.protocol;
    byId("protocol-version").textContent = "v" + board.protocol_version;
    byId("metric").textContent = board.metric;
    byId("n-seeds").textContent = String(board.n_seeds);
    byId("seeds-word").textContent = noun(board.n_seeds, "seed");
    byId("generated").textContent = board.generated;
    document.querySelectorAll(".metric-name").forEach(function (n) {
      n.textContent = board.metric;
    });
    byId("score-note").textContent = board.score_note;
    var ranked = board.rows.filter(function (r) { return r.complete; }).length;
    byId("counts").textContent = ranked + " of " + plural(board.rows.length, "mechanism") +
      " ranked on " + plural(board.tasks.length, "task") + " in " +
      plural(board.categories.length, "category", "categories");
    byId("note-unranked").hidden = ranked === board.rows.length;
    byId("note-leaky").hidden = !board.rows.some(function (r) { return r.leaky_tasks; });
    byId("note-diverged").hidden = !board.rows.some(function (r) { return r.diverged_runs; });
    byId("track-name").textContent = board.track;
    byId("note-one-seed").hidden = board.n_seeds !== 1;  // 0: no success, all unranked
    var notes = byId("board-notes");  // this board's: rank intervals, tiers, replaced runs
    notes.replaceChildren();
    board.notes.forEach(function (text) { notes.append(el("li", text)); });
    byId("caption").textContent = "Leaderboard, protocol " + board.protocol + " v" +
      board.protocol_version + (state.category ? ", category " + state.category : "");
  }

  function renderFilter(board) {
    var select = byId("category-filter");
    select.replaceChildren(el("option", "all categories"));
    select.options[0].value = "";
    board.categories.forEach(function (c) {
      var option = el("option", c);
      option.value = c;
      select.append(option);
    });
    select.value = state.category;
  }

  function render() {
    var board = boards[state.board];
    var cols = columns(board);
    if (!cols.some(function (c) { return c.key === state.key; })) {
      state.key = "rank"; state.dir = "asc";
    }
    renderMeta(board);
    renderHead(cols);
    renderBody(board, cols);
  }

  var protocol = byId("protocol");
  boards.forEach(function (b, i) {
    var option = el("option", b.protocol + " v" + b.protocol_version);
    option.value = String(i);
    protocol.append(option);
  });
  byId("protocol-control").hidden = boards.length < 2;
  protocol.addEventListener("change", function () {
    state = { board: Number(protocol.value), category: "", key: "rank", dir: "asc" };
    renderFilter(boards[state.board]);
    render();
  });
  byId("category-filter").addEventListener("change", function (event) {
    state.category = event.target.value;
    // a category's view opens ranked by that category; "all" goes back to the ranking
    if (state.category) { state.key = "cat:" + state.category; state.dir = "desc"; }
    else { state.key = "rank"; state.dir = "asc"; }
    render();
  });
  renderFilter(boards[0]);
  render();
})();
"""


def _number(value) -> float | None:
    """A float for JSON, None for a missing value (NaN is not JSON)."""
    if value is None or pd.isna(value):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _board_data(board: Leaderboard) -> dict:
    tasks = [(str(c), str(t)) for c, t in board.tasks.index]
    rows = []
    for _, row in board.table.iterrows():
        mechanism = row["mechanism"]
        per_task = board.tasks[mechanism] if mechanism in board.tasks else None
        rows.append(
            {
                "rank": None if pd.isna(row["rank"]) else int(row["rank"]),
                "rank_low": None if pd.isna(row["rank_low"]) else int(row["rank_low"]),
                "rank_high": None if pd.isna(row["rank_high"]) else int(row["rank_high"]),
                "tier": None if pd.isna(row["tier"]) else int(row["tier"]),
                "mechanism": str(mechanism),
                "score": _number(row["score"]),
                "ci_low": _number(row["ci_low"]),
                "ci_high": _number(row["ci_high"]),
                "n_tasks": int(row["n_tasks"]),
                "leaky_tasks": int(row["leaky_tasks"]),
                "diverged_runs": int(row["diverged_runs"]),
                "complete": bool(row["complete"]),
                "same_as_next": bool(row["same_as_next"]),
                "categories": [_number(row.get(c)) for c in board.categories],
                "tasks": [_number(v) for v in per_task.tolist()]
                if per_task is not None
                else [None] * len(tasks),
            }
        )
    return {
        "protocol": str(board.protocol),
        "protocol_version": int(board.protocol_version),
        "track": str(board.track),
        "metric": str(board.metric),
        "score_note": score_note(board.metric),
        "n_seeds": int(board.n_seeds),
        "generated": str(board.generated),
        "categories": [str(c) for c in board.categories],
        "tasks": tasks,
        "rows": rows,
        # what this board's legend adds: how its rank intervals and tiers are made, and the
        # reference runs the user's replaced (the Markdown's notes, word for word)
        "notes": [*interval_notes(board), *filter(None, [replaced_note(board.replaced)])],
    }


def _script_json(data: dict) -> str:
    """JSON that cannot end its <script> element: <, > and & become \\u escapes, which
    JSON.parse reads back as the same characters."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(char, escape)
    # U+2028/9 are valid in JSON strings; escaped anyway so no JS parser chokes on them
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _grid_section(grid) -> str:
    """A report Grid of text cells (a frontier table) as a static HTML table."""
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in [*grid.row_headers, *grid.columns])
    body = "".join(
        "<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in [*labels, *cells]) + "</tr>"
        for labels, cells in zip(grid.rows, grid.cells, strict=True)
    )
    notes = "".join(f"<p>{e(note)}</p>" for note in grid.shown_notes())
    return (
        f'<section class="frontier"><h2>{e(grid.title)}</h2><div class="table-wrap">'
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
        f"{notes}</section>"
    )


def to_html(boards: list[Leaderboard], title: str = "synthbench leaderboard", frontiers=()) -> str:
    """One self-contained HTML page for the boards (one per protocol, switched by a
    selector; a table never mixes protocols), and below them the ``frontiers`` tables
    (report Grids of synthbench/report/frontier.py), one per protocol with a grid of runs."""
    if isinstance(boards, Leaderboard):
        boards = [boards]
    if not boards:
        raise ValueError("no leaderboard to show")
    first = boards[0]
    e = html.escape
    confidence = f"{CONFIDENCE:.0%}"
    data = _script_json({"boards": [_board_data(b) for b in boards], "confidence": confidence})
    # The meta line is written for the first board so it reads right before (or without)
    # the script, which rewrites it when the protocol changes.
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; \
style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>{e(title)}</title>
<style>{_CSS}</style>
</head>
<body>
<header>
<h1>{e(title)}</h1>
<p id="meta">Protocol <strong id="protocol-name">{e(first.protocol)}</strong>
<span id="protocol-version">v{int(first.protocol_version)}</span>
(<span id="track-name">{e(first.track)}</span> track)
&middot; metric <strong id="metric">{e(first.metric)}</strong> on the test set
&middot; up to <strong id="n-seeds">{int(first.n_seeds)}</strong>
<span id="seeds-word">{noun(int(first.n_seeds), "seed")}</span>
&middot; generated <time id="generated">{e(first.generated)}</time><br>
<span id="counts"></span></p>
</header>
<div class="controls">
<label id="protocol-control" hidden>Protocol <select id="protocol"></select></label>
<label>Category <select id="category-filter"></select></label>
</div>
<noscript><p>This page needs JavaScript to draw the table.</p></noscript>
<div class="table-wrap">
<table id="leaderboard">
<caption id="caption" class="sr-only"></caption>
<thead><tr></tr></thead>
<tbody></tbody>
</table>
</div>
<section id="legend">
<h2>How to read this</h2>
<ul>
<li><b>Score</b>: the mean over categories of the mean over the category's tasks of the
seed-mean score of <span class="metric-name">{e(first.metric)}</span>, so every category
weighs the same whatever its number of tasks; the category and task columns are those
means. <span id="score-note">{e(score_note(first.metric))}</span></li>
<li><b>Score [low, high]</b>: the {confidence} Student-t interval over seeds: score &plusmn;
t(n-1) &middot; sd / &radic;n, sd the standard deviation of the per-seed scores (seed s is
the same data and initialisation for every mechanism), n the seeds with a run on every
task.</li>
<li><b>&asymp;</b> after a name: not significantly above the next-ranked mechanism (the
paired {confidence} t-interval of their per-seed score differences reaches 0, or they share
fewer than 2 seeds).</li>
<li id="note-unranked" hidden><b>Unranked</b> (rank --): no score on every task (no
successful run, or no known chance to normalise by); a missing value is shown as --, never
as 0.</li>
<li id="note-leaky" hidden>{e(LEAKY_NOTE)}</li>
<li id="note-diverged" hidden>{e(DIVERGED_NOTE)}</li>
<li id="note-one-seed" hidden>{e(ONE_SEED_NOTE)}</li>
</ul>
<ul id="board-notes"></ul>
<ul>
<li>Click a column header to sort by it, again to reverse; missing values always sort
last. <b>Bold</b>: the best value of a column.</li>
</ul>
</section>
{"".join(_grid_section(g) for g in frontiers)}
<script type="application/json" id="leaderboard-data">{data}</script>
<script>{_JS}</script>
</body>
</html>
"""
