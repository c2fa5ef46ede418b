"""The README's recipes for reading the results tree as one table (pandas, pyarrow, DuckDB,
Polars), run as written there, on a tree made by the commands themselves: rows of every
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

import synthbench.provenance
from synthbench.claims import CLAIMS_DIR
from synthbench.cli import app
from synthbench.protocols import PROTOCOLS
from synthbench.spec import RunSpec
from synthbench.store import ADDED_IN, DATASET_SCHEMA, SCHEMA_VERSION, ResultStore

pytest.importorskip("duckdb", reason='the test extra: pip install -e ".[test]"')
pytest.importorskip("polars", reason='the test extra: pip install -e ".[test]"')

pytestmark = pytest.mark.usefixtures("single_thread")

README = Path(__file__).resolve().parents[1] / "README.md"
ENV = {"COLUMNS": "250"}
SEEDS = 5  # one run of each schema version, 1..5
RUN = ["run", "--task", "copy", "--task-param", "n=4", "--mech", "linear", "--protocol", "smoke",
       "--seeds", str(SEEDS), "--jobs", "1", "--results", "results"]  # fmt: skip
# what each recipe's variable holds, as a pandas frame
AS_PANDAS = {
    "rows": lambda v: v,
    "table": lambda v: v.to_pandas(),
    "duck": lambda v: v,
    "frame": lambda v: v.to_pandas(),
}


def readme_recipe() -> str:
    """The first Python block of the README's "Where results go"."""
    section = README.read_text().split("## Where results go", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def invoke(*args) -> None:
    result = CliRunner().invoke(app, [str(a) for a in args], env=ENV)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> tuple[Path, dict[str, int]]:
    """In a fresh folder, as a user would: five runs, four of them rewritten as files of
    schema versions 1..4, the fifth written over an unreadable file (moved aside), a claim
    of a live command; then `synthbench bench train` with its defaults. The folder and the
    schema version of each run."""
    root = tmp_path_factory.mktemp("readers")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        patch.setattr(synthbench.provenance, "git_commit", lambda: "test")
        store = ResultStore("results")
        last = RunSpec.resolve("copy", "linear", PROTOCOLS.get("smoke"), SEEDS - 1, {"n": 4})
        unreadable = store.path_for("copy", "linear", last.run_id)
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
        metadata = {b"synthbench_schema_version": str(version).encode()}
        pq.write_table(table.replace_schema_metadata(metadata), path)
        runs[path.stem] = version
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
    assert want["lr_edge"].notna().sum() == 1 and want["threads"].notna().sum() == 3
    namespace: dict = {}
    exec(compile(readme_recipe(), str(README), "exec"), namespace)
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


def test_the_bench_rows_beside_the_tree_read_on_their_own(trees, monkeypatch):
    """docs/BENCHMARKS.md's recipe for the bench tree."""
    monkeypatch.chdir(trees[0])
    rows = pd.read_parquet("bench-results/train")
    assert rows["kind"].tolist() == ["train"] and rows["status"].tolist() == ["ok"]
