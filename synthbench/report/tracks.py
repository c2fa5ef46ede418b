"""The two tracks side by side: where a mechanism's rank moves between the core track (its
rule alone) and the block track (its published layer in fla's block: an RMSNorm before the
mixer and before the MLP, a final RMSNorm, fla's gated SwiGLU MLP and N(0, 0.02) init).

A protocol's twin in the other track is named by synthbench/run/protocols.py
(``protocol_of_track``): ``quick`` and ``quick-block``. Scores are compared within a track
only (each track is its own protocol, trained and selected on its own); across the tracks
the table compares ranks.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter

import pandas as pd

from synthbench.report.leaderboard import Leaderboard
from synthbench.report.reference import SUFFIX
from synthbench.report.tables import MISSING, Grid, track_text


def twins(boards: list[Leaderboard]) -> list[tuple[Leaderboard, Leaderboard]]:
    """(core board, block board) for every core protocol of ``boards`` whose block twin is
    among them too."""
    from synthbench.run.protocols import protocol_of_track

    by_protocol = {b.protocol: b for b in boards}
    pairs = []
    for board in boards:
        if board.track != "core":
            continue
        try:
            twin = protocol_of_track(board.protocol, "block").name
        except (KeyError, ValueError):  # a protocol without a twin, or not registered here
            continue
        if twin in by_protocol and by_protocol[twin].track == "block":
            pairs.append((board, by_protocol[twin]))
    return pairs


@functools.cache
def _defaults(mechanism: str, protocol: str) -> dict[str, str]:
    """As a label writes them, the values a run of ``mechanism`` under ``protocol`` has
    unless it was told otherwise: the protocol's fields and the mechanism's parameters in
    that track (its core's, or its published layer's); {} for what is not registered here."""
    from synthbench.core.mechanism import MECHANISMS, mixer
    from synthbench.run.protocols import PROTOCOLS

    if protocol not in PROTOCOLS:
        return {}
    p = PROTOCOLS.get(protocol)
    found = {f.name: str(getattr(p, f.name)) for f in dataclasses.fields(p)}
    if mechanism in MECHANISMS:
        built = mixer(mechanism, p.d_model, p.n_heads, p.arch)
        found |= {k: str(v) for k, v in built.params(None).items()}
    return found


def at_defaults(label: str, protocol: str) -> str:
    """``label`` (aggregate.label_variants': ``name (k=v, ...)``) without the values that are
    its track's defaults, so that one mechanism's two tracks meet on one name: ``deltanet
    (n_layers=2)`` under quick (a width grid elsewhere in the results shows the field) and
    ``deltanet (allow_neg_eigval=False, use_short_conv=True)`` under quick-block (a fact's
    variants beside it) are both ``deltanet``; a variant keeps what sets it apart, and a
    reference run its mark (SUFFIX) at the end."""
    bare = label.removesuffix(SUFFIX)
    mark = label[len(bare) :]
    name, _, shown = bare.partition(" (")
    if not shown.endswith(")"):
        return label
    defaults = _defaults(name, protocol)
    kept = [
        part
        for part in shown[:-1].split(", ")
        if defaults.get(part.partition("=")[0]) != part.partition("=")[2]
    ]
    return (f"{name} ({', '.join(kept)})" if kept else name) + mark


def _names(board: Leaderboard) -> dict[str, str]:
    """Each of the board's labels -> its name at the track's defaults (the label itself
    where two of the board's labels would share one)."""
    named = {str(m): at_defaults(str(m), board.protocol) for m in board.table["mechanism"]}
    counts = Counter(named.values())
    return {label: label if counts[n] > 1 else n for label, n in named.items()}


def _ranks(board: Leaderboard) -> dict[str, int]:
    ranked = board.table.dropna(subset=["rank"])
    names = _names(board)
    return {names[str(m)]: int(r) for m, r in zip(ranked["mechanism"], ranked["rank"], strict=True)}


def _scores(board: Leaderboard) -> dict[str, float]:
    names = _names(board)
    table = board.table
    return {names[str(m)]: s for m, s in zip(table["mechanism"], table["score"], strict=True)}


def move_text(core_rank: int | None, block_rank: int | None) -> str:
    """How a rank moves from the core track to the block track: ``up 3``, ``down 1``, ``=``,
    or MISSING where a track does not rank the mechanism."""
    if core_rank is None or block_rank is None:
        return MISSING
    places = core_rank - block_rank
    return "=" if places == 0 else f"up {places}" if places > 0 else f"down {-places}"


def kendall_tau(first: dict[str, int], second: dict[str, int]) -> tuple[float, int]:
    """Kendall's tau between two rankings over the mechanisms both rank (ranks are distinct
    within a board, so tau-a), and how many they are; NaN below 2."""
    common = sorted(set(first) & set(second))
    n = len(common)
    if n < 2:
        return float("nan"), n
    agree = sum(
        1 if (first[a] - first[b]) * (second[a] - second[b]) > 0 else -1
        for i, a in enumerate(common)
        for b in common[i + 1 :]
    )
    return agree / (n * (n - 1) / 2), n


def side_by_side(core: Leaderboard, block: Leaderboard) -> Grid:
    """One row per mechanism of either board, in the core track's order (then the block
    track's for those the core track does not rank): each track's rank and score, and the
    move from the core rank to the block rank."""
    core_ranks, block_ranks = _ranks(core), _ranks(block)
    core_scores, block_scores = _scores(core), _scores(block)
    mechanisms = sorted(
        set(core_scores) | set(block_scores),
        key=lambda m: (core_ranks.get(m, 10**6), block_ranks.get(m, 10**6), m),
    )

    def rank(ranks, m):
        return str(ranks[m]) if m in ranks else MISSING

    def score(scores, m):
        value = scores.get(m)
        return MISSING if value is None or pd.isna(value) else f"{value:.3f}"

    cells = [
        [
            rank(core_ranks, m),
            score(core_scores, m),
            rank(block_ranks, m),
            score(block_scores, m),
            move_text(core_ranks.get(m), block_ranks.get(m)),
        ]
        for m in mechanisms
    ]
    moved = [
        f"{m} {core_ranks[m]} → {block_ranks[m]}"
        for m in mechanisms
        if m in core_ranks and m in block_ranks and core_ranks[m] != block_ranks[m]
    ]
    tau, n = kendall_tau(core_ranks, block_ranks)
    agreement = (
        f"Kendall's tau between the two rankings: {tau:.2f} over the {n} mechanisms both rank."
        if n >= 2
        else "Fewer than 2 mechanisms ranked in both tracks: no rank correlation."
    )
    core_shows = track_text(core.protocol, core.protocol_version, core.track)
    block_shows = track_text(block.protocol, block.protocol_version, block.track)
    return Grid(
        f"The two tracks side by side: {core_shows} and {block_shows}",
        ["mechanism"],
        [(m,) for m in mechanisms],
        ["core rank", "core score", "block rank", "block score", "move"],
        cells,
        0,
        best=None,
        notes=[
            "Each track's leaderboard rank and score (leaderboard.md); a score is compared "
            "within its track only, each track trained and selected its own lrs. move: "
            "places gained (up) or lost (down) from the core rank to the block rank; --: "
            "not ranked in one of the tracks. A mechanism at its track's defaults is named "
            "alone (the leaderboards may show the values that set it apart from variants).",
            ("Rank moves: " + "; ".join(moved) + ".") if moved else "No rank moves.",
            agreement,
        ],
    )
