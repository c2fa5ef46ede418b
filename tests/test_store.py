"""The results store: atomic one-file-per-run writes, the Hive tree, corrupt-file handling."""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import subprocess
import sys
import warnings

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import torch
from clitools import invoke  # tests/clitools.py, beside this file

from synthbench.run.protocols import PROTOCOLS
from synthbench.run.runner import run_sweep
from synthbench.run.schema import (
    ADDED_IN,
    COLUMNS,
    DATASET_SCHEMA,
    PARTITIONS,
    SCHEMA,
    SCHEMA_VERSION,
    SchemaError,
)
from synthbench.run.spec import RunSpec
from synthbench.run.store import CorruptResultWarning, ResultStore

pytestmark = pytest.mark.usefixtures("single_thread")

SWEEP = dataclasses.replace(PROTOCOLS.get("smoke"), steps=3, lrs=(1e-3, 3e-3))


@pytest.fixture(scope="module")
def runs(single_thread) -> dict[str, list[dict]]:
    """Rows of three real runs (two lr rows each)."""
    specs = {
        "a": RunSpec.resolve("kv_recall", "linear", SWEEP, 0, {"pairs": 4, "queries": 2}),
        "b": RunSpec.resolve("kv_recall", "linear", SWEEP, 1, {"pairs": 4, "queries": 2}),
        "c": RunSpec.resolve("copy", "softmax", SWEEP, 0, {"n": 4}),
    }
    rows = {key: run_sweep(s, torch.device("cpu")) for key, s in specs.items()}
    assert all(r["status"] == "ok" for rs in rows.values() for r in rs)
    return rows


def as_version(table: pa.Table, version: int) -> pa.Table:
    """A file's table as schema ``version`` wrote it: without the columns added later."""
    later = [c for v, cols in ADDED_IN.items() if v > version for c in cols]
    table = table.drop_columns([c for c in later if c in table.column_names])
    return table.replace_schema_metadata({b"synthbench_schema_version": str(version)})


def folder_values(path) -> list[str]:
    """The partition values a run file's folders name (name=value), outermost first."""
    return [part.split("=", 1)[1] for part in path.parent.parts if "=" in part]


def legacy_copy(store: ResultStore, path) -> object:
    """Move a run's file to where a tree before schema 6 kept it, as that version wrote it
    (its protocol inside the file); the new place."""
    table = pq.read_table(path)
    protocol, task, mechanism = folder_values(path)
    table = table.append_column("protocol", pa.array([protocol] * len(table), pa.string()))
    legacy = store.legacy_path_for(task, mechanism, path.stem)
    legacy.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(as_version(table, 5), legacy)
    path.unlink()
    return legacy


def rows_of(runs, key, **changes) -> list[dict]:
    return [{**r, **changes} for r in runs[key]]


def all_files(root) -> list[str]:
    """Every file under root, hidden ones included, relative."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def same(a, b) -> bool:
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b is None or (isinstance(b, float) and math.isnan(b))
    if isinstance(a, pd.Timestamp):
        a = a.to_pydatetime()
    if hasattr(a, "tolist"):  # a list column reads back as a numpy array
        a = a.tolist()
    return a == b


# -- writing and reading back -------------------------------------------------------------


def test_round_trip(tmp_path, runs):
    store = ResultStore(tmp_path)
    rows = runs["a"]
    path = store.write(rows)
    r = rows[0]
    place = f"protocol=smoke/task=kv_recall/mechanism=linear/{r['run_id']}.parquet"
    assert path == tmp_path / place
    assert all_files(tmp_path) == [place]
    # Hive convention: the partition columns live in the path, not in the file
    file_schema = pq.read_schema(path)
    assert file_schema.names == SCHEMA.names
    assert not set(PARTITIONS) & set(file_schema.names)
    assert file_schema.metadata[b"synthbench_schema_version"] == str(SCHEMA_VERSION).encode()

    report = store.load()
    assert report.skipped == []
    loaded = report.rows
    assert list(loaded.columns) == COLUMNS
    assert len(loaded) == len(rows)
    for original, (_, stored) in zip(rows, loaded.iterrows(), strict=True):
        for column in COLUMNS:
            expected = SCHEMA_VERSION if column == "schema_version" else original.get(column)
            assert same(stored[column], expected), (column, stored[column], expected)
    assert loaded["selected"].sum() == 1


def test_partial_columns(tmp_path, runs):
    store = ResultStore(tmp_path)
    store.write(runs["a"])
    rows = store.load(columns=["status", "token_acc"]).rows
    assert list(rows.columns) == ["protocol", "task", "mechanism", "status", "token_acc"]
    assert rows["token_acc"].tolist() == [r["token_acc"] for r in runs["a"]]


def test_load_with_a_partition_column_among_columns(tmp_path, runs):
    """Asking for 'task' (a column of every loaded row) must not make good files 'corrupt'."""
    store = ResultStore(tmp_path)
    store.write(runs["a"])
    report = store.load(columns=["task", "token_acc"], warn=False)
    assert [str(p) for p, _ in report.skipped] == [], report.skipped[0][1][:120]
    assert list(report.rows.columns) == ["protocol", "task", "mechanism", "token_acc"]
    assert report.rows["task"].tolist() == ["kv_recall"] * len(runs["a"])


def test_load_empty_or_missing_root(tmp_path):
    for root in (tmp_path, tmp_path / "absent"):
        report = ResultStore(root).load()
        assert report.rows.empty and report.skipped == []
        assert list(report.rows.columns) == COLUMNS


def test_pandas_reads_the_tree_as_one_table(tmp_path, runs):
    store = ResultStore(tmp_path)
    for key in ("a", "b", "c"):
        store.write(runs[key])
    table = pd.read_parquet(tmp_path)
    assert len(table) == 6
    assert set(COLUMNS) <= set(table.columns)
    keys = ("protocol", "task", "mechanism")
    got = sorted(zip(table["run_id"], *(table[k].astype(str) for k in keys), strict=True))
    want = sorted((r["run_id"], *(r[k] for k in keys)) for k in "abc" for r in runs[k])
    assert got == want
    # pyarrow's dataset reader agrees
    assert pq.ParquetDataset(tmp_path).read().num_rows == 6


def test_no_temporary_files_left(tmp_path, runs):
    store = ResultStore(tmp_path)
    paths = [store.write(runs[k]) for k in "abc"]
    store.write(runs["a"])  # overwrite
    assert all_files(tmp_path) == sorted(str(p.relative_to(tmp_path)) for p in paths)


def test_rewrite_replaces_the_run(tmp_path, runs):
    store = ResultStore(tmp_path)
    store.write(runs["a"])
    store.write(rows_of(runs, "a", wall_seconds=123.0))
    rows = store.load().rows
    assert len(rows) == 2 and (rows["wall_seconds"] == 123.0).all()


def test_rows_of_two_runs_in_one_write_raise(tmp_path, runs):
    store = ResultStore(tmp_path)
    for mixed in (runs["a"] + runs["b"], runs["a"] + runs["c"]):
        with pytest.raises(ValueError, match="one run"):
            store.write(mixed)
    # same run_id claimed under another task: also refused
    with pytest.raises(ValueError):
        store.write([runs["a"][0], {**runs["a"][1], "task": "copy"}])
    assert all_files(tmp_path) == []


def test_failed_rows_round_trip_as_missing_metrics(tmp_path, runs):
    store = ResultStore(tmp_path)
    failed = []
    for r in runs["a"]:
        row = {k: (None if k.startswith(("token", "exact", "val_")) else v) for k, v in r.items()}
        failed.append({**row, "status": "diverged", "error": "non-finite loss", "selected": False})
    store.write(failed)
    rows = store.load().rows
    assert rows["status"].tolist() == ["diverged", "diverged"]
    assert rows["token_acc"].isna().all() and rows["val_exact_match"].isna().all()


# -- corrupt and foreign files ------------------------------------------------------------


def _truncated(store, runs):
    path = store.write(runs["b"])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _not_parquet(store, runs):
    path = store.path_for("smoke", "copy", "softmax", "0123456789abcdef")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("this is not parquet\n")
    return path


def _stray_file(store, runs):
    path = store.root / "protocol=smoke" / "task=kv_recall" / "notes.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("hello\n")
    return path


def _without_metadata(store, runs):
    path = store.write(runs["b"])
    table = pq.read_table(path).replace_schema_metadata(None)
    pq.write_table(table, path)
    return path


def _other_run_id(store, runs):
    good = store.path_for("smoke", "kv_recall", "linear", runs["a"][0]["run_id"])
    path = good.with_name("fedcba9876543210.parquet")
    shutil.copyfile(good, path)
    return path


def _other_schema_version(store, runs):
    path = store.write(runs["b"])
    table = pq.read_table(path)
    metadata = {**table.schema.metadata, b"synthbench_schema_version": b"999"}
    pq.write_table(table.replace_schema_metadata(metadata), path)
    return path


def _missing_column(store, runs):
    path = store.write(runs["b"])
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["token_acc"]), path)
    return path


def _empty(store, runs):
    path = store.write(runs["b"])
    table = pq.read_table(path).slice(0, 0)
    pq.write_table(table, path)
    return path


def _outside_partitions(store, runs):
    path = store.root / f"{runs['b'][0]['run_id']}.parquet"
    shutil.copyfile(store.write(runs["b"]), path)
    store.path_for("smoke", "kv_recall", "linear", runs["b"][0]["run_id"]).unlink()
    return path


def _other_protocol(store, runs):
    """A file of schema < 6 (its protocol inside) moved under another protocol's folder."""
    path = store.write(runs["b"])
    table = pq.read_table(path)
    table = table.append_column("protocol", pa.array(["quick"] * len(table), pa.string()))
    pq.write_table(as_version(table, 5), path)
    return path


def _legacy_without_protocol(store, runs):
    """A file in the layout before schema 6 that does not say its protocol."""
    path = store.write(runs["b"])
    legacy = store.legacy_path_for("kv_recall", "linear", path.stem)
    legacy.parent.mkdir(parents=True)
    pq.write_table(as_version(pq.read_table(path), 5), legacy)
    path.unlink()
    return legacy


CORRUPTIONS = {
    "truncated": (_truncated, "unreadable"),
    "not-parquet": (_not_parquet, "unreadable"),
    "stray-file": (_stray_file, "not a Parquet file"),
    "no-schema-version": (_without_metadata, "no schema version"),
    "other-run-id": (_other_run_id, "do not belong"),
    "other-schema-version": (_other_schema_version, "schema version 999"),
    "missing-column": (_missing_column, "token_acc"),
    "no-rows": (_empty, "do not belong"),
    "outside-partitions": (_outside_partitions, "protocol=<protocol>/task=<task>"),
    "other-protocol": (_other_protocol, "not its folder's (protocol=smoke)"),
    "legacy-without-protocol": (_legacy_without_protocol, "missing columns protocol"),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_corrupt_file_is_skipped_and_reported(tmp_path, runs, case):
    make, reason = CORRUPTIONS[case]
    store = ResultStore(tmp_path)
    store.write(runs["a"])
    bad = make(store, runs)
    good_ids = {runs["a"][0]["run_id"]}

    with pytest.warns(CorruptResultWarning) as caught:
        report = store.load()
    assert len(report.skipped) == 1
    path, why = report.skipped[0]
    assert path == bad
    assert reason in why
    messages = [str(w.message) for w in caught if issubclass(w.category, CorruptResultWarning)]
    assert len(messages) == 1 and str(bad) in messages[0] and reason in messages[0]
    assert set(report.rows["run_id"]) == good_ids
    assert len(report.rows) == len(runs["a"])

    with warnings.catch_warnings():
        warnings.simplefilter("error", CorruptResultWarning)
        quiet = store.load(warn=False)
        assert quiet.skipped == report.skipped
        assert set(quiet.rows["run_id"]) == good_ids
    assert bad.exists()  # reported, never deleted


# -- temporaries --------------------------------------------------------------------------


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_remove_stale_temporaries(tmp_path, runs):
    store = ResultStore(tmp_path)
    good = store.write(runs["a"])
    folder = good.parent
    stale = folder / f".tmp-{dead_pid()}-deadbeef-{good.name}"
    mine = folder / f".tmp-{os.getpid()}-0badf00d-{good.name}"
    stale.write_bytes(b"partial")
    mine.write_bytes(b"in progress")
    assert store.files() == [good]  # temporaries are never read as results
    assert store.remove_stale_temporaries() == 1
    assert not stale.exists()
    assert mine.exists() and good.exists()
    assert store.remove_stale_temporaries() == 0


def test_remove_stale_temporaries_without_root(tmp_path):
    assert ResultStore(tmp_path / "absent").remove_stale_temporaries() == 0


def test_schema_and_columns_agree():
    assert COLUMNS[: len(PARTITIONS)] == list(PARTITIONS)
    assert len(set(COLUMNS)) == len(COLUMNS)
    assert isinstance(SCHEMA, pa.Schema)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: {**r, "accuracy": 1.0}, "unknown accuracy"),
        (lambda r: {k: v for k, v in r.items() if k != "threads"}, "missing threads"),
        (lambda r: {**r, "schema_version": 3}, "unknown schema_version"),  # the store's own
    ],
)
def test_write_refuses_rows_with_unknown_or_missing_columns(tmp_path, runs, change, message):
    store = ResultStore(tmp_path)
    with pytest.raises(SchemaError, match=message):
        store.write([change(r) for r in runs["a"]])
    assert store.files() == []  # nothing written, not even part of the run


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION))
def test_files_of_older_schema_versions_are_read_with_later_columns_null(tmp_path, runs, version):
    store = ResultStore(tmp_path)
    path = store.write(runs["a"])
    later = sorted(c for v, cols in ADDED_IN.items() if v > version for c in cols)
    pq.write_table(as_version(pq.read_table(path), version), path)
    report = store.load()
    assert report.skipped == [] and len(report.rows) == len(runs["a"])
    assert report.rows[later].isna().all().all()
    assert report.rows["token_acc"].tolist() == [r["token_acc"] for r in runs["a"]]


# -- the layout before schema 6: no protocol level ------------------------------------------


def test_a_tree_of_the_older_layout_is_read_with_its_protocol(tmp_path, runs):
    store = ResultStore(tmp_path)
    legacy = legacy_copy(store, store.write(runs["a"]))
    newer = store.write(runs["c"])
    assert store.legacy_files() == [legacy]
    report = store.load()
    assert report.skipped == [] and report.legacy == [legacy]
    assert sorted(report.rows["protocol"]) == ["smoke"] * 4
    assert set(report.rows["run_id"]) == {runs["a"][0]["run_id"], runs["c"][0]["run_id"]}
    a = runs["a"][0]
    assert (
        store.read_run("smoke", "kv_recall", "linear", a["run_id"])[0]["token_acc"]
        == (a["token_acc"])
    )
    assert newer.exists()


def test_a_run_written_again_moves_out_of_the_older_layout(tmp_path, runs):
    store = ResultStore(tmp_path)
    legacy = legacy_copy(store, store.write(runs["a"]))
    path = store.write(rows_of(runs, "a", wall_seconds=7.0))
    assert not legacy.exists() and path.parts[-4] == "protocol=smoke"
    rows = store.load().rows
    assert len(rows) == 2 and (rows["wall_seconds"] == 7.0).all()
    assert all_files(tmp_path) == [str(path.relative_to(tmp_path))]


def test_migrate_moves_every_older_file_under_its_protocol(tmp_path, runs):
    store = ResultStore(tmp_path)
    before = {}
    for key in "abc":
        before[runs[key][0]["run_id"]] = legacy_copy(store, store.write(runs[key]))
    foreign = store.legacy_path_for("copy", "linear", "0123456789abcdef")
    foreign.parent.mkdir(parents=True)
    foreign.write_text("not parquet\n")
    loaded = store.load(warn=False).rows.sort_values(["run_id", "lr"]).reset_index(drop=True)

    done = store.migrate()
    assert sorted(old for old, _ in done.moved) == sorted(before.values())
    assert [path for path, _ in done.left] == [foreign]  # unreadable: left where it is
    assert store.legacy_files() == [foreign]
    for old, new in done.moved:
        assert not old.exists() and new == store.path_for("smoke", *folder_values(old), old.stem)
    again = store.load(warn=False).rows.sort_values(["run_id", "lr"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(again, loaded)
    # one layout now (the unreadable file aside), which DuckDB's and Polars' globs need
    foreign.unlink()
    assert store.migrate().moved == []
    assert not (tmp_path / "task=kv_recall").exists()  # emptied folders are removed
    table = ds.dataset(tmp_path, schema=DATASET_SCHEMA, partitioning="hive").to_table()
    assert sorted(table["protocol"].to_pylist()) == ["smoke"] * 6


def test_results_say_a_tree_holds_the_older_layout_and_migrate_moves_it(tmp_path, runs):
    """Through the command line: one warning line naming the command that moves them."""
    store = ResultStore(tmp_path / "results")
    legacy_copy(store, store.write(runs["a"]))
    listed = invoke("results", "--results", store.root)
    assert listed.exit_code == 0, listed.output
    assert "warning: 1 file in the layout before schema 6" in listed.stderr
    assert f"synthbench migrate --results {store.root}" in listed.stderr
    moved = invoke("migrate", "--results", store.root)
    assert moved.exit_code == 0 and "moved 1 file (protocol=smoke)" in moved.stdout
    again = invoke("results", "--results", store.root)
    assert again.exit_code == 0 and "schema 6" not in again.stderr
