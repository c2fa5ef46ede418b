"""Predictive validity: do our rankings agree with the published language-model quality of
the same mechanisms? (``synthbench report --compare published-lm``)

The published numbers are shipped in synthbench/data/published_lm.csv, one row per (source,
table, scale, tokens, model, metric), with the text each number was read from. For every
protocol (each track its own: ``quick`` and ``quick-block`` are compared separately) and every
published table and scale, the PRE-DECLARED Spearman rank correlations below are computed over
the mechanisms both cover, with an exact one-sided permutation p-value. Our side is the
leaderboard's own (synthbench/report/leaderboard.py): its score, and its Memory column (the
mean over the Memory tasks of the per-task score the leaderboard averages). Nothing is scored
here anew.

With 2 to 6 mechanisms per table such a correlation is weak evidence whatever its value: every
grid says how weak (the smallest p any ordering could reach). The pooled measure over every
table's pairwise orderings, with its sign test, is synthbench/report/published_orderings.py.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from importlib import resources

import numpy as np
import pandas as pd

from synthbench.core.text import plural
from synthbench.report import published_orderings
from synthbench.report.leaderboard import Leaderboard
from synthbench.report.reference import SUFFIX
from synthbench.report.tables import MISSING, Grid
from synthbench.report.tracks import at_defaults

NAME = "published-lm"  # the --compare name (synthbench/report/compare.py)
DATA_FILE = "published_lm.csv"
MIN_MECHANISMS = 3  # a protocol is compared where at least this many mechanisms are covered
MEMORY = "Memory"  # the leaderboard's category column our recall side is read from
RECALL_TASKS = ("swde", "squad", "fda")  # the recall average where a table prints none
LABELS = {
    "wiki_ppl": "Wiki ppl",
    "pile_ppl": "Pile ppl",
    "valid_ppl": "valid ppl",
    "avg_acc": "avg acc",
    "recall_avg": "recall avg",
}


@dataclass(frozen=True)
class Declared:
    label: str
    ours: str  # "score" (the leaderboard's) or a leaderboard category column (MEMORY)
    published: str  # a metric of the data file (recall_avg: printed, else RECALL_TASKS' mean)
    sign: int  # +1: higher is better; -1: lower is better, correlated as -value


# PRE-DECLARED: these correlations were declared before any of our results was compared with
# a published number (the predictive-validity issue), and are never changed to raise a figure.
# A correlation that comes out weak or negative is reported as it is: a measurement.
# The two perplexities after the first three were declared with the tables that print no Wiki
# perplexity (the Based and Mamba-2 papers' Pile test perplexity, the RetNet paper's in-domain
# validation perplexity; issue 72 part 5), before any of those tables was compared.
DECLARED = (
    Declared("score vs -Wiki ppl", "score", "wiki_ppl", -1),
    Declared("score vs avg acc", "score", "avg_acc", +1),
    Declared("Memory vs recall avg", MEMORY, "recall_avg", +1),
    Declared("score vs -Pile ppl", "score", "pile_ppl", -1),
    Declared("score vs -valid ppl", "score", "valid_ppl", -1),
)
NOT_IN_SYNTHBENCH = "(not in synthbench: left out of the correlation)"


def load() -> pd.DataFrame:
    """The published rows; ``mechanism`` is "" where synthbench has no such mechanism and
    ``text`` is the value as printed."""
    with resources.files("synthbench.data").joinpath(DATA_FILE).open() as f:
        data = pd.read_csv(f, comment="#", dtype=str, keep_default_na=False)
    return data.assign(text=data["value"], value=data["value"].astype(float))


def published_tables(data: pd.DataFrame) -> dict[tuple[str, str, str, str], pd.DataFrame]:
    """Per (source, table, scale, tokens), its models in the file's order: model, role,
    mechanism, and one column per metric (the value as printed, "" where the table has none),
    recall_avg filled in as the mean of RECALL_TASKS where the table prints no average."""
    keys = ["source", "table", "scale", "tokens"]
    found = {}
    for key, part in data.groupby(keys, sort=False):
        models = list(dict.fromkeys(part["model"]))
        wide = part.pivot(index="model", columns="metric", values="text").reindex(models)
        wide = wide.fillna("")
        first = part.drop_duplicates("model").set_index("model").reindex(models)
        wide.insert(0, "role", first["role"])
        wide.insert(1, "mechanism", first["mechanism"])
        printed = "recall_avg" in wide
        if not printed and all(t in wide for t in RECALL_TASKS):
            means = [
                repr(float(np.mean([float(r[t]) for t in RECALL_TASKS])))
                if all(r[t] for t in RECALL_TASKS)
                else ""
                for _, r in wide.iterrows()
            ]
            wide["recall_avg"] = means
        wide = wide.reset_index()
        wide.attrs["recall_printed"] = printed
        found[key] = wide
    return found


def average_ranks(values) -> np.ndarray:
    """Ranks 1..n of ``values``, 1 the smallest; tied values share the mean of their ranks."""
    values = np.asarray(values, float)
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[order[j + 1]] == values[order[i]]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x, y) -> float:
    """Spearman's rho: Pearson's correlation of the average ranks (ties handled); NaN below 2
    values or where either side is all tied."""
    if len(x) < 2:
        return math.nan
    rx, ry = average_ranks(x), average_ranks(y)
    dx, dy = rx - rx.mean(), ry - ry.mean()
    denominator = math.sqrt(float((dx * dx).sum() * (dy * dy).sum()))
    return math.nan if denominator == 0 else float((dx * dy).sum() / denominator)


def permutation_p(x, y) -> tuple[float, float]:
    """The exact one-sided p-value of a positive association: the share of all n! orderings
    of ``y`` against ``x`` whose rho is at least the observed one; and the smallest p any
    ordering could give (1/n! without ties). NaN where rho is undefined."""
    observed = spearman(x, y)
    if math.isnan(observed):
        return math.nan, math.nan
    rhos = [spearman(x, p) for p in itertools.permutations(y)]
    eps = 1e-9
    top = max(rhos)
    p = sum(r >= observed - eps for r in rhos) / len(rhos)
    return p, sum(r >= top - eps for r in rhos) / len(rhos)


@dataclass(frozen=True)
class Ours:
    label: str  # as the leaderboard shows it (a reference run: "softmax (reference)")
    score: float  # NaN where the leaderboard does not rank it
    memory: float


def ours(board: Leaderboard) -> dict[str, Ours]:
    """Per registered mechanism name, the board's score and Memory mean: the user's own runs
    where the board has both them and the shipped reference's; a variant run with other
    parameters ("name (k=v)") is never taken for the mechanism, while a label that only shows
    its track's defaults is (tracks.at_defaults)."""
    found: dict[str, Ours] = {}
    for _, r in board.table.iterrows():
        label = str(r["mechanism"])
        name = at_defaults(label, board.protocol).removesuffix(SUFFIX)
        if " (" in name or (name in found and label.endswith(SUFFIX)):
            continue
        memory = float(r[MEMORY]) if MEMORY in board.table else math.nan
        found[name] = Ours(label, float(r["score"]), memory)
    return found


def covered(board: Leaderboard, data: pd.DataFrame) -> list[str]:
    """The mechanisms of the published tables' correlated rows that the board ranks."""
    mine = ours(board)
    main = data[(data["role"] == "main") & (data["mechanism"] != "")]
    named = dict.fromkeys(main["mechanism"])
    return [m for m in named if m in mine and not math.isnan(mine[m].score)]


@dataclass(frozen=True)
class Correlation:
    declared: Declared
    mechanisms: list[str]  # those both cover
    rho: float
    p: float
    p_min: float
    ours_order: list[str]  # best first
    theirs_order: list[str]

    @property
    def n(self) -> int:
        return len(self.mechanisms)


def _order(names: list[str], values: list[float]) -> list[str]:
    """``names`` best (highest value) first; ties joined with '='."""
    groups: dict[float, list[str]] = {}
    for name, value in sorted(zip(names, values, strict=True), key=lambda nv: -nv[1]):
        groups.setdefault(value, []).append(name)
    return [" = ".join(g) for g in groups.values()]


def correlate(declared: Declared, table: pd.DataFrame, mine: dict[str, Ours]) -> Correlation:
    """One declared correlation over the main rows of one published table."""
    names, x, y = [], [], []
    if declared.published in table:
        for _, r in table[(table["role"] == "main") & (table["mechanism"] != "")].iterrows():
            ours_value = _our_value(mine.get(r["mechanism"]), declared.ours)
            if r[declared.published] == "" or ours_value is None:
                continue
            names.append(r["mechanism"])
            x.append(ours_value)
            y.append(declared.sign * float(r[declared.published]))
    if len(names) < 3:
        rho = p = p_min = math.nan
    else:
        rho = spearman(x, y)
        p, p_min = permutation_p(x, y)
    return Correlation(declared, names, rho, p, p_min, _order(names, x), _order(names, y))


def _our_value(mine: Ours | None, which: str) -> float | None:
    if mine is None or math.isnan(mine.score):  # unranked: no score of ours to correlate
        return None
    value = mine.score if which == "score" else mine.memory
    return None if math.isnan(value) else value


def reading(c: Correlation) -> str:
    """How much a correlation says, in words."""
    if c.n < 3:
        return f"too few mechanisms ({c.n}): correlation undefined"
    if math.isnan(c.rho):
        return "undefined: one side ties every mechanism"
    if c.p_min > 0.05:
        return f"no ordering of {c.n} reaches p of 0.05 or below: weak whatever rho"
    if c.p <= 0.05:
        return f"positive at the one-sided 5% level, over only {c.n} mechanisms"
    return "not significant (p above 0.05)"


def _f(value: float, digits: int = 2) -> str:
    return MISSING if value is None or math.isnan(value) else f"{value:.{digits}f}"


def summary_grid(board: Leaderboard, results: list[tuple[str, Correlation]]) -> Grid:
    rows = [(where, c.declared.label) for where, c in results]
    cells = [
        [
            str(c.n),
            _f(c.rho),
            _f(c.p, 3),
            _f(c.p_min, 3),
            ", ".join(c.ours_order) or MISSING,
            ", ".join(c.theirs_order) or MISSING,
            reading(c),
        ]
        for _, c in results
    ]
    notes = [
        f"Ours: the leaderboard of protocol {board.protocol} v{board.protocol_version} "
        f"({board.track} track), {board.metric}: its score, and its Memory column (the mean over "
        "the Memory tasks of the per-task score the score averages). Published: "
        "synthbench/data/published_lm.csv (the text each number was read from is recorded "
        "there).",
        "Pre-declared (synthbench/report/published_lm.py, DECLARED): per published table and "
        "scale, Spearman's rho over the mechanisms both cover of our score with -Wiki "
        "perplexity (lower perplexity is better; the Pile test or in-domain validation "
        "perplexity where that is what the table prints) and with the average zero-shot "
        "accuracy, and of our Memory score with the published recall average. Ties take "
        "average ranks.",
        "p: exact one-sided permutation p-value of a positive association, over all n! "
        "orderings. With n = 4 the smallest attainable p is 1/24 = 0.042, with n = 5 1/120 = "
        "0.008: with so few mechanisms even a perfect agreement is weak evidence, and the "
        "published numbers are single training runs without error bars.",
        "ours, published: the mechanisms in order, best first (highest score, lowest "
        "perplexity, highest accuracy or recall); '=' joins a tie.",
    ]
    return Grid(
        f"Published LM quality beside our ranking: protocol {board.protocol}",
        ["published table", "correlation"],
        rows,
        ["n", "rho", "p (one-sided)", "smallest p", "ours", "published", "reading"],
        cells,
        0,
        best=None,
        notes=notes,
    )


def table_grid(where: str, table: pd.DataFrame, board: Leaderboard, mine: dict[str, Ours]) -> Grid:
    """One published table's models beside our score and Memory score, with the ranks each
    side gives the mechanisms the correlations use; every published row is shown."""
    metrics = [d.published for d in DECLARED if d.published in table]
    in_corr = {
        r["mechanism"]
        for _, r in table.iterrows()
        if r["role"] == "main" and _our_value(mine.get(r["mechanism"]), "score") is not None
    }
    used = table[table["mechanism"].isin(in_corr) & (table["role"] == "main")]

    def ranks(values: dict[str, float]) -> dict[str, float]:
        names = [n for n, v in values.items() if v is not None]
        return dict(zip(names, average_ranks([-values[n] for n in names]), strict=True))

    our_scores = {m: _our_value(mine.get(m), "score") for m in used["mechanism"]}
    our_memory = {m: _our_value(mine.get(m), MEMORY) for m in used["mechanism"]}
    their = {
        d.published: {
            r["mechanism"]: d.sign * float(r[d.published]) if r[d.published] else None
            for _, r in used.iterrows()
        }
        for d in DECLARED
        if d.published in metrics
    }
    rank_of = {"score": ranks(our_scores), MEMORY: ranks(our_memory)}
    rank_of |= {metric: ranks(values) for metric, values in their.items()}

    def rank(which: str, mechanism: str) -> str:
        value = rank_of[which].get(mechanism)
        return MISSING if value is None else f"{value:g}"

    rows, cells = [], []
    for _, r in table.iterrows():
        m = r["mechanism"]
        mine_m = mine.get(m)
        if r["role"] == "hybrid":
            note = "(hybrid: left out of the correlation)"
        elif not m:
            note = NOT_IN_SYNTHBENCH
        elif r["role"] == "variant":
            note = f"(another {m} variant: left out of the correlation)"
        elif mine_m is None:
            note = f"(no rows of ours under {board.protocol}: left out of the correlation)"
        elif m not in in_corr:
            note = "(not ranked by our leaderboard: left out of the correlation)"
        else:
            note = ""
        ours_here = m in in_corr and r["role"] == "main"
        row = [
            mine_m.label if mine_m is not None and m else (m or MISSING),
            _f(mine_m.score, 3) if ours_here else MISSING,
            rank("score", m) if ours_here else MISSING,
            _f(mine_m.memory, 3) if ours_here else MISSING,
            rank(MEMORY, m) if ours_here else MISSING,
        ]
        for metric in metrics:
            text = r[metric]
            if text and metric == "recall_avg" and not table.attrs.get("recall_printed"):
                text = f"{float(text):.2f}"  # our mean of three, shown to two decimals
            row += [text or MISSING, rank(metric, m) if ours_here else MISSING]
        rows.append((r["model"],))
        cells.append([*row, note])
    columns = ["ours", "score", "rank", "Memory", "rank"]
    for metric in metrics:
        columns += [LABELS[metric], "rank"]
    recall = (
        "recall avg: as the table prints it"
        if table.attrs.get("recall_printed")
        else "recall avg: the mean of SWDE, SQuAD, FDA (the table prints none)"
    )
    notes = [
        "rank: 1 = best (highest score, lowest perplexity, highest accuracy or recall) among "
        "the mechanisms the correlations use; tied values share the mean rank.",
        recall if "recall_avg" in metrics else "",
        f"{plural(len(used), 'mechanism')} compared here; every published row is shown.",
    ]
    return Grid(
        f"{where}: published models beside protocol {board.protocol}",
        ["published model"],
        rows,
        [*columns, "note"],
        cells,
        0,
        best=None,
        notes=[n for n in notes if n],
    )


def grids(board: Leaderboard, data: pd.DataFrame | None = None) -> list[Grid]:
    """The comparison of one protocol's leaderboard: the correlations, the pooled orderings
    (published_orderings), then one grid per published table; [] where fewer than
    MIN_MECHANISMS mechanisms are covered."""
    data = load() if data is None else data
    if len(covered(board, data)) < MIN_MECHANISMS:
        return []
    mine = ours(board)
    published = published_tables(data)
    results, tables = [], []
    for (source, table, scale, tokens), wide in published.items():
        where = f"{source} {table}, {scale}/{tokens}"
        results += [(where, correlate(d, wide, mine)) for d in DECLARED if d.published in wide]
        tables.append(table_grid(where, wide, board, mine))
    pooled = published_orderings.grids(
        board.protocol, published, DECLARED, lambda m, which: _our_value(mine.get(m), which)
    )
    return [summary_grid(board, results), *pooled, *tables]
