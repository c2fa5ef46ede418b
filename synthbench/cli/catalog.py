"""``synthbench list``, ``synthbench show-task`` and ``synthbench audit``: what is registered,
what a task is like, whether it can be answered by a shortcut, and (``audit --informative``)
how many pairs of mechanisms its stored runs tell apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import torch
import typer

from synthbench.cli.common import (
    PluginOption,
    UsageError,
    load_plugins,
    load_results,
    out,
    path_parser,
    print_rows,
    write_stdout,
)
from synthbench.core.mechanism import (
    MECHANISMS,
    STATE_HEAD_DIM,
    STATE_LENGTH,
    state_size_at_defaults,
)
from synthbench.core.params import parse_assignments
from synthbench.core.task import CATEGORIES, IGNORE, TASK_SETS, TASKS, in_default_suite, task_set
from synthbench.core.text import did_you_mean
from synthbench.integrity.audit import MARGIN, TRAIN_ANSWERS, audit, markdown_table
from synthbench.report import informative
from synthbench.run.grid import task_defaults
from synthbench.run.limits import check_length
from synthbench.run.protocols import PROTOCOLS

# Per kind: the JSON keys of a record (``list --json``) and the column each one is shown
# under in the table; the first is the name, never cut.
LISTINGS = {
    "tasks": {
        "name": "task",
        "category": "category",
        "aliases": "aliases",
        "description": "description",
        "defaults": "defaults",
        "length_param": "length knob",
        "suite": "suite",
        "source": "source",
    },
    "mechs": {
        "name": "mechanism",
        "complexity": "complexity",
        "family": "family",
        "state_per_head": f"state/head (L {STATE_LENGTH}, d {STATE_HEAD_DIM})",
        "aliases": "aliases",
        "reference": "reference",
        "source": "source",
    },
    "protocols": {
        "name": "protocol",
        "version": "version",
        "model": "model",
        "training": "training",
        "lrs": "lrs",
        "seeds": "seeds",
        "description": "description",
    },
}


def list_command(
    what: Annotated[str, typer.Argument(help="tasks, mechs or protocols.")],
    as_json: Annotated[
        bool, typer.Option("--json", help="A JSON array of objects, one per row, every column.")
    ] = False,
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
        hint = did_you_mean(what, kinds)
        raise UsageError(f"cannot list '{what}'{hint} (tasks, mechs, protocols)")
    load_plugins(plugin)
    kind = kinds[what]
    records = _records(kind)
    if as_json:
        write_stdout(json.dumps(records, indent=1) + "\n")
        return
    columns = LISTINGS[kind]
    cells = [
        [_cell(r[key], "?" if key == "state_per_head" else "") for key in columns] for r in records
    ]
    caption = None
    if kind == "tasks":
        suite = [r for r in records if r["suite"] == "default"]
        caption = f"{len(suite)} tasks in {len({r['category'] for r in suite})} categories"
        extended = [r["name"] for r in records if r["suite"] != "default"]
        if extended:  # the State tasks: run with --task extended, never with --task all
            caption += (
                f" in the default suite (--task all), and {len(extended)} outside it, "
                f"in --task extended: {', '.join(extended)}"
            )
    print_rows(out, list(columns.values()), cells, caption)


def _records(kind: str) -> list[dict]:
    """The rows of ``list KIND`` with the keys of ``LISTINGS[kind]``, as values JSON keeps."""
    if kind == "tasks":
        order = {c: i for i, c in enumerate(CATEGORIES)}
        entries = sorted(TASKS.entries(), key=lambda e: (order[e.metadata["category"]], e.name))
        return [
            {
                "name": e.name,
                "category": e.metadata["category"],
                "aliases": list(e.aliases),
                "description": e.metadata["description"],
                "defaults": task_defaults(e.obj),
                "length_param": e.obj.length_param,
                "suite": "default" if in_default_suite(e) else "extended",
                "source": e.source,
            }
            for e in entries
        ]
    if kind == "mechs":
        return [
            {
                "name": e.name,
                "complexity": e.metadata["complexity"],
                "family": e.metadata["family"],
                "state_per_head": _state_size(e.obj),
                "aliases": list(e.aliases),
                "reference": e.metadata["reference"],
                "source": e.source,
            }
            for e in MECHANISMS.entries()
        ]
    return [
        {
            "name": p.name,
            "version": p.version,
            "model": f"{p.arch}, {p.pos} pos, d {p.d_model}, {p.n_heads} heads, "
            f"{p.n_layers} layers",
            "training": f"{p.steps} steps x batch {p.batch_size}",
            "lrs": list(p.lrs),
            "seeds": p.seeds,
            "description": p.description,
        }
        for p in (e.obj for e in PROTOCOLS.entries())
    ]


def _cell(value, missing: str = "") -> str:
    """A record's value as the table shows it."""
    if value is None:
        return missing
    if isinstance(value, list):
        return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _state_size(cls) -> int | None:
    """The recurrent state one head carries at the default parameters, or None (shown '?')
    if unknown."""
    try:
        return int(state_size_at_defaults(cls))
    except Exception:  # a plugin that cannot say: shown, not fatal for the listing
        return None


def show_task_command(
    name: Annotated[str, typer.Argument(help="Task name (synthbench list tasks).")],
    param: Annotated[
        list[str] | None, typer.Option("--param", help="KEY=VALUE task parameter (repeatable).")
    ] = None,
    difficulty: Annotated[str, typer.Option(help="easy, default or hard.")] = "default",
    seed: Annotated[
        int, typer.Option(min=0, max=2**64 - 1, help="Generator seed of the example.")
    ] = 0,  # the seeds a torch.Generator takes
    plugin: PluginOption = None,
) -> None:
    """Print one generated example, decoded, with the answer tokens in square brackets."""
    load_plugins(plugin)
    entry = TASKS.entry(name)
    task = entry.obj.from_difficulty(difficulty, **parse_assignments(param))
    check_length(task, f"task {entry.name} ({_cell(task.param_dict())})")
    batch = task.generate(1, torch.Generator().manual_seed(seed))
    inputs, targets = batch.inputs[0].tolist(), batch.targets[0].tolist()
    if task.answers_in_stream:
        # the full sequence is the inputs plus the last target (the final answer token)
        sequence = inputs + ([targets[-1]] if targets[-1] != IGNORE else [])
        answer = [False] + [t != IGNORE for t in targets]
        words = [
            f"[{task.token_name(t)}]" if is_answer else task.token_name(t)
            for t, is_answer in zip(sequence, answer, strict=False)
        ]
    else:  # labels of the positions (State tasks): each input, then its answer, if any
        answer = [t != IGNORE for t in targets]
        words = [
            task.token_name(x) + (f"[{task.token_name(t)}]" if t != IGNORE else "")
            for x, t in zip(inputs, targets, strict=True)
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
    name: Annotated[
        str | None,
        typer.Argument(
            help="Task name, 'all' (plugins included) or 'extended' (all and State); with "
            "--informative, the task to count (default: every task stored)."
        ),
    ] = None,
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
    informative: Annotated[
        bool,
        typer.Option(
            "--informative",
            help="Instead of the shortcuts: per task and track, how many pairs of mechanisms "
            "the stored runs separate, and which tasks sit at the ceiling or the floor (the "
            "shipped reference, or --results).",
        ),
    ] = False,
    results: Annotated[
        Path | None,
        typer.Option(
            "--results",
            help="With --informative: the results tree to count instead of the shipped reference.",
            parser=path_parser("--results"),
            metavar="DIR",
        ),
    ] = None,
    plugin: PluginOption = None,
) -> None:
    """Score shortcut baselines on generated data: can a task be answered without the
    computation it tests? (The method: docs/TASKS.md, "Shortcut audit".) With --informative:
    how many pairs of mechanisms each task separates (docs/TASKS.md, "Informativeness")."""
    load_plugins(plugin)
    shortcut_options = {
        "--difficulty": difficulty != "all",
        "--param": bool(param),
        "--answers": answers != TRAIN_ANSWERS,
        "--check": check,
    }
    if informative:
        given = [option for option, set_ in shortcut_options.items() if set_]
        if given:
            raise UsageError(f"{', '.join(given)}: for the shortcut audit, not --informative")
        informative_audit(name, results)
        return
    if results is not None:
        raise UsageError("--results is read only by --informative")
    if name is None:
        raise UsageError("give a task name, 'all' or 'extended' (or --informative)")
    overrides = parse_assignments(param)
    names = task_set(name) if name in TASK_SETS else [TASKS.canonical(name)]
    audits = []
    for task_name in names:
        presets = TASKS.get(task_name).presets()
        if difficulty != "all" and difficulty not in presets:
            hint = did_you_mean(difficulty, [*presets, "all"])
            raise UsageError(
                f"task {task_name} has no difficulty {difficulty!r}{hint} "
                f"(presets: {', '.join(presets)})"
            )
        for preset in presets if difficulty == "all" else (difficulty,):
            task = TASKS.get(task_name).from_difficulty(preset, **overrides)
            check_length(task, f"task {task_name} ({_cell(task.param_dict())})")
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
        f"chance: the best constant answer per position; a cell is the best token accuracy "
        f'of a family of shortcut baselines on fresh data (docs/TASKS.md, "Shortcut '
        f'audit"); *: the family is the computation the task tests; shortcut: another '
        f"family above chance + {MARGIN}.",
        highlight=False,
        markup=False,
    )
    for a in audits:
        for line in a.findings() if not a.control else ():
            out.print(line, highlight=False, markup=False)
    flagged = [a for a in audits if not a.passed]
    if flagged:
        out.print(f"{len(flagged)} of {len(audits)} audited tasks and presets have a shortcut")
        if check:
            raise typer.Exit(1)


def informative_audit(name: str | None, results: Path | None) -> None:
    """``audit --informative``: per task and track, the pairs of mechanisms the stored runs
    separate and the tasks at the ceiling or the floor (synthbench/report/informative.py),
    from the shipped reference (read as it is stored, whatever its versions) or a tree."""
    tasks = None if name in (None, "all", "extended") else [TASKS.canonical(name)]
    if results is None:
        rows, where = informative.reference_rows()
        source = f"the shipped reference {where}, read as stored"
    else:
        rows, source = load_results(results).rows, f"the runs under {results}/"
        if rows.empty:
            raise UsageError(f"no runs stored under {results}/: nothing to count")
    table = informative.informativeness(rows, tasks)
    counted = rows[rows["protocol"].isin(set(table["protocol"]))]
    out.print(
        f"counting {source}: {informative.versions_note(counted)}", highlight=False, markup=False
    )
    out.print(informative.markdown(table), highlight=False, markup=False)
    for line in informative.summary(table):
        out.print(line, highlight=False, markup=False)
    out.print(
        f"separated: seed means {informative.MIN_DIFFERENCE:g} or more apart and beyond both "
        f"95% intervals (seeds and test sets); ceiling, floor: {informative.BOUND_COUNT} or "
        f"more mechanisms within {informative.BOUND_MARGIN:g} of 1 or of chance; "
        f'{", ".join(informative.CONTROLS)} aside (docs/TASKS.md, "Informativeness").',
        highlight=False,
        markup=False,
    )
