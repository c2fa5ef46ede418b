"""The task interface: a parameter dataclass, a vectorised generator and a causal oracle.

Every task lays its sequences out for a causal model as ``prompt SEP answer``. A generator
builds whole sequences ``S`` of length ``T`` plus a mask of the answer tokens; the model
reads ``inputs = S[:, :-1]`` and at every position predicts the next token, so
``targets[:, i] = S[:, i + 1]`` where ``S[:, i + 1]`` is an answer token and ``IGNORE``
elsewhere (teacher forcing, loss on answer positions only).

The one exception: a task with ``answers_in_stream = False`` (the State category) labels
positions instead, ``targets[:, i]`` the state after ``inputs[:, i]``, and its answers are
never tokens of the stream (``Task.answers_in_stream`` says why).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from synthbench.core.params import REQUIRED, resolve_params
from synthbench.core.registry import Entry, Registry
from synthbench.core.text import did_you_mean

CATEGORIES = (
    "Basic", "Arithmetic", "Long-Range", "Memory", "Patterns", "Reasoning", "Robustness", "State",
)  # fmt: skip
IGNORE = -100  # the target outside answer positions (torch's cross-entropy ignore_index)

TASKS: Registry[type[Task]] = Registry(
    "task",
    entry_point_group="synthbench.tasks",
    builtins="synthbench.tasks",
    required=("category", "description"),
    choices={"category": CATEGORIES, "suite": ("default", "extended")},
)
# The named task sets that ``--task`` takes: "all" is the default suite, every registered task
# (plugins included) but those registered with ``suite="extended"``; "extended" adds those.
TASK_SETS = ("all", "extended")


def in_default_suite(entry: Entry) -> bool:
    """Whether a registry entry belongs to the default suite (not ``suite="extended"``)."""
    return entry.metadata.get("suite", "default") == "default"


def task_set(name: str) -> list[str]:
    """The task names of a named set (``TASK_SETS``), in registry order."""
    if name not in TASK_SETS:
        hint = did_you_mean(name, TASK_SETS)
        raise ValueError(f"unknown task set {name!r}{hint} (sets: {', '.join(TASK_SETS)})")
    return [e.name for e in TASKS.entries() if name == "extended" or in_default_suite(e)]


# The difficulty name that expands every laddered task into its ladder's levels (``run
# --difficulty ladder``; planning.py): the default suite's scoring (docs/TASKS.md, "Ladders").
LADDER = "ladder"


@dataclass(frozen=True)
class Ladder:
    """Graded difficulty, as MAD scores its tasks: a baseline level and levels that each change
    one factor from it, so that a task tells mechanisms apart by how far each gets. A task's
    ladder score is the mean over its levels (docs/TASKS.md, "Ladders").

    ``axis``: the knob (or knobs that move together, such as a period's bounds) the levels
    change; ``source``: the literature that shows this axis separates mechanisms; ``baseline``:
    the overrides of level L1; ``steps``: the overrides of L2, L3, ... on top of the baseline,
    each of axis knobs only. The levels are named L1 (the baseline) .. Ln and are plain
    parameter overrides: presets of the task like ``easy`` (``--difficulty L2``), so a
    level's runs are ordinary runs with those parameters.
    """

    axis: tuple[str, ...]
    source: str
    baseline: dict[str, Any]
    steps: tuple[dict[str, Any], ...]

    @property
    def levels(self) -> dict[str, dict[str, Any]]:
        """Level name -> its overrides, easiest first: L1 the baseline, L2 .. its steps."""
        found = {"L1": dict(self.baseline)}
        for i, step in enumerate(self.steps, start=2):
            found[f"L{i}"] = {**self.baseline, **step}
        return found

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.levels)

    def offset(self, task: str) -> int:
        """Where the dealing of ``task``'s seeds starts (``level_of_seed``): a fixed hash of
        its name, so that a seed holds different levels of different tasks (a seed of the
        suite is then a mix of levels, not all the easiest or all the hardest) and loading
        another task changes nothing."""
        return zlib.crc32(task.encode()) % len(self.names)

    def level_of_seed(self, task: str, seed: int) -> str:
        """The level that seed ``seed`` of ``task`` runs at: a ladder's seeds are dealt to
        its levels in turn, so N seeds give each level N // L or one more, and seeds 0..L-1
        one level each (the levels take the place of seeds: docs/TASKS.md)."""
        return self.names[(seed + self.offset(task)) % len(self.names)]

    def first_seed(self, task: str, level: str) -> int:
        """The smallest seed dealt to ``level``: the seed a level's value is shown under,
        so that a level is one seed of its cell in every report (one per level, distinct)."""
        return (self.names.index(level) - self.offset(task)) % len(self.names)


@dataclass
class Batch:
    inputs: torch.Tensor  # (n, L) int64 token ids
    targets: torch.Tensor  # (n, L) int64: next-token labels at answer positions, IGNORE elsewhere
    # (n, L) next-token labels a training also learns from but no metric scores (IGNORE
    # elsewhere, and at every answer): easier steps of the same computation that a task
    # supervises so that the scored ones can be learnt (stack: every POP, only the nested
    # ones scored). None: a training learns the answers alone.
    practice: torch.Tensor | None = None

    @property
    def answer_mask(self) -> torch.Tensor:
        return self.targets != IGNORE

    @property
    def training_targets(self) -> torch.Tensor:
        """The labels a training's loss is taken on: the answers and the practice labels."""
        if self.practice is None:
            return self.targets
        return torch.where(self.answer_mask, self.targets, self.practice)

    def to(self, device: torch.device | str) -> Batch:
        practice = None if self.practice is None else self.practice.to(device)
        return Batch(self.inputs.to(device), self.targets.to(device), practice)


@dataclass(frozen=True)
class ShortcutRule:
    """A rule that answers without the computation a task tests (``Task.shortcut_rules``):
    ``predict(inputs)`` gives a token at every position of the (n, L) inputs, each from its
    causal prefix ``inputs[:, : i + 1]``; ``synthbench audit`` scores it at the answers."""

    name: str
    description: str
    predict: Callable[[torch.Tensor], torch.Tensor]


def teacher_forced(
    sequences: torch.Tensor, answer_mask: torch.Tensor, practice_mask: torch.Tensor | None = None
) -> Batch:
    """Turn full sequences (n, T) and their answer-token mask (n, T) into a Batch of length T-1;
    with ``practice_mask``, the tokens a training also learns from (``Batch.practice``)."""
    targets = sequences[:, 1:].masked_fill(~answer_mask[:, 1:], IGNORE)
    practice = None
    if practice_mask is not None:
        practice_only = practice_mask[:, 1:] & ~answer_mask[:, 1:]
        practice = sequences[:, 1:].masked_fill(~practice_only, IGNORE).contiguous()
    return Batch(sequences[:, :-1].contiguous(), targets.contiguous(), practice)


def batch_from_parts(
    prompt: Sequence[torch.Tensor | int],
    answer: Sequence[torch.Tensor | int],
    device: torch.device | str,
    answer_mask: torch.Tensor | None = None,
) -> Batch:
    """The teacher-forced Batch of the sequences ``prompt answer``, moved to ``device``.

    Each part is an (n, k) tensor of tokens, or an int: a column of that token (SEP, say).
    The parts are joined in order; the tokens of the answer parts are the answers, or only
    those where ``answer_mask`` (broadcast over the answer parts) holds.
    """
    parts = [*prompt, *answer]
    tensor = next(part for part in parts if isinstance(part, torch.Tensor))  # rows, device
    columns = [
        torch.full((len(tensor), 1), part, dtype=torch.long, device=tensor.device)
        if isinstance(part, int)
        else part
        for part in parts
    ]
    sequences = torch.cat(columns, dim=1)
    prompt_len = sum(column.shape[1] for column in columns[: len(prompt)])
    mask = torch.zeros_like(sequences, dtype=torch.bool)
    mask[:, prompt_len:] = True if answer_mask is None else answer_mask
    return teacher_forced(sequences, mask).to(device)


def answered_pairs(given: torch.Tensor, answers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``g_1 a_1 .. g_m a_m`` from (n, m) given tokens and their answers, and the (2m) mask
    that marks the answers (for ``batch_from_parts``'s ``answer_mask``)."""
    pairs = torch.stack([given, answers], dim=2).flatten(1)
    return pairs, torch.arange(pairs.shape[1], device=pairs.device) % 2 == 1


def pair_places(n: int, length: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """(n, count) sorted places p in [0, length - 2], at least 2 apart, uniformly at random:
    where ``count`` token pairs (p, p + 1) go without overlapping. Distinct sorted s_j drawn
    from [0, length - count), spread to s_j + j."""
    dev = generator.device
    slots = torch.rand(n, length - count, generator=generator, device=dev).argsort(dim=1)
    return slots[:, :count].sort(dim=1).values + torch.arange(count, device=dev)


def targets_at(
    inputs: torch.Tensor, columns: int | slice | torch.Tensor, answers: torch.Tensor
) -> torch.Tensor:
    """An oracle's targets for ``inputs``: ``answers`` at ``columns`` (an index, a slice or a
    tensor of indices, the same in every row), IGNORE elsewhere."""
    targets = torch.full_like(inputs, IGNORE)
    targets[:, columns] = answers
    return targets


def require_at_least(task: str, params: Any, **minimum: int) -> None:
    """Raise a one-line ``ValueError`` naming ``task`` unless every knob of ``params`` is at
    least its minimum: ``require_at_least("copy", self, n=1, vocab=2)`` raises "copy needs
    n >= 1 and vocab >= 2, got n=0, vocab=32" for n = 0."""
    if all(getattr(params, knob) >= low for knob, low in minimum.items()):
        return
    needs = [f"{knob} >= {low}" for knob, low in minimum.items()]
    needs_text = f"{', '.join(needs[:-1])} and {needs[-1]}" if len(needs) > 1 else needs[0]
    got = ", ".join(f"{knob}={getattr(params, knob)}" for knob in minimum)
    raise ValueError(f"{task} needs {needs_text}, got {got}")


class Task:
    """Base class of a task generator.

    Subclasses set ``Params`` (a frozen dataclass with defaults; ``__post_init__`` raises
    ``ValueError`` on invalid values, ``require_at_least`` covers the plain lower bounds),
    optionally ``difficulties`` (preset name -> parameter overrides) and ``special_tokens``,
    and implement ``vocab_size``, ``seq_len``, ``generate`` and ``solve``. ``harder`` maps
    each numeric knob (int or float, not bool) to the direction that makes the task harder,
    ``"larger"`` or ``"smaller"``: the frontier report orders a sweep's values by it.
    """

    Params: ClassVar[type]
    difficulties: ClassVar[dict[str, dict[str, Any]]] = {}
    # graded difficulty: the levels the default suite scores the task over (``Ladder``;
    # ``check_ladder`` validates it). None: the task runs at one setting (controls, State).
    ladder: ClassVar[Ladder | None] = None
    # knob -> "larger" or "smaller": the direction of a numeric parameter that makes the
    # task harder (``harder_direction``; ``check_harder`` validates it)
    harder: ClassVar[dict[str, str]] = {}
    # The integer parameter that sets the sequence length; ``--eval-length-mult`` scales it
    # to test length generalisation. None when the task has no length knob. Token ids whose
    # count depends on it (number tokens) come last, so a longer task keeps every id of the
    # shorter one with the same meaning.
    length_param: ClassVar[str | None] = None
    # The audit's shortcut families (synthbench/integrity/shortcuts.py) that are the very
    # computation the task tests, each with why: copy *is* a copy from a fixed offset, so
    # the fixed-positions family solving it is no shortcut. The audit still shows their
    # scores; any other family above chance + 0.2 is a shortcut.
    computes: ClassVar[dict[str, str]] = {}
    # True: every answer is the next token of the stream (teacher forced), and the free-running
    # evaluation writes each prediction where the next position reads it. False: the answers
    # are labels of the positions they stand at (``targets[:, i]`` is the state after
    # ``inputs[:, i]``) and never enter the stream: fed back, a running state would be one
    # lookup from the previous answer (the State tasks, docs/TASKS.md), so nothing is fed
    # back and the free-running accuracy is the teacher-forced one.
    answers_in_stream: ClassVar[bool] = True

    def __init__(self, **overrides: Any) -> None:
        defaults = {
            f.name: REQUIRED if f.default is dataclasses.MISSING else f.default
            for f in dataclasses.fields(self.Params)
        }
        params = resolve_params(f"task {TASKS.name_of(type(self))}", defaults, overrides)
        self.params = self.Params(**params)

    @classmethod
    def presets(cls) -> tuple[str, ...]:
        """The difficulty presets: ``default``, the task's own and its ladder's levels."""
        levels = cls.ladder.names if cls.ladder is not None else ()
        return ("default", *cls.difficulties, *levels)

    @classmethod
    def preset_overrides(cls, name: str) -> dict[str, Any]:
        """The parameter overrides of preset ``name`` (a difficulty or a ladder level); an
        unknown name raises a one-line ValueError naming the close ones and every preset."""
        if name not in cls.presets():
            hint = did_you_mean(name, cls.presets())
            presets = ", ".join(cls.presets())
            raise ValueError(f"unknown difficulty {name!r}{hint} (presets: {presets})")
        if cls.ladder is not None and name in cls.ladder.names:
            return dict(cls.ladder.levels[name])
        return dict(cls.difficulties.get(name, {}))

    @classmethod
    def level_of(cls, params: dict[str, Any]) -> str | None:
        """The ladder level whose complete parameters are ``params`` (a run's resolved
        ``task_params``), or None: how a stored row says which level it belongs to."""
        if cls.ladder is None:
            return None
        return _level_params(cls).get(_canonical_params(params))

    def recall_distance(self) -> int | None:
        """A recall task's guarantee: the fewest positions between an answer's input
        position and the token it recalls (the value of a pair, the token after a marker, the
        first token), at these parameters, so that a window over that many positions or fewer
        (``sliding-window``'s, Based's) never sees it. None: not a recall task, or one whose
        layout bounds no distance (docs/TASKS.md, "Windows below the recall distance")."""
        return None

    @classmethod
    def harder_direction(cls, knob: str) -> str | None:
        """The direction of ``knob`` that makes the task harder, ``"larger"`` or
        ``"smaller"``; None where the task declares none. A name that is not one of the
        task's parameters raises ``ValueError``."""
        knobs = [f.name for f in dataclasses.fields(cls.Params)]
        if knob not in knobs:
            raise ValueError(
                f"task {TASKS.name_of(cls)} has no parameter {knob!r}{did_you_mean(knob, knobs)} "
                f"(knobs: {', '.join(knobs)})"
            )
        return cls.harder.get(knob)

    @classmethod
    def from_difficulty(cls, difficulty: str = "default", **overrides: Any) -> Task:
        """The task at a preset (a difficulty or a ladder level), ``overrides`` on top."""
        return cls(**{**cls.preset_overrides(difficulty), **overrides})

    def at_length(self, mult: float) -> Task:
        """The same task with its length knob scaled by ``mult`` (rounded to an integer)."""
        if self.length_param is None:
            raise ValueError(f"task {type(self).__name__} has no length parameter")
        length = getattr(self.params, self.length_param)
        return type(self)(**{**self.param_dict(), self.length_param: round(length * mult)})

    def param_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self.params)

    @property
    def special_tokens(self) -> dict[str, int]:
        """The special tokens, name -> id (``{"SEP": vocab}``, say); ``token_name`` shows
        them by name and ``sep`` is the one named SEP."""
        return {}

    @property
    def sep(self) -> int:
        """The id of the separator, the special token named SEP."""
        if "SEP" not in self.special_tokens:
            raise AttributeError(f"task {type(self).__name__} has no SEP token")
        return self.special_tokens["SEP"]

    @property
    def vocab_size(self) -> int:
        """Exact number of token ids the task uses (data tokens and special tokens)."""
        raise NotImplementedError

    @property
    def seq_len(self) -> int:
        """Length L of ``Batch.inputs``."""
        raise NotImplementedError

    def generate(self, n: int, generator: torch.Generator, device: str = "cpu") -> Batch:
        """``n`` examples drawn with ``generator`` only (never the global RNG), no Python
        loop over examples."""
        raise NotImplementedError

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        """Oracle: the targets of ``inputs``, each computed from its causal prefix
        ``inputs[:, : i + 1]`` alone; IGNORE outside answer positions."""
        raise NotImplementedError

    @property
    def target_metric(self) -> str:
        """The metric a report compares on: ``token_acc`` (teacher forced), or, for a layout
        that is a chain of steps (a walk, a running state), ``free_token_acc``: the answers
        generated free-running, so a chain is only solved where the model can produce it."""
        return "token_acc"

    def shortcut_rules(self) -> Sequence[ShortcutRule]:
        """The task's own shortcut rules, which ``synthbench audit`` scores beside its
        generic count-table baselines (synthbench/integrity/audit.py): rules a model could follow to
        answer without the computation the task tests. None by default."""
        return ()

    def token_name(self, token: int) -> str:
        """How a token is shown to a person: a special token by its name, any other by its
        id (a task with more named tokens, number tokens say, extends this)."""
        for name, special in self.special_tokens.items():
            if token == special:
                return name
        return str(token)


def check_harder(cls: type[Task]) -> None:
    """Raise a one-line ``ValueError`` naming the task unless every key of ``cls.harder``
    is a non-bool field of ``cls.Params`` and every value ``"larger"`` or ``"smaller"``."""
    name = TASKS.name_of(cls)
    fields = {f.name: f for f in dataclasses.fields(cls.Params)}
    for knob, direction in cls.harder.items():
        if knob not in fields:
            raise ValueError(
                f"task {name} declares a harder direction for {knob!r}, which is not one of "
                f"its parameters ({', '.join(fields)})"
            )
        if fields[knob].type in (bool, "bool"):
            raise ValueError(f"task {name}: {knob} is a bool, it has no harder direction")
        if direction not in ("larger", "smaller"):
            raise ValueError(
                f"task {name}: the harder direction of {knob} must be 'larger' or 'smaller', "
                f"not {direction!r}"
            )


def _canonical_params(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


@functools.cache
def _level_params(cls: type[Task]) -> dict[str, str]:
    """Canonical complete parameters -> ladder level, for ``Task.level_of`` (once per class;
    a level that does not construct is left out: ``check_ladder`` names it)."""
    found = {}
    for name, overrides in cls.ladder.levels.items():
        try:
            found[_canonical_params(cls(**overrides).param_dict())] = name
        except (TypeError, ValueError):
            continue
    return found


@functools.cache  # once per class: planning checks each task's ladder twice (plan_size, plan)
def check_ladder(cls: type[Task]) -> None:
    """Raise a one-line ``ValueError`` naming the task unless its ladder is well formed:
    level names apart from its difficulties; the axis and every override its parameters;
    at least two levels, each step a change of axis knobs only, in the direction
    ``harder`` declares (from the level below); every level constructs, and no two levels
    are the same parameters. A task without a ladder passes."""
    ladder = cls.ladder
    if ladder is None:
        return
    name = TASKS.name_of(cls)
    knobs = [f.name for f in dataclasses.fields(cls.Params)]
    clash = sorted((set(ladder.names) | {"default", LADDER}) & set(cls.difficulties))
    if clash:
        raise ValueError(f"task {name}: presets named like ladder levels: {', '.join(clash)}")
    if not ladder.steps:
        raise ValueError(f"task {name}: a ladder needs a baseline and at least one step")
    for knob in [*ladder.axis, *ladder.baseline, *(k for step in ladder.steps for k in step)]:
        if knob not in knobs:
            hint = did_you_mean(knob, knobs)
            raise ValueError(f"task {name}: its ladder names {knob!r}, not a parameter{hint}")
    levels = list(ladder.levels.items())
    built = {}
    for level, overrides in levels:
        try:
            built[level] = cls(**overrides).param_dict()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"task {name}, ladder level {level}: {exc}") from None
    names = [level for level, _ in levels]
    for lower, level, step in zip(names[:-1], names[1:], ladder.steps, strict=True):
        moved = sorted(set(step) - set(ladder.axis))
        if not step or moved:
            raise ValueError(
                f"task {name}, ladder level {level}: a step changes the axis "
                f"({', '.join(ladder.axis)}) only, not {moved or 'nothing'}"
            )
        for knob in step:
            direction = cls.harder.get(knob)
            below, here = built[lower][knob], built[level][knob]
            easier = (here < below) if direction == "larger" else (here > below)
            if direction is not None and (here == below or easier):
                raise ValueError(
                    f"task {name}, ladder level {level}: {knob}={here} is not harder than "
                    f"{lower}'s {below} (harder is {direction})"
                )
    seen: dict[str, str] = {}
    for level, params in built.items():
        key = _canonical_params(params)
        if key in seen:
            raise ValueError(f"task {name}: ladder levels {seen[key]} and {level} are the same")
        seen[key] = level


class SepTask(Task):
    """A task whose data tokens are 0..vocab-1 (``Params.vocab``) followed by one special
    token, SEP = vocab. A task with more ids (number tokens, say) extends ``vocab_size``."""

    @property
    def special_tokens(self) -> dict[str, int]:
        return {"SEP": self.params.vocab}

    @property
    def vocab_size(self) -> int:
        return self.params.vocab + 1


def markdown_table() -> str:
    """The built-in tasks at their defaults, by category (docs/TASKS.md embeds this; a test
    checks it); a task outside the default suite has "(extended)" after its category."""
    order = {c: i for i, c in enumerate(CATEGORIES)}
    entries = sorted(TASKS.entries(), key=lambda e: (order[e.metadata["category"]], e.name))
    lines = [
        "| category | task | what the answer is | defaults | input length | vocab | "
        "length knob | presets |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        if e.source != "builtin":
            continue
        task = e.obj()
        defaults = ", ".join(f"{k} {v}" for k, v in task.param_dict().items())
        presets = "; ".join(
            f"{name}: " + ", ".join(f"{k} {v}" for k, v in overrides.items())
            for name, overrides in e.obj.difficulties.items()
        )
        category = e.metadata["category"] + ("" if in_default_suite(e) else " (extended)")
        lines.append(
            f"| {category} | {e.name} | {e.metadata['description']} | "
            f"{defaults} | {task.seq_len} | {task.vocab_size} | {e.obj.length_param or '-'} | "
            f"{presets} |"
        )
    return "\n".join(lines) + "\n"


def ladder_table() -> str:
    """Every built-in task's ladder, by name: its axis, each level's parameters (the baseline's
    overrides, then the axis at each step), the input lengths, the recall distance of a recall
    task, the source (docs/TASKS.md embeds this; a test checks it)."""
    lines = [
        "| task | axis | L1 (baseline) | steps | input lengths | recall distance | source |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in sorted(TASKS.entries(), key=lambda e: e.name):
        ladder = e.obj.ladder
        if e.source != "builtin" or ladder is None:
            continue
        tasks = [e.obj(**overrides) for overrides in ladder.levels.values()]
        distances = [task.recall_distance() for task in tasks]
        steps = "; ".join(
            f"L{i}: " + ", ".join(f"{k} {v}" for k, v in step.items())
            for i, step in enumerate(ladder.steps, start=2)
        )
        lines.append(
            f"| {e.name} | {', '.join(ladder.axis)} | "
            + (", ".join(f"{k} {v}" for k, v in ladder.baseline.items()) or "the defaults")
            + f" | {steps} | {', '.join(str(t.seq_len) for t in tasks)} | "
            + ("-" if distances[0] is None else ", ".join(map(str, distances)))
            + f" | {ladder.source} |"
        )
    return "\n".join(lines) + "\n"
