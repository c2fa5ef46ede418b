"""An option or argument that names nothing ('', ',,') is a one-line error with exit status 2
(issue 73), never read as "no filter" (which would list, report or retrain everything) nor
as "nothing to do"; the results tree is left as it was."""

from __future__ import annotations

import pytest
from clitools import assert_error, invoke, tree


@pytest.mark.parametrize(
    "args, message",
    [
        (["results", "--task", ""], "--task names no task (got '')"),
        (["results", "--mech", ",,"], "--mech names no mechanism (got ',,')"),
        (["results", "--protocol", " "], "--protocol names no protocol (got ' ')"),
        (["results", "--status", ""], "--status names no status (got '')"),
        (["report", "--protocol", ""], "--protocol names no protocol (got '')"),
        (["report", "--task", ""], "--task names no task (got '')"),
        (["report", "--mech", ","], "--mech names no mechanism (got ',')"),
        (["report", "--format", ""], "--format names no format (got '')"),
        (["reproduce", "--protocol", ""], "--protocol names no protocol (got '')"),
        (["reproduce", "--task", ","], "--task names no task (got ',')"),
        (["reproduce", "--mech", ""], "--mech names no mechanism (got '')"),
        (["facts", "run", ""], "NAMES names no fact (got ''): give 'all' or fact names"),
        (["facts", "run", ",,"], "NAMES names no fact (got ',,')"),
        (["facts", "report", ""], "NAMES names no fact (got '')"),
        (["run", "--task", "copy", "--difficulty", ""], "--difficulty names no preset (got '')"),
        (["run", "--task", ",", "--protocol", "smoke"], "--task names no task (got ',')"),
    ],
    ids=lambda x: " ".join(map(repr, x)) if isinstance(x, list) else None,
)
def test_a_value_naming_nothing_is_an_error(results, tmp_path, args, message):
    before = tree(results)
    where = {
        "results": ["--results", results],
        "report": ["--results", results, "--out", tmp_path / "reports"],
        "reproduce": ["--results", tmp_path / "again", "--runs", 1],
        "facts": ["--results", results],
        "run": ["--results", results, "--dry-run"],
    }[args[0]]
    assert_error(invoke(*args, *where), 2, message)
    assert tree(results) == before
    assert not (tmp_path / "reports").exists() and not (tmp_path / "again").exists()
