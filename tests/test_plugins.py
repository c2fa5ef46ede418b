"""Plugins end to end, through the real CLI in subprocesses.

- a local file (``--plugin``): examples/synthbench-example-plugin/local_plugin.py;
- an installed package (entry point): examples/synthbench-example-plugin, pip-installed
  offline into a folder that the commands put on their path;
- broken plugins: a local file that raises or takes a built-in's name stops the command with
  exit status 2 and one line, touching nothing stored; a broken entry point is one warning
  line and the built-ins still work.

Every subprocess gets a fresh interpreter, so nothing registered here leaks into the
registries of the other tests.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from synthbench.store import ResultStore

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "synthbench-example-plugin"
LOCAL_PLUGIN = EXAMPLE / "local_plugin.py"
SMOKE = ("--protocol", "smoke", "--seeds", "1", "--task", "copy", "--device", "cpu")
BUILTINS = ("softmax", "linear")


def cli(
    *args: object, python: str | Path = sys.executable, cwd: Path, pythonpath: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m synthbench.cli ARGS`` with wide, colourless output (whole table rows)."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "PY_COLORS")}
    env.update(COLUMNS="400", NO_COLOR="1", PYTHONIOENCODING="utf-8")
    env["OMP_NUM_THREADS"] = "1"  # tiny models: extra threads only contend (3x slower on 2 cores)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    return subprocess.run(
        [str(python), "-m", "synthbench.cli", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=300,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def stderr_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


def table_rows(stdout: str) -> dict[str, list[str]]:
    """The body rows of a rich table, keyed by their first cell."""
    rows = {}
    for line in stdout.splitlines():
        if line.startswith("│"):
            cells = [cell.strip() for cell in line.strip("│").split("│")]
            rows[cells[0]] = cells
    return rows


def assert_one_run_stored(results: Path, mechanism: str) -> pd.DataFrame:
    """Exactly one file under results/ (no temporaries left), in the mechanism's partition."""
    files = [p.relative_to(results) for p in results.rglob("*") if p.is_file()]
    assert len(files) == 1, files
    assert files[0].parent == Path("task=copy", f"mechanism={mechanism}")
    assert files[0].suffix == ".parquet"
    loaded = ResultStore(results).load(warn=False)  # the store's reader (report, results)
    assert loaded.skipped == []
    rows = loaded.rows
    assert set(rows["mechanism"]) == {mechanism} and set(rows["task"]) == {"copy"}
    assert set(rows["status"]) == {"ok"}
    return rows


def snapshot(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every file and folder under root: mtime and bytes."""
    return {
        str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture(scope="module")
def stored_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results tree holding one real smoke run (copy / softmax)."""
    results = tmp_path_factory.mktemp("stored") / "results"
    ok(cli("run", "--mech", "softmax", *SMOKE, "--results", results, cwd=results.parent))
    assert_one_run_stored(results, "softmax")
    return results


# -- the local-file route ----------------------------------------------------------------


def test_local_file_plugin_runs_end_to_end(tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = ok(
        cli(
            "run", "--plugin", LOCAL_PLUGIN, "--mech", "scaled-softmax", *SMOKE,
            "--results", results, cwd=tmp_path,
        )
    )  # fmt: skip
    assert "done: 1 ok" in proc.stdout
    rows = assert_one_run_stored(results, "scaled-softmax")
    # the plugin's constructor default is resolved and stored like a built-in's
    assert {json.loads(p)["temperature"] for p in rows["mechanism_params"]} == {2.0}


def test_local_file_plugin_is_listed_with_its_source(tmp_path: Path) -> None:
    proc = ok(cli("list", "mechs", "--plugin", LOCAL_PLUGIN, cwd=tmp_path))
    rows = table_rows(proc.stdout)
    assert set(BUILTINS) <= set(rows)
    _name, complexity, family, _state, _aliases, _reference, source = rows["scaled-softmax"]
    assert (complexity, family) == ("quadratic", "softmax")
    assert source.startswith("plugin file") and "local_plugin.py" in source
    assert rows["softmax"][-1] == "builtin"
    assert stderr_lines(proc) == []


# -- the entry-point route -----------------------------------------------------------------


def _setuptools_version() -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in importlib.metadata.version("setuptools").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return (0,)


@pytest.mark.skipif(
    importlib.util.find_spec("pip") is None or _setuptools_version() < (77,),
    reason="needs pip and setuptools >= 77 in this interpreter to build the example offline",
)
def test_entry_point_plugin_installed_as_a_package(tmp_path: Path) -> None:
    # Build from a copy so the checkout gets no build/ or *.egg-info.
    src = tmp_path / "synthbench-example-plugin"
    shutil.copytree(
        EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    # Installed with this interpreter's pip into a folder of its own, which the commands
    # below put on their path: the same interpreter and packages as the test run, whether
    # that is the system's or a virtual environment's (a nested venv would see the base
    # interpreter's packages instead, not this environment's).
    site = tmp_path / "site"
    ok(
        subprocess.run(
            [
                sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                "--no-index", "--disable-pip-version-check", "--quiet", "--target", site, src,
            ],
            capture_output=True, text=True, cwd=tmp_path, timeout=300,
        )
    )  # fmt: skip

    listed = ok(cli("list", "mechs", cwd=tmp_path, pythonpath=site))
    rows = table_rows(listed.stdout)
    assert set(BUILTINS) <= set(rows)
    _name, complexity, family, state, _aliases, _reference, source = rows["relu-linear"]
    assert (complexity, family) == ("linear", "feature-map")
    assert state == f"{16 * 17:,}"  # feature_dim (d) x (d + 1) at d 16
    assert source == "plugin relu-linear (synthbench-example-plugin)"
    assert stderr_lines(listed) == []

    results = tmp_path / "results"
    proc = ok(
        cli("run", "--mech", "relu-linear", *SMOKE, "--results", results, cwd=tmp_path,
            pythonpath=site)
    )  # fmt: skip
    assert "done: 1 ok" in proc.stdout
    stored = assert_one_run_stored(results, "relu-linear")
    assert {json.loads(p)["offset"] for p in stored["mechanism_params"]} == {0.01}

    # installed into that folder only: without it on the path, the plugin is not there
    assert "relu-linear" not in table_rows(ok(cli("list", "mechs", cwd=tmp_path)).stdout)


def test_example_relu_feature_map_keeps_the_denominator_positive() -> None:
    """All-negative queries and keys: plain ReLU would give 0/0; relu + offset gives the
    uniform causal average of v."""
    spec = importlib.util.spec_from_file_location(
        "synthbench_example_plugin_under_test",
        EXAMPLE / "synthbench_example_plugin" / "__init__.py",
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # no decorator in it: registers nothing here
    mech = module.ReLULinearAttention(head_dim=8, n_heads=2)
    g = torch.Generator().manual_seed(0)
    q, k = (-(torch.rand(2, 2, 70, 8, generator=g, dtype=torch.float64) + 0.1) for _ in "qk")
    v = torch.randn(2, 2, 70, 8, generator=g, dtype=torch.float64)
    out = mech(q, k, v, causal=True)
    prefix_mean = v.cumsum(dim=-2) / torch.arange(1, 71, dtype=torch.float64)[:, None]
    torch.testing.assert_close(out, prefix_mean, rtol=2e-3, atol=2e-3)


# -- broken plugins --------------------------------------------------------------------------


def test_local_file_that_raises_exits_2_with_one_line(tmp_path: Path, stored_results: Path):
    bad = tmp_path / "exploding_plugin.py"
    bad.write_text('raise RuntimeError("kaboom from the plugin")\n')
    before = snapshot(stored_results)
    # --force: had the plugin loaded, the stored run would be rewritten
    proc = cli(
        "run", "--plugin", bad, "--mech", "softmax", "--force", *SMOKE,
        "--results", stored_results, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = stderr_lines(proc)
    assert len(lines) == 1, proc.stderr
    assert "exploding_plugin.py" in lines[0]
    assert "RuntimeError: kaboom from the plugin" in lines[0]
    assert "Traceback" not in proc.stderr
    assert snapshot(stored_results) == before


@pytest.mark.parametrize(
    ("name", "aliases", "taken"),
    [("softmax", (), "softmax"), ("my-attention", ("sdpa",), "sdpa")],
    ids=["name", "alias"],
)
def test_local_file_taking_a_builtin_name_exits_2_naming_both(
    tmp_path: Path, stored_results: Path, name: str, aliases: tuple[str, ...], taken: str
) -> None:
    clash = tmp_path / "clash_plugin.py"
    clash.write_text(
        "import torch.nn.functional as F\n"
        "from synthbench import MECHANISMS, Mechanism\n\n\n"
        f"@MECHANISMS.register({name!r}, aliases={aliases!r}, complexity='quadratic',\n"
        "                     family='softmax', reference='none')\n"
        "class Clash(Mechanism):\n"
        "    def forward(self, q, k, v, causal=True):\n"
        "        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)\n"
    )
    before = snapshot(stored_results)
    proc = cli(
        "run", "--plugin", clash, "--mech", "softmax", "--force", *SMOKE,
        "--results", stored_results, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = stderr_lines(proc)
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert f"cannot register mechanism '{name}' (plugin file {clash})" in line
    assert f"the name '{taken}' is already taken by mechanism 'softmax' (builtin)" in line
    assert snapshot(stored_results) == before


def test_broken_entry_point_is_one_warning_and_builtins_still_work(tmp_path: Path) -> None:
    # An installed distribution is only its *.dist-info on sys.path: write one by hand whose
    # entry point names a module that raises on import.
    site = tmp_path / "site"
    dist_info = site / "broken_plugin-0.1.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n"
    )
    (dist_info / "entry_points.txt").write_text(
        "[synthbench.mechanisms]\nbroken-mech = broken_plugin_mod:Attention\n"
    )
    (site / "broken_plugin_mod.py").write_text('raise RuntimeError("boom in broken_plugin_mod")\n')

    proc = ok(cli("list", "mechs", cwd=tmp_path, pythonpath=site))
    rows = table_rows(proc.stdout)
    assert set(BUILTINS) <= set(rows)
    assert "broken-mech" not in rows
    lines = stderr_lines(proc)
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("warning:")
    assert "'broken-mech'" in lines[0] and "broken-plugin" in lines[0]
    assert "RuntimeError: boom in broken_plugin_mod" in lines[0]
