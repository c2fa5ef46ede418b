"""Task audit: how much of a task can be answered without the computation it is meant to test.

From generated data the audit fits count tables ("shortcut baselines") that see only part of
what precedes an answer, and scores them on fresh data with the task's own metric (token
accuracy, averaged per example, then over examples):

- ``position``: the answer's position alone. Its score is the task's *chance*: the best
  constant answer per position, not a uniform guess.
- ``token``: the token just read (the one at the answer's input position) alone.
- ``position x token``: both jointly: what a model without token mixing (``none``) can reach.
- ``last 2`` and ``last 4``: the window of the last 2 (4) tokens read.

Each table predicts, for a context, the answer seen most often with it in training (ties:
the smallest token id). A context never seen in training backs off to a shorter one (last 4
-> last 3 -> last 2 -> token), and finally to the position's constant, so no baseline scores
below chance for want of data. ``seen`` is the share of test answers whose full context
occurs in training: below :data:`MIN_SEEN` the table is undersampled and the audit does not
call the baseline weak.

A task may also declare its own shortcut rules (``Task.shortcut_rules``): fixed functions of
the causal prefix that ignore what the task tests (copying an earlier answer, elimination,
the mode). The audit scores them the same way. A task passes when every baseline and rule
scores at most ``chance + MARGIN``; a control task (registered with ``control=True``, one
that needs no token mixing) is exempt by design.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from synthbench.core.task import IGNORE, TASKS, Task

MARGIN = 0.2  # a baseline above chance + MARGIN is a shortcut
MIN_SEEN = 0.9  # below this share of seen test contexts a table cannot show a baseline weak
TRAIN_SEED, TEST_SEED = 0xA0D17, 0xA0D18  # the audit's own data streams, apart from runs'
# How much data: about this many answers (the tables' cost), within these example counts
TRAIN_ANSWERS, TEST_ANSWERS = 400_000, 40_000
MIN_EXAMPLES, MAX_EXAMPLES = 500, 20_000


@dataclass(frozen=True)
class Baseline:
    name: str
    score: float  # token accuracy on the test data
    seen: float | None  # share of test answers whose full context was seen (None: a rule)

    def verdict(self, chance: float) -> str:
        if self.score > chance + MARGIN:
            return "shortcut"
        if self.seen is not None and self.seen < MIN_SEEN:
            return "undersampled"
        return "weak"


@dataclass(frozen=True)
class Audit:
    task: str
    difficulty: str
    control: bool
    chance: float
    baselines: tuple[Baseline, ...]

    @property
    def shortcuts(self) -> list[Baseline]:
        return [b for b in self.baselines if b.verdict(self.chance) == "shortcut"]

    @property
    def passed(self) -> bool:
        return self.control or not self.shortcuts


# -- count tables ----------------------------------------------------------------------------


def _fit(keys: np.ndarray, answers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The most frequent answer of every key (ties: the smallest answer), keys sorted."""
    order = np.lexsort((answers, keys))
    k, a = keys[order], answers[order]
    starts = np.flatnonzero(np.r_[True, (k[1:] != k[:-1]) | (a[1:] != a[:-1])])
    counts = np.diff(np.r_[starts, len(k)])
    pair_keys, pair_answers = k[starts], a[starts]
    best = np.lexsort((pair_answers, -counts, pair_keys))  # per key: most counts first
    pair_keys, pair_answers = pair_keys[best], pair_answers[best]
    first = np.r_[True, pair_keys[1:] != pair_keys[:-1]]
    return pair_keys[first], pair_answers[first]


def _lookup(
    table: tuple[np.ndarray, np.ndarray], keys: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(answer, found) for every key; answer is meaningless where not found."""
    table_keys, table_answers = table
    if len(table_keys) == 0:
        return np.zeros_like(keys), np.zeros(len(keys), dtype=bool)
    index = np.minimum(np.searchsorted(table_keys, keys), len(table_keys) - 1)
    return table_answers[index], table_keys[index] == keys


@dataclass(frozen=True)
class _Answers:
    """The answer positions of a batch, flattened: example, position, answer."""

    example: np.ndarray
    position: np.ndarray
    answer: np.ndarray
    inputs: np.ndarray  # (n, L)

    @classmethod
    def of(cls, inputs: torch.Tensor, targets: torch.Tensor) -> _Answers:
        example, position = (targets != IGNORE).nonzero(as_tuple=True)
        return cls(
            example.numpy(),
            position.numpy(),
            targets[example, position].numpy(),
            inputs.numpy(),
        )

    def window(self, width: int, base: int) -> np.ndarray:
        """A key for the last ``width`` tokens read (a pad token before the sequence)."""
        key = np.zeros(len(self.position), dtype=np.int64)
        for back in range(width):
            column = self.position - back
            token = np.where(
                column >= 0, self.inputs[self.example, np.maximum(column, 0)], base - 1
            )
            key = key * base + token
        return key

    def score(self, predicted: np.ndarray) -> float:
        """Token accuracy: the mean over examples of the share of right answers."""
        return float(self._per_example(predicted).mean())

    def exact_match(self, predicted: np.ndarray) -> float:
        """The share of examples whose every answer is right."""
        return float((self._per_example(predicted) == 1).mean())

    def _per_example(self, predicted: np.ndarray) -> np.ndarray:
        n_examples = self.inputs.shape[0]
        right = np.bincount(self.example, predicted == self.answer, minlength=n_examples)
        total = np.bincount(self.example, minlength=n_examples)
        answered = total > 0
        return right[answered] / total[answered]


# Each baseline's back-off chain of contexts, longest first (then the position's constant)
BACKOFF = {
    "token": ("token",),
    "position x token": ("position x token",),
    "last 2": ("last 2", "token"),
    "last 4": ("last 4", "last 3", "last 2", "token"),
}


def _contexts(answers: _Answers, vocab_size: int) -> dict[str, np.ndarray]:
    """The key of every context a back-off chain uses, per answer."""
    base = vocab_size + 1  # token ids and a pad before the sequence
    if base**4 >= 2**62:
        raise ValueError(f"vocabulary of {vocab_size} tokens too large for the window keys")
    token = answers.window(1, base)
    return {
        "token": token,
        "position x token": answers.position * base + token,
        **{f"last {width}": answers.window(width, base) for width in (2, 3, 4)},
    }


def examples_for(task: Task, answers: int) -> int:
    """How many examples hold about ``answers`` answers (within the example bounds)."""
    pilot = task.generate(64, torch.Generator().manual_seed(TEST_SEED))
    per_example = max(1.0, pilot.answer_mask.sum().item() / 64)
    return int(min(MAX_EXAMPLES, max(MIN_EXAMPLES, answers / per_example)))


def _audit_data(task: Task, train_answers: int, test_answers: int):
    """The audit's training and test data of ``task`` (its own seeds, apart from runs')."""
    train_gen = torch.Generator().manual_seed(TRAIN_SEED)
    train_batch = task.generate(examples_for(task, train_answers), train_gen)
    test_gen = torch.Generator().manual_seed(TEST_SEED)
    test_batch = task.generate(examples_for(task, test_answers), test_gen)
    train = _Answers.of(train_batch.inputs, train_batch.targets)
    test = _Answers.of(test_batch.inputs, test_batch.targets)
    return train, test, test_batch


def _position_constant(train: _Answers, test: _Answers) -> tuple[np.ndarray, np.ndarray]:
    """The best constant answer per position, at every test answer, and whether the
    position was answered in training (if not: the most frequent answer overall)."""
    constant, position_seen = _lookup(_fit(train.position, train.answer), test.position)
    return np.where(position_seen, constant, np.bincount(train.answer).argmax()), position_seen


@dataclass(frozen=True)
class Chance:
    """What the best constant answer per position scores: learning nothing."""

    token_acc: float
    exact_match: float


def chance(task: Task, train_answers: int = TRAIN_ANSWERS, test_answers: int = TEST_ANSWERS):
    """The task's chance (the audit's ``position`` baseline) in token accuracy and exact
    match; every run stores it, and reports normalise scores by it."""
    train, test, _ = _audit_data(task, train_answers, test_answers)
    constant, _ = _position_constant(train, test)
    return Chance(test.score(constant), test.exact_match(constant))


def shortcut_baselines(
    task: Task, train_answers: int = TRAIN_ANSWERS, test_answers: int = TEST_ANSWERS
) -> tuple[float, list[Baseline]]:
    """(chance, baselines): the count-table baselines and the task's own rules."""
    train, test, test_batch = _audit_data(task, train_answers, test_answers)
    constant, position_seen = _position_constant(train, test)
    chance = test.score(constant)

    baselines = [Baseline("position", chance, float(position_seen.mean()))]
    train_keys = _contexts(train, task.vocab_size)
    # every context's table, fitted once: (answer, found) per test answer
    looked_up = {
        context: _lookup(_fit(train_keys[context], train.answer), test_keys)
        for context, test_keys in _contexts(test, task.vocab_size).items()
    }
    for name, chain in BACKOFF.items():
        predicted, decided = constant.copy(), np.zeros(len(constant), dtype=bool)
        for context in chain:
            answer, found = looked_up[context]
            take = found & ~decided
            predicted[take] = answer[take]
            decided |= found
        found = looked_up[chain[0]][1]  # the full context, before any back-off
        seen = float(found.mean()) if len(found) else 0.0
        baselines.append(Baseline(name, test.score(predicted), seen))

    for rule in task.shortcut_rules():
        predicted = rule.predict(test_batch.inputs).numpy()[test.example, test.position]
        baselines.append(Baseline(rule.name, test.score(predicted), None))
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
    return Audit(
        entry.name, difficulty, bool(entry.metadata.get("control")), chance, tuple(baselines)
    )


def markdown_table(audits: list[Audit]) -> str:
    """One row per (task, difficulty): chance, every baseline's score, the verdict."""
    names = list(dict.fromkeys(b.name for a in audits for b in a.baselines if b.seen is not None))
    lines = [
        "| task | preset | chance | "
        + " | ".join(n for n in names if n != "position")
        + " | task's rules | verdict |",
        "|---|---|---|" + "---|" * (len(names) - 1) + "---|---|",
    ]
    for a in audits:
        tables = {b.name: b for b in a.baselines if b.seen is not None}
        rules = [b for b in a.baselines if b.seen is None]
        cells = [
            f"{tables[n].score:.2f}" + (" (u)" if tables[n].seen < MIN_SEEN else "")
            if n in tables
            else "-"
            for n in names
            if n != "position"
        ]
        rule_cells = ", ".join(f"{b.name} {b.score:.2f}" for b in rules) or "-"
        if a.control:
            verdict = "control"
        elif a.shortcuts:
            verdict = "shortcut: " + ", ".join(b.name for b in a.shortcuts)
        else:
            verdict = "ok"
        lines.append(
            f"| {a.task} | {a.difficulty} | {a.chance:.2f} | "
            + " | ".join(cells)
            + f" | {rule_cells} | {verdict} |"
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
