"""``synthbench check MECH``: every check of synthbench/integrity/ (causality.py,
contract.py), one line per check."""

from __future__ import annotations

from typing import Annotated

import typer

from synthbench.cli.common import (
    DeviceOption,
    PluginOption,
    UsageError,
    echo,
    load_plugins,
    select_mechanisms,
)
from synthbench.core.layer import Layer
from synthbench.core.mechanism import build_mixer_once, mixer
from synthbench.core.params import parse_assignments
from synthbench.integrity.causality import Subject, float64_device, one_thread
from synthbench.integrity.contract import check_mechanism, suite_lengths
from synthbench.integrity.layer_checks import check_layer
from synthbench.run.devices import resolve_device
from synthbench.run.limits import MAX_SEQ_LEN
from synthbench.run.protocols import protocol_of_track


def check_command(
    mech: Annotated[str, typer.Argument(help="A mechanism, comma-separated mechanisms, or 'all'.")],
    mech_param: Annotated[
        list[str] | None,
        typer.Option(help="KEY=VALUE for every selected mechanism, e.g. eps=1e-4 (repeatable)."),
    ] = None,
    plugin: PluginOption = None,
    length: Annotated[
        list[int] | None,
        typer.Option(
            help="Check at this sequence length (repeatable; default: every length of "
            "every registered task at each of its presets)."
        ),
    ] = None,
    protocol: Annotated[
        str, typer.Option(help="Build the mechanism with this protocol's head size and count.")
    ] = "quick",
    device: DeviceOption = "cpu",
    track: Annotated[
        str | None,
        typer.Option(
            help="block: check each mechanism's published layer (one without a layer: its "
            "core, as in the core track); core (default): the core."
        ),
    ] = None,
) -> None:
    """Check a mechanism: causality (autograd and perturbation), layout, dtypes, large
    inputs, determinism, state size. Exit status 1 if any check fails."""
    load_plugins(plugin)
    try:
        proto = protocol_of_track(protocol, track)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    names = select_mechanisms(mech, "MECH")
    for value in length or []:
        if not 1 <= value <= MAX_SEQ_LEN:
            raise UsageError(f"--length must be in [1, {MAX_SEQ_LEN}], got {value}")
    lengths = sorted(set(length)) if length else suite_lengths()
    overrides = parse_assignments(mech_param)
    dev = float64_device(resolve_device(device))
    head_dim = proto.d_model // proto.n_heads
    subjects, layers = [], []
    for name in names:  # every name and parameter checked before the first check runs
        built = mixer(name, proto.d_model, proto.n_heads, proto.arch)
        params = built.params(overrides)
        build_mixer_once(built, params)  # as `run` does
        if issubclass(built.cls, Layer):  # the block track's published layer
            layers.append((name, params))
        else:
            subjects.append(Subject(name, params, head_dim, proto.n_heads, device=dev))
    failed = False
    width = max(map(len, names))  # the columns line up under `check all`
    for subject in subjects:
        with one_thread():
            results = check_mechanism(subject, lengths)
        for result in results:
            echo(result.line(subject.name.ljust(width)))
            failed |= not result.passed
    for name, params in layers:
        with one_thread():
            results = check_layer(name, params, proto.d_model, proto.n_heads, lengths)
        for result in results:
            echo(result.line(name.ljust(width)))
            failed |= not result.passed
    if failed:
        raise typer.Exit(1)
