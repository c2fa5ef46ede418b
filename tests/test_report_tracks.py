"""What the report says of tracks and of diverged runs: every table names the track it shows,
a core protocol and its block twin are put side by side with the rank moves, and a
mechanism whose runs diverged is scored as no right answer there and ranked last."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
from test_report import frame, row

from synthbench.report.aggregate import protocol_track
from synthbench.report.leaderboard import DIVERGED_NOTE, build, to_markdown
from synthbench.report.publish import write_reports
from synthbench.report.tracks import kendall_tau, move_text, side_by_side
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.spec import RunSpec


def scores(values: dict[tuple[str, str, str], list[float]]) -> pd.DataFrame:
    """{(category, task, mechanism): per-seed scores} -> the runs frame build() takes."""
    return pd.DataFrame(
        [
            {"category": c, "task": t, "mechanism": m, "seed": s, "score": v}
            for (c, t, m), seeds in values.items()
            for s, v in enumerate(seeds)
        ]
    )


def diverged(*runs) -> pd.DataFrame:
    return pd.DataFrame(runs, columns=["category", "task", "mechanism", "seed"])


def test_a_diverged_run_scores_nothing_and_ranks_its_mechanism_last():
    # "a" is far ahead on the runs it has, but one of its kv_recall seeds diverged
    runs = scores(
        {
            ("Basic", "copy", "a"): [1.0, 1.0],
            ("Memory", "kv_recall", "a"): [0.9],  # seed 1 diverged
            ("Basic", "copy", "b"): [0.3, 0.3],
            ("Memory", "kv_recall", "b"): [0.2, 0.2],
        }
    ).assign(chance=0.0)
    board = build(
        runs,
        "quick-block",
        1,
        "token_acc",
        diverged=diverged(("Memory", "kv_recall", "a", 1)),
        track="block",
    )
    table = board.table.set_index("mechanism")
    assert board.table["mechanism"].tolist() == ["b", "a"]
    assert table.loc["a", "rank"] == 2 and bool(table.loc["a", "complete"])
    # the diverged seed counts as 0 (no chance here): kv_recall's mean (0.9 + 0) / 2
    assert table.loc["a", "Memory"] == pytest.approx(0.45)
    assert table.loc["a", "diverged_runs"] == 1 and table.loc["b", "diverged_runs"] == 0
    text = to_markdown(board)
    assert "2/2, 1 run diverged" in text and DIVERGED_NOTE in text
    assert "block track" in text


def test_a_diverged_run_scores_below_chance_where_the_metric_is_normalised():
    runs = scores({("Memory", "kv_recall", "a"): [1.0, 1.0], ("Memory", "kv_recall", "b"): [1.0]})
    runs["chance"] = 0.2
    board = build(runs, "quick", 1, "target", diverged=diverged(("Memory", "kv_recall", "b", 1)))
    table = board.table.set_index("mechanism")
    # what no right answer scores: (0 - 0.2) / (1 - 0.2) = -0.25; mean (1 - 0.25) / 2
    assert table.loc["b", "score"] == pytest.approx(0.375)
    assert board.table["mechanism"].tolist() == ["a", "b"]


def test_a_board_without_divergence_says_nothing_of_it():
    board = build(scores({("Basic", "copy", "a"): [0.5, 0.6]}), "quick", 1, "token_acc")
    assert DIVERGED_NOTE not in to_markdown(board) and "core track" in to_markdown(board)


def test_moves_and_rank_agreement():
    assert [move_text(3, 1), move_text(1, 4), move_text(2, 2), move_text(None, 1)] == [
        "up 2",
        "down 3",
        "=",
        "--",
    ]
    assert kendall_tau({"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 2, "c": 3}) == (1.0, 3)
    assert kendall_tau({"a": 1, "b": 2, "c": 3}, {"a": 3, "b": 2, "c": 1}) == (-1.0, 3)
    # one swapped pair of three: (2 - 1) / 3; d ranked in one only
    tau, n = kendall_tau({"a": 1, "b": 2, "c": 3, "d": 4}, {"a": 2, "b": 1, "c": 3})
    assert (tau, n) == (pytest.approx(1 / 3), 3)


def test_the_track_comes_from_the_stored_config_then_the_protocol_name():
    block = {"protocol": {"arch": "block", "name": "mine"}}
    core = {"protocol": {"arch": "attn-conv", "name": "mine"}}
    assert protocol_track(frame(row("copy", "a", 0, 1.0, config=json.dumps(block)))) == "block"
    assert protocol_track(frame(row("copy", "a", 0, 1.0, config=json.dumps(core)))) == "core"
    assert protocol_track(frame(row("copy", "a", 0, 1.0, protocol="quick-block"))) == "block"
    assert protocol_track(frame(row("copy", "a", 0, 1.0, protocol="quick"))) == "core"
    assert protocol_track(frame(row("copy", "a", 0, 1.0, protocol="not-registered"))) == "core"


@pytest.fixture
def two_tracks() -> pd.DataFrame:
    """smoke and its block twin: in the core track softmax leads linear, in the block track
    linear leads softmax and deltanet diverged on one kv_recall seed."""
    rows = []
    for protocol, accs in (
        ("smoke", {"softmax": 0.9, "linear": 0.5, "deltanet": 0.4}),
        ("smoke-block", {"softmax": 0.6, "linear": 0.8, "deltanet": 1.0}),
    ):
        for mech, acc in accs.items():
            for task in ("copy", "kv_recall"):
                for seed in range(3):
                    if (protocol, mech, task, seed) == ("smoke-block", "deltanet", "kv_recall", 2):
                        rows.append(
                            row(task, mech, seed, None, protocol=protocol, status="diverged")
                        )
                    else:
                        rows.append(row(task, mech, seed, acc + seed / 100, protocol=protocol))
    return frame(*rows)


def test_the_report_puts_the_two_tracks_side_by_side(two_tracks, tmp_path):
    written = write_reports(two_tracks, tmp_path, formats=("md", "tex"))
    names = sorted(p.relative_to(tmp_path).as_posix() for p in written)
    assert "tracks-smoke.md" in names and "tracks-smoke.tex" in names
    side = (tmp_path / "tracks-smoke.md").read_text()
    assert "protocol smoke v1 (core track)" in side
    assert "protocol smoke-block v1 (block track)" in side
    lines = {line.split("|")[1].strip(): line for line in side.splitlines() if line.count("|") > 5}
    # core: softmax 1, linear 2, deltanet 3; block: linear 1, softmax 2, deltanet 3 (diverged)
    assert "up 1" in lines["linear"] and "down 1" in lines["softmax"]
    assert lines["deltanet"].rstrip(" |").endswith("=")
    assert "Rank moves: softmax 1 → 2; linear 2 → 1." in side
    assert "Kendall's tau between the two rankings: 0.33 over the 3 mechanisms" in side
    assert r"softmax 1 $\to$ 2" in (tmp_path / "tracks-smoke.tex").read_text()
    board = (tmp_path / "leaderboard.md").read_text()
    assert "## smoke (core track)" in board and "## smoke-block (block track)" in board
    assert "1 run diverged" in board and DIVERGED_NOTE in board
    # every table of a protocol says its track
    assert "(block track)" in (tmp_path / "smoke-block" / "target" / "full.md").read_text()
    assert "(block track)" in (tmp_path / "smoke-block" / "separation.md").read_text()
    assert "(core track)" in (tmp_path / "smoke" / "target" / "summary.md").read_text()


def test_no_side_by_side_without_the_twin(two_tracks, tmp_path):
    core_only = two_tracks[two_tracks["protocol"] == "smoke"]
    written = write_reports(core_only, tmp_path, formats=("md",))
    assert not any(p.name.startswith("tracks-") for p in written)


def test_the_page_says_the_track_and_the_divergence(two_tracks, tmp_path):
    write_reports(two_tracks, tmp_path, formats=("html",))
    page = (tmp_path / "leaderboard.html").read_text()
    assert '"track": "block"' in page and '"diverged_runs": 1' in page
    assert 'id="note-diverged" hidden>Diverged: runs' in page


def test_one_mechanism_meets_itself_across_the_tracks_beside_its_variants(tmp_path):
    """Facts' runs in the same results tree make the labels show parameters: a width grid of
    softmax under smoke shows n_layers on every smoke row, the no-conv deltanet under
    smoke-block shows the layer's options on every deltanet row. The side-by-side still
    pairs each mechanism at its track's defaults with itself, and keeps the variants apart."""
    rows = []
    runs = {  # (protocol, mechanism, layer or protocol changes) -> accuracy
        ("smoke", "softmax", ()): 0.9,
        ("smoke", "deltanet", ()): 0.5,
        ("smoke", "softmax", (("n_layers", 2),)): 0.3,
        ("smoke-block", "softmax", ()): 0.6,
        ("smoke-block", "deltanet", ()): 0.8,
        ("smoke-block", "deltanet", (("use_short_conv", False),)): 0.2,
    }
    for (protocol, mech, changes), acc in runs.items():
        base = PROTOCOLS.get(protocol)
        fields = dict(changes)
        protocol_changes = {k: v for k, v in fields.items() if hasattr(base, k)}
        layer = {k: v for k, v in fields.items() if not hasattr(base, k)} or None
        chosen = dataclasses.replace(base, **protocol_changes)
        for task in ("copy", "kv_recall"):
            spec = RunSpec.resolve(task, mech, chosen, 0, mechanism_overrides=layer)
            stored = {k: spec.row_fields()[k] for k in ("run_id", "mechanism_params", "config")}
            rows.append(row(task, mech, 0, acc, protocol=protocol, **stored))
    written = write_reports(frame(*rows), tmp_path, formats=("md",))
    assert (tmp_path / "leaderboard.md") in written
    side = (tmp_path / "tracks-smoke.md").read_text()
    table = [line for line in side.splitlines() if line.count("|") > 5 and "|:" not in line]
    lines = {line.split("|")[1].strip(): line for line in table}
    assert set(lines) - {"mechanism"} == {"softmax", "deltanet", "softmax (n_layers=2)",
                                          "deltanet (use_short_conv=False)"}  # fmt: skip
    # core: softmax 1, deltanet 2, softmax (n_layers=2) 3; block: deltanet 1, softmax 2, ...
    assert "up 1" in lines["deltanet"] and "down 1" in lines["softmax"]
    assert lines["softmax (n_layers=2)"].rstrip(" |").endswith("--")
    assert "Kendall's tau between the two rankings: -1.00 over the 2 mechanisms" in side
    board = (tmp_path / "leaderboard.md").read_text()
    assert "softmax (n_layers=1)" in board  # the leaderboards keep their full labels


def test_a_reference_runs_mark_stays_when_its_defaults_are_dropped():
    core = build(scores({("Basic", "copy", "softmax (n_layers=2) (reference)"): [0.9, 0.9],
                         ("Basic", "copy", "deltanet (n_layers=2)"): [0.5, 0.5]}),
                 "quick", 1, "token_acc")  # fmt: skip
    block = build(scores({("Basic", "copy", "softmax (reference)"): [0.4, 0.4],
                          ("Basic", "copy", "deltanet"): [0.8, 0.8]}),
                  "quick-block", 1, "token_acc", track="block")  # fmt: skip
    grid = side_by_side(core, block)
    moves = {r[0]: cells[-1] for r, cells in zip(grid.rows, grid.cells, strict=True)}
    assert moves == {"softmax (reference)": "down 1", "deltanet": "up 1"}


def test_a_mechanism_at_each_tracks_own_defaults_is_named_alone_on_both_boards(tmp_path):
    """mamba2's core runs store chunk_size 64, its published layer's 256 (and the layer's
    other parameters): each protocol's runs hold one parameter set, so neither board labels
    it as a variant, and both quote its declared state."""
    rows = []
    for protocol in ("smoke", "smoke-block"):
        for mech, acc in (("mamba2", 0.7), ("softmax", 0.9)):
            for task in ("copy", "kv_recall"):
                spec = RunSpec.resolve(task, mech, PROTOCOLS.get(protocol), 0)
                fields = spec.row_fields()
                stored = {k: fields[k] for k in ("run_id", "mechanism_params", "config")}
                rows.append(row(task, mech, 0, acc, protocol=protocol, **stored))
    params = {r["protocol"]: r["mechanism_params"] for r in rows if r["mechanism"] == "mamba2"}
    assert params["smoke"] != params["smoke-block"]  # what would make a cross-protocol label
    write_reports(frame(*rows), tmp_path, formats=("md",))
    board = (tmp_path / "leaderboard.md").read_text()
    assert "mamba2 (" not in board
    lines = [line for line in board.splitlines() if line.startswith("| 2 ")]
    assert len(lines) == 2 and all("| mamba2 " in line for line in lines)
    assert not any(line.rstrip(" |").endswith("--") for line in lines)  # its state/head
    assert "mamba2 (" not in (tmp_path / "smoke" / "target" / "full.md").read_text()
