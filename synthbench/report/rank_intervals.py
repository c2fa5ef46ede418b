"""Rank intervals and tiers: how sure the leaderboard is of its order.

A board ranks mechanisms by one score (synthbench/report/leaderboard.py): the mean over
categories of the mean over the category's tasks of each cell's seed-mean score. How much of
that order would other tasks and seeds like these keep? A seeded bootstrap answers, as the
public model arenas do for their ratings. Each of ``DRAWS`` draws, from one
``numpy.random.default_rng(SEED)`` per board:

1. **tasks**: ``u = rng.random((DRAWS, T))`` (T the board's tasks, in its order: categories
   in the suite's order, tasks by name). Position p of draw b, a task of category c (n_c
   tasks), takes c's task ``floor(u[b, p] * n_c)`` (c's tasks in the board's order): each
   category keeps its number of tasks, so each still weighs the same.
2. **seeds**: ``v = rng.random((DRAWS, T, M, K))`` (M the ranked mechanisms in rank order, K
   the most seeds any cell has), drawn after ``u`` (in chunks of draws: the same stream).
   Mechanism m at position p, whose drawn task's cell holds k seeds (its scores in
   increasing seed order), takes the seeds ``floor(v[b, p, m, j] * k)`` for j < k: the cell's
   value in the draw is their mean. Each cell draws its own seeds: cells may hold different
   seeds (your one seed beside the reference's three).
3. **score**: the board's score of the drawn cell values (mean over categories of the mean
   over the category's positions).
4. **rank**: 1 + the mechanisms ranked above it: those in a better group (the board ranks a
   mechanism with diverged runs below every one without) and those of its group whose draw
   score exceeds its own by more than ``TIE`` (tied scores share the better rank).

A mechanism's 95% rank interval runs from the 50th to the 1950th of its 2000 ranks sorted
(numpy's ``quantile`` at 0.025 and 0.975 with ``method="inverted_cdf"``: ranks stay whole).

**Tiers**: the ranked mechanisms in rank order, a new tier beginning below a mechanism that
is significantly above the next one on both tests: in the bootstrap, fewer than 2.5% of the
draws (fewer than 50 of 2000) have its score at or below the next one's (+ ``TIE``), and the
paired t-test over seeds on these tasks (the board's ≈) tells them apart too. The bootstrap
asks whether other tasks would keep the step, the t-test whether other seeds would; a step
either test doubts does not split a tier.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DRAWS = 2000
SEED = 0
TIE = 1e-9  # draw scores this close count as tied (sums in another order differ by less)
CHUNK = 250  # draws computed at once: the seed draws of a chunk take DRAWS/CHUNK of the memory


@dataclass(frozen=True)
class RankDraws:
    """The bootstrap of one board's ranked mechanisms (in rank order)."""

    scores: np.ndarray  # (draws, mechanisms): the board's score in each draw
    ranks: np.ndarray  # (draws, mechanisms): the rank in each draw (1 is first)


def draw_ranks(
    cells: list[list[np.ndarray]],
    categories: list[str],
    groups: list[int],
    draws: int = DRAWS,
    seed: int = SEED,
) -> RankDraws:
    """The bootstrap of the module's docstring. ``cells[m][t]``: the scores of mechanism m's
    seeds on task t, in increasing seed order (at least one each: ranked mechanisms have a
    score on every task); ``categories[t]``: task t's category; ``groups[m]``: 0, or 1 for a
    mechanism ranked below every one of group 0 (diverged runs)."""
    n_mechanisms, n_tasks = len(cells), len(categories)
    most = max((len(v) for row in cells for v in row), default=1)
    values = np.zeros((n_tasks, n_mechanisms, most))
    counts = np.ones((n_tasks, n_mechanisms), dtype=int)
    for m, row in enumerate(cells):
        for t, seeds in enumerate(row):
            values[t, m, : len(seeds)] = seeds
            counts[t, m] = len(seeds)
    rng = np.random.default_rng(seed)
    task_u = rng.random((draws, n_tasks))
    drawn = np.empty((draws, n_tasks), dtype=int)
    members = {c: np.flatnonzero(np.array(categories) == c) for c in dict.fromkeys(categories)}
    for tasks in members.values():  # a category's positions draw among its own tasks
        drawn[:, tasks] = tasks[np.floor(task_u[:, tasks] * len(tasks)).astype(int)]
    scores = np.empty((draws, n_mechanisms))
    mechanisms = np.arange(n_mechanisms)[None, None, :, None]
    for start in range(0, draws, CHUNK):
        tasks = drawn[start : start + CHUNK]  # (b, T)
        seed_u = rng.random((len(tasks), n_tasks, n_mechanisms, most))
        k = counts[tasks]  # (b, T, M): the seeds of each drawn cell
        picked = values[tasks[..., None, None], mechanisms, np.floor(seed_u * k[..., None])
                        .astype(int).clip(max=most - 1)]  # fmt: skip
        used = np.arange(most) < k[..., None]  # only the first k draws of a k-seed cell
        cell_means = np.where(used, picked, 0.0).sum(-1) / k  # (b, T, M)
        per_category = [cell_means[:, tasks_c, :].mean(axis=1) for tasks_c in members.values()]
        scores[start : start + CHUNK] = np.mean(per_category, axis=0)
    group = np.asarray(groups)
    above_by_group = (group[None, :] < group[:, None]).sum(axis=1)  # (M,)
    same_group = group[None, :] == group[:, None]  # (M, M')
    higher = scores[:, None, :] > scores[:, :, None] + TIE  # (draws, M, M'): m' above m
    ranks = 1 + above_by_group[None, :] + (higher & same_group[None]).sum(axis=2)
    return RankDraws(scores, ranks)


def _tail(draws: int, confidence: float) -> float:
    """The draws in each tail of a ``confidence`` interval: 50 of 2000 at 95% (a product
    of floats, compared with a margin: 2000 x 0.025 must stay 50)."""
    return draws * (1 - confidence) / 2


def rank_interval(ranks: np.ndarray, confidence: float) -> tuple[int, int]:
    """The ``confidence`` percentile interval of one mechanism's ranks: for q the tail's
    share (0.025) and 1 - q, the smallest rank that at least that share of the draws reach
    or beat (the inverted empirical CDF): the 50th and 1950th of 2000 ranks sorted."""
    ordered = np.sort(ranks)
    tail = _tail(len(ordered), confidence)
    low = max(math.ceil(tail - 1e-9), 1)
    high = math.ceil(len(ordered) - tail - 1e-9)
    return int(ordered[low - 1]), int(ordered[high - 1])


def step_significant(upper: np.ndarray, lower: np.ndarray, confidence: float) -> bool:
    """Whether ``upper``'s draw scores are significantly above ``lower``'s: fewer than the
    tail's share of the draws (2.5%: fewer than 50 of 2000) have ``upper`` at or below
    ``lower`` (the tail's quantile of the differences is above 0)."""
    at_or_below = int((upper - lower <= TIE).sum())
    return at_or_below < _tail(len(upper), confidence) - 1e-9


def tiers(draws: RankDraws, same_as_next: list[bool], confidence: float) -> list[int]:
    """The tier of each ranked mechanism (rank order), from 1: a new tier begins below a
    mechanism whose step to the next is significant in the bootstrap and, on the paired
    t-test over seeds, not ``same_as_next``."""
    tier, result = 1, []
    for m in range(draws.scores.shape[1]):
        result.append(tier)
        last = m == draws.scores.shape[1] - 1
        if not last and not same_as_next[m]:
            upper, lower = draws.scores[:, m], draws.scores[:, m + 1]
            tier += step_significant(upper, lower, confidence)
    return result
