"""The built wheel carries tasks/ and mechanisms/ as synthbench.tasks and synthbench.mechanisms,
and the shipped reference baselines as package data."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from synthbench.report import reference

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_installs_and_imports_the_registries(tmp_path):
    # build from a copy: setuptools keeps a build/ folder beside the sources, and a stale one
    # (files since removed or renamed) would leak into the wheel
    source = tmp_path / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            *(".git", ".venv", "build", "dist", "*.egg-info", "results", "reports"),
            *(".*cache", "__pycache__"),
        ),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("synthbench-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"synthbench/tasks/copy.py", "synthbench/mechanisms/softmax.py"} <= names
    # the reference baselines `report` shows beside a user's rows (synthbench/report/reference.py)
    assert "synthbench/data/reference/quick.parquet" in names
    # the facts' measured runs (synthbench/facts/shipped.py) and the published LM numbers
    assert {"synthbench/data/facts_runs.parquet", "synthbench/data/published_lm.csv"} <= names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "synthbench = synthbench.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()

    # install it alone into a bare target folder and import from there, not from the checkout
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    # an editable install of this checkout (pip install -e) adds a finder that would supply
    # any module the wheel lacks: leave it out, so the wheel is imported alone
    only_the_wheel = (
        f"import sys; sys.path.insert(0, {str(target)!r});"
        "sys.meta_path[:] = [f for f in sys.meta_path"
        " if not getattr(f, '__module__', '').startswith('__editable__')]"
    )
    code = (
        "import pkgutil, importlib, synthbench, synthbench.tasks, synthbench.mechanisms;"
        # every module imports from the wheel alone (a package missing from the wheel fails)
        "[importlib.import_module(m.name) for m in"
        " pkgutil.walk_packages(synthbench.__path__, 'synthbench.')"
        " if not m.name.endswith('__main__')];"
        "print(sorted({(m.__file__ or next(iter(m.__path__))).split('/synthbench/')[0]"
        " for n, m in sys.modules.items() if n.startswith('synthbench')}));"
        "from synthbench import TASKS, MECHANISMS;"
        "print(synthbench.tasks.__file__); print(TASKS.names(), MECHANISMS.names())"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", f"{only_the_wheel}; {code}"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    folders, tasks_file, names = result.stdout.splitlines()
    assert folders == repr([str(target)])
    assert tasks_file.startswith(str(target))
    assert "copy" in names and "softmax" in names and "linear" in names

    # the shipped reference is found through importlib.resources, in the installed package
    code = (
        "from synthbench.report import reference;"
        "loaded = reference.load(); print(loaded.where); print(loaded.problem);"
        "print(sorted(set(loaded.rows['mechanism']))); print(loaded.outdated)"
    )
    env = {k: v for k, v in os.environ.items() if k != reference.ENV}
    result = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            f"{only_the_wheel}; {code}",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    where, problem, mechanisms, outdated = result.stdout.splitlines()
    assert where == str(target / "synthbench" / "data" / "reference" / "quick.parquet")
    # found and read; stale only between a change of the suite or the recipe and its one
    # rebuild (then it is never shown, and says why)
    stale = outdated == "True"
    assert problem == "None" or stale, problem
    assert stale or "softmax" in mechanisms


def _listed_packages():
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return set(setuptools["packages"]), setuptools["package-dir"]


def test_every_source_folder_is_a_listed_package():
    # setuptools installs only the packages pyproject lists: a folder left out imports from a
    # checkout (an editable install) and is missing from a wheel (synthbench.facts once was)
    listed, package_dir = _listed_packages()
    found = set()
    for name, folder in package_dir.items():
        for source in (ROOT / folder).rglob("*.py"):
            if "__pycache__" in source.parts:
                continue
            relative = source.parent.relative_to(ROOT / folder)
            found.add(".".join((name, *relative.parts)))
    assert found - listed == set(), "pyproject.toml's [tool.setuptools] packages lacks these"
    assert listed - found == set(), "pyproject.toml lists packages that hold no module"
