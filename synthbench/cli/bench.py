"""``synthbench bench``: what a mechanism costs and how well a linearisation approximates its
exact kernel (docs/BENCHMARKS.md).

    synthbench bench scaling     latency, peak memory, throughput of one layer against length
    synthbench bench decode      per-token decoding latency and state memory (recurrent forms)
    synthbench bench fidelity    SLAY variants against exact spherical Yat; quadrature error
    synthbench bench train       steps/s and tokens/s of the real training loop
    synthbench bench plot        figures and tables of the stored rows

The measurements live in synthbench/bench; this module only parses options and prints.
Rows go to ``bench-results/<kind>/<id>.parquet`` (``synthbench.bench.common``); figures and
tables to ``reports/bench/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pandas as pd
import torch
import typer

from synthbench.bench import decode, fidelity, scaling, throughput
from synthbench.bench.common import (
    DEFAULT_BENCH_RESULTS,
    DEFAULT_MECHS,
    BenchFile,
    check_bench_results,
    load_bench,
    new_bench_id,
)
from synthbench.bench.memory import available_memory
from synthbench.cli.common import (
    DeviceOption,
    PluginOption,
    check_writable_folder,
    echo,
    fail,
    guard,
    load_plugins,
    select_mechanisms,
    select_tasks,
    split,
)
from synthbench.core.task import task_set
from synthbench.core.text import did_you_mean, plural
from synthbench.mechanisms.slay import MAX_QUAD_NODES
from synthbench.report.formats import to_markdown
from synthbench.run.allocator import reuse_freed_memory
from synthbench.run.devices import resolve_device
from synthbench.run.protocols import PROTOCOLS

bench_app = typer.Typer(
    no_args_is_help=True,
    help="Cost and fidelity benchmarks of the mechanisms (docs/BENCHMARKS.md).",
)

BenchResultsOption = Annotated[
    Path,
    typer.Option(
        "--bench-results",
        help="Where bench rows go (<dir>/<kind>/<id>.parquet); not inside the results tree.",
    ),
]
# bench rows went to <results>/bench/ before they got their own tree: said so, not obeyed
OldResultsOption = Annotated[Path | None, typer.Option("--results", hidden=True)]
OutOption = Annotated[Path, typer.Option("--out", help="Where figures and tables go.")]
DEFAULT_OUT = Path("reports/bench")
FIGURE_FORMATS = ("png", "pdf")


def _choose(option: str, value: str, known) -> list[str]:
    """Comma-separated choices out of ``known``; a ValueError names an unknown one."""
    chosen = split(value)
    for name in chosen:
        if name not in known:
            hint = did_you_mean(name, known)
            raise ValueError(f"unknown {option} '{name}'{hint} (known: {', '.join(known)})")
    if not chosen:
        raise ValueError(f"--{option} names nothing")
    return list(dict.fromkeys(chosen))


def _plots():
    """The figures module, imported by the commands that draw: matplotlib takes a second
    to load, which every other command of the line would pay."""
    from synthbench.bench import plots

    return plots


def _bench_results(bench_results: Path, results: Path | None) -> Path:
    """The bench tree of a measuring command, checked before anything is measured."""
    if results is not None:
        raise ValueError(
            "bench rows no longer go into the results tree (its readers would trip on them): "
            f"use --bench-results DIR (default {DEFAULT_BENCH_RESULTS}/) instead of --results"
        )
    check_bench_results(bench_results)
    check_writable_folder(bench_results, "--bench-results")  # before anything is measured
    return bench_results


def _interrupted(file: BenchFile):
    return fail(f"interrupted; the rows measured so far are in {file.path}", 130)


def _wrote(paths: list[Path]) -> None:
    for path in paths:
        echo(f"wrote {path}")


# -- scaling --------------------------------------------------------------------------------


@bench_app.command("scaling")
@guard
def scaling_command(
    mech: Annotated[str, typer.Option(help="'all' or comma-separated mechanism names.")] = (
        ",".join(DEFAULT_MECHS)
    ),
    d_model: Annotated[int, typer.Option(help="Embedding dimension.")] = 256,
    heads: Annotated[int, typer.Option(help="Attention heads.")] = 8,
    batch: Annotated[int, typer.Option(help="Batch size.")] = 1,
    min_len: Annotated[int, typer.Option(help="First sequence length.")] = 128,
    max_len: Annotated[int, typer.Option(help="Last sequence length (doubling).")] = 131072,
    repeats: Annotated[int, typer.Option(help="Timed rounds per point (median).")] = 5,
    warmup: Annotated[int, typer.Option(help="Untimed rounds before them.")] = 2,
    time_limit: Annotated[float, typer.Option(help="Seconds per point.")] = 60.0,
    memory_limit_gb: Annotated[
        float | None,
        typer.Option(
            help="GiB the measured work may allocate (default: CPU, half the memory available "
            "at the start; CUDA, the whole device)."
        ),
    ] = None,
    device: DeviceOption = "auto",
    compare_features: Annotated[
        bool,
        typer.Option(
            help="Also time `linear` with its features tiled to each SLAY mechanism's "
            "feature dimension (SLAY / linear at the same total features)."
        ),
    ] = True,
    plot: Annotated[bool, typer.Option(help="Write the figures when done.")] = True,
    bench_results: BenchResultsOption = DEFAULT_BENCH_RESULTS,
    out: OutOption = DEFAULT_OUT,
    plugin: PluginOption = None,
    results: OldResultsOption = None,
) -> None:
    """Latency, peak memory and throughput of one causal attention layer against length."""
    bench_results = _bench_results(bench_results, results)
    load_plugins(plugin)
    names = select_mechanisms(mech)
    dev = resolve_device(device)
    if memory_limit_gb is not None:
        limit = int(memory_limit_gb * 2**30)
    elif dev.type == "cpu":  # keep the machine usable: half of what is free now
        available = available_memory()
        limit = available // 2 if available else None
    else:
        limit = None  # the whole device
    setup = scaling.Setup(
        d_model, heads, batch, min_len, max_len, repeats, warmup, time_limit, limit, str(dev),
        torch.get_num_threads(), tuple(str(p.resolve()) for p in plugin or []),
    )  # fmt: skip
    series = scaling.make_series(names, setup, compare_features)
    file = BenchFile(bench_results, "scaling", scaling.METRICS, new_bench_id())
    memory = f"{limit / 2**30:.3g} GiB" if limit else "no memory limit"
    echo(
        f"scaling {file.bench_id}: {len(series)} series x L {setup.min_len}..{setup.max_len}; "
        f"d_model {d_model}, {heads} heads, batch {batch}, causal, float32, device {dev}, "
        f"{setup.threads} threads; median of {repeats} after {warmup} warm-up rounds; limits "
        f"{time_limit:g} s and {memory} per point -> {file.path}"
    )

    def on_row(row):
        file.add([row], dev)
        echo(scaling.point_line(row))

    try:
        scaling.sweep(series, setup, on_row)
    except KeyboardInterrupt:
        raise _interrupted(file) from None
    rows = pd.DataFrame(file.rows)
    echo()
    for line in scaling.summary_lines(rows):
        echo(line)
    if plot:
        _wrote(_plots().scaling_figure(rows, out / "scaling", [f".{f}" for f in FIGURE_FORMATS]))


# -- decode ---------------------------------------------------------------------------------


@bench_app.command("decode")
@guard
def decode_command(
    mech: Annotated[
        str,
        typer.Option(
            help="'all' (every mechanism with a recurrent form) or comma-separated names."
        ),
    ] = "all",
    lengths: Annotated[
        str, typer.Option(help="Comma-separated context lengths L the state is prefilled with.")
    ] = ",".join(map(str, decode.DEFAULT_LENGTHS)),
    tokens: Annotated[int, typer.Option(help="Steps timed after the prefill.")] = 64,
    batch: Annotated[int, typer.Option(help="Sequences decoded at once.")] = 1,
    head_dim: Annotated[int, typer.Option(help="Head size (quick's layer: 16).")] = 16,
    heads: Annotated[int, typer.Option(help="Heads (quick's layer: 4).")] = 4,
    repeats: Annotated[int, typer.Option(help="Timed rounds (median).")] = 11,
    warmup: Annotated[int, typer.Option(help="Untimed rounds before them.")] = 1,
    threads: Annotated[int, typer.Option(help="Torch threads while measuring.")] = 1,
    device: DeviceOption = "auto",
    bench_results: BenchResultsOption = DEFAULT_BENCH_RESULTS,
    plugin: PluginOption = None,
    results: OldResultsOption = None,
) -> None:
    """Per-token decoding latency and state memory of the mechanisms with a recurrent form."""
    bench_results = _bench_results(bench_results, results)
    reuse_freed_memory()  # as `synthbench run` does: a KV cache grown by cat is not mapped anew
    dev = resolve_device(device)
    setup = decode.DecodeSetup(
        decode.parse_lengths(lengths), tokens, batch, head_dim, heads, repeats, warmup, threads,
        str(dev),
    )  # fmt: skip
    load_plugins(plugin)
    names, skipped = decode.select(select_mechanisms(mech), setup, explicit=mech != "all")
    file = BenchFile(bench_results, decode.KIND, decode.METRICS, new_bench_id())
    without = f" (no recurrent form: {', '.join(skipped)})" if skipped else ""
    echo(
        f"decode {file.bench_id}: {plural(len(names), 'mechanism')}{without} x L "
        f"{', '.join(map(str, setup.lengths))}; {plural(tokens, 'step')} timed after each "
        f"prefill, batch {batch}, {plural(heads, 'head')} of {head_dim}, float32, device {dev}, "
        f"{plural(threads, 'thread')}; median of {repeats} interleaved rounds after {warmup} "
        f"warm-up -> {file.path}"
    )
    try:
        rows = decode.measure(names, setup)
    except KeyboardInterrupt:
        raise fail("interrupted; nothing stored", 130) from None
    file.add(rows, dev)
    echo()
    for line in decode.table_lines(rows):
        echo(line)
    for line in decode.growth_lines(rows):
        echo(line)
    echo(decode.note(setup, str(dev), rows[0]["reference"]))


# -- fidelity -------------------------------------------------------------------------------


@bench_app.command("fidelity")
@guard
def fidelity_command(
    variants: Annotated[str, typer.Option(help="Comma-separated SLAY variants.")] = (
        ",".join(fidelity.VARIANTS)
    ),
    budget: Annotated[
        str, typer.Option(help="Comma-separated budgets of 001 Table 6: small, medium, large.")
    ] = ",".join(fidelity.BUDGETS),
    seeds: Annotated[int, typer.Option(help="Seeds 0..N-1 (projections, inputs, features).")] = 5,
    seq_len: Annotated[
        int | None, typer.Option(help="Sequence length for every budget (default: its T).")
    ] = None,
    d_model: Annotated[int, typer.Option(help="Embedding dimension.")] = 64,
    heads: Annotated[int, typer.Option(help="Attention heads.")] = 4,
    batch: Annotated[int, typer.Option(help="Batch size.")] = 8,
    eps: Annotated[float, typer.Option(help="The kernel's eps (C = 2 + eps).")] = 1e-3,
    match_features: Annotated[
        bool,
        typer.Option(help="Give slay-laplace and slay-hadamard M x P PRF features (the paper's)."),
    ] = True,
    repeats: Annotated[int, typer.Option(help="Timed forwards per latency (median).")] = 3,
    warmup: Annotated[int, typer.Option(help="Untimed forwards before them.")] = 1,
    max_nodes: Annotated[int, typer.Option(help="Quadrature error for R = 1..N.")] = 16,
    device: DeviceOption = "auto",
    bench_results: BenchResultsOption = DEFAULT_BENCH_RESULTS,
    out: OutOption = DEFAULT_OUT,
    plugin: PluginOption = None,
    results: OldResultsOption = None,
) -> None:
    """SLAY variants against exact spherical Yat (001 Table 6, Fig. 7); quadrature (Fig. 9)."""
    bench_results = _bench_results(bench_results, results)
    load_plugins(plugin)
    names = select_mechanisms(variants, "--variants")
    budgets = [fidelity.BUDGETS[b] for b in _choose("budget", budget, fidelity.BUDGETS)]
    if not 1 <= max_nodes <= MAX_QUAD_NODES:
        raise ValueError(f"--max-nodes must be in [1, {MAX_QUAD_NODES}], got {max_nodes}")
    dev = resolve_device(device)
    setup = fidelity.FidelitySetup(
        d_model, heads, batch, seeds, seq_len, eps, match_features, repeats, warmup, str(dev)
    )
    for name in names:  # every variant's parameters, checked before anything runs
        fidelity.variant_params(name, budgets[0], setup, 0)
    bench_id = new_bench_id()
    file = BenchFile(bench_results, "fidelity", fidelity.METRICS, bench_id)
    echo(
        f"fidelity {bench_id}: {len(names)} variants x budgets {', '.join(b.name for b in budgets)}"
        f" x {seeds} seeds against {fidelity.REFERENCE}; d_model {d_model}, {heads} heads, "
        f"batch {batch}, eps {eps:g}, device {dev} -> {file.path}"
    )

    def on_rows(rows):
        file.add(rows, dev)
        first = rows[0]
        echo(f"  {first['budget']} (T {first['seq_len']}) seed {first['seed']}: done")

    try:
        fidelity.measure(setup, budgets, names, on_rows)
    except KeyboardInterrupt:
        raise _interrupted(file) from None
    quadrature = BenchFile(bench_results, "quadrature", fidelity.QUADRATURE_METRICS, bench_id)
    quadrature.add(fidelity.quadrature_rows(eps, max_nodes), dev)
    rows, quad_rows = pd.DataFrame(file.rows), pd.DataFrame(quadrature.rows)
    echo()
    echo(to_markdown(fidelity.fidelity_grid(rows)))
    for line in fidelity.quadrature_lines(quad_rows):
        echo(line)
    suffixes = [f".{f}" for f in FIGURE_FORMATS]
    _wrote(_plots().fidelity_tables(rows, out))
    _wrote(_plots().quadrature_figure(quad_rows, out / "quadrature", suffixes))


# -- train ----------------------------------------------------------------------------------


@bench_app.command("train")
@guard
def train_command(
    protocol: Annotated[str, typer.Option(help="Protocol (synthbench list protocols).")] = "quick",
    task: Annotated[
        str, typer.Option(help="'all', 'extended' or comma-separated task names.")
    ] = "all",
    mech: Annotated[
        str, typer.Option(help="'all' or comma-separated mechanism names.")
    ] = "softmax",
    steps: Annotated[int, typer.Option(help="Steps of the measured run per task.")] = 100,
    device: DeviceOption = "auto",
    bench_results: BenchResultsOption = DEFAULT_BENCH_RESULTS,
    plugin: PluginOption = None,
    results: OldResultsOption = None,
) -> None:
    """Steps/s and tokens/s of the real training loop; predicted time of `run --task all`."""
    bench_results = _bench_results(bench_results, results)
    load_plugins(plugin)
    reuse_freed_memory()  # as `synthbench run` trains
    proto = PROTOCOLS.get(protocol)
    tasks = select_tasks(task, None)
    names = select_mechanisms(mech)
    if steps < 2:
        raise ValueError(f"--steps must be >= 2, got {steps}")
    dev = resolve_device(device)
    file = BenchFile(bench_results, "train", throughput.METRICS, new_bench_id())
    echo(
        f"train {file.bench_id}: {len(names)} mechanisms x {len(tasks)} tasks, protocol "
        f"{proto.name} v{proto.version}, {steps} steps per run, device {dev}, "
        f"{torch.get_num_threads()} threads -> {file.path}"
    )
    try:
        for name in names:
            throughput.warm_up(tasks[0], name, proto, dev)
            for t in tasks:
                row = throughput.measure_task(t, name, proto, steps, dev)
                file.add([row], dev)
                echo(throughput.task_line(row))
    except KeyboardInterrupt:
        raise _interrupted(file) from None
    rows = pd.DataFrame(file.rows)
    echo()
    for name in names:
        echo(throughput.suite_line(name, rows[rows["mechanism"] == name], proto, task_set("all")))


# -- plot -----------------------------------------------------------------------------------


@bench_app.command("plot")
@guard
def plot_command(
    bench_results: BenchResultsOption = DEFAULT_BENCH_RESULTS,
    results: Annotated[
        Path,
        typer.Option(
            "--results", help="Also read the rows older versions stored in <results>/bench/."
        ),
    ] = Path("results"),
    out: OutOption = DEFAULT_OUT,
    bench_id: Annotated[
        str | None, typer.Option("--id", help="A stored run's id (default: the newest of each).")
    ] = None,
    formats: Annotated[
        str, typer.Option("--format", help="Comma-separated figure formats: png, pdf.")
    ] = ",".join(FIGURE_FORMATS),
) -> None:
    """Figures (scaling, quadrature) and the fidelity table of stored bench rows."""
    suffixes = [f".{f}" for f in _choose("format", formats, FIGURE_FORMATS)]
    found = {}
    for kind in ("scaling", "fidelity", "quadrature"):
        try:
            found[kind] = load_bench(bench_results, kind, bench_id, legacy=results)
        except ValueError:  # that id is another kind's
            found[kind] = None
    if all(rows is None for rows in found.values()):
        what = f"with id {bench_id} " if bench_id else ""
        raise ValueError(f"no bench results {what}under {bench_results}/ (nor {results}/bench/)")
    written = []
    if found["scaling"] is not None:
        written += _plots().scaling_figure(found["scaling"], out / "scaling", suffixes)
    if found["fidelity"] is not None:
        written += _plots().fidelity_tables(found["fidelity"], out)
    if found["quadrature"] is not None:
        written += _plots().quadrature_figure(found["quadrature"], out / "quadrature", suffixes)
    _wrote(written)
