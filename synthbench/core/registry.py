"""One generic registry for tasks, mechanisms and protocols.

Registration is by decorator (or a direct call for instances), with aliases and free-form
metadata. Third-party plugins are found through an entry-point group and loaded lazily on
first lookup (``SYNTHBENCH_DISABLE_PLUGIN_AUTOLOAD=1`` skips them, as pytest's variable does
its own); a local file can be loaded with :func:`load_plugin_file`. A plugin that fails
to import is reported by name with its error and never stops the built-ins from working.
A plugin's entries carry a hash of its code (``Entry.code_hash``), which goes into the run
ids of its runs: edited plugin code is run again, not matched to the old results.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from synthbench.core.interrupts import caught, describe
from synthbench.core.text import did_you_mean

T = TypeVar("T")
# set (to anything but the empty string): installed plugins are not loaded
DISABLE_AUTOLOAD = "SYNTHBENCH_DISABLE_PLUGIN_AUTOLOAD"
# what a registered name may be: it becomes a folder name and a command-line value, so a name
# read back from the results tree is checked against it too (synthbench/run/row_checks.py)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


class RegistryError(Exception):
    """A registration that cannot be accepted (duplicate name, missing metadata)."""


class UnknownNameError(KeyError):
    """A lookup for a name that is not registered; the message lists the close matches."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class PluginError(Exception):
    """A plugin (entry point or local file) that could not be loaded."""


class PluginWarning(UserWarning):
    """An entry-point plugin failed to load; the built-ins and other plugins still work."""


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    aliases: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)
    source: str = "builtin"
    # a plugin's code: the hash of its file, or the entry point whose installed files are
    # hashed on first use (``code_hash``); None for a built-in (versioned by SUITE_VERSION)
    origin: str | importlib.metadata.EntryPoint | None = field(default=None, repr=False)

    @functools.cached_property
    def code_hash(self) -> str | None:
        """What identifies the code behind a plugin entry (it goes into the run id)."""
        if self.origin is None or isinstance(self.origin, str):
            return self.origin
        return entry_point_hash(self.origin)


class Registry(Generic[T]):
    """Maps names (and aliases) to objects with metadata.

    ``builtins`` names the module whose import registers the built-in entries; it is
    imported on first use, before the entry-point plugins. ``required`` names the metadata
    keys every entry must carry; ``choices`` restricts the values some of them may take
    (for example a task's category).
    """

    def __init__(
        self,
        kind: str,
        entry_point_group: str | None = None,
        builtins: str | None = None,
        required: tuple[str, ...] = (),
        choices: dict[str, tuple[str, ...]] | None = None,
    ) -> None:
        self.kind = kind
        self.entry_point_group = entry_point_group
        self.builtins = builtins
        self.required = required
        self.choices = choices or {}
        self._entries: dict[str, Entry[T]] = {}
        self._aliases: dict[str, str] = {}
        self._builtins_loaded = False
        self._plugins_loaded = False
        self._source = "builtin"
        self._origin: str | importlib.metadata.EntryPoint | None = None
        self.plugin_errors: list[PluginError] = []

    # -- registration -------------------------------------------------------------------

    def register(
        self, name: str, *, aliases: tuple[str, ...] | list[str] = (), **metadata: Any
    ) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("name", aliases=("alt",), key=value)``."""

        def decorator(obj: T) -> T:
            self.add(name, obj, aliases=aliases, **metadata)
            return obj

        return decorator

    def add(
        self, name: str, obj: T, *, aliases: tuple[str, ...] | list[str] = (), **metadata: Any
    ) -> Entry[T]:
        self._load_builtins()  # built-ins first, so a plugin's collision is reported as its own
        for label in (name, *aliases):
            if not isinstance(label, str) or not NAME.fullmatch(label):
                raise RegistryError(
                    f"invalid {self.kind} name {label!r}: use letters, digits and _ . + - "
                    "(names become folder names and command-line values)"
                )
        missing = [key for key in self.required if key not in metadata]
        if missing:
            raise RegistryError(f"{self.kind} '{name}' is missing metadata: {', '.join(missing)}")
        for key, allowed in self.choices.items():
            if key in metadata and metadata[key] not in allowed:
                raise RegistryError(
                    f"{self.kind} '{name}': {key} must be one of {', '.join(allowed)}, "
                    f"not {metadata[key]!r}"
                )
        for label in (name, *aliases):
            taken = self._aliases.get(label)
            if taken is not None:
                holder = self._entries[taken]
                raise RegistryError(
                    f"cannot register {self.kind} '{name}' ({self._source}): the name '{label}' "
                    f"is already taken by {self.kind} '{holder.name}' ({holder.source})"
                )
        entry = Entry(name, obj, tuple(aliases), dict(metadata), self._source, self._origin)
        self._entries[name] = entry
        for label in (name, *aliases):
            self._aliases[label] = name
        return entry

    # -- lookup -------------------------------------------------------------------------

    def entry(self, name: str) -> Entry[T]:
        self.load_plugins()
        canonical = self._aliases.get(name)
        if canonical is None:
            hint = did_you_mean(name, self._aliases)
            raise UnknownNameError(
                f"unknown {self.kind} '{name}'{hint} (known: {', '.join(self.names())})"
            )
        return self._entries[canonical]

    def get(self, name: str) -> T:
        return self.entry(name).obj

    def canonical(self, name: str) -> str:
        return self.entry(name).name

    def names(self) -> list[str]:
        self.load_plugins()
        return list(self._entries)

    def name_of(self, obj: object) -> str:
        """The name ``obj`` is registered under, for messages (the user typed that name, not
        the class's); an object not registered goes by its own ``__name__``."""
        found = (e.name for e in self._entries.values() if e.obj is obj)
        return next(found, getattr(obj, "__name__", repr(obj)))

    def entries(self) -> list[Entry[T]]:
        self.load_plugins()
        return list(self._entries.values())

    def __contains__(self, name: object) -> bool:
        self.load_plugins()
        return name in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    # -- plugins ------------------------------------------------------------------------

    def load_plugins(self) -> None:
        """Import the built-ins, then every entry point of this registry's group, once.

        An entry point may point at a module (whose decorators register things) or at an
        object, which is then registered under the entry point's name unless the import
        already registered it. Failures are kept in ``plugin_errors`` and warned about.
        """
        self._load_builtins()
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        if not self.entry_point_group or os.environ.get(DISABLE_AUTOLOAD):
            return
        for ep in importlib.metadata.entry_points(group=self.entry_point_group):
            dist = ep.dist.name if ep.dist is not None else "unknown distribution"
            source = f"plugin {ep.name} ({dist})"
            try:
                with self._registering_from(source, ep):
                    obj = ep.load()
                    known = {id(e.obj) for e in self._entries.values()}
                    if not isinstance(obj, type(sys)) and id(obj) not in known:
                        self.add(ep.name, obj, **dict(getattr(obj, "registry_metadata", {})))
            except BaseException as exc:  # a broken plugin (even sys.exit) must not take the
                # built-ins, or every command, down; the user's Ctrl-C is raised again
                caught(exc)
                error = PluginError(
                    f"{self.kind} plugin '{ep.name}' from {dist} {import_failure(exc, 'load')}"
                )
                self.plugin_errors.append(error)
                warnings.warn(str(error), PluginWarning, stacklevel=2)

    def _remove(self, name: str) -> None:
        entry = self._entries.pop(name)
        for label in (entry.name, *entry.aliases):
            self._aliases.pop(label, None)

    def _load_builtins(self) -> None:
        if self._builtins_loaded:
            return
        self._builtins_loaded = True
        if self.builtins:
            with self._registering_from("builtin"):
                importlib.import_module(self.builtins)

    @contextmanager
    def _registering_from(
        self, source: str, origin: str | importlib.metadata.EntryPoint | None = None
    ) -> Iterator[None]:
        """Label the entries registered inside the block with where they came from (and,
        for a plugin, the ``origin`` of its code: ``Entry.code_hash``)."""
        previous = self._source, self._origin
        self._source, self._origin = source, origin
        try:
            yield
        finally:
            self._source, self._origin = previous


def load_plugin_file(path: str | Path, registries: list[Registry]) -> list[Entry]:
    """Import a local Python file whose decorators register tasks or mechanisms; returns
    the entries it registered (empty: the caller warns that the file registers nothing).

    Raises :class:`PluginError` naming the file and the error if it cannot be imported.
    The entries' ``code_hash`` is the hash of the file's bytes: the very bytes that run.
    """
    path = Path(path)
    if path.is_dir():
        raise PluginError(f"plugin {path} is a directory, not a Python file")
    if not path.is_file():
        raise PluginError(f"plugin file {path} does not exist")
    if path.suffix != ".py":
        raise PluginError(f"plugin file {path} is not a Python file (.py)")
    module_name = f"synthbench_plugin_{path.stem}_{abs(hash(str(path.resolve())))}"
    if module_name in _loaded_files:  # the same file named twice
        return _loaded_files[module_name]
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise PluginError(f"plugin file {path} cannot be read: {exc.strerror or exc}") from None
    code_hash = hashlib.sha256(source).hexdigest()[:16]
    for registry in registries:
        registry._load_builtins()
    before = [set(registry._entries) for registry in registries]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"plugin file {path} is not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    with ExitStack() as stack:
        for registry in registries:
            stack.enter_context(registry._registering_from(f"plugin file {path}", code_hash))
        try:
            sys.modules[module_name] = module
            # the bytes just hashed are the ones run, compiled here rather than by the import
            # system, which would write a __pycache__/ into the user's folder
            exec(compile(source, str(path), "exec"), module.__dict__)
        except BaseException as exc:  # sys.exit() too: never a silent exit 0
            caught(exc)  # the user's Ctrl-C is raised again
            sys.modules.pop(module_name, None)
            for registry, names in zip(registries, before, strict=True):  # no half-loaded plugin
                for name in set(registry._entries) - names:
                    registry._remove(name)
            raise PluginError(f"plugin file {path} {import_failure(exc, 'import')}") from exc
    added = [
        registry._entries[name]
        for registry, names in zip(registries, before, strict=True)
        for name in registry._entries
        if name not in names
    ]
    _loaded_files[module_name] = added
    return added


_loaded_files: dict[str, list[Entry]] = {}  # module name -> what the file registered


def import_failure(exc: BaseException, verb: str) -> str:
    """How importing a plugin failed, on one line: ``failed to <verb>: Type: message``,
    with the place of a syntax error, or the exit a plugin asked for."""
    if isinstance(exc, SystemExit):
        code = "" if exc.code is None else repr(exc.code)
        return f"called sys.exit({code}) while being imported"
    if not isinstance(exc, Exception):  # a KeyboardInterrupt of its own, say
        return f"failed to {verb}: {describe(exc)}"
    if isinstance(exc, SyntaxError):
        return f"failed to {verb}: {type(exc).__name__} at {exc.filename}:{exc.lineno}: {exc.msg}"
    message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"failed to {verb}: {type(exc).__name__}" + (f": {message}" if message else "")


def entry_point_hash(ep: importlib.metadata.EntryPoint) -> str:
    """The installed code behind an entry point: its distribution's name and version and the
    bytes of the ``.py`` files of the top-level package that defines the object (a handful
    for a plugin package). The files are those the distribution's RECORD lists; an editable
    install lists none of them (only a .pth or finder file), so then the package's folder."""
    dist = ep.dist
    top = (getattr(ep, "module", None) or "").partition(".")[0]
    digest = hashlib.sha256(
        f"{getattr(dist, 'name', None)}\0{getattr(dist, 'version', None)}\0".encode()
    )
    for name, file in _module_files(dist, top):
        digest.update(f"{name}\0".encode())
        try:
            digest.update(file.read_bytes())
        except OSError:  # listed but gone: the hash still differs from the intact install
            digest.update(b"\0missing\0")
    return digest.hexdigest()[:16]


def _module_files(dist: Any, top: str) -> list[tuple[str, Path]]:
    """(name, path) of the .py files of package ``top`` (or module ``top.py``), sorted."""
    if not top:
        return []
    listed = [
        f
        for f in getattr(dist, "files", None) or ()
        if f.suffix == ".py" and (f.parts[0] == top or str(f) == f"{top}.py")
    ]
    if listed:
        return sorted((str(f), Path(f.locate())) for f in listed)
    module = sys.modules.get(top)  # imported by the entry point's load
    if module is None:
        return []
    folders = [Path(p) for p in getattr(module, "__path__", None) or ()]
    if folders:
        return sorted(
            (str(Path(top, p.relative_to(folder))), p)
            for folder in folders
            for p in folder.rglob("*.py")
        )
    origin = getattr(module, "__file__", None)
    return [(f"{top}.py", Path(origin))] if origin and origin.endswith(".py") else []
