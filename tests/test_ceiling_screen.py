"""benchmarks/ceiling_screen.py: a ladder's top level is judged at the ceiling or below it
as soon as its runs decide it, from complete runs only."""

from __future__ import annotations

import json
import math

import pytest
from clitools import load_script

from synthbench.core.task import TASKS
from synthbench.run.store import ResultStore

screen = load_script("ceiling_screen")
MECHS = [f"m{i}" for i in range(12)]


def test_the_verdict_is_reached_as_soon_as_the_runs_decide_it():
    assert screen.verdict({}, MECHS) == ("open", 0, 12)
    # ten at the ceiling: decided whatever the other two score
    at_top = {m: 0.99 for m in MECHS[:10]}
    assert screen.verdict(at_top, MECHS) == ("at the ceiling", 10, 2)
    # three below: the nine untried cannot take the count to ten
    low = {m: 0.5 for m in MECHS[:3]}
    assert screen.verdict(low, MECHS) == ("below the ceiling", 0, 9)
    # two below, ten untried: not yet
    assert screen.verdict({m: 0.5 for m in MECHS[:2]}, MECHS)[0] == "open"
    # 0.98 is at the ceiling (within 0.02 of 1.0); a failed run (NaN) is not
    edge = {**{m: 0.98 for m in MECHS[:9]}, MECHS[9]: math.nan}
    assert screen.verdict(edge, MECHS) == ("open", 9, 2)
    # ... with one untried, ten are still possible; with none, nine is the most
    assert screen.verdict({**edge, MECHS[10]: math.nan}, MECHS)[0] == "open"
    failed = {**edge, MECHS[10]: math.nan, MECHS[11]: 0.5}
    assert screen.verdict(failed, MECHS) == ("below the ceiling", 9, 0)


def level_rows(smoke_tree, level: str):
    """The smoke tree's two copy runs as if trained at ``level`` of copy's ladder."""
    rows = ResultStore(smoke_tree).load(warn=False).rows
    params = next(p for p, name in _levels("copy").items() if name == level)
    return rows.assign(task_params=params)


def _levels(task: str) -> dict[str, str]:
    spec = TASKS.get(task)
    return {
        json.dumps(spec(**overrides).param_dict(), sort_keys=True): name
        for name, overrides in spec.ladder.levels.items()
    }


def test_a_level_is_scored_from_its_complete_runs_selected_rows(smoke_tree):
    rows = level_rows(smoke_tree, "L3")
    found = screen.level_scores(rows, "smoke", "copy", "L3")
    selected = rows[rows["selected"]]
    expected = {r["mechanism"]: r[r["target_metric"]] for r in selected.to_dict("records")}
    assert found == pytest.approx(expected) and sorted(found) == ["linear", "softmax"]
    assert screen.level_scores(rows, "smoke", "copy", "L2") == {}
    assert screen.level_scores(rows, "quick", "copy", "L3") == {}


def test_a_run_under_way_is_not_scored(smoke_tree):
    rows = level_rows(smoke_tree, "L3")
    softmax = rows["mechanism"] == "softmax"
    dropped = rows[softmax & ~rows["selected"]].index[:1]  # one lr of its sweep not yet back
    found = screen.level_scores(rows.drop(dropped).assign(selected=False), "smoke", "copy", "L3")
    assert found == {}
    partial = rows.drop(dropped)
    partial.loc[partial["mechanism"] == "softmax", "selected"] = False
    assert sorted(screen.level_scores(partial, "smoke", "copy", "L3")) == ["linear"]


def test_bad_input_is_one_line_and_nonzero(tmp_path, capsys):
    assert screen.main(["--results", str(tmp_path), "--tasks", "bigram"]) == 2
    assert capsys.readouterr().err.strip() == "ceiling_screen: no ladder: bigram"
    assert screen.main(["--results", str(tmp_path), "--mechs", "softmax,linear"]) == 2
    assert "cannot reach 10" in capsys.readouterr().err
