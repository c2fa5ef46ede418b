"""Plugins end to end, through the real CLI in subprocesses.

- a local file (``--plugin``): examples/synthbench-example-plugin/local_plugin.py;
- an installed package (entry point): examples/synthbench-example-plugin, pip-installed
  offline into a folder that the commands put on their path;
- broken plugins: a local file that raises or takes a built-in's name stops the command with
  exit status 2 and one line, touching nothing stored; a broken entry point is one warning
  line and the built-ins still work;
- a plugin's code in its run id: an edited file or installed package is trained again;
- ``--version``, shell completion, and the documented plugin walkthroughs, run as written.

Every subprocess gets a fresh interpreter, so nothing registered here leaks into the
registries of the other tests. The broken-plugin commands also run in this process (the
fast tier; their process cases are slow ones), each restoring the registries afterwards
(forget_plugins); the other commands run in this process load only plugin files that
register nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from synthbench.cli import app
from synthbench.core.mechanism import MECHANISMS
from synthbench.core.registry import DISABLE_AUTOLOAD, entry_point_hash
from synthbench.report.aggregate import label_variants
from synthbench.run.store import ResultStore

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "synthbench-example-plugin"
LOCAL_PLUGIN = EXAMPLE / "local_plugin.py"
SMOKE = ("--protocol", "smoke", "--seeds", "1", "--task", "copy", "--device", "cpu")
BUILTINS = ("softmax", "linear")
ENV = {"COLUMNS": "400", "NO_COLOR": "1"}  # in-process commands (CliRunner): whole lines


def cli(
    *args: object,
    python: str | Path = sys.executable,
    cwd: Path,
    pythonpath: Path | None = None,
    autoload: bool | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m synthbench.cli ARGS`` with wide, colourless output (whole table rows).
    ``autoload``: installed plugins are loaded (default: where ``pythonpath`` adds a folder
    a plugin was installed into; the suite runs without them otherwise: tests/conftest.py)."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "PY_COLORS")}
    if autoload is None:
        autoload = pythonpath is not None
    if autoload:
        env.pop(DISABLE_AUTOLOAD, None)
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


# where a broken-plugin case runs its command: in this process, through the CLI's own entry
# (the fast tier; the registries restored afterwards: forget_plugins), or in a process of
# its own, as a user's shell runs it (the slow tier)
HOW = ["in-process", pytest.param("process", marks=pytest.mark.slow)]


def command(
    how: str,
    *args: object,
    cwd: Path,
    pythonpath: Path | None = None,
    autoload: bool | None = None,
) -> subprocess.CompletedProcess[str]:
    """``synthbench ARGS`` (``HOW``), as a finished process: exit status, stdout, stderr.
    ``pythonpath`` and ``autoload`` set up a process of its own (``cli``)."""
    if how == "process":
        return cli(*args, cwd=cwd, pythonpath=pythonpath, autoload=autoload)
    assert pythonpath is None and autoload is None, "a process of its own sets those up"
    with contextlib.chdir(cwd):
        result = CliRunner().invoke(app, [str(a) for a in args], env=ENV)
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def list_mechanisms(
    *args: object,
    cwd: Path,
    pythonpath: Path | None = None,
    autoload: bool | None = None,
    how: str = "process",
) -> tuple[subprocess.CompletedProcess[str], dict[str, dict]]:
    """``synthbench list mechs --json ARGS``: the finished command and its rows by name."""
    options = {"cwd": cwd, "pythonpath": pythonpath, "autoload": autoload}
    proc = ok(command(how, "list", "mechs", "--json", *args, **options))
    return proc, {row["name"]: row for row in json.loads(proc.stdout)}


def assert_one_run_stored(results: Path, mechanism: str) -> pd.DataFrame:
    """Exactly one file under results/ (no temporaries left), in the mechanism's partition."""
    files = [p.relative_to(results) for p in results.rglob("*") if p.is_file()]
    assert len(files) == 1, files
    assert files[0].parent == Path("protocol=smoke", "task=copy", f"mechanism={mechanism}")
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


@pytest.fixture
def stored_results(results: Path) -> Path:
    """A results tree holding real smoke runs (tests/conftest.py's, copied for the test)."""
    assert not ResultStore(results).load(warn=False).rows.empty
    return results


# -- the local-file route ----------------------------------------------------------------


@pytest.mark.slow
def test_local_file_plugin_runs_end_to_end_and_again_once_edited(tmp_path: Path) -> None:
    plugin = tmp_path / "local_plugin.py"  # a copy, to edit
    shutil.copy(LOCAL_PLUGIN, plugin)
    results = tmp_path / "results"

    def run() -> str:
        return ok(
            cli(
                "run", "--plugin", plugin, "--mech", "scaled-softmax", *SMOKE,
                "--results", results, cwd=tmp_path,
            )
        ).stdout  # fmt: skip

    assert "done: 1 ok" in run()
    rows = assert_one_run_stored(results, "scaled-softmax")
    # the plugin's constructor default is resolved and stored like a built-in's
    assert {json.loads(p)["temperature"] for p in rows["mechanism_params"]} == {2.0}
    # the file's code is in the run id and in the row's config
    code = hashlib.sha256(plugin.read_bytes()).hexdigest()[:16]
    assert all(json.loads(c)["plugin_code"] == {"mechanism": code} for c in rows["config"])
    first = {path: value for path, value in snapshot(results).items() if value[1] is not None}

    assert "1 already stored, 0 to run" in run()  # unchanged: resumed
    plugin.write_text(plugin.read_text() + "# any edit is other code\n")
    assert "0 already stored, 1 to run" in run()  # edited: trained again, beside the first
    loaded = ResultStore(results).load(warn=False).rows
    assert len(set(loaded["run_id"])) == 2
    codes = {json.loads(c)["plugin_code"]["mechanism"] for c in loaded["config"]}
    assert codes == {code, hashlib.sha256(plugin.read_bytes()).hexdigest()[:16]}
    assert all(snapshot(results)[path] == value for path, value in first.items())  # kept


@pytest.mark.parametrize("how", HOW)
def test_local_file_plugin_is_listed_with_its_source(tmp_path: Path, how, forget_plugins) -> None:
    proc, rows = list_mechanisms("--plugin", LOCAL_PLUGIN, cwd=tmp_path, how=how)
    assert set(BUILTINS) <= set(rows)
    plugin = rows["scaled-softmax"]
    assert (plugin["complexity"], plugin["family"]) == ("quadratic", "softmax")
    assert plugin["source"].startswith("plugin file") and "local_plugin.py" in plugin["source"]
    assert rows["softmax"]["source"] == "builtin"
    assert stderr_lines(proc) == []


# -- the entry-point route -----------------------------------------------------------------


def _setuptools_version() -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in importlib.metadata.version("setuptools").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return (0,)


needs_pip = pytest.mark.skipif(
    importlib.util.find_spec("pip") is None or _setuptools_version() < (77,),
    reason="needs pip and setuptools >= 77 in this interpreter to build the example offline",
)


def pip_install(package: Path, tmp_path: Path) -> Path:
    """Install ``package`` into tmp_path/site, which the commands then put on their path.

    Built from a copy so the checkout gets no build/ or *.egg-info. Installed with this
    interpreter's pip into a folder of its own: the same interpreter and packages as the test
    run, whether that is the system's or a virtual environment's (a nested venv would see the
    base interpreter's packages instead, not this environment's).
    """
    src = tmp_path / package.name
    shutil.copytree(
        package, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
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
    return site


def mechanism_entry_points() -> set[str]:
    """The mechanism plugins this environment's packages declare (what autoloading reads)."""
    return {ep.name for ep in importlib.metadata.entry_points(group=MECHANISMS.entry_point_group)}


@pytest.mark.slow
@needs_pip
def test_entry_point_plugin_installed_as_a_package(tmp_path: Path) -> None:
    # whether this environment has the plugin installed already (the test must pass either way)
    installed_here = mechanism_entry_points()
    site = pip_install(EXAMPLE, tmp_path)

    listed, rows = list_mechanisms(cwd=tmp_path, pythonpath=site)
    assert set(BUILTINS) <= set(rows)
    plugin = rows["relu-linear"]
    assert (plugin["complexity"], plugin["family"]) == ("linear", "feature-map")
    assert plugin["state_per_head"] == 16 * 17  # feature_dim (d) x (d + 1) at d 16
    assert plugin["source"] == "plugin relu-linear (synthbench-example-plugin)"
    assert stderr_lines(listed) == []

    results = tmp_path / "results"
    proc = ok(
        cli("run", "--mech", "relu-linear", *SMOKE, "--results", results, cwd=tmp_path,
            pythonpath=site)
    )  # fmt: skip
    assert "done: 1 ok" in proc.stdout
    stored = assert_one_run_stored(results, "relu-linear")
    assert {json.loads(p)["offset"] for p in stored["mechanism_params"]} == {0.01}
    # the installed package's code is in the run id (and shown in the row's config): the
    # hash of its version and module files, which an edit of an installed file changes
    (dist,) = importlib.metadata.distributions(path=[str(site)])
    (ep,) = dist.entry_points
    code = entry_point_hash(ep)
    assert all(json.loads(c)["plugin_code"] == {"mechanism": code} for c in stored["config"])
    module = site / "synthbench_example_plugin" / "__init__.py"
    module.write_text(module.read_text() + "# edited\n")
    assert entry_point_hash(ep) != code

    # installed into that folder only: without it on the path, the environment is as it was
    assert mechanism_entry_points() == installed_here
    # and with autoloading off, an installed plugin is not loaded at all
    assert "relu-linear" not in list_mechanisms(cwd=tmp_path, pythonpath=site, autoload=False)[1]


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


@pytest.mark.parametrize("how", HOW)
def test_local_file_that_raises_exits_2_with_one_line(
    tmp_path: Path, stored_results: Path, how: str, forget_plugins
) -> None:
    bad = tmp_path / "exploding_plugin.py"
    bad.write_text('raise RuntimeError("kaboom from the plugin")\n')
    before = snapshot(stored_results)
    # --force: had the plugin loaded, the stored run would be rewritten
    proc = command(
        how, "run", "--plugin", bad, "--mech", "softmax", "--force", *SMOKE,
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
@pytest.mark.parametrize("how", HOW)
def test_local_file_taking_a_builtin_name_exits_2_naming_both(
    tmp_path: Path,
    stored_results: Path,
    name: str,
    aliases: tuple[str, ...],
    taken: str,
    how: str,
    forget_plugins,
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
    proc = command(
        how, "run", "--plugin", clash, "--mech", "softmax", "--force", *SMOKE,
        "--results", stored_results, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = stderr_lines(proc)
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert f"cannot register mechanism '{name}' (plugin file {clash})" in line
    assert f"the name '{taken}' is already taken by mechanism 'softmax' (builtin)" in line
    assert snapshot(stored_results) == before


# (distribution, entry point, module, what its warning says); both in one command
BROKEN = [
    (
        "broken-plugin",
        "broken-mech",
        'raise RuntimeError("boom in broken_plugin_mod")\n',
        "failed to load: RuntimeError: boom in broken_plugin_mod",
    ),
    # SystemExit is no Exception: it used to end every command, silently, with status 0
    (
        "exiting-plugin",
        "exiting-mech",
        "import sys\nsys.exit(0)\n",
        "called sys.exit(0) while being imported",
    ),
]


def test_broken_entry_points_are_one_warning_each_and_builtins_still_work(tmp_path: Path) -> None:
    # An installed distribution is only its *.dist-info on sys.path: write, by hand, one per
    # broken plugin whose entry point names a module that fails on import.
    site = tmp_path / "site"
    for dist, entry, module, _ in BROKEN:
        dist_info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
        dist_info.mkdir(parents=True)
        (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        module_name = f"{dist.replace('-', '_')}_mod"
        (dist_info / "entry_points.txt").write_text(
            f"[synthbench.mechanisms]\n{entry} = {module_name}:Attention\n"
        )
        (site / f"{module_name}.py").write_text(module)

    proc, rows = list_mechanisms(cwd=tmp_path, pythonpath=site)
    assert set(BUILTINS) <= set(rows)
    lines = stderr_lines(proc)
    assert len(lines) == len(BROKEN), proc.stderr
    for dist, entry, _, failure in BROKEN:
        assert entry not in rows
        (line,) = [li for li in lines if f"'{entry}'" in li]
        assert line.startswith("warning:") and dist in line and failure in line, line


def test_a_plugins_code_before_and_after_an_edit_are_separate_variants_in_reports() -> None:
    """Not two seeds of one mechanism (or task): each code is its own table row."""

    def stored(task_code: str | None, mech_code: str | None) -> dict[str, str]:
        code = {"task": task_code, "mechanism": mech_code}
        config = {"plugin_code": {k: v for k, v in code.items() if v is not None}}
        return {
            "task": "my-task", "task_params": "{}", "mechanism": "my-mech",
            "mechanism_params": "{}", "protocol": "smoke", "config": json.dumps(config),
        }  # fmt: skip

    rows = pd.DataFrame([stored("t1", "m1"), stored("t1", "m2"), stored("t2", "m2")])
    labelled = label_variants(rows)
    assert list(labelled["mechanism"]) == ["my-mech (code=m1)", *["my-mech (code=m2)"] * 2]
    assert list(labelled["task"]) == [*["my-task (code=t1)"] * 2, "my-task (code=t2)"]
    one_code = label_variants(pd.DataFrame([stored(None, "m1"), stored(None, "m1")]))
    assert set(one_code["mechanism"]) == {"my-mech"} and set(one_code["task"]) == {"my-task"}


# -- plugin files that cannot be loaded: one line each, in process (none registers anything) --


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("exits.py", "import sys\nsys.exit(0)\n", "plugin file {path} called sys.exit(0) while"),
        ("exits_1.py", "raise SystemExit(1)\n", "plugin file {path} called sys.exit(1) while"),
        ("plugins", None, "plugin {path} is a directory, not a Python file"),
        ("missing.py", "", "plugin file {path} does not exist"),
        ("notes.txt", "x = 1\n", "plugin file {path} is not a Python file (.py)"),
        (
            "typo.py",
            "import torch\n\ndef f(:\n",
            "plugin file {path} failed to import: SyntaxError at {path}:3: invalid syntax",
        ),
        (
            "needs.py",
            "import synthbench_no_such_module\n",
            "failed to import: ModuleNotFoundError: No module named 'synthbench_no_such_module'",
        ),
    ],
    ids=["sys.exit(0)", "SystemExit(1)", "directory", "missing", "not-py", "syntax", "import"],
)
def test_plugin_file_that_cannot_load_is_one_line_and_exit_2(
    tmp_path: Path, name: str, content: str | None, message: str
) -> None:
    path = tmp_path / name
    if content is None:
        path.mkdir()
    elif name != "missing.py":
        path.write_text(content)
    result = CliRunner().invoke(app, ["list", "mechs", "--plugin", str(path)], env=ENV)
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and message.format(path=path) in lines[0]


def test_plugin_file_that_registers_nothing_is_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "empty.py"
    path.write_text("# nothing registered here\n")
    result = CliRunner().invoke(app, ["list", "mechs", "--plugin", str(path)], env=ENV)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        f"warning: plugin file {path} registers no task, mechanism or fact"
    ]


# -- the command line's own options ----------------------------------------------------------


@pytest.mark.parametrize("option", ["--version", "-V"])
def test_version_names_synthbench_and_torch(option) -> None:
    result = CliRunner().invoke(app, [option], env=ENV)
    assert result.exit_code == 0, result.output
    version = importlib.metadata.version("synthbench")
    assert result.stdout == f"synthbench {version} (torch {torch.__version__})\n"


@pytest.mark.parametrize("command", [["run"], ["results"], ["report"], ["bench", "scaling"], []])
def test_help_shows_flags_plainly(command) -> None:
    """A flag is its name in help (``--force``), never ``--force <bool>`` nor an unasked-for
    ``--no-force``; an option with a value still shows its type."""
    result = CliRunner().invoke(app, [*command, "--help"], env=ENV)
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.stdout
    assert "--no-force" not in result.stdout and "--no-all-lrs" not in result.stdout
    if command == ["run"]:
        assert "--force" in result.stdout and "<int>" in result.stdout


def test_shell_completion_is_available() -> None:
    """The options are there, the script for a named shell (docs/CLI.md's recipe, which
    needs no shell detection and no terminal), and a completion request is answered."""
    help_text = CliRunner().invoke(app, ["--help"], env=ENV).stdout
    assert "--install-completion" in help_text and "--show-completion" in help_text

    def complete(env: dict[str, str]) -> str:
        result = CliRunner().invoke(app, [], env={**ENV, **env}, prog_name="synthbench")
        assert result.exit_code == 0, result.output
        return result.stdout

    assert "compdef synthbench" in complete({"_SYNTHBENCH_COMPLETE": "source_zsh"})
    script = complete({"_SYNTHBENCH_COMPLETE": "source_bash"})
    assert "complete -o default -F _synthbench_completion synthbench" in script
    request = {"_SYNTHBENCH_COMPLETE": "complete_bash", "COMP_CWORD": "1"}
    assert complete({**request, "COMP_WORDS": "synthbench ru"}).split() == ["run"]
    request["COMP_CWORD"] = "2"
    words = complete({**request, "COMP_WORDS": "synthbench run --protocol-"}).split()
    assert words == ["--protocol-param"]


# -- the documented plugin walkthroughs -------------------------------------------------------


def walkthrough(doc: str, *sections: str) -> tuple[list[str], list[str]]:
    """From ``sections`` of ``doc`` (their "## " headings): the plugin file's code (a python
    block that starts ``# my_mechanism.py``) and the commands of their bash blocks, in order."""
    text = (REPO / doc).read_text()
    code, commands = [], []
    for heading in sections:
        section = text.split(f"\n## {heading}\n")[1].split("\n## ")[0]
        blocks = re.findall(r"^( *)```(\w+)\n(.*?)^\1```", section, flags=re.M | re.S)
        code += [
            textwrap.dedent(body)
            for _, lang, body in blocks
            if lang == "python" and body.lstrip().startswith("# my_mechanism.py")
        ]
        commands += [
            line.strip()
            for _, lang, body in blocks
            if lang == "bash"
            for line in body.splitlines()
            if line.strip()
        ]
    return code, commands


def run_walkthrough(code: list[str], commands: list[str], tmp_path: Path) -> pd.DataFrame:
    """The plugin file written, then every command run in order as a newcomer would (a pip
    install into a folder of the test's own); the rows they stored."""
    assert len(code) == 1, "the plugin file, # my_mechanism.py, is shown once"
    (tmp_path / "my_mechanism.py").write_text(code[0])
    site = tmp_path / "site"
    for command in commands:
        argv = shlex.split(command)
        if argv[:2] == ["pip", "install"]:
            (package,) = argv[2:]
            assert pip_install(REPO / package, tmp_path) == site
            continue
        assert argv[0] == "synthbench", command
        proc = cli(*argv[1:], cwd=tmp_path, pythonpath=site)
        assert proc.returncode == 0, f"{command}: exit {proc.returncode}\n{proc.stderr}"
        assert not re.search(r"^(error|warning):", proc.stderr, flags=re.M), proc.stderr
        if argv[1] == "check":  # the contract, every check passed, one line each
            assert "FAIL" not in proc.stdout and proc.stdout.count("PASS") >= 7, proc.stdout
    return ResultStore(tmp_path / "results").load(warn=False).rows


@pytest.mark.parametrize("doc", ["README.md", "docs/PLUGINS.md", "docs/CLI.md"])
def test_documented_plugin_runs_try_one_task_with_the_smoke_protocol(doc) -> None:
    """Trying a plugin must not start the whole suite (66 runs under quick)."""
    lines = [
        line
        for line in (REPO / doc).read_text().splitlines()
        if "synthbench run" in line and "--plugin" in line
    ]
    assert lines
    for line in lines:
        argv = shlex.split(line.split("#")[0].strip().strip("`"))
        options = dict(zip(argv, argv[1:], strict=False))  # option -> the word after it
        assert options.get("--protocol") == "smoke", line
        assert "--task" in options and "," not in options["--task"], line


@pytest.mark.slow
def test_readme_plugin_walkthrough_works_in_order(tmp_path: Path) -> None:
    """The README's plugin file, its check and its run beside softmax, top to bottom."""
    code, commands = walkthrough("README.md", "Adding a mechanism")
    assert [c.split()[1] for c in commands] == ["check", "run"], commands
    stored = run_walkthrough(code, commands, tmp_path)
    assert set(stored["mechanism"]) == {"my-relu-linear", "softmax"}
    assert set(stored["protocol"]) == {"smoke"} and set(stored["task"]) == {"copy"}


@pytest.mark.slow
@needs_pip
def test_plugins_doc_walkthrough_works_in_order(tmp_path: Path) -> None:
    """docs/PLUGINS.md's local file and its installed package, run top to bottom as a
    newcomer would: the file, then the example package installed, then both at once (no
    name collision)."""
    code, commands = walkthrough("docs/PLUGINS.md", "A local file", "An installed package")
    installs = [c for c in commands if c.startswith("pip install ")]
    assert len(installs) == 1, commands  # the entry-point route
    assert any("--plugin my_mechanism.py" in c for c in commands), commands  # the file route
    stored = run_walkthrough(code, commands, tmp_path)
    assert {"my-relu-linear", "relu-linear"} <= set(stored["mechanism"])
    assert set(stored["protocol"]) == {"smoke"} and set(stored["task"]) == {"copy"}
