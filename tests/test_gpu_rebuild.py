"""benchmarks/gpu_rebuild.sh, the script a lent GPU runs for a slice of the reference rebuild,
tried on the CPU under smoke: it must not waste a lease, and only whole runs come back."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from clitools import load_script

from synthbench.run.lr_selection import sweep_state
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.store import ResultStore

REPO = Path(__file__).resolve().parents[1]
keep_complete = load_script("keep_complete")


@pytest.mark.slow
def test_a_slice_brings_back_only_complete_runs(tmp_path, capsys):
    env = {**os.environ, "DEV": "cpu", "PROTO": "smoke", "MECHS": "none", "TRACKS": "core",
           "TASKS": "copy,parity,sort", "CAP": "120", "JOBS": "1", "PY": sys.executable,
           "OUT": str(tmp_path / "out"), "ROWS": str(tmp_path / "rows"), "SEED": ""}  # fmt: skip

    def slice_(**changes):
        done = subprocess.run(
            ["bash", "benchmarks/gpu_rebuild.sh"], cwd=REPO, env={**env, **changes},
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    done = slice_()
    tree = tmp_path / "tree"
    with tarfile.open(tmp_path / "out" / "rows.tar") as tar:
        # the "data" filter where this Python has it (3.12, and 3.10.12 / 3.11.4 onwards)
        tar.extractall(tree, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    rows = ResultStore(tree).load(warn=False).rows
    assert not rows.empty and set(rows["protocol"]) == {"smoke"}
    for _, run in rows.groupby("run_id"):
        protocol = PROTOCOLS.get(run["protocol"].iloc[0])
        assert sweep_state(protocol, run.to_dict("records")).complete
    started = ResultStore(tmp_path / "rows").load(warn=False).rows["run_id"].nunique()
    archived = rows["run_id"].nunique()
    assert f"{archived} complete of {started} runs started" in done.stdout
    assert (tmp_path / "out" / "env.txt").is_file()
    # seeded with what is kept already (the committed tree, by default), a slice trains
    # none of it again and brings none of it back
    again = slice_(SEED=str(tree), ROWS=str(tmp_path / "rows-seeded"), OUT=str(tmp_path / "o2"))
    assert f"{archived} complete of {archived} runs started; 0 new in" in again.stdout
    assert "ok " not in (tmp_path / "o2" / "rebuild.log").read_text()
    _into_a_tree_copies_the_same_runs_and_overwrites_none(tmp_path, tree, capsys)


def _into_a_tree_copies_the_same_runs_and_overwrites_none(tmp_path, archived_tree, capsys):
    """benchmarks/keep_complete.py --into (how the CPU streams' rows reach a committed tree)
    keeps exactly the runs the archive kept, and leaves a file already there as it is. (Its
    main in this process: the script's command line is the slice's, above.)"""
    into = tmp_path / "kept"

    def keep(into, src=tmp_path / "rows"):
        capsys.readouterr()
        code = keep_complete.main([str(src), "--into", str(into)])
        return code, *capsys.readouterr()

    first, _, err = keep(into)
    assert first == 0, err

    def relative_files(root):
        return sorted(p.relative_to(root) for p in root.rglob("*.parquet"))

    assert relative_files(into) == relative_files(archived_tree)
    held = into / relative_files(into)[0]
    held.write_bytes(b"already here")
    again, out, _ = keep(into)
    assert again == 0 and "0 new in" in out, out
    assert held.read_bytes() == b"already here"
    empty, _, err = keep(into, src=tmp_path / "none")
    assert empty == 1 and err.count("\n") == 1
    # a run with an lr stored as an error is not done (run trains that lr again): it stays
    raised = tmp_path / "rows" / relative_files(into)[0]
    table = pq.read_table(raised)
    status = ["error"] + table["status"].to_pylist()[1:]
    pq.write_table(table.set_column(table.schema.get_field_index("status"), "status",
                                    pa.array(status, pa.string())), raised)  # fmt: skip
    assert keep(tmp_path / "kept-again")[0] == 0
    assert relative_files(tmp_path / "kept-again") == [f for f in relative_files(archived_tree)
                                    if f != raised.relative_to(tmp_path / "rows")]  # fmt: skip
