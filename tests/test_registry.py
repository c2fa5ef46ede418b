"""The generic Registry: registration, lookup errors, entry-point plugins and plugin files."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.metadata
import json
import os
import shutil
import signal
import sys
import types
import uuid
import warnings
from dataclasses import dataclass

import pytest

from synthbench import MECHANISMS, TASKS
from synthbench.core import interrupts
from synthbench.core.registry import (
    DISABLE_AUTOLOAD,
    PluginError,
    Registry,
    RegistryError,
    UnknownNameError,
    load_plugin_file,
)
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.spec import RunSpec

GROUP = "synthbench.test_widgets"
HOLDER = "_synthbench_test_holder"  # module through which plugin code reaches the test registry

BUILTINS_CODE = f"""
from {HOLDER} import REGISTRY

@REGISTRY.register("alpha", aliases=("a",), category="Basic")
class Alpha:
    pass

@REGISTRY.register("beta", category="Basic")
class Beta:
    pass
"""


def widget_registry(**kwargs) -> Registry:
    return Registry(
        "widget", required=("category",), choices={"category": ("Basic", "Memory")}, **kwargs
    )


class Thing:
    pass


class Other:
    pass


# -- fixtures -----------------------------------------------------------------------------


@pytest.fixture
def holder(monkeypatch) -> types.ModuleType:
    """A module plugin code imports its registry from: ``from _synthbench_test_holder import
    REGISTRY``; the test sets ``holder.REGISTRY``."""
    module = types.ModuleType(HOLDER)
    monkeypatch.setitem(sys.modules, HOLDER, module)
    return module


@pytest.fixture
def builtins_module(tmp_path, monkeypatch, holder):
    """Writes BUILTINS_CODE as an importable module with a unique name; returns the name."""
    name = f"_synthbench_test_builtins_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(BUILTINS_CODE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


@dataclass
class FakeDist:
    name: str


class FakeEntryPoint:
    """Just what the registry uses of importlib.metadata.EntryPoint."""

    def __init__(self, name: str, load, dist: str = "fake-dist") -> None:
        self.name, self._load, self.dist = name, load, FakeDist(dist)

    def load(self):
        return self._load()


@pytest.fixture
def entry_points(monkeypatch) -> dict[str, list[FakeEntryPoint]]:
    """Replaces importlib.metadata.entry_points; tests fill the returned {group: [eps]}.
    Loading them is on (the suite turns it off: tests/conftest.py)."""
    monkeypatch.delenv(DISABLE_AUTOLOAD, raising=False)
    installed: dict[str, list[FakeEntryPoint]] = {}

    def fake_entry_points(*, group=None, **_):
        return list(installed.get(group, []))

    monkeypatch.setattr(importlib.metadata, "entry_points", fake_entry_points)
    return installed


def raising(exc: Exception):
    def load():
        raise exc

    return load


def class_with_metadata(**metadata) -> type:
    return type("PluginThing", (), {"registry_metadata": metadata})


# -- registration -------------------------------------------------------------------------


def test_decorator_registers_with_aliases_and_metadata():
    reg = widget_registry()

    @reg.register("thing", aliases=("t", "thingy"), category="Basic", extra=3)
    class Decorated:
        pass

    assert Decorated.__name__ == "Decorated"  # the decorator returns the class itself
    for label in ("thing", "t", "thingy"):
        assert label in reg
        assert reg.get(label) is Decorated
        assert reg.canonical(label) == "thing"
    entry = reg.entry("t")
    assert entry.metadata == {"category": "Basic", "extra": 3}
    assert entry.aliases == ("t", "thingy")
    assert entry.source == "builtin"
    assert reg.names() == ["thing"] and list(reg) == ["thing"] and len(reg) == 1
    assert "nothing" not in reg


def test_missing_required_metadata_is_refused():
    reg = widget_registry()
    with pytest.raises(RegistryError, match=r"widget 'thing' is missing metadata: category"):
        reg.add("thing", Thing)
    assert "thing" not in reg


def test_value_outside_choices_is_refused():
    reg = widget_registry()
    with pytest.raises(RegistryError, match=r"category must be one of Basic, Memory.*'Fancy'"):
        reg.add("thing", Thing, category="Fancy")
    assert "thing" not in reg


@pytest.mark.parametrize(
    ("name", "aliases", "label"),
    [
        ("thing", (), "thing"),  # same name
        ("other", ("t",), "t"),  # alias taken by an alias
        ("other", ("thing",), "thing"),  # alias taken by a name
        ("t", (), "t"),  # name taken by an alias
    ],
)
def test_duplicate_name_or_alias_is_refused_naming_the_holder(name, aliases, label):
    reg = widget_registry()
    reg.add("thing", Thing, aliases=("t",), category="Basic")
    with pytest.raises(RegistryError) as info:
        reg.add(name, Other, aliases=aliases, category="Basic")
    message = str(info.value)
    assert f"cannot register widget '{name}'" in message
    assert f"the name '{label}' is already taken by widget 'thing' (builtin)" in message
    assert reg.names() == ["thing"] and reg.get(label) is Thing  # nothing half-registered


def test_unknown_name_lists_close_matches():
    reg = widget_registry()
    for name in ("softmax", "linear", "performer"):
        reg.add(name, type(name, (), {}), category="Basic")
    with pytest.raises(UnknownNameError) as info:
        reg.get("sofmax")
    message = str(info.value)
    assert "unknown widget 'sofmax'; did you mean softmax?" in message
    assert "known: softmax, linear, performer" in message
    assert isinstance(info.value, KeyError)  # still catchable as a failed lookup
    with pytest.raises(UnknownNameError, match="unknown widget 'xyzzy'") as info:
        reg.entry("xyzzy")
    assert "did you mean" not in str(info.value)


# -- entry-point plugins ------------------------------------------------------------------


def test_entry_point_plugins_load_and_a_broken_one_is_reported(
    entry_points, holder, builtins_module
):
    good = class_with_metadata(category="Memory")
    entry_points[GROUP] = [
        FakeEntryPoint("good", lambda: good, dist="good-dist"),
        FakeEntryPoint("broken", raising(ImportError("no module named shiny")), dist="bad-dist"),
    ]
    entry_points["some.other.group"] = [FakeEntryPoint("stray", raising(AssertionError))]
    holder.REGISTRY = reg = widget_registry(entry_point_group=GROUP, builtins=builtins_module)

    with pytest.warns(UserWarning, match=r"plugin 'broken' from bad-dist.*ImportError: no module"):
        names = reg.names()

    assert names == ["alpha", "beta", "good"]
    assert reg.get("good") is good
    assert reg.entry("good").metadata == {"category": "Memory"}
    assert reg.entry("good").source == "plugin good (good-dist)"
    assert reg.canonical("a") == "alpha" and reg.entry("alpha").source == "builtin"
    assert [str(e) for e in reg.plugin_errors] == [
        "widget plugin 'broken' from bad-dist failed to load: ImportError: no module named shiny"
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # plugins are loaded once: no second warning
        assert "beta" in reg and "broken" not in reg


def test_installed_plugins_are_skipped_when_autoloading_is_off(
    entry_points, holder, builtins_module, monkeypatch
):
    """SYNTHBENCH_DISABLE_PLUGIN_AUTOLOAD: the built-ins only, no entry point even loaded."""
    entry_points[GROUP] = [FakeEntryPoint("good", raising(AssertionError("never loaded")))]
    monkeypatch.setenv(DISABLE_AUTOLOAD, "1")
    holder.REGISTRY = reg = widget_registry(entry_point_group=GROUP, builtins=builtins_module)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reg.names() == ["alpha", "beta"] and reg.plugin_errors == []


def test_module_entry_point_registers_through_its_decorators(entry_points, holder):
    holder.REGISTRY = reg = widget_registry(entry_point_group=GROUP)

    def load_module():  # what importing a plugin module whose decorators register does
        reg.register("from_module", category="Basic")(Thing)
        return types.ModuleType("plugin_module")

    entry_points[GROUP] = [FakeEntryPoint("modplugin", load_module, dist="mod-dist")]
    assert reg.names() == ["from_module"]  # the module itself is not registered
    assert reg.entry("from_module").source == "plugin modplugin (mod-dist)"
    assert reg.plugin_errors == []


@pytest.mark.parametrize(
    ("name", "load", "error"),
    [
        (
            "alpha",
            lambda: class_with_metadata(category="Basic"),
            "the name 'alpha' is already taken by widget 'alpha' (builtin)",
        ),
        ("bare", lambda: Thing, "missing metadata: category"),
        ("odd", lambda: class_with_metadata(category="Fancy"), "category must be one of"),
        ("crash", raising(ZeroDivisionError("division by zero")), "ZeroDivisionError"),
    ],
)
def test_broken_plugin_never_takes_the_builtins_down(
    entry_points, holder, builtins_module, name, load, error
):
    entry_points[GROUP] = [FakeEntryPoint(name, load)]
    holder.REGISTRY = reg = widget_registry(entry_point_group=GROUP, builtins=builtins_module)
    with pytest.warns(UserWarning, match=f"widget plugin '{name}' from fake-dist failed to load"):
        assert reg.names() == ["alpha", "beta"]
    assert len(reg.plugin_errors) == 1 and error in str(reg.plugin_errors[0])
    assert reg.entry("alpha").source == "builtin"


def test_builtins_imported_directly_still_win_over_a_colliding_plugin(
    entry_points, holder, builtins_module
):
    """``import synthbench.mechanisms`` (or any of its modules) before the first lookup must
    not let a plugin claim a built-in's name and break the built-ins' import."""
    entry_points[GROUP] = [FakeEntryPoint("beta", lambda: class_with_metadata(category="Basic"))]
    holder.REGISTRY = reg = widget_registry(entry_point_group=GROUP, builtins=builtins_module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        importlib.import_module(builtins_module)
        names = reg.names()
    assert names == ["alpha", "beta"]
    assert reg.entry("beta").source == "builtin"
    assert len(reg.plugin_errors) == 1 and "already taken" in str(reg.plugin_errors[0])


# -- plugin files -------------------------------------------------------------------------


def test_plugin_file_registers_and_records_its_source(tmp_path, holder):
    holder.REGISTRY = reg = widget_registry()
    path = tmp_path / "my_widgets.py"
    path.write_text(
        f"from {HOLDER} import REGISTRY\n\n"
        "@REGISTRY.register('local', aliases=('loc',), category='Memory')\n"
        "class Local:\n"
        "    pass\n"
    )
    load_plugin_file(path, [reg])
    assert reg.get("loc").__name__ == "Local"
    assert str(path) in reg.entry("local").source
    reg.add("later", Thing, category="Basic")
    assert reg.entry("later").source == "builtin"  # the label ends with the file


def test_plugin_file_that_raises_names_the_file_and_the_error(tmp_path, holder):
    holder.REGISTRY = reg = widget_registry()
    path = tmp_path / "broken_widgets.py"
    path.write_text("raise RuntimeError('widget factory on fire')\n")
    with pytest.raises(PluginError) as info:
        load_plugin_file(path, [reg])
    message = str(info.value)
    assert str(path) in message
    assert "RuntimeError: widget factory on fire" in message
    assert isinstance(info.value.__cause__, RuntimeError)


def test_missing_plugin_file_is_a_plugin_error(tmp_path):
    path = tmp_path / "nowhere.py"
    with pytest.raises(PluginError, match="does not exist") as info:
        load_plugin_file(path, [widget_registry()])
    assert str(path) in str(info.value)


# -- the global registries ----------------------------------------------------------------


def test_global_registries_hold_the_builtins():
    assert {"copy", "kv_recall"} <= set(TASKS.names())
    assert TASKS.canonical("mqar") == "kv_recall"
    assert {"softmax", "linear"} <= set(MECHANISMS.names())
    for registry in (TASKS, MECHANISMS):
        for entry in registry.entries():
            assert set(registry.required) <= set(entry.metadata)


def test_plugin_file_that_fails_half_way_leaves_nothing_registered(tmp_path):
    registry = Registry("mechanism")
    plugin = tmp_path / "half.py"
    plugin.write_text(
        "import sys\n"
        f"registry = sys.modules[{__name__!r}].HALF_REGISTRY\n"
        "registry.add('first', object())\n"
        "raise RuntimeError('second one broke')\n"
    )
    globals()["HALF_REGISTRY"] = registry
    with pytest.raises(PluginError, match="second one broke"):
        load_plugin_file(plugin, [registry])
    assert "first" not in registry


def test_same_plugin_file_twice_is_loaded_once(tmp_path):
    registry = Registry("mechanism")
    globals()["TWICE_REGISTRY"] = registry
    plugin = tmp_path / "twice.py"
    plugin.write_text(
        f"import sys\nsys.modules[{__name__!r}].TWICE_REGISTRY.add('once', object())\n"
    )
    load_plugin_file(plugin, [registry])
    load_plugin_file(tmp_path / "." / "twice.py", [registry])
    assert registry.names() == ["once"]


@pytest.mark.parametrize("bad", ["", "has space", "a/b", "task=x", "-lead", "ünï"])
def test_names_that_cannot_be_folder_names_or_cli_values_are_refused(bad):
    with pytest.raises(RegistryError, match="invalid mechanism name"):
        Registry("mechanism").add(bad, object())


# -- plugins that exit or interrupt at import ---------------------------------------------


def test_entry_point_that_calls_sys_exit_is_a_plugin_error(entry_points, holder, builtins_module):
    entry_points[GROUP] = [FakeEntryPoint("quits", raising(SystemExit(0)))]
    holder.REGISTRY = reg = widget_registry(entry_point_group=GROUP, builtins=builtins_module)
    with pytest.warns(UserWarning, match=r"called sys\.exit\(0\) while being imported"):
        assert reg.names() == ["alpha", "beta"]  # and the process is still here
    assert [str(e) for e in reg.plugin_errors] == [
        "widget plugin 'quits' from fake-dist called sys.exit(0) while being imported"
    ]


def test_plugin_file_that_calls_sys_exit_is_a_plugin_error_and_registers_nothing(tmp_path):
    registry = Registry("mechanism")
    globals()["EXIT_REGISTRY"] = registry
    plugin = tmp_path / "quits.py"
    plugin.write_text(
        f"import sys\nsys.modules[{__name__!r}].EXIT_REGISTRY.add('early', object())\n"
        "sys.exit('bye')\n"
    )
    with pytest.raises(PluginError) as info:
        load_plugin_file(plugin, [registry])
    assert str(info.value) == f"plugin file {plugin} called sys.exit('bye') while being imported"
    assert "early" not in registry


def ctrl_c():
    """The user's Ctrl-C, as a terminal delivers it: a SIGINT to this process."""
    os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_while_a_plugin_imports_is_not_swallowed(
    tmp_path, entry_points, holder, monkeypatch
):
    """Ctrl-C is the user's: it still stops the command (a KeyboardInterrupt the plugin
    raises itself, with no SIGINT, is its failure: tests/test_plugin_exits.py)."""
    monkeypatch.setattr(interrupts, "_received", 0)  # what this test counts stays here
    plugin = tmp_path / "interrupted.py"
    plugin.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n")
    with pytest.raises(KeyboardInterrupt):
        load_plugin_file(plugin, [Registry("mechanism")])
    entry_points[GROUP] = [FakeEntryPoint("slow", ctrl_c)]
    holder.REGISTRY = reg = widget_registry(entry_point_group=GROUP)
    with pytest.raises(KeyboardInterrupt):
        reg.names()


def test_plugin_file_returns_what_it_registered(tmp_path, holder):
    holder.REGISTRY = reg = widget_registry()
    empty = tmp_path / "empty_widgets.py"
    empty.write_text("x = 1\n")
    assert load_plugin_file(empty, [reg]) == []  # the command line warns about it
    one = tmp_path / "one_widget.py"
    one.write_text(f"from {HOLDER} import REGISTRY\nREGISTRY.add('solo', 1, category='Basic')\n")
    assert [e.name for e in load_plugin_file(one, [reg])] == ["solo"]
    assert [e.name for e in load_plugin_file(one, [reg])] == ["solo"]  # named twice: once


# -- a plugin's code hash (it goes into the run id) -----------------------------------------


def test_plugin_file_entries_carry_the_hash_of_the_file(tmp_path, holder):
    holder.REGISTRY = reg = widget_registry()
    path = tmp_path / "hashed_widgets.py"
    path.write_text(f"from {HOLDER} import REGISTRY\nREGISTRY.add('hashed', 1, category='Basic')\n")
    load_plugin_file(path, [reg])
    assert reg.entry("hashed").code_hash == hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    reg.add("later", Thing, category="Basic")
    assert reg.entry("later").code_hash is None  # only the file's entries


def test_builtins_have_no_code_hash():
    for registry in (TASKS, MECHANISMS):
        assert {e.code_hash for e in registry.entries() if e.source == "builtin"} == {None}


def install_fake_distribution(site, module: str, version: str, record: bool) -> None:
    """A distribution in ``site`` whose entry point names the class ``module:Widget``: its
    package (two files) and *.dist-info; ``record``: a RECORD listing the files, as a regular
    install has (an editable install lists only a .pth file)."""
    package = site / module
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("from .widget import Widget\n", encoding="utf-8")
    (package / "widget.py").write_text(
        "class Widget:\n    registry_metadata = {'category': 'Basic'}\n", encoding="utf-8"
    )
    for old in site.glob("*.dist-info"):
        shutil.rmtree(old)
    info = site / f"{module}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\nwidget = {module}:Widget\n")
    if record:
        files = [f"{module}/__init__.py", f"{module}/widget.py", f"{info.name}/METADATA"]
        (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))


@pytest.fixture
def fake_module_name():
    """A unique package name; the package and its modules leave sys.modules afterwards."""
    name = f"_synthbench_test_dist_{uuid.uuid4().hex[:12]}"
    yield name
    for loaded in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
        del sys.modules[loaded]


@pytest.mark.parametrize("record", [True, False], ids=["installed", "editable"])
def test_entry_point_code_hash_follows_the_installed_files_and_version(
    tmp_path, monkeypatch, fake_module_name, record
):
    module = fake_module_name
    site = tmp_path / "site"
    install_fake_distribution(site, module, "0.1", record)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv(DISABLE_AUTOLOAD)  # loading entry points is what this tests

    def code_hash() -> str:
        reg = widget_registry(entry_point_group=GROUP)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return reg.entry("widget").code_hash

    first = code_hash()
    assert first is not None and first == code_hash()  # the same code, the same hash
    widget = site / module / "widget.py"
    widget.write_text(widget.read_text() + "# edited\n")  # a module other than the entry's
    edited = code_hash()
    assert edited != first
    install_fake_distribution(site, module, "0.2", record)  # the files as first, a new version
    assert code_hash() not in (first, edited)


def test_plugin_code_is_in_the_config_and_run_id_only_when_there_is_some():
    smoke = PROTOCOLS.get("smoke")
    builtin = RunSpec.resolve("copy", "softmax", smoke, 0)
    assert builtin.plugin_code == {} and "plugin_code" not in builtin.config()
    plugin = dataclasses.replace(builtin, plugin_code={"mechanism": "0123456789abcdef"})
    assert plugin.config()["plugin_code"] == {"mechanism": "0123456789abcdef"}
    assert json.loads(plugin.row_fields()["config"])["plugin_code"] == plugin.plugin_code
    edited = dataclasses.replace(builtin, plugin_code={"mechanism": "fedcba9876543210"})
    assert len({builtin.run_id, plugin.run_id, edited.run_id}) == 3
    assert plugin.with_seed(1).plugin_code == plugin.plugin_code  # every seed of the run
