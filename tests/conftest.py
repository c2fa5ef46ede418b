"""Shared test fixtures.

The suite runs without the plugins installed in the environment (an entry point of another
package, the example plugin installed as docs/PLUGINS.md shows): their names would change
what the tests count and list. Tests of the entry-point route turn loading back on for the
interpreter they start (tests/test_plugins.py) or the registry they build
(tests/test_registry.py)."""

from __future__ import annotations

import os
import shutil
import signal
import sys

# Bytecode caches (git ignores __pycache__/), even where PYTHONDONTWRITEBYTECODE asks for none,
# as on our CI machines: without them each xdist worker rewrites every test module and each
# CLI process a test starts compiles the package again, a sixth of the fast tier's time.
sys.dont_write_bytecode = False  # before pytest rewrites (and caches) the test modules
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # the processes the tests start

from synthbench.core import registry  # noqa: E402
from synthbench.core.registry import DISABLE_AUTOLOAD  # noqa: E402

os.environ[DISABLE_AUTOLOAD] = "1"  # before anything looks a name up, here and in subprocesses

import pytest  # noqa: E402


def runs_tests(config) -> bool:
    """Whether this process runs tests: an xdist worker, or pytest without workers. The
    xdist controller only hands tests out and prints; it never imports torch or the package
    (4 CPU-s, and the workers start that much later)."""
    return hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)


def pytest_configure(config):
    """Python's own Ctrl-C handler, which the Ctrl-C tests need: Python does not install it
    when it starts with SIGINT ignored, as a background job of a non-interactive shell does
    (`nohup pytest &`), and a test process's workers inherit that."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if not runs_tests(config):
        return
    import clitools  # noqa: F401  (tests/clitools.py: the CLI runner's command, built once)
    import torch

    if hasattr(config, "workerinput"):
        # pytest-xdist runs one worker per core (pyproject.toml's addopts): torch's intra-op
        # threads would only compete with the other workers' tests
        torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (it names each item by one)
def pytest_collection_modifyitems(items):
    """What runs together on one xdist worker (``--dist loadgroup``): each file's tests, as
    they were written to run, one after another in one process, unless a test names a group
    of its own (a hundred independent audits spread over the workers); and every test marked
    ``ray`` (it starts a local Ray instance), whatever its file, so that two local Ray
    instances never share the machine.

    The slow tier (``pytest -m slow``) holds, beside what is marked so by hand, every test
    marked ``ray`` or clicking through the page in a browser: they test wiring that the fast
    tier's tests of the same modules cover, at seconds each."""
    for item in items:
        ray = item.get_closest_marker("ray") is not None
        if ray or item.get_closest_marker("xdist_group") is None:  # a test may name its own
            group = "ray" if ray else item.nodeid.split("::")[0]
            item.add_marker(pytest.mark.xdist_group(group), append=False)
        if ray or "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
        if ray:  # a new list: a parametrized test's items share one, and its other
            # parameters (the in-process executor) must not start Ray
            item.fixturenames = ["ray_instance", *item.fixturenames]
    for item in items:  # only a test marked ray starts Ray
        ray = item.get_closest_marker("ray") is not None
        if ray != ("ray_instance" in getattr(item, "fixturenames", ())):
            raise pytest.UsageError(f"{item.nodeid}: starts Ray without the ray mark, or not")


@pytest.fixture(scope="session")
def ray_instance():
    """One local Ray instance for the tests marked ``ray``, started before the first: the
    executor in a test's process joins it (a running instance, as on a cluster) instead of
    starting and stopping its own (12 CPU-s each, with its workers' imports). A command that
    a test runs as a process starts its own, as a user's does: Ray joins an instance started
    by ``ray.init`` only when given its address."""
    ray = pytest.importorskip("ray", reason='the Ray extra: pip install "synthbench[ray]"')
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def single_thread():
    """One torch thread: the models under test are tiny, and on a busy 2-core machine
    intra-op threads spend far longer waiting for each other than computing."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def smoke_tree(tmp_path_factory):
    """copy x (softmax, linear), smoke, seed 0: two runs stored through the real CLI, once
    for every test that needs a results tree; never written to (copy it: ``results``)."""
    import torch
    from clitools import SMOKE, invoke

    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # as single_thread: tiny models
    root = tmp_path_factory.mktemp("smoke_tree") / "results"
    result = invoke("run", "--task", "copy", "--mech", "softmax,linear", *SMOKE, "--results", root)
    torch.set_num_threads(previous)
    assert result.exit_code == 0, result.output
    return root


@pytest.fixture
def results(smoke_tree, tmp_path):
    """A copy of ``smoke_tree`` that a test may change."""
    root = tmp_path / "results"
    shutil.copytree(smoke_tree, root)
    return root


@pytest.fixture
def afile(tmp_path):
    """A file where a folder is expected."""
    path = tmp_path / "afile"
    path.write_text("not a folder\n")
    return path


@pytest.fixture
def forget_plugins():
    """What a test's plugin files register in this process is forgotten afterwards (the
    registries have no public way to unregister: their dicts are restored)."""
    from synthbench.core.mechanism import MECHANISMS
    from synthbench.core.task import TASKS
    from synthbench.facts.fact import FACTS

    registries = (TASKS, MECHANISMS, FACTS)
    for r in registries:
        r.names()  # the built-ins first: what is restored must hold them
    saved = [(r, dict(r._entries), dict(r._aliases)) for r in registries]
    loaded = dict(registry._loaded_files)
    yield
    for r, entries, aliases in saved:
        r._entries.clear()
        r._entries.update(entries)
        r._aliases.clear()
        r._aliases.update(aliases)
    registry._loaded_files.clear()
    registry._loaded_files.update(loaded)
