"""docs/RESULTS.md's recipes for reading the results tree as one table (pandas, pyarrow,
DuckDB, Polars), run as written there, on a tree made by the commands themselves: rows of every
schema version, what `synthbench run` leaves hidden in it (a claim, an unreadable file moved
aside), and the rows of a `synthbench bench` command beside it."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import synthbench.run.provenance
from synthbench.cli import app
from synthbench.run.claims import CLAIMS_DIR
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.schema import ADDED_IN, DATASET_SCHEMA, SCHEMA_VERSION
from synthbench.run.spec import RunSpec
from synthbench.run.store import ResultStore

pytest.importorskip("duckdb", reason='the test extra: pip install -e ".[test]"')
pytest.importorskip("polars", reason='the test extra: pip install -e ".[test]"')

pytestmark = pytest.mark.usefixtures("single_thread")

RESULTS_DOC = Path(__file__).resolve().parents[1] / "docs" / "RESULTS.md"
ENV = {"COLUMNS": "250"}
SEEDS = SCHEMA_VERSION  # one run of each schema version
RUN = ["run", "--task", "copy", "--task-param", "n=4", "--mech", "linear", "--protocol", "smoke",
       "--seeds", str(SEEDS), "--jobs", "1", "--results", "results"]  # fmt: skip
# what each recipe's variable holds, as a pandas frame
AS_PANDAS = {
    "rows": lambda v: v,
    "table": lambda v: v.to_pandas(),
    "duck": lambda v: v,
    "frame": lambda v: v.to_pandas(),
}


def reading_recipe() -> str:
    """The first Python block of docs/RESULTS.md's "Reading the tree as one table"."""
    section = RESULTS_DOC.read_text().split("## Reading the tree as one table", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def invoke(*args) -> None:
    result = CliRunner().invoke(app, [str(a) for a in args], env=ENV)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> tuple[Path, dict[str, int]]:
    """In a fresh folder, as a user would: a run of each schema version, those before 6
    rewritten as their version wrote them (the protocol inside the file, no protocol= folder)
    and moved under their protocol by `synthbench migrate`, the newest written over an
    unreadable file (moved aside), a claim of a live command; then `synthbench bench train`
    with its defaults. The folder and the schema version of each run."""
    root = tmp_path_factory.mktemp("readers")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        patch.setattr(synthbench.run.provenance, "git_commit", lambda: "test")
        store = ResultStore("results")
        last = RunSpec.resolve("copy", "linear", PROTOCOLS.get("smoke"), SEEDS - 1, {"n": 4})
        unreadable = store.path_for("smoke", "copy", "linear", last.run_id)
        unreadable.parent.mkdir(parents=True)
        unreadable.write_text("not parquet\n")
        invoke(*RUN)
        invoke("bench", "train", "--protocol", "smoke", "--task", "copy", "--mech", "linear",
               "--steps", 2)  # fmt: skip
    runs = {p.stem: SCHEMA_VERSION for p in ResultStore(root / "results").files()}
    assert len(runs) == SEEDS
    older = sorted(p for p in ResultStore(root / "results").files() if p.stem != last.run_id)
    for version, path in zip(range(1, SCHEMA_VERSION), older, strict=True):
        later = sorted(c for v, cols in ADDED_IN.items() if v > version for c in cols)
        table = pq.read_table(path).drop_columns(later)
        at = table.schema.get_field_index("schema_version")  # as that version wrote it
        table = table.set_column(at, "schema_version", pa.array([version] * len(table), pa.int32()))
        table = table.append_column("protocol", pa.array(["smoke"] * len(table), pa.string()))
        metadata = {b"synthbench_schema_version": str(version).encode()}
        legacy = root / "results" / path.relative_to(root / "results" / "protocol=smoke")
        legacy.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.replace_schema_metadata(metadata), legacy)
        path.unlink()
        runs[path.stem] = version
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        invoke("migrate", "--results", "results")
    assert ResultStore(root / "results").legacy_files() == []
    claim = root / "results" / CLAIMS_DIR / last.run_id
    claim.parent.mkdir()
    claim.write_text('{"pid": 1, "host": "elsewhere", "started": "now", "token": "x"}')
    # what the tree holds besides the runs: hidden, every reader must pass them by
    hidden = sorted(p.name for p in (root / "results").rglob(".*"))
    assert len(hidden) == 2 and CLAIMS_DIR in hidden, hidden
    assert any(n.startswith(f".{unreadable.name}.unreadable-") for n in hidden), hidden
    return root, runs


def same(a, b) -> bool:
    """One cell read two ways: nulls, lists (numpy arrays), timestamps and numbers alike."""
    a, b = (x.tolist() if hasattr(x, "tolist") and not isinstance(x, str) else x for x in (a, b))
    if isinstance(a, list) or isinstance(b, list):
        return isinstance(a, list) and isinstance(b, list) and a == pytest.approx(b)
    if a is None or b is None or pd.isna(a) or pd.isna(b):
        return (a is None or bool(pd.isna(a))) and (b is None or bool(pd.isna(b)))
    if isinstance(a, float) or isinstance(b, float):
        return a == pytest.approx(b)
    return pd.Timestamp(a) == pd.Timestamp(b) if hasattr(a, "year") else str(a) == str(b)


def test_the_readme_recipes_read_every_schema_version(trees, monkeypatch):
    root, runs = trees
    monkeypatch.chdir(root)
    reference = ResultStore("results").load()  # tested against the files in test_store.py
    assert reference.skipped == [] and len(reference.rows) == SEEDS
    want = reference.rows.set_index("run_id")
    for run_id, version in runs.items():  # the columns a version lacks read as null
        later = [c for v, cols in ADDED_IN.items() if v > version for c in cols]
        assert want.loc[run_id, later].isna().all(), (run_id, version)
        assert want.loc[run_id, "schema_version"] == version
    # the runs of the versions that have a column hold it
    for column, version in (
        ("lr_edge", 5), ("threads", 3), ("cpu_isa", 6), ("cpu_model", 7), ("lr_robustness", 8)
    ):  # fmt: skip
        assert want[column].notna().sum() == SCHEMA_VERSION - version + 1, column
    namespace: dict = {}
    exec(compile(reading_recipe(), str(RESULTS_DOC), "exec"), namespace)
    for name, to_pandas in AS_PANDAS.items():
        got = to_pandas(namespace[name])
        assert sorted(got.columns) == sorted(DATASET_SCHEMA.names), name
        got = got.set_index("run_id")
        assert sorted(got.index) == sorted(want.index), name
        for run_id in want.index:
            for column in want.columns:
                assert same(got.loc[run_id, column], want.loc[run_id, column]), (
                    name,
                    run_id,
                    column,
                    got.loc[run_id, column],
                    want.loc[run_id, column],
                )


def test_the_documented_query_groups_by_protocol(trees, monkeypatch):
    """docs/RESULTS.md's SQL, as written: one row per (protocol, task, mechanism)."""
    import duckdb

    monkeypatch.chdir(trees[0])
    query = re.search(r"```sql\n(.*?)```", RESULTS_DOC.read_text(), re.S).group(1)
    got = duckdb.sql(query).df()
    assert got[["protocol", "task", "mechanism"]].values.tolist() == [["smoke", "copy", "linear"]]


def test_the_bench_rows_beside_the_tree_read_on_their_own(trees, monkeypatch):
    """docs/BENCHMARKS.md's recipe for the bench tree."""
    monkeypatch.chdir(trees[0])
    rows = pd.read_parquet("bench-results/train")
    assert rows["kind"].tolist() == ["train"] and rows["status"].tolist() == ["ok"]
