"""The package's layout (docs/ARCHITECTURE.md): no import circle, counting the imports inside
functions; rooms that import only what lies below them; no module too long to read in one
sitting; the public names; and every import the docs show resolves."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# the top-level packages and the package each is installed as (pyproject.toml's package-dir)
PACKAGES = {
    "synthbench": "synthbench",
    "tasks": "synthbench.tasks",
    "mechanisms": "synthbench.mechanisms",
}
LONGEST = 600  # lines
# what each room may import from the others (docs/ARCHITECTURE.md: arrows point down, and
# run's one narrow arrow up: a trained model's causality check and a task's chance)
ALLOWED = {
    "core": set(),
    "tasks": {"core"},
    "mechanisms": {"core"},
    "run": {"core", "integrity.causality", "integrity.audit"},
    "integrity": {"core", "run"},
    "report": {"core", "run", "integrity"},
    "bench": {"core", "run", "report", "mechanisms"},
    "facts": {"core", "run", "integrity", "report"},  # a task's chance at a longer test
    "cli": {"core", "run", "integrity", "report", "bench", "facts", "mechanisms"},
}


def modules() -> dict[str, Path]:
    """Every module of the package by its installed dotted name."""
    found = {}
    for folder, name in PACKAGES.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([name, *parts])] = path
    return found


def imports(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    """The package's own modules that ``path`` imports anywhere in it (functions too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in names:
            while target and target not in known:
                target = target.rpartition(".")[0]
            # a module's own packages run before it: importing them closes no circle
            if target and target != name and not name.startswith(target + "."):
                targets.add(target)
    return targets


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, name, known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    assert circles(graph()) == []


def test_the_circle_finder_finds_one():
    """The check above can fail: two modules that import each other inside functions."""
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    edges = graph()
    edges["synthbench.core.task"] = edges["synthbench.core.task"] | {"synthbench.run.train"}
    assert any("synthbench.core.task" in c for c in circles(edges))


def room(module: str) -> str | None:
    """The room of a module: core, run, integrity, report, bench, cli, tasks or mechanisms
    (None: the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_each_room_imports_only_what_lies_below_it():
    wrong = []
    for module, targets in graph().items():
        mine = room(module)
        for target in targets:
            theirs = room(target)
            if mine in ALLOWED and theirs not in (None, mine):
                allowed = ALLOWED[mine]
                if theirs not in allowed and ".".join(target.split(".")[1:3]) not in allowed:
                    wrong.append(f"{module} imports {target}")
    assert wrong == []


def test_no_module_is_too_long_to_read_in_one_sitting():
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text().splitlines())) > LONGEST}  # fmt: skip
    assert long == {}


def test_no_module_lies_loose_at_the_top_of_the_package():
    loose = [p.name for p in (REPO / "synthbench").glob("*.py") if p.name != "__init__.py"]
    assert loose == []


def test_the_public_names_resolve():
    import synthbench

    for name in synthbench.__all__:
        assert getattr(synthbench, name) is not None, name
    from synthbench import FeatureMapMechanism, Mechanism

    assert issubclass(FeatureMapMechanism, Mechanism)


def documented_imports() -> list[tuple[str, str]]:
    """(file, import line) of every synthbench import in a Python block of the README and
    docs/."""
    found = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for block in re.findall(r"```python\n(.*?)```", path.read_text(), re.S):
            for line in block.splitlines():
                if re.match(r"\s*(from synthbench\S* import|import synthbench)", line):
                    found.append((path.name, line.strip()))
    return found


@pytest.mark.parametrize("where, line", documented_imports())
def test_every_import_the_docs_show_resolves(where, line):
    module = re.match(r"(?:from|import) (\S+)", line).group(1)
    imported = importlib.import_module(module)
    if line.startswith("from "):
        for name in re.sub(r"#.*", "", line.split(" import ", 1)[1]).split(","):
            assert hasattr(imported, name.strip().split(" as ")[0]), (where, line)


def test_a_files_tests_run_together_on_one_worker(request):
    """tests/conftest.py groups each file's tests on one xdist worker (its module fixtures
    built once): under ``--dist loadgroup`` xdist names each item by its group. Under pytest
    9.2 it named none (pytest-xdist issue 1386), silently: pyproject.toml keeps pytest below
    9.2, and this test fails should a grouping be lost again."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("runs under pytest-xdist's --dist loadgroup (the README's test command)")
    assert request.node.nodeid.endswith("@tests/test_layout.py"), request.node.nodeid
