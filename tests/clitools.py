"""Helpers of the command-line tests (tests/test_reliability.py, tests/test_cli_errors.py):
the real CLI in this process or in a subprocess, a script of benchmarks/ as a module, a
results tree's files by hash, the one-line error every user fault must end in. Fixtures:
tests/conftest.py."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
from pathlib import Path

import typer.testing
from typer.testing import CliRunner

from synthbench.cli import app

# typer's CliRunner builds the click command from the app at every invoke (about 0.08 CPU-s,
# some 600 times a fast tier, 6% of it); the app never changes, so each test process builds
# it once. Every test's CliRunner goes through this (this module is loaded by conftest.py);
# a typer without this private name builds it each time, as before.
if hasattr(typer.testing, "_get_command"):
    typer.testing._get_command = functools.cache(typer.testing._get_command)

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SMOKE = ["--protocol", "smoke", "--seeds", "1", "--jobs", "1"]
ENV = {"COLUMNS": "250"}  # rich never wraps a message or a name
SUBPROCESS_ENV = {**os.environ, **ENV, "OMP_NUM_THREADS": "1"}


def invoke(*args):
    """``synthbench ARGS`` in this process."""
    return CliRunner().invoke(app, [str(a) for a in args], env=ENV)


def command_line(*args) -> list[str]:
    """``synthbench ARGS`` as a subprocess runs it."""
    return [sys.executable, "-m", "synthbench.cli", *map(str, args)]


@functools.cache
def load_script(name: str):
    """benchmarks/<name>.py as a module (the folder is not a package), loaded once per test
    process and registered under its name (a dataclass of it looks its module up)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def tree(root: Path) -> dict[str, str]:
    """Every file under root (hidden ones too) with the hash of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def assert_error(result, code: int, message: str) -> None:
    """Exit ``code``, ``message`` in the one error line, nothing else on stderr but
    warnings, and no traceback anywhere."""
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), result.exception
    errors = [line for line in result.stderr.splitlines() if not line.startswith("warning:")]
    assert len(errors) == 1 and errors[0].startswith("error: "), result.stderr
    assert message in errors[0], errors[0]


def refuse_access(monkeypatch, denied: Path) -> None:
    """As a user who may not write ``denied`` (the tests may run as root, who may write
    anywhere)."""
    real = os.access

    def access(path, mode, *args, **kwargs):
        if Path(path).resolve() == denied.resolve() and mode & os.W_OK:
            return False
        return real(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)
