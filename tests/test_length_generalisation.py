"""Evaluation at a longer length than training: Task.at_length, RunSpec, the stored long_*
metrics, reading results written before those columns existed, and the report on them."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from synthbench.core.task import TASKS
from synthbench.report.aggregate import aggregate
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.runner import run_sweep
from synthbench.run.schema import ADDED_IN, PARTITIONS, SCHEMA
from synthbench.run.spec import RunSpec
from synthbench.run.store import ResultStore
from synthbench.run.train import build_model

pytestmark = pytest.mark.usefixtures("single_thread")

SMOKE = PROTOCOLS.get("smoke")
LENGTH_TASKS = [n for n in TASKS.names() if TASKS.get(n).length_param is not None]


@pytest.mark.parametrize("name", LENGTH_TASKS)
def test_at_length_scales_the_knob_and_keeps_token_meanings(name):
    task = TASKS.get(name)()
    longer = task.at_length(2)
    knob = task.length_param
    assert getattr(longer.params, knob) == 2 * getattr(task.params, knob)
    assert {k: v for k, v in longer.param_dict().items() if k != knob} == {
        k: v for k, v in task.param_dict().items() if k != knob
    }
    assert longer.seq_len > task.seq_len
    assert longer.vocab_size >= task.vocab_size
    # every id of the trained vocabulary means the same at the longer length
    assert [longer.token_name(t) for t in range(task.vocab_size)] == [
        task.token_name(t) for t in range(task.vocab_size)
    ]
    batch = longer.generate(8, torch.Generator().manual_seed(0))
    assert torch.equal(longer.solve(batch.inputs), batch.targets)


def test_most_tasks_have_a_length_knob():
    assert len(LENGTH_TASKS) >= 20


def test_at_length_without_a_knob_raises():
    class Fixed(TASKS.get("copy")):
        length_param = None

    with pytest.raises(ValueError, match="no length parameter"):
        Fixed().at_length(2)


def test_runspec_records_the_multiplier_only_when_given():
    plain = RunSpec.resolve("copy", "softmax", SMOKE, 0)
    longer = RunSpec.resolve("copy", "softmax", SMOKE, 0, eval_length_mult=2)
    assert "eval_length_mult" not in plain.config()
    assert longer.config()["eval_length_mult"] == 2.0
    assert plain.run_id != longer.run_id


def test_runspec_refuses_a_bad_multiplier_and_a_length_the_task_cannot_take():
    with pytest.raises(ValueError, match="must be > 0"):
        RunSpec.resolve("copy", "softmax", SMOKE, 0, eval_length_mult=0)
    with pytest.raises(ValueError, match="kv_recall at 8x length"):
        RunSpec.resolve("kv_recall", "softmax", SMOKE, 0, eval_length_mult=8)  # pairs > keys


def test_runspec_drops_the_multiplier_for_a_task_without_a_length_knob(monkeypatch):
    monkeypatch.setattr(TASKS.get("copy"), "length_param", None)
    spec = RunSpec.resolve("copy", "softmax", SMOKE, 0, eval_length_mult=2)
    assert spec.eval_length_mult is None


def test_model_covers_the_longer_task():
    spec = RunSpec.resolve("counting", "softmax", SMOKE, 0, eval_length_mult=2)
    task = TASKS.get("counting")(**spec.task_params)
    longer = task.at_length(2)
    model = build_model(spec, task, longer)
    assert model.head.out_features == longer.vocab_size > task.vocab_size
    batch = longer.generate(2, torch.Generator().manual_seed(0))
    assert model(batch.inputs).shape == (2, longer.seq_len, longer.vocab_size)


@pytest.fixture(scope="module")
def long_rows(single_thread):
    spec = RunSpec.resolve("copy", "softmax", SMOKE, 0, {"n": 8}, eval_length_mult=2)
    return spec, run_sweep(spec, torch.device("cpu"))


def test_run_stores_long_metrics(long_rows, tmp_path):
    spec, rows = long_rows
    (row,) = rows
    assert row["status"] == "ok", row.get("error")
    assert row["eval_length_mult"] == 2.0
    assert 0 <= row["long_token_acc"] <= 1 and 0 <= row["long_exact_match"] <= 1
    store = ResultStore(tmp_path)
    store.write(rows)
    loaded = store.load().rows
    assert loaded.loc[0, "long_token_acc"] == pytest.approx(row["long_token_acc"])


def test_run_without_multiplier_leaves_long_metrics_null(tmp_path):
    spec = RunSpec.resolve("copy", "softmax", SMOKE, 0, {"n": 4})
    (row,) = run_sweep(spec, torch.device("cpu"))
    assert row["eval_length_mult"] is None and row.get("long_token_acc") is None
    store = ResultStore(tmp_path)
    store.write([row])
    loaded = store.load().rows
    assert loaded[["eval_length_mult", "long_token_acc", "long_exact_match"]].isna().all().all()


def test_files_of_schema_version_1_are_read_with_the_new_columns_null(long_rows, tmp_path):
    spec, rows = long_rows
    store = ResultStore(tmp_path)
    path = store.write(rows)
    added = set(ADDED_IN[2])
    table = pq.read_table(path)
    old = table.drop_columns(sorted(added))
    old = old.replace_schema_metadata({b"synthbench_schema_version": b"1"})
    pq.write_table(old, path)
    report = store.load()
    assert report.skipped == []
    loaded = report.rows
    assert list(loaded.columns[len(PARTITIONS) :]) == SCHEMA.names
    assert loaded[sorted(added)].isna().all().all()
    assert loaded.loc[0, "token_acc"] == pytest.approx(rows[0]["token_acc"])


def test_a_schema_1_file_without_an_old_column_is_still_refused(long_rows, tmp_path):
    spec, rows = long_rows
    store = ResultStore(tmp_path)
    path = store.write(rows)
    table = pq.read_table(path).drop_columns(["eval_length_mult", "token_acc"])
    pq.write_table(table.replace_schema_metadata({b"synthbench_schema_version": b"1"}), path)
    with pytest.warns(UserWarning, match="missing columns token_acc"):
        report = store.load()
    assert len(report.skipped) == 1


def _rows(mults, accs):
    base = {
        "protocol": "p",
        "protocol_version": 1,
        "category": "Basic",
        "task": "copy",
        "mechanism": "softmax",
        "status": "ok",
        "selected": True,
    }
    return pd.DataFrame(
        [
            {**base, "run_id": str(i), "seed": i, "eval_length_mult": m, "long_token_acc": a}
            for i, (m, a) in enumerate(zip(mults, accs, strict=True))
        ]
    )


def test_report_long_metric_counts_only_runs_evaluated_longer():
    table = aggregate(_rows([2.0, 2.0, None], [0.5, 0.7, None]), "long_token_acc")
    (r,) = table.itertuples()
    assert r.count == 2 and r.mean == pytest.approx(0.6)


def test_report_long_metric_refuses_mixed_multipliers():
    with pytest.raises(ValueError, match="several eval length multipliers"):
        aggregate(_rows([2.0, 4.0], [0.5, 0.7]), "long_token_acc")


def test_schema_has_the_added_columns():
    for cols in ADDED_IN.values():
        assert set(cols) <= set(SCHEMA.names)
    assert SCHEMA.field("long_token_acc").type == pa.float64()
