"""The pooled published orderings (synthbench/report/published_orderings.py): the sign test
against an independent binomial, the pair extraction on a hand-made table with a hand-counted
answer (thresholds, reprints, roles, ties, unscored mechanisms), the shipped data's reprints,
and `report --compare published-lm` end to end with a count done by hand on the shipped data."""

from __future__ import annotations

import itertools
import math

import pandas as pd
import pytest
from test_published_lm import tiny_reference
from typer.testing import CliRunner

from synthbench.cli import app
from synthbench.report import published_lm, reference
from synthbench.report import published_orderings as po

pytestmark = pytest.mark.usefixtures("single_thread")


def brute_force_p(k: int, n: int) -> float:
    """P(X >= k) by listing all 2^n equally likely sign sequences."""
    return sum(sum(s) >= k for s in itertools.product((0, 1), repeat=n)) / 2**n


def test_sign_test_against_a_brute_force_count():
    for n in range(0, 11):
        for k in range(0, n + 1):
            assert po.sign_test_p(k, n) == pytest.approx(brute_force_p(k, n), abs=1e-15)


def test_sign_test_against_scipy_and_known_values():
    stats = pytest.importorskip("scipy.stats")
    for n in (1, 7, 20, 51):
        for k in range(n + 1):
            expected = stats.binomtest(k, n, 0.5, alternative="greater").pvalue
            assert po.sign_test_p(k, n) == pytest.approx(expected, rel=1e-9, abs=1e-300)
    assert po.sign_test_p(5, 5) == 1 / 32
    assert po.sign_test_p(0, 5) == 1.0 and po.sign_test_p(0, 0) == 1.0
    assert po.sign_test_p(9, 10) == 11 / 1024
    with pytest.raises(ValueError, match="0 <= k <= n"):
        po.sign_test_p(6, 5)


def test_every_declared_metric_has_a_positive_threshold():
    assert {d.published for d in published_lm.DECLARED} == set(po.THRESHOLDS)
    assert all(t > 0 for t in po.THRESHOLDS.values())


def published(*rows) -> pd.DataFrame:
    """Rows of the data file's shape: (source, table, scale, model, role, mechanism, metric,
    value as printed)."""
    cols = ["source", "table", "scale", "model", "role", "mechanism", "metric", "text"]
    data = pd.DataFrame(rows, columns=cols).assign(tokens="10B", checked_against="paper:x")
    return data.assign(value=data["text"].astype(float))


def hand_made() -> pd.DataFrame:
    a = ("x", "Table 1", "1B", "A", "main", "softmax")
    b = ("x", "Table 1", "1B", "B", "main", "gla")
    c = ("x", "Table 1", "1B", "C", "main", "retnet")
    return published(
        # table 1: ln(20.30/20) = 0.0149 is below 0.02 nats, so A-B is not ordered on wiki;
        # avg: B ahead of A by 1.5 (counted), A-C by exactly 1.0 and B-C by 0.5 (not above)
        *(a + m for m in (("wiki_ppl", "20.00"), ("avg_acc", "50.0"), ("recall_avg", "40.0"))),
        *(b + m for m in (("wiki_ppl", "20.30"), ("avg_acc", "51.5"), ("recall_avg", "30.0"))),
        *(c + m for m in (("wiki_ppl", "22.00"), ("avg_acc", "51.0"), ("recall_avg", "33.0"))),
        # never ordered: a variant, a hybrid and a model without a mechanism of ours
        ("x", "Table 1", "1B", "B (w. conv)", "variant", "gla", "wiki_ppl", "10.0"),
        ("x", "Table 1", "1B", "B + attention", "hybrid", "", "wiki_ppl", "10.0"),
        ("x", "Table 1", "1B", "Mamba", "main", "", "wiki_ppl", "10.0"),
        # table 2 (another paper, same scale and tokens): A 20.00 / C 22.00 is table 1's run
        # reprinted (counted once); B is another run: ln(20.41/20) = 0.0203, just above
        ("y", "Table 2", "1B", "A", "main", "softmax", "wiki_ppl", "20.00"),
        ("y", "Table 2", "1B", "B", "main", "gla", "wiki_ppl", "20.41"),
        ("y", "Table 2", "1B", "C", "main", "retnet", "wiki_ppl", "22.00"),
        # table 3, another scale: the same printed values are another run; ln(20.396/20) =
        # 0.0196, just below
        ("y", "Table 3", "2B", "A", "main", "softmax", "wiki_ppl", "20.00"),
        ("y", "Table 3", "2B", "B", "main", "gla", "wiki_ppl", "20.396"),
        ("y", "Table 3", "2B", "C", "main", "retnet", "wiki_ppl", "22.00"),
    )


def extraction() -> po.Extraction:
    tables = published_lm.published_tables(hand_made())
    return po.published_orderings(tables, published_lm.DECLARED)


def test_pair_extraction_matches_a_hand_count():
    found = extraction()
    got = [(o.where, o.declared.published, o.better, o.worse) for o in found.orderings]
    assert got == [
        ("x Table 1, 1B/10B", "wiki_ppl", "softmax", "retnet"),
        ("x Table 1, 1B/10B", "wiki_ppl", "gla", "retnet"),
        ("x Table 1, 1B/10B", "avg_acc", "gla", "softmax"),
        ("x Table 1, 1B/10B", "recall_avg", "softmax", "gla"),
        ("x Table 1, 1B/10B", "recall_avg", "softmax", "retnet"),
        ("x Table 1, 1B/10B", "recall_avg", "retnet", "gla"),
        ("y Table 2, 1B/10B", "wiki_ppl", "softmax", "gla"),
        ("y Table 2, 1B/10B", "wiki_ppl", "gla", "retnet"),
        ("y Table 3, 2B/10B", "wiki_ppl", "softmax", "retnet"),
        ("y Table 3, 2B/10B", "wiki_ppl", "gla", "retnet"),
    ]
    # below: A-B wiki, A-C avg (gap equal to the threshold), B-C avg; table 3's A-B wiki
    assert found.below_threshold == 4 and found.reprints == 1
    first = found.orderings[0]
    assert (first.better_text, first.worse_text) == ("20.00", "22.00")
    assert first.gap == pytest.approx(math.log(22 / 20))
    assert all(o.gap > po.THRESHOLDS[o.declared.published] for o in found.orderings)


def test_ties_on_our_side_count_as_not_reproduced_and_unscored_are_not_counted():
    board = {
        ("softmax", "score"): 0.9,
        ("gla", "score"): 0.5,
        ("retnet", "score"): 0.5,  # tied with gla
        ("softmax", "Memory"): 0.8,
        ("gla", "Memory"): 0.2,
        ("retnet", "Memory"): 0.4,
    }
    found = po.votes(extraction().orderings, lambda m, which: board.get((m, which)))
    outcomes = [v.outcome for v in found]
    r, t, v = po.REPRODUCED, po.TIED, po.REVERSED
    assert outcomes == [r, t, v, r, r, r, r, t, r, t]
    result = po.pooled(found)
    assert (result.n, result.reproduced, result.reversed, result.tied) == (10, 6, 1, 3)
    assert result.share == 0.6 and result.p == pytest.approx(386 / 1024)
    # a mechanism the board does not score: its orderings are not counted at all
    unscored = po.votes(
        extraction().orderings, lambda m, which: None if m == "retnet" else board[(m, which)]
    )
    assert [(v.ordering.better, v.ordering.worse) for v in unscored] == [
        ("gla", "softmax"),
        ("softmax", "gla"),
        ("softmax", "gla"),
    ]


def test_the_reading_says_what_the_share_and_p_are():
    assert "no published ordering" in po.reading(po.Pooled(0, 0, 0, 0))
    text = po.reading(po.Pooled(10, 9, 1, 0))
    assert "9 of 10 published orderings (90%)" in text and "p = 0.0107" in text
    assert "(they are not)" in text
    assert "not distinguishable from one half" in po.reading(po.Pooled(10, 6, 1, 3))


def test_the_shipped_gla_tables_are_reprints_of_the_deltanet_tables():
    tables = published_lm.published_tables(published_lm.load())
    found = po.published_orderings(tables, published_lm.DECLARED)
    assert not [o for o in found.orderings if o.where.startswith("gla-2024")]
    alone = {k: v for k, v in tables.items() if k[0] == "gla-2024"}
    assert found.reprints == len(po.published_orderings(alone, published_lm.DECLARED).orderings)
    assert found.reprints > 0
    # Mamba-2 and Transformer++ are within 0.02 nats at both of its scales (by hand:
    # ln(8.68 / 8.60) = 0.0093, ln(6.13 / 6.09) = 0.0065) and tie on accuracy
    assert not [o for o in found.orderings if o.where.startswith("mamba2-2024")]
    assert all(o.gap > po.THRESHOLDS[o.declared.published] for o in found.orderings)


def test_report_shows_the_pooled_orderings_counted_by_hand(tmp_path, monkeypatch):
    """softmax 0.9 > based 0.7 > linear 0.6 > retnet 0.3 on both score and Memory. Counted by
    hand on the shipped data: softmax ahead of based on Pile ppl (8.39 vs 8.65) and recall
    (Based Table 1); retnet ahead of linear (RetNet Table 5: 26.05 vs 40.24); softmax ahead
    of retnet in the DeltaNet paper (340M Wiki ppl, recall; 1.3B Wiki ppl, avg acc 50.9 vs
    48.9, recall) and the Gated DeltaNet paper (Wiki ppl 18.53 vs 19.08, recall 37.0 vs
    22.9). The GLA paper's are reprints; 340M avg acc (41.2 vs 41.0) and the Gated DeltaNet
    avg acc (52.25 vs 52.02) are below 1 point. 10 orderings, 9 reproduced: p = 11/1024."""
    scores = {"softmax": 0.9, "based": 0.7, "linear": 0.6, "retnet": 0.3}
    tiny_reference(tmp_path / "ref.parquet", scores, step=0.001)
    monkeypatch.setenv(reference.ENV, str(tmp_path / "ref.parquet"))
    (tmp_path / "results").mkdir()
    out = tmp_path / "reports"
    args = ["report", "--compare", "published-lm", "--results", str(tmp_path / "results")]
    result = CliRunner().invoke(app, [*args, "--out", str(out), "--format", "md,tex"])
    assert result.exit_code == 0, result.output
    text = (out / "published-lm-quick.md").read_text()
    (line,) = [x for x in text.splitlines() if x.startswith("| all (the declared measure)")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells == ["all (the declared measure)", "10", "9", "1", "0", "90%", "0.0107"]
    assert "the board reproduces 9 of 10 published orderings (90%)" in text
    assert "retnet &gt; linear" in text and "| reversed" in text
    tex = (out / "published-lm-quick.tex").read_text()
    assert "Published orderings the board reproduces" in tex and "0.0107" in tex
