"""`synthbench bench`: scaling, fidelity, train and plot on tiny sizes; the stored rows, forced
out-of-memory and time-limit points, the fidelity trends, and the bench rows kept out of
the task results (their own tree; tests/test_readers.py reads both trees side by side)."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

import synthbench.bench.common
import synthbench.run.provenance
from synthbench.bench import scaling
from synthbench.bench.common import META, BenchFile, bench_dir, bench_files, legacy_bench_dir
from synthbench.bench.fidelity import METRICS as FIDELITY_METRICS
from synthbench.bench.fidelity import QUADRATURE_METRICS
from synthbench.bench.scaling import METRICS as SCALING_METRICS
from synthbench.bench.scaling import TiledFeatures
from synthbench.bench.throughput import METRICS as TRAIN_METRICS
from synthbench.cli import app
from synthbench.core.mechanism import MECHANISMS
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.runner import run_sweep
from synthbench.run.spec import RunSpec
from synthbench.run.store import BENCH_DIR, ResultStore

pytestmark = pytest.mark.usefixtures("single_thread")

ENV = {"COLUMNS": "250"}  # no wrapping of the printed lines
TINY = ["--d-model", "32", "--heads", "2", "--repeats", "1", "--warmup", "0"]
# tensors of 64 KiB and more at L >= 256 (d_model 32): fresh mappings, a peak above 0 for sure
LENGTHS = ["--min-len", "256", "--max-len", "512"]
SLOW_PLUGIN = """
import time

from synthbench.core.mechanism import MECHANISMS, Mechanism


@MECHANISMS.register("sleepy", complexity="linear", family="test", reference="none")
class Sleepy(Mechanism):  # each call takes 0.3 s
    def forward(self, q, k, v, causal=True):
        time.sleep(0.3)
        return v


@MECHANISMS.register("stuck", complexity="linear", family="test", reference="none")
class Stuck(Mechanism):  # never finishes within the limit
    def forward(self, q, k, v, causal=True):
        time.sleep(30)
        return v
"""


@pytest.fixture(scope="module", autouse=True)
def no_git():
    """The rows' commit without running git (another session works in this checkout)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(synthbench.run.provenance, "git_commit", lambda: "test")
        yield


def invoke(*args):
    result = CliRunner().invoke(app, ["bench", *map(str, args)], env=ENV)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def stored(root: Path, kind: str) -> pd.DataFrame:
    files = bench_files(root, kind)
    assert len(files) == 1, files
    return pd.read_parquet(files[0])


def check_schema(root: Path, kind: str, metrics) -> None:
    """One Parquet file under <root>/<kind>/ (root: the bench tree), nothing else there (no
    temporaries), with the shared columns and the kind's own."""
    folder = bench_dir(root, kind)
    files = sorted(p.name for p in folder.iterdir())
    assert len(files) == 1 and files[0].endswith(".parquet"), files
    schema = pq.read_schema(folder / files[0])
    assert schema.names == [name for name, _ in META + metrics]
    assert schema.metadata[b"synthbench_bench_kind"] == kind.encode()
    assert set(pd.read_parquet(folder / files[0])["kind"]) == {kind}


# -- scaling ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scaling_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("scaling")
    result = invoke(
        "scaling", "--mech", "linear,slay", *TINY, *LENGTHS,
        "--bench-results", root / "bench-results", "--out", root / "reports",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return root, result


def test_scaling_stores_well_formed_rows(scaling_run):
    root, result = scaling_run
    check_schema(root / "bench-results", "scaling", SCALING_METRICS)
    rows = stored(root / "bench-results", "scaling")
    # slay at head_dim 16 has 2 x 8 x 16 = 256 features: linear is also timed at as many
    assert list(dict.fromkeys(rows["label"])) == ["linear", "slay", "linear (F=256)"]
    assert (rows["status"] == "ok").all()
    assert rows.groupby("label")["seq_len"].apply(list).to_dict() == {
        "linear": [256, 512],
        "slay": [256, 512],
        "linear (F=256)": [256, 512],
    }
    for column in ("fwd_ms", "fwd_bwd_ms", "tokens_per_s", "us_per_token", "peak_mb"):
        assert (rows[column] > 0).all(), column  # peak memory measured for real, in a child
    assert (rows["memory_method"] == "vmhwm").all()
    assert rows["kib_per_token"].tolist() == pytest.approx(
        (rows["peak_mb"] * 1024 / rows["seq_len"]).tolist()
    )
    assert set(rows["device"]) == {"cpu"} and set(rows["torch_version"]) == {torch.__version__}
    assert rows.loc[rows["label"] == "slay", "feature_dim"].unique().tolist() == [256]
    assert '"tile_to": 256' in rows.loc[rows["label"] == "linear (F=256)", "params"].iloc[0]
    # one line per point as it goes, then the summary and the SLAY / linear ratio per length
    assert result.stdout.count(" us/tok ") == 6
    assert "slay / linear (F=256), fwd+bwd time: 256: " in result.stdout
    assert "(target <= 2x)" in result.stdout
    assert (root / "reports" / "scaling.png").stat().st_size > 0


@pytest.mark.slow  # it waits out its limits and a kill: seconds of time, not of logic
def test_forced_limits_are_stored_and_the_sweep_goes_on(tmp_path, monkeypatch):
    """yat runs out of its 4 MiB, sleepy out of time (projected from its first round), stuck
    is killed (GRACE_S shortened, but not below a busy machine's process start: at 1 s a
    sleepy child that started late was killed before its first round); each stops growing L
    and the next mechanism still runs."""
    plugin = tmp_path / "slow_plugin.py"
    plugin.write_text(SLOW_PLUGIN)
    monkeypatch.setattr(scaling, "GRACE_S", 3.0)
    root = tmp_path / "bench-results"
    result = invoke(
        "scaling", "--mech", "yat,sleepy,stuck,linear", *TINY, "--min-len", "256",
        "--max-len", "1024", "--memory-limit-gb", "0.004", "--time-limit", "0.5", "--plugin",
        plugin, "--no-compare-features", "--no-plot", "--bench-results", root,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = stored(root, "scaling")
    by = {label: part for label, part in rows.groupby("label")}
    yat = by["yat"]
    assert yat["status"].iloc[-1] == "oom" and (yat["status"].iloc[:-1] == "ok").all()
    assert "can't allocate memory" in yat["error"].iloc[-1]
    assert len(yat) < 3  # no length after the failed one
    assert by["sleepy"]["status"].tolist() == ["time_limit"]
    assert "would take about" in by["sleepy"]["error"].iloc[0]
    assert by["stuck"]["status"].tolist() == ["time_limit"]
    assert "killed after" in by["stuck"]["error"].iloc[0]
    assert by["linear"]["status"].tolist() == ["ok"] * 3
    assert by["linear"]["seq_len"].tolist() == [256, 512, 1024]
    assert "yat                L" in result.stdout and "oom:" in result.stdout


def test_tiled_features_are_the_same_attention():
    """linear with its features repeated 6 times: more features, the same normalised output."""
    torch.manual_seed(0)
    base = MECHANISMS.get("linear")(16, 2)
    q, k, v = torch.randn(3, 2, 2, 40, 16)
    tiled = TiledFeatures(base, 96)
    assert tiled.feature_dim == 96
    torch.testing.assert_close(tiled(q, k, v), base(q, k, v), atol=1e-5, rtol=1e-4)


def test_peak_bytes_on_cpu_measures_the_resident_set():
    """In a fresh process, as `bench scaling` measures: this one's allocator has a history."""
    code = (
        "import torch\n"
        "from synthbench.run.allocator import map_large_blocks\n"
        "from synthbench.bench.memory import peak_bytes\n"
        "map_large_blocks()\n"
        "print(peak_bytes(lambda: torch.ones(16 * 2**20), torch.device('cpu')) / 2**20)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert 60 < float(proc.stdout) < 72  # 64 MiB of float32 ones, touched


# -- fidelity ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fidelity_run(tmp_path_factory):
    """16 seeds, two budgets, every variant, at a tenth of the paper's sizes."""
    root = tmp_path_factory.mktemp("fidelity")
    result = invoke(
        "fidelity", "--seeds", 16, "--budget", "small,large", "--seq-len", 64, "--d-model", 32,
        "--heads", 2, "--batch", 2, "--repeats", 1, "--warmup", 0, "--max-nodes", 8,
        "--bench-results", root / "bench-results", "--out", root / "reports",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return root, result


def test_fidelity_rows_and_tables(fidelity_run):
    root, result = fidelity_run
    check_schema(root / "bench-results", "fidelity", FIDELITY_METRICS)
    check_schema(root / "bench-results", "quadrature", QUADRATURE_METRICS)
    rows = stored(root / "bench-results", "fidelity")
    assert len(rows) == 2 * 16 * 8  # budgets x seeds x (reference + 7 variants)
    assert (rows["status"] == "ok").all() and (rows["latency_ms"] > 0).all()
    reference = rows[rows["mechanism"] == "yat-spherical"]
    assert (reference["rel_l2"] == 0).all()
    # the budget mapping: R, M, P of 001 Table 6; laplace and hadamard get M x P PRF features
    large = rows[(rows["budget"] == "large") & (rows["seed"] == 0)].set_index("mechanism")
    assert large.loc["slay", ["quad_nodes", "prf_features", "poly_features"]].tolist() == [
        2,
        32,
        32,
    ]
    assert large.loc["slay-laplace", "prf_features"] == 1024
    assert large.loc["slay", "feature_dim"] == large.loc["slay-laplace", "feature_dim"] == 2048
    # negative denominators (001 Fig. 7): never for the positive estimators, often for sketches
    neg = rows.groupby("mechanism")["neg_den_frac"].mean()
    for name in ("yat-spherical", "slay", "slay-exact-poly", "slay-laplace", "slay-hadamard"):
        assert neg[name] == 0, name
    assert neg["slay-tensorsketch"] > 0.05 and neg["slay-maclaurin"] > 0.05
    markdown = (root / "reports" / "fidelity.md").read_text()
    assert "slay-tensorsketch" in markdown and "±" in markdown
    assert r"\toprule" in (root / "reports" / "fidelity.tex").read_text()
    assert (root / "reports" / "quadrature.png").stat().st_size > 0
    assert "| large    | slay-laplace" in result.stdout


def test_fidelity_errors_fall_with_the_budget(fidelity_run):
    rows = stored(fidelity_run[0] / "bench-results", "fidelity")
    error = rows.groupby(["budget", "mechanism"])["rel_l2"].mean()
    for name in ("slay", "slay-laplace"):  # the positive estimators
        assert error["large", name] < error["small", name], name
    for budget in ("small", "large"):  # unbiased for the discretised kernel, anchors are not
        assert error[budget, "slay-exact-poly"] < error[budget, "slay"]


def test_quadrature_error_falls_with_the_nodes(fidelity_run):
    rows = stored(fidelity_run[0] / "bench-results", "quadrature").sort_values("quad_nodes")
    assert rows["quad_nodes"].tolist() == list(range(1, 9))
    for column in ("max_abs_err", "mean_abs_err", "max_abs_err_half", "median_rel_err"):
        assert rows[column].is_monotonic_decreasing, column
    assert rows["max_abs_err_half"].iloc[-1] < 1e-6 < rows["max_abs_err_half"].iloc[0]


# -- train ------------------------------------------------------------------------------------


def test_train_measures_the_real_loop(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default places: bench-results/ beside results/
    root = tmp_path / "bench-results"
    result = invoke(
        "train", "--protocol", "smoke", "--task", "copy", "--mech", "softmax", "--steps", 10
    )
    assert result.exit_code == 0, result.output
    check_schema(root, "train", TRAIN_METRICS)
    row = stored(root, "train").iloc[0]
    assert row["status"] == "ok" and row["task"] == "copy" and row["protocol"] == "smoke"
    assert row["steps_per_s"] > 0 and row["tokens_per_s"] > 0
    assert row["tokens_per_s"] == pytest.approx(row["steps_per_s"] * 16 * row["seq_len"])
    assert row["run_s"] == pytest.approx(row["fixed_s"] + 20 * row["step_ms"] / 1e3)
    assert "`synthbench run --task all --mech softmax --protocol smoke` would take" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench-results"]  # nothing else


# -- storage, plot ----------------------------------------------------------------------------


def test_old_bench_subtree_is_not_task_results(scaling_run, tmp_path):
    """A results tree that still holds bench rows where older versions put them
    (<results>/bench/): ResultStore and `synthbench report` see the task runs only; no bench
    file is reported as corrupt."""
    root = tmp_path / "results"
    shutil.copytree(scaling_run[0] / "bench-results", root / BENCH_DIR)
    smoke = dataclasses.replace(PROTOCOLS.get("smoke"), steps=3)
    spec = RunSpec.resolve("copy", "linear", smoke, 0, {"n": 4})
    ResultStore(root).write(run_sweep(spec, torch.device("cpu")))
    store = ResultStore(root)
    assert all(BENCH_DIR not in p.relative_to(root).parts for p in store.files())
    assert len(store.files()) == 1
    loaded = store.load(warn=False)
    assert loaded.skipped == [] and len(loaded.rows) == 1
    result = CliRunner().invoke(
        app, ["report", "--results", str(root), "--out", str(tmp_path / "r"), "--format", "md"]
    )
    assert result.exit_code == 0, result.output
    assert "skipping" not in result.stderr


def test_plot_writes_figures_and_tables(scaling_run, fidelity_run, tmp_path):
    root = tmp_path / "bench-results"
    shutil.copytree(scaling_run[0] / "bench-results", root)
    shutil.copytree(fidelity_run[0] / "bench-results", root, dirs_exist_ok=True)
    out = tmp_path / "plots"
    result = invoke("plot", "--bench-results", root, "--out", out, "--format", "png")
    assert result.exit_code == 0, result.output
    for name in ("scaling.png", "quadrature.png", "fidelity.md", "fidelity.tex"):
        assert (out / name).stat().st_size > 0, name
    assert not (out / "scaling.pdf").exists()
    scaling_id = bench_files(root, "scaling")[0].stem
    only = tmp_path / "only"
    assert invoke("plot", "--bench-results", root, "--out", only, "--id", scaling_id).exit_code == 0
    assert sorted(p.name for p in only.iterdir()) == ["scaling.pdf", "scaling.png"]


def test_plot_reads_rows_older_versions_stored_in_the_results_tree(scaling_run, tmp_path):
    legacy = tmp_path / "results"
    shutil.copytree(scaling_run[0] / "bench-results", legacy / BENCH_DIR)
    (scaling_id,) = [p.stem for p in bench_files(legacy / BENCH_DIR, "scaling")]
    assert bench_files(tmp_path / "bench-results", "scaling", legacy=legacy) == [
        legacy_bench_dir(legacy, "scaling") / f"{scaling_id}.parquet"
    ]
    out = tmp_path / "plots"
    result = invoke(
        "plot", "--bench-results", tmp_path / "bench-results", "--results", legacy, "--out", out,
        "--id", scaling_id, "--format", "png",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["scaling.png"]


def test_bench_file_rows_accumulate_atomically(tmp_path):
    file = BenchFile(tmp_path, "quadrature", QUADRATURE_METRICS, "20990101-000000-abcdef")
    for nodes in (1, 2):
        file.add([{"mechanism": "slay", "status": "ok", "quad_nodes": nodes}], torch.device("cpu"))
        assert pd.read_parquet(file.path)["quad_nodes"].tolist() == list(range(1, nodes + 1))
    assert [p.name for p in file.path.parent.iterdir()] == [file.path.name]
    with pytest.raises(KeyError, match="not_a_column"):
        file.add([{"not_a_column": 1}], torch.device("cpu"))


# -- user errors ------------------------------------------------------------------------------

BAD = {
    "unknown-mech": (["scaling", "--mech", "linaer"], "did you mean linear"),
    "indivisible": (["scaling", "--d-model", "30", "--heads", "4"], "--d-model 30"),
    "lengths": (["scaling", "--min-len", "512", "--max-len", "256"], "--max-len 256"),
    "memory": (["scaling", "--memory-limit-gb", "-1"], "--memory-limit-gb"),
    "device": (["scaling", "--device", "gpu"], "'gpu'"),
    "budget": (["fidelity", "--budget", "smal"], "did you mean small"),
    "variant": (["fidelity", "--variants", "slay-lapalce"], "did you mean slay-laplace"),
    "nodes": (["fidelity", "--max-nodes", "0"], "--max-nodes"),
    "protocol": (["train", "--protocol", "quik"], "did you mean quick"),
    "steps": (["train", "--steps", "1"], "--steps"),
    "task": (["train", "--task", "cpy"], "did you mean copy"),
    "format": (["plot", "--format", "gif"], "unknown format 'gif'"),
    "nothing": (["plot"], "no bench results"),
    "id": (["plot", "--id", "nope"], "no bench results with id nope"),
    "old-option": (["train", "--results", "results"], "use --bench-results DIR"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_user_errors_exit_2_with_one_line(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # plot also reads ./results/bench/
    args, culprit = BAD[case]
    result = invoke(*args, "--bench-results", tmp_path / "bench-results")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert culprit in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("inside", ["results", "results/task=copy/mechanism=linear"])
def test_bench_rows_are_refused_inside_a_results_tree(tmp_path, inside):
    (tmp_path / "results" / "task=copy" / "mechanism=linear").mkdir(parents=True)
    before = sorted(tmp_path.rglob("*"))
    result = invoke("train", "--steps", 2, "--bench-results", tmp_path / inside / "bench")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "inside the results tree" in lines[0], result.stderr
    assert f"{tmp_path / 'results'} " in lines[0]
    assert sorted(tmp_path.rglob("*")) == before
