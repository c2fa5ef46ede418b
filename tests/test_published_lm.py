"""Predictive validity against published LM quality (synthbench/report/published_lm.py): the
rank statistics against hand counts, the shipped data file's promises, every published row
shown (a mechanism we lack is marked, never dropped), and `report --compare published-lm` end
to end on tiny rows."""

from __future__ import annotations

import itertools
import math
import random

import pandas as pd
import pytest
from test_report import frame, row
from typer.testing import CliRunner

from synthbench.cli import app
from synthbench.core.mechanism import MECHANISMS
from synthbench.report import published_lm, reference
from synthbench.report.leaderboard import build
from synthbench.report.publish import write_reports
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.schema import DATASET_SCHEMA, SCHEMA_VERSION
from synthbench.run.spec import SUITE_VERSION

pytestmark = pytest.mark.usefixtures("single_thread")


def test_spearman_on_hand_computed_cases():
    x = [1, 2, 3, 4]
    assert published_lm.spearman(x, [10, 20, 30, 40]) == pytest.approx(1.0)
    assert published_lm.spearman(x, [4, 3, 2, 1]) == pytest.approx(-1.0)
    # d = (1, -1, 1, -1): 1 - 6 * 4 / (4 * 15) = 0.6
    assert published_lm.spearman(x, [2, 1, 4, 3]) == pytest.approx(0.6)
    assert math.isnan(published_lm.spearman(x, [5, 5, 5, 5]))  # one side all tied
    assert math.isnan(published_lm.spearman([1], [2]))


def test_spearman_matches_the_formula_without_ties():
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(3, 7)
        x, y = rng.sample(range(100), n), rng.sample(range(100), n)
        rx, ry = published_lm.average_ranks(x), published_lm.average_ranks(y)
        d2 = sum((a - b) ** 2 for a, b in zip(rx, ry, strict=True))
        expected = 1 - 6 * d2 / (n * (n * n - 1))
        assert published_lm.spearman(x, y) == pytest.approx(expected)


def test_ties_take_average_ranks():
    assert list(published_lm.average_ranks([3, 1, 3, 2])) == [3.5, 1.0, 3.5, 2.0]
    # ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4): by hand 4.5 / sqrt(4.5 * 5)
    rho = published_lm.spearman([1, 2, 2, 3], [1, 2, 3, 4])
    assert rho == pytest.approx(4.5 / math.sqrt(4.5 * 5))


def test_exact_p_against_a_hand_count_for_four():
    # rho = 1 - 6 sum(d^2) / 60 >= 0.8 <=> sum(d^2) <= 2: the identity and the 3 swaps of
    # neighbours, 4 of the 24 orderings
    p, p_min = published_lm.permutation_p([1, 2, 3, 4], [1, 2, 4, 3])
    assert p == pytest.approx(4 / 24) and p_min == pytest.approx(1 / 24)
    assert published_lm.permutation_p([1, 2, 3, 4], [1, 2, 3, 4])[0] == pytest.approx(1 / 24)
    # brute force, for a tie on one side too
    x, y = [1, 2, 2, 3], [4, 1, 3, 2]
    rho = published_lm.spearman(x, y)
    count = sum(published_lm.spearman(x, q) >= rho - 1e-9 for q in itertools.permutations(y))
    assert published_lm.permutation_p(x, y)[0] == pytest.approx(count / 24)


def test_the_data_file_keeps_its_promises():
    data = published_lm.load()
    needed = ["source", "table", "scale", "tokens", "model", "metric", "value", "checked_against"]
    assert not (data[needed] == "").any().any()
    assert data["checked_against"].str.match(r"^(paper|transcription):").all()
    names = set(MECHANISMS.names())
    assert set(data["mechanism"]) - {""} <= names
    assert {
        "softmax",
        "retnet",
        "gla",
        "deltanet",
        "mamba2",
        "gated-deltanet",
        "based",
        "linear",
    } <= set(data["mechanism"])
    assert set(data["role"]) <= {"main", "variant", "hybrid"}
    assert not data.duplicated(["source", "table", "scale", "model", "metric"]).any()
    # Mamba-1 is kept, as a row without a mechanism of ours
    mamba = data[data["model"].str.startswith("Mamba") & ~data["model"].str.contains("2")]
    assert len(mamba) and (mamba["mechanism"] == "").all()
    # one correlated row per mechanism per table
    main = data[(data["role"] == "main") & (data["mechanism"] != "")]
    per_table = main.drop_duplicates(["source", "table", "scale", "model"])
    assert not per_table.duplicated(["source", "table", "scale", "mechanism"]).any()


# printed averages their accuracies do not give back at print precision: the papers' own
# arithmetic (the data file's header lists them), kept as printed
AVERAGES_AS_PRINTED = {
    ("deltanet-2024", "340M", "DeltaNet + Global Attn (2 layers)"),
    ("deltanet-2024", "1.3B", "GLA (w. conv)"),
    ("gated-deltanet-2025", "1.3B", "Samba"),
    ("gated-deltanet-2025", "1.3B", "Gated DeltaNet-H1"),
}
ACCURACIES = ("lmb_acc", "piqa", "hella", "wino", "arc_e", "arc_c", "siqa", "boolq", "obqa")


def test_a_row_averaged_over_its_accuracies_gives_the_printed_average():
    data = published_lm.load()
    checked = 0
    for (source, _, scale, model), part in data.groupby(["source", "table", "scale", "model"]):
        texts = dict(zip(part["metric"], part["text"], strict=True))
        accuracies = [float(texts[m]) for m in ACCURACIES if m in texts]
        if "avg_acc" not in texts or not accuracies:
            continue
        printed = texts["avg_acc"]
        half_unit = 0.5 * 10 ** -len(printed.partition(".")[2])
        mean = sum(accuracies) / len(accuracies)
        agrees = abs(mean - float(printed)) <= half_unit + 1e-9
        assert agrees != ((source, scale, model) in AVERAGES_AS_PRINTED), (source, model, mean)
        checked += 1
    assert checked >= 40


def test_recall_average_is_printed_or_the_mean_of_three():
    tables = published_lm.published_tables(published_lm.load())
    t1 = tables[("deltanet-2024", "Table 1", "340M", "15B")].set_index("model")
    assert not t1.attrs["recall_printed"]
    assert float(t1.loc["Transformer++", "recall_avg"]) == pytest.approx((42.2 + 22.1 + 21.4) / 3)
    t4 = tables[("gated-deltanet-2025", "Table 4", "1.3B", "100B")]
    assert t4.attrs["recall_printed"]


def board(scores: dict[str, tuple[float, float]], protocol="quick"):
    runs = pd.DataFrame(
        [
            {"category": c, "task": t, "mechanism": m, "seed": s, "score": v + 0.01 * s}
            for m, (basic, memory) in scores.items()
            for c, t, v in (("Basic", "copy", basic), ("Memory", "kv_recall", memory))
            for s in range(2)
        ]
    ).assign(chance=0.0)
    return build(runs, protocol, 1, "target")


def test_a_missing_mechanism_is_marked_not_dropped():
    b = board({"softmax": (0.9, 0.8), "gla": (0.6, 0.5), "retnet (reference)": (0.3, 0.2)})
    grids = published_lm.grids(b)
    data = published_lm.load()
    n_tables = len(data.drop_duplicates(["source", "table", "scale", "tokens"]))
    # the correlations, the pooled orderings and the pairs behind them, then each table
    assert len(grids) == 1 + 2 + n_tables
    assert grids[1].title.startswith("Published orderings the board reproduces")
    assert [g.title.split(":")[0] for g in grids[3:5]] == [
        "deltanet-2024 Table 1, 340M/15B",
        "deltanet-2024 Table 1, 1.3B/100B",
    ]
    t1 = grids[3]
    models = [r[0] for r in t1.rows]
    published = data[(data["source"] == "deltanet-2024") & (data["scale"] == "340M")]
    assert models == list(dict.fromkeys(published["model"]))  # every published row
    notes = {r[0]: cells[-1] for r, cells in zip(t1.rows, t1.cells, strict=True)}
    assert notes["DeltaNet (w. conv)"].startswith("(no rows of ours under quick")
    assert notes["Mamba (w. conv)"] == published_lm.NOT_IN_SYNTHBENCH
    assert notes["Transformer++"] == "" and notes["RetNet (w/o. conv)"] == ""
    assert "variant" in notes["GLA (w. conv)"] and "hybrid" in notes["DeltaNet + Sliding Attn"]
    summary = grids[0]
    first = summary.cells[0]
    assert first[0] == "3" and first[4] == "softmax, gla, retnet"  # the reference run counts
    # Table 4 of the Gated DeltaNet paper: only softmax and retnet are ours there
    gdn4 = [c for r, c in zip(summary.rows, summary.cells, strict=True) if "Table 4" in r[0]]
    assert gdn4[0][0] == "2" and gdn4[0][-1].startswith("too few mechanisms")


def test_fewer_than_three_covered_mechanisms_compare_nothing():
    assert published_lm.grids(board({"softmax": (0.9, 0.8), "linear": (0.5, 0.2)})) == []


def test_the_users_own_run_wins_over_the_reference():
    b = board({"softmax": (0.9, 0.8), "softmax (reference)": (0.1, 0.1), "gla (k=2)": (0.5, 0.5)})
    mine = published_lm.ours(b)
    assert mine["softmax"].label == "softmax" and "gla" not in mine


def test_a_label_that_only_shows_its_tracks_defaults_is_the_mechanism():
    """Other runs in the results (a fact's n_layers grid, its no-conv layer) make the labels
    show parameters; at the track's defaults the run is still the mechanism's."""
    b = board({"softmax (n_layers=2)": (0.9, 0.8), "softmax (reference)": (0.1, 0.1),
               "deltanet (n_layers=1)": (0.5, 0.5)})  # fmt: skip
    mine = published_lm.ours(b)
    assert mine["softmax"].label == "softmax (n_layers=2)" and "deltanet" not in mine
    block = board({"deltanet (allow_neg_eigval=False, use_short_conv=True)": (0.5, 0.5),
                   "gla (use_short_conv=True)": (0.4, 0.4)}, protocol="quick-block")  # fmt: skip
    assert set(published_lm.ours(block)) == {"deltanet"}  # gla's layer: use_short_conv=False


def test_write_reports_compares_each_track_on_its_own(tmp_path):
    scores = {"softmax": (0.9, 0.8), "gla": (0.7, 0.5), "deltanet": (0.6, 0.7)}
    scores["retnet"] = (0.3, 0.2)
    rows = frame(
        *(
            row(t, m, s, a + 0.01 * s, protocol=p)
            for p in ("quick", "quick-block")
            for m, (basic, memory) in scores.items()
            for t, a in (("copy", basic), ("kv_recall", memory))
            for s in range(2)
        )
    )
    written = write_reports(rows, tmp_path, formats=("md", "tex"), compare="published-lm")
    names = {p.name for p in written}
    assert {"published-lm-quick.md", "published-lm-quick-block.tex"} <= names
    assert (tmp_path / "leaderboard.md").exists()  # the normal reports too
    text = (tmp_path / "published-lm-quick-block.md").read_text()
    assert "protocol quick-block" in text and "(block track)" in text
    assert "1/24 = 0.042" in text


def test_unknown_comparison_names_the_close_ones(tmp_path):
    result = CliRunner().invoke(
        app, ["report", "--compare", "publishd-lm", "--out", str(tmp_path / "r")]
    )
    assert result.exit_code == 2
    assert "unknown comparison 'publishd-lm'; did you mean published-lm?" in result.output


TINY = {"softmax": 0.9, "gla": 0.7, "deltanet": 0.6, "retnet": 0.3}


def tiny_reference(path, scores: dict[str, float] = TINY, step: float = 0.01) -> None:
    """A reference file of ``scores``' mechanisms on copy and kv_recall (Memory), 2 seeds,
    each mechanism its value on both tasks (plus ``step`` times the seed), of today's
    versions."""
    version = PROTOCOLS.get("quick").version
    rows = frame(
        *(
            row(t, m, s, a + step * s, protocol="quick", version=version)
            for m, a in scores.items()
            for t in ("copy", "kv_recall")
            for s in range(2)
        )
    ).assign(suite_version=SUITE_VERSION, schema_version=SCHEMA_VERSION)
    for field in DATASET_SCHEMA:
        if field.name not in rows:
            rows[field.name] = None
    reference.write(rows, path)


def test_a_fresh_clone_compares_the_shipped_reference(tmp_path, monkeypatch):
    tiny_reference(tmp_path / "ref.parquet")
    monkeypatch.setenv(reference.ENV, str(tmp_path / "ref.parquet"))
    (tmp_path / "results").mkdir()  # empty: nothing of the user's
    out = tmp_path / "reports"
    args = ["report", "--compare", "published-lm", "--results", str(tmp_path / "results")]
    result = CliRunner().invoke(app, [*args, "--out", str(out), "--format", "md,tex"])
    assert result.exit_code == 0, result.output
    assert "comparing the shipped reference runs alone" in result.output
    text = (out / "published-lm-quick.md").read_text()
    assert "softmax (reference)" in text and "(not in synthbench" in text
    assert (out / "published-lm-quick.tex").exists() and (out / "leaderboard.md").exists()
