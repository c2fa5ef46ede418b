"""Task audit: how much of a task can be answered without the computation it is meant to test.

The audit generates two streams of a task (its own seeds, apart from runs'), fits shortcut
baselines on one and scores them on the other with the task's metric (token accuracy,
averaged per example, then over examples). The baselines come in generic families that know
nothing of the task (synthbench/integrity/shortcuts.py): count tables on windows of up to 8
tokens, copies from fixed positions and lags, counts of the token read, tables on relabelled
tokens, and elimination of the answers already given. A task may add rules of its own
(``Task.shortcut_rules``): fixed functions of the causal prefix that ignore what the task
tests; the audit scores them the same way (family "task's rules").

*Chance* is the ``position`` baseline: the best constant answer per position, not a uniform
guess. A task passes when every baseline scores at most ``chance + MARGIN``; a control task
(registered with ``control=True``, one that needs no token mixing) is exempt by design. A
table whose test contexts were mostly unseen in training (``seen`` below ``MIN_SEEN``) is
undersampled: it can flag a shortcut, never show that none exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from synthbench.core.task import TASKS, Task
from synthbench.integrity import shortcuts
from synthbench.integrity.shortcuts import MARGIN, MIN_SEEN, Answers, Baseline, Streams

TRAIN_SEED, TEST_SEED = 0xA0D17, 0xA0D18  # the audit's own data streams, apart from runs'
# How much data: about this many answers (the tables' cost), within these example counts
TRAIN_ANSWERS, TEST_ANSWERS = 400_000, 40_000
MIN_EXAMPLES, MAX_EXAMPLES = 500, 20_000
GENERIC_FAMILIES = ("windows", "fixed positions", "counts", "relabelled", "elimination")
FAMILIES = (*GENERIC_FAMILIES, "task's rules")

__all__ = ["MARGIN", "MIN_SEEN", "Audit", "Baseline", "audit", "chance", "shortcut_baselines"]


@dataclass(frozen=True)
class Audit:
    task: str
    difficulty: str
    control: bool
    chance: float
    baselines: tuple[Baseline, ...]
    computes: tuple[str, ...] = ()  # families that are the task's own computation

    @property
    def shortcuts(self) -> list[Baseline]:
        return [
            b
            for b in self.baselines
            if b.family not in self.computes and b.verdict(self.chance) == "shortcut"
        ]

    @property
    def passed(self) -> bool:
        return self.control or not self.shortcuts

    def best(self, family: str) -> Baseline | None:
        """The family's highest-scoring baseline (None: the family has none here)."""
        members = [b for b in self.baselines if b.family == family]
        return max(members, key=lambda b: b.score) if members else None

    def findings(self) -> list[str]:
        """One line per shortcut: the family, the baseline, its score and the chance line."""
        line = self.chance + MARGIN
        return [
            f"{self.task} ({self.difficulty}): {b.family}, {b.name}: {b.score:.2f} "
            f"> chance {self.chance:.2f} + {MARGIN} = {line:.2f}"
            for b in self.shortcuts
        ]


def examples_for(task: Task, answers: int) -> int:
    """How many examples hold about ``answers`` answers (within the example bounds)."""
    pilot = task.generate(64, torch.Generator().manual_seed(TEST_SEED))
    per_example = max(1.0, pilot.answer_mask.sum().item() / 64)
    return int(min(MAX_EXAMPLES, max(MIN_EXAMPLES, answers / per_example)))


def _audit_data(task: Task, train_answers: int, test_answers: int) -> tuple[Answers, Answers]:
    """The audit's training and test streams of ``task``."""
    train = task.generate(
        examples_for(task, train_answers), torch.Generator().manual_seed(TRAIN_SEED)
    )
    test = task.generate(examples_for(task, test_answers), torch.Generator().manual_seed(TEST_SEED))
    in_stream = task.answers_in_stream  # labels (State tasks): no input holds an answer
    return Answers.of(train, in_stream), Answers.of(test, in_stream)


def _position_constant(train: Answers, test: Answers) -> tuple[np.ndarray, np.ndarray]:
    """The best constant answer per position, at every test answer, and whether the
    position was answered in training (if not: the most frequent answer overall)."""
    table = shortcuts.fit(train.position, train.answer)
    constant, position_seen = shortcuts.lookup(table, test.position)
    return np.where(position_seen, constant, np.bincount(train.answer).argmax()), position_seen


@dataclass(frozen=True)
class Chance:
    """What the best constant answer per position scores: learning nothing."""

    token_acc: float
    exact_match: float


def chance(task: Task, train_answers: int = TRAIN_ANSWERS, test_answers: int = TEST_ANSWERS):
    """The task's chance (the audit's ``position`` baseline) in token accuracy and exact
    match; every run stores it, and reports normalise scores by it."""
    train, test = _audit_data(task, train_answers, test_answers)
    constant, _ = _position_constant(train, test)
    return Chance(test.score(constant == test.answer), test.exact_match(constant))


def shortcut_baselines(
    task: Task, train_answers: int = TRAIN_ANSWERS, test_answers: int = TEST_ANSWERS
) -> tuple[float, list[Baseline]]:
    """(chance, baselines): every generic family's baselines and the task's own rules."""
    unknown = set(task.computes) - set(GENERIC_FAMILIES)
    if unknown:
        raise ValueError(
            f"task {type(task).__name__} declares computes {sorted(unknown)}, not audit "
            f"families (families: {', '.join(GENERIC_FAMILIES)})"
        )
    train, test = _audit_data(task, train_answers, test_answers)
    constant, position_seen = _position_constant(train, test)
    streams = Streams(train, test, constant)
    chance = test.score(constant == test.answer)
    baselines = [Baseline("chance", "position", chance, float(position_seen.mean()))]
    baselines += shortcuts.windows(streams)
    baselines += shortcuts.fixed_positions(streams)
    baselines += shortcuts.counts(streams)
    baselines += shortcuts.relabelled(streams, task.vocab_size)
    baselines += shortcuts.elimination(streams, task.vocab_size)
    inputs = torch.from_numpy(test.inputs)
    for rule in task.shortcut_rules():
        predicted = rule.predict(inputs).numpy()[test.example, test.position]
        baselines.append(
            Baseline("task's rules", rule.name, test.score(predicted == test.answer), None)
        )
    return chance, baselines


def audit(
    name: str,
    difficulty: str = "default",
    train_answers: int = TRAIN_ANSWERS,
    test_answers: int = TEST_ANSWERS,
    **overrides,
) -> Audit:
    """Audit the registered task ``name`` at a difficulty preset (and parameter overrides)."""
    entry = TASKS.entry(name)
    task = entry.obj.from_difficulty(difficulty, **overrides)
    chance, baselines = shortcut_baselines(task, train_answers, test_answers)
    control = bool(entry.metadata.get("control"))
    return Audit(entry.name, difficulty, control, chance, tuple(baselines), tuple(task.computes))


def markdown_table(audits: list[Audit]) -> str:
    """One row per (task, difficulty): chance, each family's best score (``*``: a family
    that is the task's own computation, ``Task.computes``), the verdict."""
    lines = [
        "| task | preset | chance | " + " | ".join(FAMILIES) + " | verdict |",
        "|---|---|---|" + "---|" * len(FAMILIES) + "---|",
    ]
    for a in audits:
        cells = []
        for family in FAMILIES:
            best = a.best(family)
            mark = "*" if family in a.computes else ""
            cells.append("-" if best is None else f"{best.score:.2f}{mark}")
        if a.control:
            verdict = "control"
        elif a.shortcuts:
            verdict = "shortcut: " + ", ".join(f"{b.family} ({b.name})" for b in a.shortcuts)
        else:
            verdict = "ok"
        lines.append(
            f"| {a.task} | {a.difficulty} | {a.chance:.2f} | "
            + " | ".join(cells)
            + f" | {verdict} |"
        )
    return "\n".join(lines) + "\n"


def builtin_markdown_table() -> str:
    """The audit of every built-in task at every preset, by name (docs/TASKS.md embeds it)."""
    return markdown_table(
        [
            audit(e.name, preset)
            for e in sorted(TASKS.entries(), key=lambda e: e.name)
            if e.source == "builtin"
            for preset in e.obj.presets()
        ]
    )


if __name__ == "__main__":  # python -m synthbench.integrity.audit: the table for docs/TASKS.md
    print(builtin_markdown_table(), end="")
