"""synthbench audit --informative (synthbench/report/informative.py): the separation rule on
intervals computed by hand, the pairs, the ceiling and the floor on hand-made rows whose
answers are known, the command on a reference file and on the shipped one, its bad input."""

from __future__ import annotations

import math
from itertools import combinations

import pandas as pd
import pytest
from clitools import assert_error, invoke

from synthbench.report import informative
from synthbench.report.informative import Interval, informativeness, interval, separated

Z = 1.96


def test_an_interval_holds_the_seeds_spread_and_the_test_sets():
    values, ses = pd.Series([0.9, 0.8, 1.0]), pd.Series([0.01, 0.02, 0.03])
    # the seeds' variance 0.01, the mean squared standard error (1 + 4 + 9) / 3 x 1e-4
    half = Z * math.sqrt((0.01 + 14e-4 / 3) / 3)
    assert interval(values, ses) == pytest.approx((0.9, half))
    # one seed: no spread, its test set alone; a missing standard error counts as 0
    assert interval(pd.Series([0.5]), pd.Series([float("nan")])) == (0.5, 0.0)


@pytest.mark.parametrize(
    "a, b, expected",
    [
        (Interval(0.9, 0.02), Interval(0.8, 0.03), True),  # 0.1 apart, beyond 0.05
        (Interval(0.9, 0.05), Interval(0.82, 0.04), False),  # 0.08 apart, within 0.09
        (Interval(0.5, 0.001), Interval(0.54, 0.001), False),  # beyond the noise, under 0.05
        (Interval(0.75, 0.0), Interval(0.70, 0.0), True),  # exactly 0.05, in binary too
        (Interval(0.2, 0.1), Interval(0.6, 0.1), True),  # either order
    ],
)
def test_two_cells_separate_by_005_and_beyond_both_intervals(a, b, expected):
    assert separated(a, b) is expected and separated(b, a) is expected


def runs_of(protocol, task, cells, chance=0.1, se=0.0, target="token_acc"):
    """Stored rows (one lr, selected) of ``cells``: mechanism -> its seeds' test values."""
    return [
        {
            "protocol": protocol,
            "protocol_version": 6 if protocol == "quick" else 4,
            "suite_version": 4,
            "category": "Test",
            "task": task,
            "mechanism": mech,
            "run_id": f"{protocol}-{task}-{mech}-{seed}",
            "seed": seed,
            "lr": 1e-3,
            "status": "ok",
            "selected": True,
            "target_metric": target,
            target: value,
            f"{target}_se": se,
            "chance_token_acc": chance,
            "chance_exact_match": 0.0,
        }
        for mech, values in cells.items()
        for seed, value in enumerate(values)
    ]


MECHS = [f"m{i:02d}" for i in range(12)]


def hand_made_rows() -> pd.DataFrame:
    """copy: 12 mechanisms at 1.0 (the ceiling, nothing separated); parity: 10 at chance 0.5
    and 2 far above (the floor; only the pairs with those 2 separate); kv_recall: 4 cells
    0.2 apart with tight seeds (all 6 pairs), one cell of a single seed (no cell), and the
    control none, far below (no pair); the block track: copy again, two cells 0.03 apart."""
    spread = {m: [0.2 * i + d for d in (0.0, 0.01, -0.01)] for i, m in enumerate(MECHS[:4])}
    rows = (
        runs_of("quick", "copy", {m: [1.0, 1.0, 0.995] for m in MECHS})
        + runs_of("quick", "parity", {m: [0.5, 0.51, 0.5] for m in MECHS[:10]}, chance=0.5)
        + runs_of("quick", "parity", {"m10": [0.9, 0.92, 0.91], "m11": [1.0, 1.0, 1.0]}, 0.5)
        + runs_of("quick", "kv_recall", spread, se=0.005)
        + runs_of("quick", "kv_recall", {"m05": [0.5], "none": [0.0, 0.0, 0.0]})
        + runs_of("quick-block", "copy", {"m00": [0.9, 0.9], "m01": [0.93, 0.93]})
    )
    return pd.DataFrame(rows)


def test_pairs_ceiling_and_floor_on_known_rows():
    table = informativeness(hand_made_rows()).set_index(["protocol", "task"])
    copy = table.loc[("quick", "copy")]
    assert (copy["mechanisms"], copy["pairs"], copy["separated"]) == (12, 66, 0)
    assert (copy["ceiling"], copy["bound"], copy["track"]) == (12, "ceiling", "core")
    parity = table.loc[("quick", "parity")]
    assert (parity["separated"], parity["floor"], parity["bound"]) == (2 * 10 + 1, 10, "floor")
    kv = table.loc[("quick", "kv_recall")]
    assert (kv["mechanisms"], kv["pairs"], kv["separated"], kv["bound"]) == (4, 6, 6, "")
    block = table.loc[("quick-block", "copy")]
    assert (block["track"], block["pairs"], block["separated"]) == ("block", 1, 0)  # 0.03 apart
    lines = informative.summary(informativeness(hand_made_rows()))
    assert lines[0].startswith("quick v6 (core track): 27 of 138 pairs separated (20%) over 3")
    assert "separating none: copy; at the ceiling: copy; at the floor: parity" in lines[0]
    assert lines[1].startswith("quick-block v4 (block track): 0 of 1 pairs separated (0%)")


def test_the_count_is_the_rule_applied_to_every_pair():
    """The separated count equals the rule applied here pair by pair to intervals computed
    from the rows by hand."""
    rows = hand_made_rows()
    kv = rows[(rows["task"] == "kv_recall") & rows["mechanism"].isin(MECHS[:4])]
    cells = []
    for _, cell in kv.groupby("mechanism"):
        n = len(cell)
        variance = cell["token_acc"].var() + (cell["token_acc_se"] ** 2).mean()
        cells.append((cell["token_acc"].mean(), Z * math.sqrt(variance / n)))
    expected = sum(
        abs(ma - mb) >= 0.05 and abs(ma - mb) > ha + hb
        for (ma, ha), (mb, hb) in combinations(cells, 2)
    )
    assert informative.separated_pairs(informative.selected_runs(kv, "target")) == {
        "kv_recall": expected
    }


def test_a_task_filter_and_nothing_to_count():
    table = informativeness(hand_made_rows(), tasks=["parity"])
    assert set(table["task"]) == {"parity"}
    lonely = pd.DataFrame(runs_of("quick", "copy", {"m00": [1.0, 1.0], "m01": [1.0]}))
    with pytest.raises(ValueError, match="no task holds 2 or more mechanisms"):
        informativeness(lonely)


def test_the_command_on_a_reference_file(tmp_path, monkeypatch):
    path = tmp_path / "reference.parquet"
    hand_made_rows().to_parquet(path)
    monkeypatch.setenv("SYNTHBENCH_REFERENCE", str(path))
    result = invoke("audit", "--informative")
    assert result.exit_code == 0, result.output
    assert f"counting the shipped reference {path}, read as stored: quick v6, quick-block v4" in (
        result.stdout
    )
    assert "| quick v6 | core | copy | 12 | 0 of 66 | 12 | 0 | ceiling |" in result.stdout
    assert "at the floor: parity" in result.stdout
    one = invoke("audit", "mqar", "--informative")  # an alias of kv_recall
    assert one.exit_code == 0 and "| parity |" not in one.stdout and "kv_recall" in one.stdout


def test_the_shipped_reference_is_counted_with_its_versions_named():
    result = invoke("audit", "--informative")
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert first.startswith("counting the shipped reference") and "quick v" in first
    assert "(core track)" in result.stdout and "(block track)" in result.stdout


def test_the_shortcut_audit_still_takes_its_task():
    """NAME became optional for --informative; without it the shortcut audit runs as ever."""
    result = invoke("audit", "bigram", "--difficulty", "easy")
    assert result.exit_code == 0, result.output
    assert "| bigram | easy |" in result.stdout and "control" in result.stdout


def test_bad_input_is_one_line(tmp_path, monkeypatch):
    assert_error(invoke("audit", "--informative", "--results", tmp_path / "nope"), 2,
                 "does not exist")  # fmt: skip
    assert_error(invoke("audit", "--informative", "--results", tmp_path), 2, "no runs stored")
    assert_error(invoke("audit", "--informative", "--check"), 2, "not --informative")
    assert_error(invoke("audit", "copy", "--results", tmp_path), 2, "only by --informative")
    assert_error(invoke("audit"), 2, "give a task name")
    assert_error(invoke("audit", "kvrecall", "--informative"), 2, "did you mean kv_recall")
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    monkeypatch.setenv("SYNTHBENCH_REFERENCE", str(bad))
    assert_error(invoke("audit", "--informative"), 2, "cannot read the reference")
