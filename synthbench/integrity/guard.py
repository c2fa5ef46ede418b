"""The leak guard of ``synthbench run``: no mechanism that sees later positions trains.

Before anything trains, every mechanism configuration of the selection goes through the
layout and causality checks (synthbench/integrity/causality.py) at the lengths its runs use.
A leaky one is refused: its runs are stored with status ``leaky`` at every lr of the grid, so
that nothing retrains them and no lr of theirs is ever selected.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from synthbench.core.interrupts import caught
from synthbench.core.layer import Layer
from synthbench.core.mechanism import MECHANISMS, mixer
from synthbench.integrity.causality import (
    CheckResult,
    Subject,
    check_leaks,
    float64_device,
    one_thread,
)
from synthbench.integrity.layer_checks import leak_in_layer
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
        if issubclass(mixer(spec.mechanism, p.d_model, p.n_heads, p.arch).cls, Layer):
            key = json.dumps([spec.mechanism, spec.mechanism_params, p.d_model, p.n_heads, "layer"],
                             default=str)  # fmt: skip
            config = found.setdefault(key, Configuration(spec.mechanism))
            config.specs.append(spec)
            config.layer_lengths.add(spec.make_task().seq_len)
            if spec.eval_length_mult:
                config.layer_lengths.add(spec.make_task().at_length(spec.eval_length_mult).seq_len)
            continue
        head_dim = p.d_model // p.n_heads
        key = json.dumps([spec.mechanism, spec.mechanism_params, head_dim, p.n_heads], default=str)
        config = found.setdefault(key, Configuration(spec.mechanism))
        config.specs.append(spec)
        task = spec.make_task()
        lengths = {task.seq_len}
        if spec.eval_length_mult:
            lengths.add(task.at_length(spec.eval_length_mult).seq_len)
        subject = Subject(
            spec.mechanism, spec.mechanism_params, head_dim, p.n_heads, max(lengths),
            float64_device(device),
        )  # fmt: skip
        config.lengths.setdefault(subject.max_len, (subject, set()))[1].update(lengths)
    return list(found.values())


@dataclass
class Configuration:
    """One mechanism configuration of a ``run``: the runs that use it, and by ``max_len`` the
    Subject the model builds and the lengths it sees."""

    name: str
    specs: list[RunSpec] = field(default_factory=list)
    lengths: dict[int, tuple[Subject, set[int]]] = field(default_factory=dict)
    # the block track's published layer: checked whole, at these lengths (layer_checks.py)
    layer_lengths: set[int] = field(default_factory=set)

    def first_leak(self) -> CheckResult | None:
        """The first layout or causality check failed by what the mechanism computed."""
        if self.layer_lengths:
            spec = self.specs[0]
            p = spec.protocol
            try:
                leak = leak_in_layer(spec.mechanism, spec.mechanism_params, p.d_model,
                                     p.n_heads, sorted(self.layer_lengths))  # fmt: skip
            except BaseException as exc:  # raising is no proof of a leak: training says why
                caught(exc)
                return None
            return None if leak is None else CheckResult("layer-causal", False, leak)
        for subject, lengths in self.lengths.values():
            for result in check_leaks(subject, sorted(lengths)):
                if result.leaks:
                    return result
        return None


def leak_guard(
    specs: Sequence[RunSpec], store: ResultStore, device: torch.device | None
) -> str | None:
    """``run``'s check before training: the layout and causality checks of every mechanism
    configuration of ``specs`` at the lengths its runs use. A leaky mechanism's runs are
    stored with status ``leaky`` at every lr of the protocol's grid (so that nothing retrains
    them, and no lr of theirs stays selected) and the one-line refusal is returned; None when
    every mechanism passes. ``device``: the run's (None: the CPU, as for Ray)."""
    device = device or torch.device("cpu")
    refusals, refused = [], []
    for config in configurations(specs, device):
        with one_thread():
            failed = config.first_leak()
        if failed is None:
            continue
        error = f"leaky: {failed.name} check failed: {failed.detail}"
        for spec in config.specs:
            rows = [
                {**failed_row(spec, lr, device, error), "status": LEAKY} for lr in spec.protocol.lrs
            ]
            try:
                store.write(rows, settle=functools.partial(mark_selected, spec.protocol))
            except NewerSchemaError:  # a newer synthbench's file: left as it is
                continue
        refusals.append(f"mechanism {config.name} is not causal ({failed.name}: {failed.detail})")
        refused.append(config.name)
    if not refusals:
        return None
    names = list(dict.fromkeys(refused))
    plugin_files = dict.fromkeys(  # the check needs the same --plugin to find the name
        source.removeprefix("plugin file ")
        for source in (MECHANISMS.entry(n).source for n in names)
        if source.startswith("plugin file ")
    )
    command = " ".join(
        ["synthbench check", ",".join(names), *(f"--plugin {p}" for p in plugin_files)]
    )
    return (
        f"refused: {'; '.join(refusals)}; nothing trained, its runs are stored with status "
        f"leaky; {command} runs every check"
    )
