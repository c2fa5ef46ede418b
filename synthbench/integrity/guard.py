"""The leak guard of ``synthbench run``: no mechanism that sees later positions trains.

Before anything trains, every mechanism configuration of the selection goes through the
layout and causality checks (synthbench/integrity/causality.py) at the lengths its runs use.
A leaky one is refused: its runs are stored with status ``leaky`` at every lr of the grid, so
that nothing retrains them and no lr of theirs is ever selected.

The command line runs the checks in a child process (integrity/isolation.py): a mechanism
whose check ends that process or never returns is named, with where it was; its runs are
stored as errors (retried by the next command) and the other mechanisms' runs train.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from synthbench.core.layer import Layer
from synthbench.core.mechanism import MECHANISMS, mixer
from synthbench.core.text import plural
from synthbench.integrity.causality import CheckResult, Subject, float64_device
from synthbench.integrity.isolation import CheckProcess, Ended
from synthbench.integrity.leaks import LeakCheck
from synthbench.run.lr_selection import mark_selected
from synthbench.run.schema import LEAKY
from synthbench.run.spec import RunSpec
from synthbench.run.store import NewerSchemaError, ResultStore
from synthbench.run.train import failed_row


def configurations(specs: Sequence[RunSpec], device: torch.device) -> list[Configuration]:
    """The distinct mechanism configurations of ``specs`` (name, parameters and the
    protocol's head size and count), each with the lengths its runs train and evaluate at
    (the task's and, with ``eval_length_mult``, the long one), grouped by the ``max_len``
    their model tells the mechanism, as ``build_model`` sets it."""
    found: dict[str, Configuration] = {}
    for spec in specs:
        p = spec.protocol
        task = spec.make_task()
        lengths = {task.seq_len}
        if spec.eval_length_mult:
            lengths.add(task.at_length(spec.eval_length_mult).seq_len)
        if issubclass(mixer(spec.mechanism, p.d_model, p.n_heads, p.arch).cls, Layer):
            key = json.dumps([spec.mechanism, spec.mechanism_params, p.d_model, p.n_heads, "layer"],
                             default=str)  # fmt: skip
            config = found.setdefault(key, Configuration(spec, layer=True))
            config.specs.append(spec)
            config.layer_lengths |= lengths
            continue
        head_dim = p.d_model // p.n_heads
        key = json.dumps([spec.mechanism, spec.mechanism_params, head_dim, p.n_heads], default=str)
        config = found.setdefault(key, Configuration(spec))
        config.specs.append(spec)
        subject = Subject(
            spec.mechanism, spec.mechanism_params, head_dim, p.n_heads, max(lengths),
            float64_device(device),
        )  # fmt: skip
        config.lengths.setdefault(subject.max_len, (subject, set()))[1].update(lengths)
    return list(found.values())


class Configuration:
    """One mechanism configuration of a ``run``: the runs that use it, and by ``max_len`` the
    Subject the model builds and the lengths it sees (or, for the block track's published
    layer, the lengths it is checked at whole: layer_checks.py)."""

    def __init__(self, spec: RunSpec, layer: bool = False) -> None:
        self.name = spec.mechanism
        self.params = spec.mechanism_params
        self.sizes = (spec.protocol.d_model, spec.protocol.n_heads)
        self.layer = layer
        self.specs: list[RunSpec] = []
        self.lengths: dict[int, tuple[Subject, set[int]]] = {}
        self.layer_lengths: set[int] = set()

    def leak_check(self) -> LeakCheck:
        """What its check computes (integrity/leaks.py: small, to run in a child process)."""
        return LeakCheck(
            self.name, self.params, *self.sizes,
            subjects=[(subject, sorted(lengths)) for subject, lengths in self.lengths.values()],
            layer_lengths=sorted(self.layer_lengths),
        )  # fmt: skip

    def first_leak(self) -> CheckResult | None:
        """The first layout or causality check failed by what the mechanism computed."""
        return self.leak_check().first_leak()


@dataclass
class Guarded:
    """What the leak guard found: ``refusal``, the one-line refusal of a mechanism proven
    to leak (nothing trains); ``ended``, one line per mechanism whose check ended the
    process it ran in or never returned (its runs are stored as errors, the rest train);
    ``stopped``, the run ids of those runs (not to train now)."""

    refusal: str | None = None
    ended: list[str] = field(default_factory=list)
    stopped: set[str] = field(default_factory=set)


def leak_guard(
    specs: Sequence[RunSpec],
    store: ResultStore,
    device: torch.device | None,
    checks: CheckProcess | None = None,
) -> Guarded:
    """``run``'s check before training: the layout and causality checks of every mechanism
    configuration of ``specs`` at the lengths its runs use, in ``checks``' child process
    when given (integrity/isolation.py), else here. A leaky mechanism's runs are stored
    with status ``leaky`` at every lr of the protocol's grid (so that nothing retrains them,
    and no lr of theirs stays selected) and its one-line refusal is returned; a mechanism
    whose check ends the child or never returns has its runs stored as errors, named in
    ``Guarded.ended``. ``device``: the run's (None: the CPU, as for Ray)."""
    device = device or torch.device("cpu")
    refusals, refused = [], []
    guarded = Guarded()
    for config in configurations(specs, device):
        label = f"the leak check of mechanism {config.name}"
        try:
            if checks is None:
                failed = config.first_leak()
            else:
                failed = checks.run(label, [config.name], LeakCheck.first_leak, config.leak_check())
        except Ended as exc:
            error = f"not trained: its leak check {exc}"
            _store(config, store, device, error, "error")
            guarded.ended.append(
                f"mechanism {config.name}: its leak check {exc}; "
                f"{plural(len(config.specs), 'run')} of it stored with status error, not "
                f"trained ({check_command([config.name])} runs every check)"
            )
            guarded.stopped |= {spec.run_id for spec in config.specs}
            continue
        if failed is None:
            continue
        error = f"leaky: {failed.name} check failed: {failed.detail}"
        _store(config, store, device, error, LEAKY)
        refusals.append(f"mechanism {config.name} is not causal ({failed.name}: {failed.detail})")
        refused.append(config.name)
    if refusals:
        guarded.refusal = (
            f"refused: {'; '.join(refusals)}; nothing trained, its runs are stored with status "
            f"leaky; {check_command(list(dict.fromkeys(refused)))} runs every check"
        )
    return guarded


def _store(config: Configuration, store: ResultStore, device, error: str, status: str) -> None:
    """Rows of ``status`` with ``error`` at every lr of each run of ``config``'s grid (a
    stored result stays: ``ResultStore.save``)."""
    for spec in config.specs:
        rows = [
            {**failed_row(spec, lr, device, error), "status": status} for lr in spec.protocol.lrs
        ]
        try:
            store.write(rows, settle=functools.partial(mark_selected, spec.protocol))
        except NewerSchemaError:  # a newer synthbench's file: left as it is
            continue


def check_command(names: list[str]) -> str:
    """The ``synthbench check`` command that runs every check of mechanisms ``names``
    (with the ``--plugin`` files it needs to find them)."""
    plugin_files = dict.fromkeys(
        source.removeprefix("plugin file ")
        for source in (MECHANISMS.entry(n).source for n in names)
        if source.startswith("plugin file ")
    )
    return " ".join(["synthbench check", ",".join(names), *(f"--plugin {p}" for p in plugin_files)])
