"""The leaderboard: mechanisms ranked by their mean category score, with a Student-t 95%
interval over seeds and a mark where two neighbours are not told apart.

A mechanism's score is the mean over categories of the mean over the category's tasks of
its seed-mean score (chance-normalised where the metric has a chance: ``report.score_note``),
so every category weighs the same whatever its number of tasks.

Seed s is the same data stream and initialisation seed for every mechanism, so the score
of one seed (the same mean over categories of that seed's task scores) is comparable across
mechanisms. The score's interval is the t-interval of the per-seed scores (a bootstrap over
3 seeds alone, the usual count, has only 10 distinct resamples); the ≈ mark is the paired
t-interval of two neighbours' per-seed score differences. How sure the order is, over tasks
and seeds together, is the rank interval and the tiers (synthbench/report/rank_intervals.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import date

import numpy as np
import pandas as pd

from synthbench.core.task import CATEGORIES
from synthbench.core.text import plural
from synthbench.report import rank_intervals
from synthbench.report.aggregate import CHANCE_COLUMN, LEVEL, normalise
from synthbench.report.formats import latex_escape, latex_notes, markdown_table
from synthbench.report.tables import score_note, track_text

CONFIDENCE = 0.95


def _t_within(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` (a positive integer) degrees of freedom, in
    closed form (Abramowitz and Stegun 26.7.3 and 26.7.4): no scipy needed."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:  # odd: (2/pi) (theta + sin cos (1 + 2/3 cos^2 + 2.4/3.5 cos^4 + ...))
        term = total = 1.0
        for k in range(3, df - 1, 2):
            term *= c2 * (k - 1) / k
            total += term
        series = math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0
        return 2 / math.pi * (theta + series)
    term = total = 1.0  # even: sin (1 + 1/2 cos^2 + 1.3/2.4 cos^4 + ...)
    for k in range(2, df - 1, 2):
        term *= c2 * (k - 1) / k
        total += term
    return math.sin(theta) * total


def t_critical(df: int, confidence: float = CONFIDENCE) -> float:
    """The two-sided critical value of Student's t: P(|T| <= t) = ``confidence`` (12.706
    for df 1, 4.303 for 2, 2.262 for 9 at 95%), by bisection on the closed form."""
    low, high = 0.0, 1.0
    while _t_within(high, df) < confidence:
        high *= 2
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if _t_within(middle, df) < confidence else (low, middle)
    return (low + high) / 2


def t_half_width(values, confidence: float = CONFIDENCE) -> float:
    """Half the width of the t-interval of the mean of ``values`` (NaN below 2 values)."""
    values = np.asarray(values, float)
    n = len(values)
    if n < 2:
        return np.nan
    return t_critical(n - 1, confidence) * float(values.std(ddof=1)) / math.sqrt(n)


@dataclass
class Leaderboard:
    protocol: str
    protocol_version: int
    metric: str
    n_seeds: int  # the most seeds any (task, mechanism) has
    categories: list[str]  # the categories present, in the suite's order
    tasks: pd.DataFrame  # (category, task) index, mechanism columns: seed-mean score or NaN
    # one row per mechanism, in rank order: rank (None for incomplete ones), mechanism,
    # score, ci_low, ci_high (NaN below 2 seeds), ci_seeds (the seeds the interval is over),
    # same_as_next (not significantly above the next one), n_tasks, leaky_tasks (refused as
    # leaky: it sees later positions), diverged_runs (scored as no right answer), complete,
    # fewest_seeds (the fewest seeds of its cells), then one column per category with its
    # mean, then rank_low, rank_high (the bootstrap's rank interval) and tier (NA where the
    # board has no bootstrap: one seed; and for unranked mechanisms)
    table: pd.DataFrame
    # seed index, mechanism columns: the per-seed score (NaN where the seed lacks a task)
    per_seed: pd.DataFrame
    generated: str = field(default_factory=lambda: date.today().isoformat())
    track: str = "core"  # synthbench/run/protocols.py: the rule alone, or published layers
    draws: int = 0  # the bootstrap's draws (rank_intervals.DRAWS), 0 where none was drawn
    # the reference runs the user's runs replaced (the same run id): task, mechanism, seed
    # (synthbench/report/reference.py ``replaced_runs``), named in the notes
    replaced: pd.DataFrame | None = None
    # per mechanism, the state its runs stored (``aggregate.stored_states``), which the state
    # column shows; a mechanism without: its registered declaration (``declared_state``)
    states: dict[str, int] = field(default_factory=dict)
    # the tasks scored over their ladders (one value per level: aggregate.selected_runs)
    laddered: tuple[str, ...] = ()


def _category_scores(task_means: np.ndarray, task_categories: list[str], categories: list[str]):
    """(..., tasks) task means -> (..., categories) category means and (...) overall score."""
    per_category = np.stack(
        [
            task_means[..., [i for i, c in enumerate(task_categories) if c == category]].mean(-1)
            for category in categories
        ],
        axis=-1,
    )
    return per_category, per_category.mean(-1)


def _lowest_scores(runs: pd.DataFrame, columns: pd.MultiIndex, metric: str) -> np.ndarray:
    """Per (category, task) of ``columns``, the score of a run with no answer right: 0, or
    where ``metric`` is normalised by a chance c, -c / (1 - c) (-inf where c is unknown)."""
    if metric not in CHANCE_COLUMN:
        return np.zeros(len(columns))
    if "chance" not in runs:
        return np.full(len(columns), -np.inf)
    chance = runs.groupby(["category", "task"])["chance"].mean().reindex(columns).to_numpy()
    return np.nan_to_num(normalise(np.zeros(len(columns)), chance), nan=-np.inf)


def same_as_next(upper: pd.Series, lower: pd.Series) -> bool:
    """Whether ``upper`` is not significantly above ``lower`` (per-seed scores, indexed by
    seed): the paired t-interval of their differences over the seeds both have reaches 0,
    or they share fewer than 2 seeds (nothing can be told then)."""
    differences = (upper - lower).dropna()
    if len(differences) < 2:
        return True
    return bool(differences.mean() - t_half_width(differences) <= 0)


def build(
    runs: pd.DataFrame,
    protocol: str,
    protocol_version: int,
    metric: str,
    mechanisms: list[str] | None = None,
    tasks: list[tuple[str, str]] | None = None,
    leaky_tasks: dict[str, int] | None = None,
    diverged: pd.DataFrame | None = None,
    track: str = "core",
    replaced: pd.DataFrame | None = None,
    intervals: bool = True,
    states: dict[str, int] | None = None,
) -> Leaderboard:
    """``runs``: one row per successful run of one protocol version, with columns category,
    task, mechanism, seed and score (``report.selected_runs``). A run whose score is NaN (no
    known chance) counts as missing: its mechanism is listed, not ranked. ``mechanisms`` and
    ``tasks`` ((category, task) pairs) are those of the report, with the ones that have no
    successful run (listed unranked; default: those of ``runs``). ``leaky_tasks``: per
    mechanism, the tasks its runs were refused on as leaky (``ReportTables.leaky_tasks``),
    shown beside its task count. ``diverged``: the runs that diverged at every lr (category,
    task, mechanism, seed; ``ReportTables.diverged``): each scores what no right answer
    scores on its task, and a mechanism with any is ranked below every one without, so a
    layer that diverges is never dropped from the ranking nor lifted by its surviving seeds.
    ``track``: the track the board shows, said in its notes. ``replaced``: the reference
    runs the user's runs of the same run id replaced (task, mechanism, seed), said in its
    notes. With ``intervals`` and 2 seeds or more, the ranked mechanisms get a rank interval
    and a tier (synthbench/report/rank_intervals.py). ``states``: per mechanism, the state
    its runs stored (``ReportTables.states``), shown in the state column."""
    order = {c: i for i, c in enumerate(CATEGORIES)}
    diverged = _no_diverged() if diverged is None else diverged[_DIVERGED_KEYS]
    tasks = sorted(
        set(zip(runs["category"], runs["task"], strict=True)) | set(tasks or ()),
        key=lambda ct: (order.get(ct[0], 99), ct[1]),
    )
    task_categories = [c for c, _ in tasks]
    categories = sorted(set(task_categories), key=lambda c: order.get(c, 99))
    mechanisms = sorted(set(runs["mechanism"]) | set(diverged["mechanism"]) | set(mechanisms or ()))
    # per mechanism, seeds x tasks; a task it lacks is a column of NaN
    scored = runs.dropna(subset=["score"])
    columns = pd.MultiIndex.from_tuples(tasks, names=["category", "task"])
    # the score's range, that the interval is kept within: every task scores at most 1, and
    # at least what no right answer scores (below 0 where normalised by a chance)
    lowest_per_task = _lowest_scores(scored, columns, metric)
    floor = dict(zip(columns, lowest_per_task, strict=True))
    diverged = diverged.assign(
        score=[
            floor.get((c, t), -np.inf)
            for c, t in zip(diverged["category"], diverged["task"], strict=True)
        ]
    )
    diverged_runs = diverged.groupby("mechanism").size()
    # a diverged run on a task without a known floor stays missing (its mechanism unranked)
    scored = pd.concat([scored, diverged[np.isfinite(diverged["score"])]], ignore_index=True)
    by_mechanism = {
        m: part.pivot_table(index="seed", columns=["category", "task"], values="score")
        for m, part in scored.groupby("mechanism")
    }

    lowest = _category_scores(lowest_per_task, task_categories, categories)[1]
    means, per_seed, seeds, rows = {}, {}, {}, []
    for m in mechanisms:
        mine = by_mechanism.get(m, pd.DataFrame()).reindex(columns=columns)
        seeds[m] = mine
        means[m] = mine.mean(axis=0).to_numpy()
        complete = bool(len(mine)) and not np.isnan(means[m]).any()
        # the seeds with a score on every task
        full = mine.dropna()
        seed_scores = _category_scores(full.to_numpy(), task_categories, categories)[1]
        per_seed[m] = pd.Series(seed_scores, index=full.index, dtype=float)
        per_category, score = _category_scores(means[m], task_categories, categories)
        # centred on the score; the spread is that of the per-seed scores
        half = t_half_width(per_seed[m]) if complete else np.nan
        rows.append(
            {
                "mechanism": m,
                "score": float(score) if complete else np.nan,
                "ci_low": float(max(score - half, lowest)) if complete else np.nan,
                "ci_high": float(min(score + half, 1.0)) if complete else np.nan,
                "ci_seeds": len(per_seed[m]),
                "n_tasks": int((~np.isnan(means[m])).sum()),
                "leaky_tasks": int((leaky_tasks or {}).get(m, 0)),
                "diverged_runs": int(diverged_runs.get(m, 0)),
                "complete": complete,
                "fewest_seeds": int(mine.notna().sum().min()) if len(mine) else 0,
                **{c: float(s) for c, s in zip(categories, per_category, strict=True)},
            }
        )
    fields = ["mechanism", "score", "ci_low", "ci_high", "ci_seeds", "n_tasks", "leaky_tasks",
              "diverged_runs", "complete", "fewest_seeds"]  # fmt: skip
    table = pd.DataFrame(rows, columns=[*fields, *categories])  # the columns even when empty
    table = (
        table.assign(any_diverged=table["diverged_runs"] > 0)
        .sort_values(
            ["complete", "any_diverged", "score", "mechanism"],
            ascending=[False, True, False, True],
        )
        .drop(columns="any_diverged")
        .reset_index(drop=True)
    )
    ranks = [i + 1 if ok else None for i, ok in enumerate(table["complete"])]
    table.insert(0, "rank", pd.array(ranks, dtype="Int64"))
    table["same_as_next"] = False
    ranked = table[table["complete"]]["mechanism"].tolist()
    for i, (upper, lower) in enumerate(zip(ranked, ranked[1:], strict=False)):
        table.loc[i, "same_as_next"] = same_as_next(per_seed[upper], per_seed[lower])
    # 0 for a protocol with no successful run
    n_seeds = int(runs.groupby(["category", "task", "mechanism"]).size().max()) if len(runs) else 0
    for column in ("rank_low", "rank_high", "tier"):
        table[column] = pd.array([None] * len(table), dtype="Int64")
    draws = 0
    if intervals and n_seeds >= 2 and ranked:  # one seed: nothing to resample or compare
        draws = rank_intervals.DRAWS
        cells = [[seeds[m][task].dropna().to_numpy() for task in columns] for m in ranked]
        drawn = rank_intervals.draw_ranks(
            cells, task_categories, [int(r > 0) for r in table["diverged_runs"][: len(ranked)]]
        )
        for i in range(len(ranked)):
            low, high = rank_intervals.rank_interval(drawn.ranks[:, i], CONFIDENCE)
            table.loc[i, ["rank_low", "rank_high"]] = [low, high]
        next_same = table["same_as_next"][: len(ranked)].tolist()
        table.loc[: len(ranked) - 1, "tier"] = rank_intervals.tiers(drawn, next_same, CONFIDENCE)
    return Leaderboard(
        protocol,
        protocol_version,
        metric,
        n_seeds,
        categories,
        pd.DataFrame(means, index=columns),
        table,
        pd.DataFrame(per_seed).sort_index(),
        track=track,
        draws=draws,
        replaced=replaced,
        states=dict(states or {}),
        laddered=tuple(sorted(set(runs.loc[runs[LEVEL] != "", "task"]))) if LEVEL in runs else (),
    )


_DIVERGED_KEYS = ["category", "task", "mechanism", "seed"]


def _no_diverged() -> pd.DataFrame:
    return pd.DataFrame(
        {k: pd.Series(dtype=int if k == "seed" else object) for k in _DIVERGED_KEYS}
    )


def _interval(row) -> str:
    if not row["complete"]:
        return "--"
    if pd.isna(row["ci_low"]):
        return f"{row['score']:.3f}"
    return f"{row['score']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"


def rank_text(row) -> str:
    """A mechanism's rank and its bootstrap interval: "3 [2, 6]"; "" when unranked."""
    if pd.isna(row["rank"]):
        return ""
    if pd.isna(row["rank_low"]):
        return str(int(row["rank"]))
    return f"{int(row['rank'])} [{int(row['rank_low'])}, {int(row['rank_high'])}]"


def tier_text(row) -> str:
    return "" if pd.isna(row["tier"]) else str(int(row["tier"]))


def rank_note(board: Leaderboard) -> str:
    """How the rank interval is drawn (docs/REPORTS.md, "Rank intervals and tiers")."""
    tail = round(board.draws * (1 - CONFIDENCE) / 2)
    return (
        f"Rank [{CONFIDENCE:.0%} CI]: the board's rank, and its interval from a bootstrap over "
        f"tasks and seeds ({board.draws:,} draws, numpy default_rng({rank_intervals.SEED})): "
        "each draw takes, within each category, as many of its tasks as it has, at random "
        "with replacement, and for each drawn task each mechanism's seeds likewise; the score "
        "is recomputed and the mechanisms ranked (tied scores share the better rank; one "
        "with diverged runs stays below every one without); the interval runs from the "
        f"{tail:,}th to the {board.draws - tail:,}th of a mechanism's {board.draws:,} ranks, "
        "sorted."
    )


TIER_NOTE = (
    "Tier: a new tier begins below a mechanism that is significantly above the next one on "
    f"both tests: fewer than {(1 - CONFIDENCE) / 2:.1%} of the bootstrap's draws have the next "
    "at or above it (other tasks would keep the step), and the paired t-test over seeds tells "
    "them apart (no ≈: other seeds would keep it)."
)
ONE_SEED_NOTE = (
    "One seed: no interval (score or rank) and no tiers, since both resample or compare "
    "seeds; and no two mechanisms can be told apart (≈)."
)


def interval_notes(board: Leaderboard) -> list[str]:
    """How the rank intervals and tiers are made, where the board has them (2 seeds or
    more), and which mechanisms' intervals miss a seed spread (a cell of one seed)."""
    if not board.draws:
        return []
    notes = [rank_note(board), TIER_NOTE]
    one_seed = board.table[board.table["rank_low"].notna() & (board.table["fewest_seeds"] < 2)]
    if len(one_seed):
        notes.append(
            f"One seed on some task ({', '.join(one_seed['mechanism'])}): such a cell gives "
            "its one value in every draw, so the rank interval holds the spread over tasks "
            "but not over its seeds."
        )
    return notes


def notes(board: Leaderboard) -> list[str]:
    """The footnotes of the ranking, as sentences (the Markdown's and the LaTeX's; the page
    says the same)."""
    notes = [
        f"Protocol {board.protocol} v{board.protocol_version}, {TRACK_TEXT[board.track]}; "
        f"{board.metric} on the test set, up to {plural(board.n_seeds, 'seed')}; generated "
        f"{board.generated}.",
        "Score: mean over categories of the mean over their tasks of the seed-mean score; "
        "the category columns are those means. " + score_note(board.metric),
        f"Score interval: {CONFIDENCE:.0%} Student-t over seeds: score ± t(n-1) · sd / √n, sd "
        "the standard deviation of the per-seed scores (seed s: the same data and "
        "initialisation for every mechanism), n the seeds with a run on every task; cut to the "
        "score's range (at most 1).",
        "≈: not significantly above the next mechanism: the paired "
        f"{CONFIDENCE:.0%} t-interval of their per-seed score differences reaches 0 (or they "
        "share fewer than 2 seeds).",
    ]
    if board.laddered:
        notes.append(ladder_note(board.laddered))
    notes += interval_notes(board)
    if not board.table["complete"].all():
        notes.append(
            "Unranked: a mechanism without a score on every task (no successful run, or no "
            "known chance to normalise by)."
        )
    if board.table["leaky_tasks"].any():
        notes.append(LEAKY_NOTE)
    if board.table["diverged_runs"].any():
        notes.append(DIVERGED_NOTE)
    replaced = replaced_note(board.replaced)
    if replaced:
        notes.append(replaced)
    if not board.n_seeds:
        notes.append("No successful run: nothing is ranked.")
    elif board.n_seeds < 2:
        notes.append(ONE_SEED_NOTE)
    return notes


def ladder_note(tasks: tuple[str, ...]) -> str:
    """What a laddered task's score and seeds are, on a board that has some."""
    return (
        f"Ladders ({plural(len(tasks), 'task')}: {', '.join(tasks)}): a task's score is the "
        "mean over its difficulty levels; its seeds are dealt to its levels, one value per "
        "level under the seed it ran at, so a seed's score mixes levels across tasks, and an "
        "interval over seeds holds the spread across levels as well as the seeds' "
        '(docs/TASKS.md, "Ladders").'
    )


def _seed_list(seeds) -> str:
    seeds = sorted(int(s) for s in seeds)
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"


def replaced_note(replaced: pd.DataFrame | None) -> str | None:
    """What the board says of the reference runs the user's runs replaced (the same run id:
    the same configuration), so that a reference cell with fewer seeds is explained where
    it is shown; None: none was."""
    if replaced is None or replaced.empty:
        return None
    parts = []
    for mechanism, mine in replaced.groupby("mechanism", sort=True):
        tasks = mine.groupby("task", sort=True)["seed"].unique()
        if len(tasks) <= 4:
            where = ", ".join(f"{task} ({_seed_list(s)})" for task, s in tasks.items())
        else:
            where = f"{plural(len(tasks), 'task')} ({plural(len(mine), 'run')})"
        parts.append(f"{mechanism} on {where}")
    one = len(replaced) == 1
    return (
        f"Replaced: {plural(len(replaced), 'run')} of yours "
        f"{'has' if one else 'have'} the configuration (the run id) of a shipped reference "
        f"run; yours {'is' if one else 'are'} shown and the reference's left out, so its "
        f"cells there hold fewer seeds: {'; '.join(parts)}."
    )


LEAKY_NOTE = (
    "Leaky: tasks on which the mechanism's runs were refused because its output at a "
    "position depends on later positions (the causality check, `synthbench check`); they "
    "are never scored."
)
DIVERGED_NOTE = (
    "Diverged: runs whose training diverged at every learning rate (stored as diverged). "
    "Each scores what no right answer scores on its task and seed (0, or -chance / (1 - "
    "chance)), and a mechanism with any is ranked below every mechanism without."
)
# what a board's track means, in its notes (synthbench/run/protocols.py)
TRACK_TEXT = {
    "core": "core track (each mechanism's rule alone in the attention-only model)",
    "block": "block track (each mechanism as its published layer in fla's block: an RMSNorm "
    "before the mixer and before the MLP, a final RMSNorm, fla's gated SwiGLU MLP and "
    "N(0, 0.02) init; the attention family as its core there)",
}
# where the leaderboard quotes each mechanism's state: the length the rows' state_size is
# measured at (synthbench/core/mechanism.py STATE_LENGTH; a test checks they agree)
STATE_LENGTH = 1024


def declared_state(label: str, protocol: str) -> int | None:
    """What a mechanism declares it carries from one token to the next (``state_size``) at
    length STATE_LENGTH, at its default parameters and the protocol's sizes: per head in the
    core track (its core), per layer in the block track (its published layer's whole state,
    or its core's times the heads where it enters the block as its core). None for a
    mechanism that is not registered here or a variant run with other parameters (``name
    (k=v)``)."""
    # torch: only where a board is written
    from synthbench.core.mechanism import MECHANISMS, layer_state
    from synthbench.run.protocols import PROTOCOLS

    name, _, variant = label.partition(" (")
    if variant not in ("", "reference)") or name not in MECHANISMS or protocol not in PROTOCOLS:
        return None
    preset = PROTOCOLS.get(protocol)
    try:
        size = layer_state(name, preset.d_model, preset.n_heads, preset.arch, None, STATE_LENGTH)
    except Exception:  # a plugin that cannot be built with its defaults: no figure
        return None
    return size if preset.track == "block" else size // preset.n_heads


# where the state column's figure comes from (``_state_text``), said in its note
STATE_SOURCE = (
    "as its runs measured and stored it when they trained, with their parameters (rows "
    "written before schema 9 store none: there, the registered mechanism's declaration at its "
    "default parameters; -- where neither is known)"
)


def state_column(track: str) -> tuple[str, str]:
    """The header of the board's state column and the note that explains it."""
    if track == "block":
        return "state/layer", (
            "state/layer: the numbers one layer carries from one token to the next when "
            "generating (its declared state_size: the published layer's whole state, "
            "convolution windows included, or its core's over every head) at length "
            f"{STATE_LENGTH} and this protocol's sizes, {STATE_SOURCE}; a KV cache "
            "(softmax) grows with the length, a recurrent state does not."
        )
    return "state/head", (
        f"state/head: the numbers a head carries from one token to the next when generating "
        f"(its declared state_size) at length {STATE_LENGTH} and this protocol's head size, "
        f"{STATE_SOURCE}; a KV cache (softmax) grows with the length, a recurrent state "
        "does not."
    )


def tasks_leaky(n: int, diverged: int = 0) -> str:
    """What follows a mechanism's task count where it was refused as leaky, or where runs
    of it diverged."""
    return (f", {n} leaky" if n else "") + (
        f", {plural(diverged, 'run')} diverged" if diverged else ""
    )


def _state_text(board: Leaderboard, mechanism: str) -> str:
    """The stored state of the mechanism's runs, else its registered declaration."""
    state = board.states.get(mechanism)
    if state is None:
        state = declared_state(mechanism, board.protocol)
    return "--" if state is None else f"{state:,}"


def _rows(board: Leaderboard) -> list[list[str]]:
    """The ranking's cells as text, a row per mechanism: rank [CI], tier, mechanism (≈),
    score [CI], each category's mean, tasks, state."""
    body = []
    for _, row in board.table.iterrows():
        tie = " ≈" if row["same_as_next"] else ""
        cells = ["--" if pd.isna(row[c]) else f"{row[c]:.3f}" for c in board.categories]
        tasks = f"{row['n_tasks']}/{len(board.tasks)}" + tasks_leaky(
            row["leaky_tasks"], row["diverged_runs"]
        )
        body.append(
            [rank_text(row), tier_text(row), row["mechanism"] + tie, _interval(row), *cells,
             tasks, _state_text(board, row["mechanism"])]
        )  # fmt: skip
    return body


def _headers(board: Leaderboard) -> list[str]:
    return [f"rank [{CONFIDENCE:.0%} CI]", "tier", "mechanism", f"score [{CONFIDENCE:.0%} CI]",
            *board.categories, "tasks", state_column(board.track)[0]]  # fmt: skip


def to_markdown(board: Leaderboard) -> str:
    """The ranking as a Markdown table with its footnotes: each mechanism's rank with its
    bootstrap interval, its tier, its score with its t-interval, and its declared state."""
    text = markdown_table(_rows(board), _headers(board))
    lines = [*notes(board), state_column(board.track)[1]]
    return text + "\n\n" + "\n".join(f"- {n}" for n in lines) + "\n"


def to_latex(board: Leaderboard) -> str:
    """The ranking as a booktabs tabular, a rule between tiers, its notes below it as a
    paragraph (they wrap at the text's width, where a table cell would not)."""
    headers = _headers(board)
    lines = [
        f"% Leaderboard, {latex_escape(_title(board))}; needs \\usepackage{{booktabs}}",
        r"\begin{tabular}{rcl" + "c" * (len(headers) - 3) + "}",
        r"\toprule",
        " & ".join(latex_escape(h) for h in headers) + r" \\",
        r"\midrule",
    ]
    previous = None
    for row in _rows(board):
        if previous is not None and row[1] != previous:
            lines.append(r"\midrule")  # a new tier, or the unranked below the ranked
        previous = row[1]
        lines.append(" & ".join(latex_escape(cell) for cell in row) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n" + latex_notes([*notes(board), state_column(board.track)[1]])


def _title(board: Leaderboard) -> str:
    return track_text(board.protocol, board.protocol_version, board.track)
