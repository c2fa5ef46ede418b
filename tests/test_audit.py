"""The task audit: count tables against a plain-Python reference, baselines on toy tasks whose
shortcut is known by construction, task rules, every built-in task, the command."""

from __future__ import annotations

import functools
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from synthbench.cli import app
from synthbench.core.task import TASKS, ShortcutRule, Task, teacher_forced
from synthbench.integrity import audit

SMALL = {"train_answers": 20_000, "test_answers": 4_000}


def test_fit_is_the_most_frequent_answer_per_key_smallest_on_ties():
    rng = random.Random(0)
    keys = [rng.randrange(30) for _ in range(2000)]
    answers = [rng.randrange(4) for _ in range(2000)]
    table_keys, table_answers = audit._fit(np.array(keys), np.array(answers))
    counts: dict[int, Counter] = {}
    for k, a in zip(keys, answers, strict=True):
        counts.setdefault(k, Counter())[a] += 1
    expected = {k: min(c, key=lambda a: (-c[a], a)) for k, c in counts.items()}
    assert dict(zip(table_keys.tolist(), table_answers.tolist(), strict=True)) == expected
    answer, found = audit._lookup((table_keys, table_answers), np.array([3, 99]))
    assert found.tolist() == [3 in expected, False]


@dataclass(frozen=True)
class ToyParams:
    rule: str = "token"
    vocab: int = 8
    length: int = 12


class Toy(Task):
    """Random tokens; every position from 2 on is an answer, the next token set by ``rule``:
    'token' f(current token), 'back2' the token two back, 'position' f(position), 'noise'
    uniform and independent of everything."""

    Params = ToyParams

    @property
    def vocab_size(self):
        return self.params.vocab

    @property
    def seq_len(self):
        return self.params.length

    def generate(self, n, generator, device="cpu"):
        p = self.params
        s = torch.randint(p.vocab, (n, p.length + 1), generator=generator)
        for i in range(3, p.length + 1):
            if p.rule == "token":
                s[:, i] = (3 * s[:, i - 1] + 1) % p.vocab
            elif p.rule == "back2":
                s[:, i] = s[:, i - 2]
            elif p.rule == "position":
                s[:, i] = i % p.vocab
        mask = torch.zeros_like(s, dtype=torch.bool)
        mask[:, 3:] = True
        return teacher_forced(s, mask)

    def solve(self, inputs):  # not needed by the audit
        raise NotImplementedError


def scores(task: Task) -> tuple[float, dict[str, audit.Baseline]]:
    chance, baselines = audit.shortcut_baselines(task, **SMALL)
    return chance, {b.name: b for b in baselines}


def test_a_function_of_the_current_token_is_found_by_every_table_but_position():
    chance, found = scores(Toy(rule="token"))
    assert chance < 0.25
    for name in ("token", "position x token", "last 2", "last 4"):
        assert found[name].score == 1.0 and found[name].verdict(chance) == "shortcut"
    assert found["position"].score == chance


def test_a_token_two_back_needs_a_window_of_two():
    chance, found = scores(Toy(rule="back2"))
    assert found["token"].score < chance + 0.1
    assert found["last 2"].score == found["last 4"].score == 1.0


def test_a_position_rule_is_chance_itself():
    chance, found = scores(Toy(rule="position"))
    assert chance == 1.0  # the best constant answer per position


def test_noise_is_chance_and_thin_tables_are_not_called_weak():
    chance, found = scores(Toy(rule="noise", vocab=64))
    assert abs(chance - 1 / 64) < 0.02
    assert all(b.score < chance + 0.05 for b in found.values())
    assert found["token"].seen == 1.0 and found["token"].verdict(chance) == "weak"
    # 64^4 contexts: most test windows were never seen, so the table proves nothing
    assert found["last 4"].seen < audit.MIN_SEEN
    assert found["last 4"].verdict(chance) == "undersampled"


class ToyWithRules(Toy):
    def shortcut_rules(self):
        def oracle(inputs: torch.Tensor) -> torch.Tensor:
            return (3 * inputs + 1) % self.params.vocab

        return [
            ShortcutRule("oracle", "what the toy computes", oracle),
            ShortcutRule("zero", "always 0", torch.zeros_like),
        ]


def test_a_task_rule_is_scored_at_the_answers():
    chance, found = scores(ToyWithRules(rule="token", vocab=8))
    assert found["oracle"].score == 1.0 and found["oracle"].seen is None
    assert abs(found["zero"].score - 1 / 8) < 0.02


def test_a_window_before_the_sequence_start_is_a_pad_not_a_token():
    inputs = torch.tensor([[5, 6, 7]])
    targets = torch.tensor([[1, 1, 1]])
    answers = audit._Answers.of(inputs, targets)
    base = 9  # 8 token ids and the pad; the token just read is the leading digit
    assert answers.window(2, base).tolist() == [5 * base + 8, 6 * base + 5, 7 * base + 6]


# -- every built-in task ---------------------------------------------------------------------

BUILTIN_CASES = [
    pytest.param(name, preset, id=f"{name}-{preset}")
    for name in TASKS.names()
    if TASKS.entry(name).source == "builtin" and not TASKS.entry(name).metadata.get("control")
    for preset in TASKS.get(name).presets()
]


@functools.cache
def builtin_audit(name: str, preset: str) -> audit.Audit:
    return audit.audit(name, preset)  # at the sizes `synthbench audit` uses


@pytest.mark.parametrize(("name", "preset"), BUILTIN_CASES)
def test_no_builtin_task_has_a_shortcut(name, preset):
    result = builtin_audit(name, preset)
    assert not result.shortcuts, [(b.name, round(b.score, 3)) for b in result.shortcuts]
    assert result.passed


def test_a_control_task_passes_with_its_shortcut():
    result = audit.audit("bigram", **SMALL)
    assert result.control and result.shortcuts and result.passed


def test_the_docs_show_the_audit_of_every_builtin_task():
    audits = [
        builtin_audit(e.name, preset)
        for e in sorted(TASKS.entries(), key=lambda e: e.name)
        if e.source == "builtin"
        for preset in e.obj.presets()
    ]
    docs = (Path(__file__).parents[1] / "docs" / "TASKS.md").read_text()
    assert audit.markdown_table(audits) in docs, "regenerate: python -m synthbench.integrity.audit"


# -- the command -----------------------------------------------------------------------------


def test_audit_command():
    cli_runner = CliRunner(env={"COLUMNS": "250"})
    result = cli_runner.invoke(app, ["audit", "bigram", "--difficulty", "easy"])
    assert result.exit_code == 0, result.output
    assert "| bigram | easy |" in result.output and "control" in result.output
    result = cli_runner.invoke(app, ["audit", "sort", "--difficulty", "default", "--check"])
    assert result.exit_code == 0 and "| sort | default |" in result.output
    v1_sort = ["audit", "sort", "--difficulty", "default", "--param", "vocab=32", "--check"]
    result = cli_runner.invoke(app, v1_sort)  # suite v1's sort: y + 1 after y
    assert result.exit_code == 1 and "shortcut: token" in result.output
    result = cli_runner.invoke(app, ["audit", "srot"])
    assert result.exit_code == 2 and "did you mean sort" in result.output
    result = cli_runner.invoke(app, ["audit", "sort", "--difficulty", "medium"])
    assert result.exit_code == 2 and "presets: default, easy, hard" in result.output
