"""benchmarks/keep_complete.py: a stored run is done by the recipe it was trained under."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
from clitools import load_script

keep_complete = load_script("keep_complete")


def test_a_run_is_judged_by_the_recipe_its_rows_store(results):
    """Both smoke runs are done; one whose stored recipe asks for an lr it never trained (as
    a run of today's recipe would be, were it stored under an older one) is not."""
    runs, started = keep_complete.complete_runs(results)
    assert len(runs) == started == 2
    path = runs[0][2]
    table = pq.read_table(path)  # its schema kept, as the store checks it
    config = json.loads(table.column("config")[0].as_py())
    config["protocol"]["lrs"] = [1e-3, 3e-3]
    column = table.schema.get_field_index("config")
    changed = pa.array([json.dumps(config)] * table.num_rows, table.schema.field(column).type)
    pq.write_table(table.set_column(column, table.schema.field(column), changed), path)
    runs, started = keep_complete.complete_runs(results)
    assert started == 2 and len(runs) == 1 and path not in [p for _, _, p in runs]
