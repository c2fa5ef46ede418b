"""``synthbench check MECH``: every check of synthbench/integrity/ (causality.py,
contract.py), one line per check."""

from __future__ import annotations

import math
from typing import Annotated

import typer

from synthbench.cli.common import (
    INTERRUPTED,
    DeviceOption,
    PluginOption,
    UsageError,
    echo,
    fail,
    load_plugins,
    say_slow_check,
    select_mechanisms,
)
from synthbench.core.layer import Layer
from synthbench.core.mechanism import build_mixer_once, mixer
from synthbench.core.params import parse_assignments
from synthbench.integrity.causality import CheckResult, Subject, float64_device
from synthbench.integrity.contract import CHECKS, run_check, suite_lengths
from synthbench.integrity.isolation import CHECK_SECONDS, CheckProcess, Ended, Interrupted
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
            help="block: check each mechanism's published layer, as the block track puts it "
            "in fla's block (one without a layer: its core, as in the core track); core "
            "(default): the core."
        ),
    ] = None,
    max_seconds: Annotated[
        float,
        typer.Option(
            help="Stop a check still running after this many seconds: it fails, naming where "
            "it was."
        ),
    ] = CHECK_SECONDS,
) -> None:
    """Check a mechanism: causality (autograd and perturbation), layout, dtypes, large
    inputs, determinism, state size. Exit status 1 if any check fails. A plugin's checks run
    in a child process: one that ends it or never returns fails, naming where it was."""
    if not 0 < max_seconds < math.inf:
        raise UsageError(f"--max-seconds must be > 0 and finite, got {max_seconds:g}")
    load_plugins(plugin)
    checks = CheckProcess(plugin, max_seconds, on_slow=say_slow_check(max_seconds, "--max-seconds"))
    try:
        failed = _check(checks, mech, mech_param, length, protocol, device, track)
    except Interrupted as exc:  # Ctrl-C during a check: which one, and where it was
        raise fail(str(exc), INTERRUPTED) from None
    finally:
        checks.close()
    if failed:
        raise typer.Exit(1)


def _check(checks: CheckProcess, mech, mech_param, length, protocol, device, track) -> bool:
    """Every check of every selected mechanism, a line each; whether any failed."""
    try:
        proto = protocol_of_track(protocol, track)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    names = select_mechanisms(mech, "MECH")
    checks.start(names)  # a plugin's: its child loads while the mechanisms are built here
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
        for i, check in enumerate(CHECKS):  # one at a time: a check that ends the child is named
            label = f"the {check} check of mechanism {subject.name}"
            ended = False
            try:
                results = checks.run(label, [subject.name], run_check, check, subject, lengths)
            except Ended as exc:  # the checks after it would end the child again: left
                ended = True
                left = "; the checks after it not run" if i < len(CHECKS) - 1 else ""
                results = [CheckResult(check, False, f"{exc}{left}", raised=True)]
            for result in results:
                echo(result.line(subject.name.ljust(width)))
                failed |= not result.passed
            if ended:
                break
    for name, params in layers:
        label = f"the layer checks of mechanism {name}"
        args = (name, params, proto.d_model, proto.n_heads, lengths)
        try:
            results = checks.run(label, [name], check_layer, *args)
        except Ended as exc:
            results = [CheckResult("layer", False, str(exc), raised=True)]
        for result in results:
            echo(result.line(name.ljust(width)))
            failed |= not result.passed
    return failed
