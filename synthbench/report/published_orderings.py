"""Predictive validity with power: the published pairwise orderings of our mechanisms, pooled
over every published table, and the share our leaderboard reproduces, with an exact sign test
(``synthbench report --compare published-lm``; the per-table correlations are in
synthbench/report/published_lm.py, which calls this module).

PRE-DECLARED (issue 72 part 5, written before any ordering was counted and never to be changed
to raise the figure; a share that comes out near one half is reported as it is):

- A published ordering is two mechanisms of ours, both main rows of one published table block
  (source, table, scale, tokens), ordered by one of the declared metrics (``DECLARED`` in
  published_lm.py: a perplexity, the average accuracy, the recall average), whose published
  gap is strictly above that metric's threshold (``THRESHOLDS``).
- The board reproduces it when the mechanism the paper puts ahead has the higher value of the
  column the declaration compares (the leaderboard's score, or its Memory column). A tie on our
  side (the two values equal as the board computes them) counts as not reproduced, so a tie can
  only lower the share. An ordering with a mechanism the board does not score is not counted.
- Reprints count once: two orderings of the same pair on the same metric, scale and tokens
  with the same printed values are one training run printed twice (the GLA paper's rows in the
  DeltaNet paper's Table 1); the first table in the data file keeps it.
- Distinct runs are pooled: the same pair at another scale, in another paper or on another
  metric is another vote. They are not independent (the same architectures, often the same
  code and authors, and a run's perplexity and accuracy move together), so the sign test's p,
  which assumes independent votes, overstates the evidence; the grids say so.
- The share reproduced k / n is tested against one half with the exact one-sided binomial
  sign test: p = P(X >= k), X ~ Binomial(n, 1/2), summed from ``math.comb``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from synthbench.core.text import plural
from synthbench.report.tables import MISSING, Grid

# PRE-DECLARED thresholds, per published metric, in the metric's own units, fixed from the
# published side alone before any ordering was counted. No table gives seeds or error bars:
# each model is one training run, so a gap below these is a near-tie that the tables cannot
# order. Perplexities are compared as ln(perplexity), the mean token loss in nats, so one
# threshold serves every scale: 0.02 nats, about 2% in perplexity (28.4 against 28.6 is 0.007
# and does not count; 17.0 against 17.5 is 0.029 and does). Accuracy averages, printed
# to 0.1 or 0.01 points, need more than 1 point; recall averages, over three to six extraction
# and QA tasks whose scores differ by tens of points between models, more than 2 points.
PERPLEXITY_NATS = 0.02
THRESHOLDS = {
    "wiki_ppl": PERPLEXITY_NATS,
    "pile_ppl": PERPLEXITY_NATS,
    "valid_ppl": PERPLEXITY_NATS,
    "avg_acc": 1.0,
    "recall_avg": 2.0,
}
EPS = 1e-9  # a gap equal to its threshold at print precision is not above it
REPRODUCED, REVERSED, TIED = "reproduced", "reversed", "tied (counted as not reproduced)"


class Declaration(Protocol):
    """What this module reads of published_lm.Declared."""

    label: str
    ours: str
    published: str
    sign: int


def is_perplexity(metric: str) -> bool:
    return metric.endswith("_ppl")


def gap(metric: str, sign: int, a: float, b: float) -> float:
    """How much better ``a`` is than ``b`` in the declared units: ln(b / a) for a perplexity
    (lower is better), else sign * (a - b)."""
    if is_perplexity(metric):
        return math.log(b) - math.log(a)
    return sign * (a - b)


def gap_text(metric: str, value: float) -> str:
    if is_perplexity(metric):
        return f"{value:.3f} nats ({math.expm1(value):.1%})"
    return f"{value:.2f} points"


def threshold_text(metric: str) -> str:
    return gap_text(metric, THRESHOLDS[metric])


@dataclass(frozen=True)
class Ordering:
    """A published ordering: ``better`` ahead of ``worse`` by ``gap`` (declared units)."""

    where: str  # "source table, scale/tokens"
    declared: Declaration
    better: str
    worse: str
    better_text: str  # the published values as printed (or our mean of three recall tasks)
    worse_text: str
    gap: float


@dataclass(frozen=True)
class Extraction:
    orderings: list[Ordering]
    below_threshold: int  # pairs whose published gap is not above the threshold
    reprints: int  # orderings dropped as a reprint of one already counted


def published_orderings(tables: dict, declared) -> Extraction:
    """Every published ordering of two mechanisms of ours, in the data file's order of tables,
    mechanisms and declarations. ``tables``: published_lm.published_tables' blocks, keyed by
    (source, table, scale, tokens)."""
    found, below, reprints, seen = [], 0, 0, set()
    for (source, table, scale, tokens), wide in tables.items():
        where = f"{source} {table}, {scale}/{tokens}"
        main = wide[(wide["role"] == "main") & (wide["mechanism"] != "")]
        for d in declared:
            if d.published not in wide:
                continue
            texts = {r["mechanism"]: r[d.published] for _, r in main.iterrows() if r[d.published]}
            shown = {m: _shown(d.published, wide, text) for m, text in texts.items()}
            for a, b in itertools.combinations(texts, 2):
                g = gap(d.published, d.sign, float(texts[a]), float(texts[b]))
                if abs(g) <= THRESHOLDS[d.published] + EPS:
                    below += 1
                    continue
                better, worse = (a, b) if g > 0 else (b, a)
                run = (d.published, scale, tokens, frozenset({(a, texts[a]), (b, texts[b])}))
                if run in seen:
                    reprints += 1
                    continue
                seen.add(run)
                found.append(Ordering(where, d, better, worse, shown[better], shown[worse], abs(g)))
    return Extraction(found, below, reprints)


def _shown(metric: str, wide, text: str) -> str:
    """A value as printed; a recall average the table does not print (our mean of three) to
    two decimals, as the table grids show it."""
    if metric == "recall_avg" and not wide.attrs.get("recall_printed"):
        return f"{float(text):.2f}"
    return text


@dataclass(frozen=True)
class Vote:
    ordering: Ordering
    ours_better: float  # our value of the mechanism the paper puts ahead
    ours_worse: float

    @property
    def outcome(self) -> str:
        if self.ours_better > self.ours_worse:
            return REPRODUCED
        return REVERSED if self.ours_better < self.ours_worse else TIED


def votes(orderings: list[Ordering], ours: Callable[[str, str], float | None]) -> list[Vote]:
    """The orderings the board can vote on; ``ours(mechanism, column)`` is the board's value
    (None where it has none)."""
    found = []
    for o in orderings:
        better, worse = ours(o.better, o.declared.ours), ours(o.worse, o.declared.ours)
        if better is not None and worse is not None:
            found.append(Vote(o, better, worse))
    return found


def sign_test_p(k: int, n: int) -> float:
    """Exact one-sided sign test: P(X >= k) for X ~ Binomial(n, 1/2); 1.0 for n = 0."""
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


@dataclass(frozen=True)
class Pooled:
    n: int
    reproduced: int
    reversed: int
    tied: int

    @property
    def share(self) -> float:
        return self.reproduced / self.n if self.n else math.nan

    @property
    def p(self) -> float:
        return sign_test_p(self.reproduced, self.n)


def pooled(found: list[Vote]) -> Pooled:
    outcomes = [v.outcome for v in found]
    return Pooled(
        len(found), outcomes.count(REPRODUCED), outcomes.count(REVERSED), outcomes.count(TIED)
    )


def reading(result: Pooled) -> str:
    """The one-line reading of the pooled measure."""
    if result.n == 0:
        return "no published ordering above its threshold has both mechanisms on the board"
    head = (
        f"the board reproduces {result.reproduced} of {plural(result.n, 'published ordering')} "
        f"({result.share:.0%}); exact one-sided sign test p = {result.p:.3g}"
    )
    if result.p <= 0.05:
        return (
            f"{head}: above one half at the 5% level, if the votes were independent (they are not)"
        )
    return f"{head}: not distinguishable from one half at the 5% level"


def _row(label: str, result: Pooled, p: bool) -> tuple[tuple[str], list[str]]:
    share = MISSING if result.n == 0 else f"{result.share:.0%}"
    return (label,), [
        str(result.n),
        str(result.reproduced),
        str(result.reversed),
        str(result.tied),
        share,
        f"{result.p:.3g}" if p and result.n else MISSING,
    ]


def pooled_grid(
    protocol: str, declared, extraction: Extraction, found: list[Vote], uncovered: int
) -> Grid:
    """The pooled measure (row "all", the declared one) and its breakdown per metric."""
    rows, cells = [], []
    for label, result, p in [
        ("all (the declared measure)", pooled(found), True),
        *(
            (d.label, pooled([v for v in found if v.ordering.declared is d]), False)
            for d in declared
            if any(v.ordering.declared is d for v in found)
        ),
    ]:
        row, cell = _row(label, result, p)
        rows.append(row)
        cells.append(cell)
    thresholds = ", ".join(f"{m} {threshold_text(m)}" for m in THRESHOLDS)
    notes = [
        f"Reading: {reading(pooled(found))}.",
        "Pre-declared (synthbench/report/published_orderings.py): every pair of our mechanisms "
        "in one published table and scale, on a declared metric, whose published gap is "
        f"strictly above its threshold ({thresholds}; a perplexity gap is ln of the ratio, the "
        "mean token loss in nats); reproduced when the mechanism the paper puts ahead has the "
        "higher leaderboard score (Memory column for the recall average); a tie on our side "
        "counts as not reproduced.",
        f"Not counted: {plural(extraction.below_threshold, 'pair')} at or below the threshold, "
        f"{plural(extraction.reprints, 'reprint')} of a run already counted (the same pair, "
        f"metric, scale, tokens and printed values), {plural(uncovered, 'ordering')} with a "
        "mechanism the board does not score.",
        "p: exact one-sided binomial sign test against one half, P(X >= reproduced), X ~ "
        "Binomial(n, 1/2); given for the pooled row only (the rows below break it down and "
        "were not declared apart). Distinct training runs of the same pair (other scales, "
        "papers, metrics) are separate votes, but not independent ones: the p assumes "
        "independence and so overstates the evidence.",
    ]
    return Grid(
        f"Published orderings the board reproduces: protocol {protocol}",
        ["votes"],
        rows,
        ["n", "reproduced", "reversed", "tied", "share", "p (one-sided)"],
        cells,
        0,
        best=None,
        notes=notes,
    )


def pairs_grid(protocol: str, found: list[Vote]) -> Grid:
    """Every counted ordering, the published gap beside ours."""
    rows = [(v.ordering.where, v.ordering.declared.label) for v in found]
    cells = [
        [
            f"{v.ordering.better} > {v.ordering.worse}",
            f"{v.ordering.better_text} vs {v.ordering.worse_text}",
            gap_text(v.ordering.declared.published, v.ordering.gap),
            f"{v.ours_better:.3f} vs {v.ours_worse:.3f}",
            v.outcome,
        ]
        for v in found
    ]
    return Grid(
        f"Each published ordering beside the board: protocol {protocol}",
        ["published table", "metric"],
        rows,
        ["published order", "published values", "published gap", "ours", "board"],
        cells,
        0,
        best=None,
        notes=[
            "published values: as printed (a recall average the table does not print is our "
            "mean of SWDE, SQuAD and FDA); ours: the leaderboard's score, or its Memory column "
            "for the recall average, in the same order."
        ],
    )


def grids(
    protocol: str,
    tables: dict,
    declared,
    ours: Callable[[str, str], float | None],
) -> list[Grid]:
    """The pooled measure and the orderings behind it, for one protocol's board."""
    extraction = published_orderings(tables, declared)
    found = votes(extraction.orderings, ours)
    uncovered = len(extraction.orderings) - len(found)
    pooled_table = pooled_grid(protocol, declared, extraction, found, uncovered)
    return [pooled_table, pairs_grid(protocol, found)] if found else [pooled_table]
