"""The generic Registry: registration, lookup errors, entry-point plugins and plugin files."""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import types
import uuid
import warnings
from dataclasses import dataclass

import pytest

from synthbench import MECHANISMS, TASKS
from synthbench.registry import (
    PluginError,
    Registry,
    RegistryError,
    UnknownNameError,
    load_plugin_file,
)

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
    """Replaces importlib.metadata.entry_points; tests fill the returned {group: [eps]}."""
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
