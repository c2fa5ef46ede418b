"""``synthbench list`` and ``synthbench show-task``: what is registered, what a task is like."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import torch
import typer
from rich.table import Table

from synthbench.audit import MARGIN, MIN_SEEN, TRAIN_ANSWERS, audit, markdown_table
from synthbench.cli.common import PluginOption, UsageError, load_plugins, out
from synthbench.mechanism import MECHANISMS, STATE_HEAD_DIM, STATE_LENGTH, state_size_at_defaults
from synthbench.params import parse_assignments
from synthbench.protocols import PROTOCOLS
from synthbench.task import CATEGORIES, IGNORE, TASKS


def list_command(
    what: Annotated[str, typer.Argument(help="tasks, mechs or protocols.")],
    plugin: PluginOption = None,
) -> None:
    """List the registered tasks, mechanisms or protocols."""
    kinds = {
        "tasks": "tasks",
        "task": "tasks",
        "mechs": "mechs",
        "mechanisms": "mechs",
        "mech": "mechs",
        "protocols": "protocols",
        "protocol": "protocols",
    }
    if what not in kinds:
        raise UsageError(f"cannot list '{what}' (tasks, mechs, protocols)")
    load_plugins(plugin)
    kind = kinds[what]
    if kind == "tasks":
        table = Table(
            "category", "task", "aliases", "description", "defaults", "length knob", "source"
        )
        order = {c: i for i, c in enumerate(CATEGORIES)}
        for e in sorted(TASKS.entries(), key=lambda e: (order[e.metadata["category"]], e.name)):
            defaults = ", ".join(f"{f.name}={f.default}" for f in dataclasses.fields(e.obj.Params))
            table.add_row(
                e.metadata["category"],
                e.name,
                ", ".join(e.aliases),
                e.metadata["description"],
                defaults,
                e.obj.length_param or "",
                e.source,
            )
        categories = {e.metadata["category"] for e in TASKS.entries()}
        table.caption = f"{len(TASKS.names())} tasks in {len(categories)} categories"
    elif kind == "mechs":
        table = Table(
            "mechanism",
            "complexity",
            "family",
            f"state/head (L {STATE_LENGTH}, d {STATE_HEAD_DIM})",
            "aliases",
            "reference",
            "source",
        )
        for e in MECHANISMS.entries():
            table.add_row(
                e.name,
                e.metadata["complexity"],
                e.metadata["family"],
                _state_size(e.obj),
                ", ".join(e.aliases),
                e.metadata["reference"],
                e.source,
            )
    else:
        table = Table("protocol", "model", "training", "lrs", "seeds", "description")
        for e in PROTOCOLS.entries():
            p = e.obj
            table.add_row(
                f"{p.name} v{p.version}",
                f"{p.arch}, {p.pos} pos, d {p.d_model}, {p.n_heads} heads, {p.n_layers} layers",
                f"{p.steps} steps x batch {p.batch_size}",
                ", ".join(f"{lr:g}" for lr in p.lrs),
                str(p.seeds),
                p.description,
            )
    out.print(table)


def _state_size(cls) -> str:
    """The recurrent state one head carries at the default parameters, or '?' if unknown."""
    try:
        return f"{state_size_at_defaults(cls):,}"
    except Exception:  # a plugin that cannot say: shown, not fatal for the listing
        return "?"


def show_task_command(
    name: Annotated[str, typer.Argument(help="Task name (synthbench list tasks).")],
    param: Annotated[
        list[str] | None, typer.Option("--param", help="KEY=VALUE task parameter (repeatable).")
    ] = None,
    difficulty: Annotated[str, typer.Option(help="easy, default or hard.")] = "default",
    seed: Annotated[int, typer.Option(help="Generator seed of the example.")] = 0,
    plugin: PluginOption = None,
) -> None:
    """Print one generated example, decoded, with the answer tokens in square brackets."""
    load_plugins(plugin)
    entry = TASKS.entry(name)
    task = entry.obj.from_difficulty(difficulty, **parse_assignments(param))
    batch = task.generate(1, torch.Generator().manual_seed(seed))
    inputs, targets = batch.inputs[0].tolist(), batch.targets[0].tolist()
    # the full sequence is the inputs plus the last target (the final answer token)
    sequence = inputs + ([targets[-1]] if targets[-1] != IGNORE else [])
    answer = [False] + [t != IGNORE for t in targets]
    words = [
        f"[{task.token_name(t)}]" if is_answer else task.token_name(t)
        for t, is_answer in zip(sequence, answer, strict=False)
    ]
    params = " ".join(f"{k}={v}" for k, v in task.param_dict().items())
    out.print(
        f"{entry.name} ({entry.metadata['category']}): {entry.metadata['description']}\n"
        f"params: {params}; difficulty {difficulty}; vocab_size {task.vocab_size}; "
        f"input length {task.seq_len}; {sum(answer)} answer tokens, marked [..]\n"
        + " ".join(words),
        highlight=False,
        markup=False,
    )


def audit_command(
    name: Annotated[str, typer.Argument(help="Task name, or 'all' (plugins included).")],
    difficulty: Annotated[
        str, typer.Option(help="A preset (easy, default, hard, ...) or 'all' of the task's.")
    ] = "all",
    param: Annotated[
        list[str] | None, typer.Option("--param", help="KEY=VALUE task parameter (repeatable).")
    ] = None,
    answers: Annotated[
        int, typer.Option(min=1000, help="About how many answers the count tables learn from.")
    ] = TRAIN_ANSWERS,
    check: Annotated[
        bool, typer.Option("--check", help="Exit with status 1 if a task has a shortcut.")
    ] = False,
    plugin: PluginOption = None,
) -> None:
    """Score shortcut baselines on generated data: can a task be answered without the
    computation it tests? (The method: docs/TASKS.md, "Shortcut audit".)"""
    load_plugins(plugin)
    overrides = parse_assignments(param)
    names = TASKS.names() if name == "all" else [TASKS.canonical(name)]
    audits = []
    for task_name in names:
        presets = TASKS.get(task_name).presets()
        if difficulty != "all" and difficulty not in presets:
            raise UsageError(
                f"task {task_name} has no difficulty {difficulty!r} (presets: {', '.join(presets)})"
            )
        for preset in presets if difficulty == "all" else (difficulty,):
            audits.append(
                audit(
                    task_name,
                    preset,
                    train_answers=answers,
                    test_answers=answers // 10,
                    **overrides,
                )
            )
    out.print(markdown_table(audits), highlight=False, markup=False)
    out.print(
        f"chance: the best constant answer per position; a cell is a baseline's token accuracy "
        f"on fresh data, (u): fewer than {MIN_SEEN:.0%} of its test contexts seen in training; "
        f"shortcut: above chance + {MARGIN}.",
        highlight=False,
        markup=False,
    )
    flagged = [a for a in audits if not a.passed]
    if flagged:
        out.print(f"{len(flagged)} of {len(audits)} audited tasks and presets have a shortcut")
        if check:
            raise typer.Exit(1)
