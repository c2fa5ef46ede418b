"""A path built from stored data never leaves its root (issue 73): every one goes through
``synthbench.core.paths.path_under`` (the results tree's through ``ResultStore.path_for``),
fuzzed here as tests/test_stored_rows.py fuzzes the readers; `migrate` checks every row as
the readers do and moves no file a row of which fails; a file moved aside is named where it
stood."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from clitools import SMOKE, invoke, tree
from test_stored_rows import HOSTILE_TEXT

from synthbench.core.paths import OutsideRoot, path_under
from synthbench.run.store import ResultStore

# pieces a hostile value is made of: climbing, absolute, separators, NUL, hidden names,
# markup, encodings of them, and harmless text around them
PIECES = ["..", ".", "/", "\\", "\x00", "~", "a", "protocol=", "x.parquet", " ", "é", "%2e%2e",
          "<img src=x>", "C:", "//", "\n", "*", ".hidden", "-", "+", "_"]  # fmt: skip
ESCAPES = ["../../../../ESCAPED", "../../x", "<img src=x onerror=alert(1)>", "/tmp/abs", "..",
           ".", "", "a/b", "a\\b", "smoke\x00x", ".hidden"]  # fmt: skip


def hostile_values(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    values = list(ESCAPES)
    for _ in range(n):
        values.append("".join(rng.choice(PIECES) for _ in range(rng.randint(1, 6))))
    return values


def inside(root: Path, path: Path) -> bool:
    """Whether ``path`` lies under ``root``, lexically and once resolved."""
    lexical = os.path.normpath(path)
    return (
        os.path.commonpath([os.path.normpath(root), lexical]) == os.path.normpath(root)
        and lexical != os.path.normpath(root)
        and path.resolve().is_relative_to(root.resolve())
    )


def test_path_under_refuses_every_part_that_is_not_one_plain_name(tmp_path):
    root = tmp_path / "root"
    for value in hostile_values(73, 2000):
        for parts in ((value,), ("ok", value), (value, "x.parquet")):
            try:
                path = path_under(root, *parts)
            except OutsideRoot as exc:
                assert str(root) in str(exc)
                continue
            assert inside(root, path), (parts, path)
            assert path.parts == (*root.parts, *parts)  # each part one folder or file


def test_the_results_tree_builds_no_path_from_a_value_that_is_not_a_name(tmp_path):
    """Each of a run's values (protocol, task, mechanism, run id), in both layouts: a value
    the registry's name rule refuses (synthbench/run/row_checks.py) builds no path."""
    store = ResultStore(tmp_path / "results")
    good = ["smoke", "copy", "softmax", "0123456789abcdef"]
    for value in hostile_values(32, 300):
        for i in range(4):
            values = good[:i] + [value] + good[i + 1 :]
            for build in (store.path_for, lambda *v: store.legacy_path_for(*v[1:])):
                if build is not store.path_for and i == 0:
                    continue  # the older layout has no protocol level
                try:
                    path = build(*values)
                except OutsideRoot as exc:
                    assert "is not a name" in str(exc) or "no path under" in str(exc)
                    continue
                assert inside(store.root, path) and path.name == f"{values[3]}.parquet"
                assert not any(part.startswith(".") for part in path.relative_to(store.root).parts)


def legacy_file(results: Path, protocol: object) -> list[Path]:
    """Every run of ``results`` rewritten in the layout before schema 6, its protocol (in
    the file) set to ``protocol``; their new places."""
    moved = []
    for path in sorted((results / "protocol=smoke").rglob("*.parquet")):
        folders = path.relative_to(results / "protocol=smoke").parent
        table = pq.read_table(path)
        table = table.append_column("protocol", pa.array([protocol] * table.num_rows))
        metadata = {**table.schema.metadata, b"synthbench_schema_version": b"5"}
        legacy = results / folders / path.name
        legacy.parent.mkdir(parents=True, exist_ok=True)
        table = table.drop(["cpu_isa", "cpu_model"]).replace_schema_metadata(metadata)
        pq.write_table(table, legacy)
        path.unlink()
        moved.append(legacy)
    for folder in sorted((results / "protocol=smoke").rglob("*"), reverse=True):
        folder.rmdir()
    (results / "protocol=smoke").rmdir()
    return moved


def everything(root: Path) -> set[str]:
    """Every file and folder under ``root``."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("protocol", ["../../../../ESCAPED", "../../x", *HOSTILE_TEXT])
def test_migrate_moves_no_file_whose_rows_name_no_protocol(results, tmp_path, protocol):
    """The issue's case: `migrate --results a/b/r` moved such files to a/ESCAPED/... or to
    a/b/r/x/..., out of every reader's sight, and created a folder named by markup."""
    legacy = legacy_file(results, protocol)
    before, around = tree(results), everything(tmp_path)
    result = invoke("migrate", "--results", results)
    assert result.exit_code == 1, result.output
    assert "moved 0 files" in result.stdout
    for path in legacy:
        assert f"warning: left {path} where it is: protocol {protocol!r}" in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: 2 files of the older layout left where they are (see the warnings above)"
    ]
    assert tree(results) == before and everything(tmp_path) == around  # nothing moved or made


def test_results_recommend_migrate_only_for_files_it_moves(results):
    legacy_file(results, "../../x")
    listed = invoke("results", "--results", results)
    assert listed.exit_code == 0, listed.output
    assert "protocol '../../x' is not a name" in listed.stderr
    assert "synthbench migrate" not in listed.stderr  # it would leave them: no advice


def test_migrate_still_moves_a_good_older_tree(results):
    legacy = legacy_file(results, "smoke")
    moved = invoke("migrate", "--results", results)
    assert moved.exit_code == 0 and "moved 2 files (protocol=smoke)" in moved.stdout
    assert all(not path.exists() for path in legacy)
    assert len(list((results / "protocol=smoke").rglob("*.parquet"))) == 2


def test_an_unreadable_file_of_the_older_layout_is_moved_aside_where_it_stands(results):
    """The issue's case: `run` said it moved a file from under protocol=smoke/, where it
    never stood; it stood in the older layout's task=copy/mechanism=softmax/."""
    (softmax,) = legacy_file(results, "smoke")[1:]
    softmax.write_bytes(b"not parquet")
    result = invoke("run", "--task", "copy", "--mech", "softmax", *SMOKE, "--results", results)
    assert result.exit_code == 0, result.output
    (aside,) = [p for p in softmax.parent.iterdir() if ".unreadable-" in p.name]
    assert aside.name.startswith(f".{softmax.name}.unreadable-")
    assert aside.read_bytes() == b"not parquet"
    assert f"{softmax} could not be read (" in result.stderr
    assert f"moved it to {aside}" in result.stderr
    assert "protocol=smoke" not in result.stderr  # nothing of it ever stood there
    new = ResultStore(results).path_for("smoke", "copy", "softmax", softmax.stem)
    assert new.is_file() and list(new.parent.iterdir()) == [new]
