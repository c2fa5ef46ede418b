"""Stored rows are data (issue 32): a row whose names, numbers or version no training could
have written is left out with a warning naming its file and field, never ranked, never used
to build a path; every Markdown cell is escaped; reports stay inside --out.

The fuzz test edits one field of one stored file at a time to a hostile value (out of
range, of the wrong type, a path, markup) and runs `results` and `report` over the tree."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from clitools import invoke, tree

from synthbench.report.formats import markdown_text
from synthbench.report.publish import _under
from synthbench.run.row_checks import RANGES, row_problems
from synthbench.run.schema import SCHEMA_VERSION

HOSTILE_TEXT = [
    "../../../x",
    "/tmp/abs",
    "a/b",
    "..",
    "<img src=x onerror=alert(1)>",
    "**bold** _x_ [a](javascript:alert(1))",
    "lin|ear\nnext",
    "",
]
HOSTILE_NUMBERS = [7.5, -1.0, -0.001, 1.0001, math.inf, -math.inf, 1e308, 999]


def a_row(**changes) -> dict:
    row = {
        "protocol": "quick",
        "task": "copy",
        "mechanism": "softmax",
        "run_id": "0123456789abcdef",
        "schema_version": SCHEMA_VERSION,
        "status": "ok",
        "target_metric": "token_acc",
        "task_params": "{}",
        "mechanism_params": "{}",
        "config": '{"protocol": {"name": "quick"}}',
        "token_acc": 0.5,
        "lr": 1e-3,
        "steps": 10,
        "steps_done": 10,
        "seed": 0,
        "final_loss": 0.1,
        "curve_steps": [1, 2],
        "curve_val_token_acc": [0.1, 0.2],
    }
    return {**row, **changes}


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({}, None),
        ({"token_acc": 7.5}, "token_acc 7.5 is not in [0, 1]"),
        ({"token_acc": None}, None),  # a failed training has no metrics
        ({"token_acc": math.nan}, None),  # NaN reads as null in a frame: a missing value
        ({"schema_version": 999}, f"schema_version 999 is not in [1, {SCHEMA_VERSION}]"),
        ({"lr": 0.0}, "lr 0.0 is not > 0"),
        ({"steps_done": -1}, "steps_done -1 is not >= 0"),
        ({"final_loss": math.inf}, None),  # a diverged training
        ({"final_loss": -2.0}, "final_loss -2.0 is not >= 0"),
        ({"protocol": "../../../x"}, "protocol '../../../x' is not a name"),
        ({"mechanism": "<img src=x>"}, "mechanism '<img src=x>' is not a name"),
        ({"run_id": "a/b"}, "run_id 'a/b' is not a name"),
        ({"status": "great"}, "status 'great' is not one of diverged, ok, error, leaky"),
        ({"target_metric": "score"}, "target_metric 'score' is not one of"),
        ({"config": "[1, 2]"}, "config '[1, 2]' is not a JSON object"),
        ({"curve_val_token_acc": [0.1, 3.0]}, "curve_val_token_acc holds a value not in [0, 1]"),
        ({"curve_steps": [1]}, "curve_steps has 1 points, curve_val_token_acc 2"),
    ],
)
def test_row_problems_name_the_field(changes, problem):
    (found,) = row_problems(pd.DataFrame([a_row(**changes)]))
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem), found


def test_every_declared_range_refuses_a_value_past_it():
    for column, (low, high, open_low) in RANGES.items():
        below = low if open_low else low - 1
        for value in (below, high + 1 if high != math.inf else None, math.inf):
            if value is None or (column == "final_loss" and value == math.inf):
                continue
            (found,) = row_problems(pd.DataFrame([a_row(**{column: value})]))
            assert found is not None and found.startswith(column), (column, value, found)


def test_markdown_text_leaves_no_markup():
    assert markdown_text("<img src=x onerror=alert(1)>") == "&lt;img src=x onerror=alert(1)&gt;"
    assert markdown_text("**b** `c` ~~d~~ |") == r"\*\*b\*\* \`c\` \~\~d\~\~ \|"
    assert markdown_text("[a](javascript:x) ![i](y)") == r"[a\](javascript:x) ![i\](y)"
    assert markdown_text("_x_ long_copy") == r"\_x\_ long_copy"  # _ inside a word is inert
    assert markdown_text("0.5 [0.1, 0.9]") == "0.5 [0.1, 0.9]"
    assert markdown_text("a\nb") == "a b"


def test_report_folders_never_leave_out(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert _under(out, "quick", "target") == out / "quick" / "target"
    (out / "link").symlink_to(tmp_path)
    for parts in (("..",), ("../x",), ("/abs",), ("",), ("link",)):
        with pytest.raises(ValueError, match="outside --out"):
            _under(out, *parts)


# -- through the command line ------------------------------------------------------------


def _hostile_copy(path: Path, dest: Path, column: str, value, metadata_version=None) -> None:
    """``path``'s table with every row's ``column`` set to ``value`` (its own Arrow type, the
    column's type changed where it differs: a wrong type), written to ``dest``."""
    table = pq.read_table(path)
    index = table.schema.get_field_index(column)
    array = pa.array([value] * table.num_rows)
    table = table.set_column(index, column, array)
    metadata = dict(table.schema.metadata or {})
    if metadata_version is not None:
        metadata[b"synthbench_schema_version"] = str(metadata_version).encode()
    dest.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.replace_schema_metadata(metadata), dest)


def _outside(root: Path, out: Path) -> set[str]:
    return {str(p) for p in root.rglob("*") if out not in p.parents and p != out}


def _check_commands(results: Path, tmp_path: Path) -> None:
    """`results` and `report` over ``results`` neither crash, nor rank an impossible score,
    nor write outside --out, nor change the tree."""
    out = tmp_path / "reports"
    before, around = tree(results), _outside(tmp_path, out)
    listing = invoke("results", "--results", results)
    report = invoke("report", "--results", results, "--out", out, "--format", "md,tex,html")
    for result in (listing, report):
        assert result.exit_code in (0, 2), result.output
        assert "Traceback" not in result.output and "unexpected" not in result.output
        assert not isinstance(result.exception, Exception) or isinstance(
            result.exception, SystemExit
        ), result.exception
    assert tree(results) == before
    assert _outside(tmp_path, out) == around, "a report was written outside --out"
    for path in out.rglob("*"):
        assert path.resolve().is_relative_to(out.resolve())
    for path in out.rglob("*.md"):
        text = path.read_text()
        assert "<img" not in text and "](javascript" not in text, path
        scores = re.findall(r"\| *\d+ *\| [^|]+\| (-?\d+\.\d+)", text)
        assert all(float(s) <= 1 for s in scores), (path, scores)


# numeric and text columns of a file (the partition columns live in the path: below)
FUZZED = [
    "token_acc",
    "exact_match",
    "val_token_acc",
    "free_token_acc",
    "chance_token_acc",
    "token_acc_se",
    "schema_version",
    "lr",
    "steps",
    "steps_done",
    "seed",
    "n_params",
    "wall_seconds",
    "status",
    "target_metric",
    "task_params",
    "config",
    "selected",
]


@pytest.mark.parametrize("size", ["sample", pytest.param("full", marks=pytest.mark.slow)])
def test_fuzzed_stored_rows_are_never_ranked_nor_paths(results, tmp_path, size):
    """Every fuzzed column at full size (the slow tier); a sample of 8 in the fast tier."""
    rng = random.Random(32)
    (softmax,) = (results / "protocol=smoke" / "task=copy" / "mechanism=softmax").glob("*.parquet")
    pristine = softmax.read_bytes()
    cases = [(c, rng.choice([*HOSTILE_NUMBERS, *HOSTILE_TEXT, True])) for c in FUZZED]
    cases += [(c, rng.choice(HOSTILE_NUMBERS)) for c in rng.sample(FUZZED, 6)]
    if size == "sample":
        cases = rng.sample(cases, 8)
    for column, value in cases:
        _hostile_copy(softmax, softmax, column, value)
        _check_commands(results, tmp_path / f"{column}-{len(str(value))}")
        softmax.write_bytes(pristine)


@pytest.mark.parametrize("value", HOSTILE_TEXT[:6])
def test_a_protocol_read_from_an_older_file_never_becomes_a_path(results, tmp_path, value):
    """Files of schema < 6 hold their protocol: one that is a path or markup is left out
    with a warning naming the file and the field; nothing lands outside --out."""
    (softmax,) = (results / "protocol=smoke" / "task=copy" / "mechanism=softmax").glob("*.parquet")
    legacy = results / "task=copy" / "mechanism=softmax" / softmax.name
    table = pq.read_table(softmax)
    table = table.append_column("protocol", pa.array([value] * table.num_rows))
    metadata = {**table.schema.metadata, b"synthbench_schema_version": b"5"}
    legacy.parent.mkdir(parents=True)
    pq.write_table(table.drop(["cpu_isa", "cpu_model"]).replace_schema_metadata(metadata), legacy)
    softmax.unlink()
    _check_commands(results, tmp_path)
    report = invoke("report", "--results", results, "--out", tmp_path / "again", "--format", "md")
    assert f"skipping the row of {legacy}: protocol {value!r}" in report.stderr


@pytest.mark.parametrize(
    "folder", ["mechanism=<img src=x onerror=alert(1)>", "mechanism=**x**", "mechanism=.hidden"]
)
def test_a_folder_name_that_is_not_a_name_is_left_out(results, tmp_path, folder):
    (softmax,) = (results / "protocol=smoke" / "task=copy" / "mechanism=softmax").glob("*.parquet")
    odd = results / "protocol=smoke" / "task=copy" / folder / "0123456789abcdef.parquet"
    _hostile_copy(softmax, odd, "run_id", "0123456789abcdef")
    _check_commands(results, tmp_path)


def test_an_impossible_score_is_skipped_naming_file_and_field(results, tmp_path):
    (softmax,) = (results / "protocol=smoke" / "task=copy" / "mechanism=softmax").glob("*.parquet")
    _hostile_copy(softmax, softmax, "token_acc", 7.5)
    out = tmp_path / "reports"
    report = invoke("report", "--results", results, "--out", out, "--format", "md")
    assert report.exit_code == 0, report.output
    assert f"warning: skipping the row of {softmax}: token_acc 7.5 is not in [0, 1]" in (
        report.stderr
    )
    board = (out / "leaderboard.md").read_text()
    ranked = [line for line in board.splitlines() if re.match(r"\| +1 +\|", line)]
    assert ranked and "softmax" not in ranked[0]  # linear, the one row left, ranks first
    listing = invoke("results", "--results", results, "--json")
    assert all(r["mechanism"] != "softmax" for r in json.loads(listing.stdout))
