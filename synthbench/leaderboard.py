"""The leaderboard: mechanisms ranked by their mean category score, with a bootstrap 95%
confidence interval over seeds and a mark where two neighbours are not told apart.

A mechanism's score is the mean over categories of the mean over the category's tasks of
its seed-mean accuracy, so every category weighs the same whatever its number of tasks.
The bootstrap redraws each task's seeds with replacement; the draw is shared by all
mechanisms (seed s is the same data stream and initialisation seed for every mechanism),
so the difference between two neighbours is a paired comparison.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date

import numpy as np
import pandas as pd
from tabulate import tabulate

from synthbench.task import CATEGORIES

N_BOOTSTRAP = 2000
CONFIDENCE = 0.95


@dataclass
class Leaderboard:
    protocol: str
    protocol_version: int
    metric: str
    n_seeds: int  # the most seeds any (task, mechanism) has
    categories: list[str]  # the categories present, in the suite's order
    tasks: pd.DataFrame  # (category, task) index, mechanism columns: seed-mean or NaN
    # one row per mechanism, in rank order: rank (None for incomplete ones), mechanism,
    # score, ci_low, ci_high, same_as_next (not significantly above the next one),
    # n_tasks, complete, then one column per category with its mean
    table: pd.DataFrame
    generated: str = field(default_factory=lambda: date.today().isoformat())


def _seed_values(runs: pd.DataFrame, tasks: list[tuple[str, str]], mechanism: str):
    """Per task, the mechanism's values sorted by seed (an empty array if it has none)."""
    mine = runs[runs["mechanism"] == mechanism]
    grouped = {
        key: part.sort_values("seed")["value"].to_numpy()
        for key, part in mine.groupby(["category", "task"])
    }
    return [grouped.get(key, np.array([])) for key in tasks]


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


def build(
    runs: pd.DataFrame,
    protocol: str,
    protocol_version: int,
    metric: str,
    n_bootstrap: int = N_BOOTSTRAP,
    seed: int = 0,
) -> Leaderboard:
    """``runs``: one row per successful run of one protocol version, with columns category,
    task, mechanism, seed and value (the metric)."""
    order = {c: i for i, c in enumerate(CATEGORIES)}
    tasks = sorted(
        set(zip(runs["category"], runs["task"], strict=True)),
        key=lambda ct: (order.get(ct[0], 99), ct[1]),
    )
    task_categories = [c for c, _ in tasks]
    categories = sorted(set(task_categories), key=lambda c: order.get(c, 99))
    mechanisms = sorted(runs["mechanism"].unique())
    values = {m: _seed_values(runs, tasks, m) for m in mechanisms}

    means = pd.DataFrame(
        {m: [v.mean() if len(v) else np.nan for v in values[m]] for m in mechanisms},
        index=pd.MultiIndex.from_tuples(tasks, names=["category", "task"]),
    )
    complete = [m for m in mechanisms if all(len(v) for v in values[m])]

    # the bootstrap: per task, one draw of seed positions shared by every mechanism that has
    # that many seeds (the common case); a mechanism with another count gets its own draw
    rng = np.random.default_rng(seed)
    draws: dict[tuple[int, int], np.ndarray] = {}

    def draw(task_index: int, n: int) -> np.ndarray:
        if (task_index, n) not in draws:
            draws[task_index, n] = rng.integers(0, n, size=(n_bootstrap, n))
        return draws[task_index, n]

    replicates = {}
    for m in complete:
        boot_means = np.stack(
            [v[draw(i, len(v))].mean(-1) for i, v in enumerate(values[m])], axis=-1
        )  # (n_bootstrap, tasks)
        replicates[m] = _category_scores(boot_means, task_categories, categories)[1]

    rows = []
    for m in mechanisms:
        per_category, score = _category_scores(means[m].to_numpy(), task_categories, categories)
        low = high = np.nan
        if m in replicates:
            tail = (1 - CONFIDENCE) / 2 * 100
            low, high = np.percentile(replicates[m], [tail, 100 - tail])
        rows.append(
            {
                "mechanism": m,
                "score": float(score) if m in replicates else np.nan,
                "ci_low": float(low),
                "ci_high": float(high),
                "n_tasks": int(sum(len(v) > 0 for v in values[m])),
                "complete": m in replicates,
                **{c: float(s) for c, s in zip(categories, per_category, strict=True)},
            }
        )
    table = pd.DataFrame(rows)
    table = table.sort_values(
        ["complete", "score", "mechanism"], ascending=[False, False, True]
    ).reset_index(drop=True)
    ranks = [i + 1 if ok else None for i, ok in enumerate(table["complete"])]
    table.insert(0, "rank", pd.array(ranks, dtype="Int64"))
    table["same_as_next"] = False
    ranked = table[table["complete"]]["mechanism"].tolist()
    tail = (1 - CONFIDENCE) / 2 * 100
    for i, (upper, lower) in enumerate(zip(ranked, ranked[1:], strict=False)):
        difference = replicates[upper] - replicates[lower]
        # not significant when the interval of the paired difference reaches 0
        table.loc[i, "same_as_next"] = bool(np.percentile(difference, tail) <= 0)
    n_seeds = int(runs.groupby(["category", "task", "mechanism"]).size().max())
    return Leaderboard(protocol, protocol_version, metric, n_seeds, categories, means, table)


def _interval(row) -> str:
    if not row["complete"]:
        return "--"
    return f"{row['score']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"


def to_markdown(board: Leaderboard) -> str:
    """The ranking as a Markdown table with its footnotes."""
    n_tasks = len(board.tasks)
    body = []
    for _, row in board.table.iterrows():
        rank = "" if pd.isna(row["rank"]) else str(int(row["rank"]))
        tie = " ≈" if row["same_as_next"] else ""
        cells = ["--" if pd.isna(row[c]) else f"{row[c]:.3f}" for c in board.categories]
        tasks = f"{row['n_tasks']}/{n_tasks}"
        body.append([rank, row["mechanism"] + tie, _interval(row), *cells, tasks])
    text = tabulate(
        body,
        headers=["rank", "mechanism", "score [95% CI]", *board.categories, "tasks"],
        tablefmt="pipe",
        disable_numparse=True,
    )
    notes = [
        f"Protocol {board.protocol} v{board.protocol_version}, {board.metric} on the test set, "
        f"up to {board.n_seeds} seeds; generated {board.generated}.",
        "Score: mean over categories of the mean over their tasks of the seed-mean. "
        f"Interval: {CONFIDENCE:.0%} bootstrap over seeds.",
        "≈: not significantly above the next mechanism (paired bootstrap of the difference).",
    ]
    if not board.table["complete"].all():
        notes.append("Unranked: a mechanism without a successful run on every task.")
    if board.n_seeds < 2:
        notes.append("One seed: the intervals have no width and say nothing.")
    return text + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
