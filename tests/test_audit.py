"""The task audit: count tables and features against plain-Python references, every shortcut
family on a toy task whose shortcut is known by construction, task rules, suite v2's leaky
layouts (flagged by the generic families alone), every built-in task, the command."""

from __future__ import annotations

import functools
import json
import random
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from synthbench.cli import app
from synthbench.core.task import IGNORE, TASKS, Batch, ShortcutRule, Task, teacher_forced
from synthbench.integrity import audit, shortcuts

SMALL = {"train_answers": 20_000, "test_answers": 4_000}


@pytest.mark.parametrize(
    "key_range, answer_range, n_keys",
    [
        ((0, 30), (0, 4), None),
        ((-(2**62), 2**62), (-1, 3), None),  # hashed keys are any int64; PAD < 0
        ((0, 30), (-1, 3), 40),  # codes below n_keys (ContextKeys), counted in a table
        ((0, 30), (0, 4), shortcuts.CHUNK),  # codes whose table would be too large: sorted
    ],
)
def test_fit_is_the_most_frequent_answer_per_key_smallest_on_ties(key_range, answer_range, n_keys):
    rng = random.Random(0)
    pool = [rng.randrange(*key_range) for _ in range(30)]
    keys = [rng.choice(pool) for _ in range(2000)]
    answers = [rng.randrange(*answer_range) for _ in range(2000)]
    table_keys, table_answers = shortcuts.fit(np.array(keys), np.array(answers), n_keys)
    assert table_keys.tolist() == sorted(set(keys))
    counts: dict[int, Counter] = {}
    for k, a in zip(keys, answers, strict=True):
        counts.setdefault(k, Counter())[a] += 1
    expected = {k: min(c, key=lambda a: (-c[a], a)) for k, c in counts.items()}
    assert dict(zip(table_keys.tolist(), table_answers.tolist(), strict=True)) == expected
    present, absent = keys[0], max(pool) + 1
    answer, found = shortcuts.lookup((table_keys, table_answers), np.array([present, absent]))
    assert found.tolist() == [True, False] and answer[0] == expected[present]


@pytest.mark.parametrize("spread", [1, 10**6])  # exact codes; a hash past CHUNK combinations
def test_context_keys_tell_rows_apart_and_mark_what_training_never_showed(spread):
    rng = np.random.default_rng(0)
    # PAD is -1; the last two rows are what the two unseen rows below would read as, in a
    # mixed radix without the check of each digit
    train = np.concatenate([rng.integers(-1, 5, size=(500, 3)), [[1, -1, 0], [-1, 4, 0]]])
    train = train * spread
    keys = shortcuts.ContextKeys(train)
    assert (keys.n_keys is None) == (spread > 1)
    train_keys = keys.train
    rows = [tuple(row) for row in train.tolist()]
    same = {}
    for row, key in zip(rows, train_keys.tolist(), strict=True):
        assert same.setdefault(row, key) == key  # a row has one key
    assert len(set(same.values())) == len(same)  # and no two rows share one
    if keys.n_keys is not None:
        assert min(same.values()) >= 0 and max(same.values()) < keys.n_keys
    test = np.array([train[0], [0, 5 * spread, 0], [0, -2 * spread, 0]])
    test_keys = keys.of(test).tolist()
    assert test_keys[0] == train_keys[0] and not set(test_keys[1:]) & set(same.values())


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
    answers = shortcuts.Answers.of(Batch(torch.tensor([[5, 6, 7]]), torch.tensor([[1, 1, 1]])))
    pad = shortcuts.PAD
    assert answers.window(3).tolist() == [[5, pad, pad], [6, 5, pad], [7, 6, 5]]
    assert answers.index.tolist() == [0, 1, 2]
    assert answers.is_answer.tolist() == [[False, True, True]]  # 6 and 7 were answers


def test_a_table_keeps_each_keys_most_frequent_answer_the_smallest_of_a_tie():
    keys = np.array([5, 5, 5, 2, 2, 9, 2, 2], dtype=np.int64)
    answers = np.array([1, 3, 3, 7, 4, 0, 4, 7])
    table_keys, table_answers = shortcuts.fit(keys, answers)
    assert table_keys.tolist() == [2, 5, 9] and table_answers.tolist() == [4, 3, 0]
    empty = shortcuts.fit(np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    assert [len(a) for a in empty] == [0, 0]
    assert not shortcuts.lookup(empty, np.array([2, 5]))[1].any()


def test_every_window_width_reads_the_same_tokens():
    """Windows up to the widest the families read are views of one; a wider one is built
    apart; each reads the tokens back from the answer, a pad before the start."""
    tokens = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]])
    answers = shortcuts.Answers.of(Batch(tokens, torch.ones_like(tokens)))
    pad, row = shortcuts.PAD, tokens[0].tolist()
    for width in (1, 3, shortcuts.WIDEST, shortcuts.WIDEST + 3):
        window = answers.window(width)
        expected = [[row[p - b] if p >= b else pad for b in range(width)] for p in range(len(row))]
        assert window.tolist() == expected, width
    assert not answers.window(4).flags.writeable  # a view of the shared one: never written


# -- the generic families, each on a toy built for it -----------------------------------------


@dataclass(frozen=True)
class BlockParams:
    rule: str = "first"
    vocab: int = 64
    blocks: int = 6


class Blocks(Task):
    """Blocks of 4 random tokens, each followed by one answer: 'first' the sequence's first
    token (a fixed position, at a lag that grows), 'count' how often the block's last token
    has occurred so far (as a token id), 'duplicate' the one value the block shows twice
    (in random slots: only its equality pattern tells), 'smallest' the smallest token of
    the sequence not yet answered (an elimination)."""

    Params = BlockParams

    @property
    def vocab_size(self):
        return self.params.vocab

    @property
    def seq_len(self):
        return 5 * self.params.blocks - 1

    def generate(self, n, generator, device="cpu"):
        p = self.params
        # distinct prompt tokens (but for the duplicate the rule plants)
        distinct = torch.rand(n, p.vocab, generator=generator).argsort(dim=1)[:, : 4 * p.blocks]
        blocks = distinct.view(n, p.blocks, 4).clone()
        if p.rule == "duplicate":  # one slot repeats another, both at random
            slots = torch.rand(n, p.blocks, 4, generator=generator).argsort(dim=2)
            source = blocks.gather(2, slots[:, :, :1])
            blocks.scatter_(2, slots[:, :, 1:2], source)
        s = torch.zeros(n, p.blocks, 5, dtype=torch.long)
        s[:, :, :4] = blocks
        flat = s.view(n, -1)
        for b in range(p.blocks):
            prefix = flat[:, : 5 * b + 4]
            if p.rule == "first":
                answer = flat[:, 0]
            elif p.rule == "count":
                answer = (prefix == prefix[:, -1:]).sum(dim=1)
            elif p.rule == "duplicate":
                answer = source[:, b, 0]
            else:  # smallest token of the prompt blocks not yet answered
                answered = flat[:, 4 : 5 * b : 5]
                prompt = torch.cat([flat[:, 5 * c : 5 * c + 4] for c in range(b + 1)], dim=1)
                done = (prompt.unsqueeze(2) == answered.unsqueeze(1)).any(2)
                left = prompt.masked_fill(done, p.vocab)
                answer = left.min(dim=1).values
            flat[:, 5 * b + 4] = answer
        mask = torch.zeros_like(flat, dtype=torch.bool)
        mask[:, 4::5] = True
        return teacher_forced(flat, mask)

    def solve(self, inputs):  # not needed by the audit
        raise NotImplementedError


@pytest.mark.parametrize(
    ("rule", "family"),
    [
        ("first", "fixed positions"),
        ("count", "counts"),
        ("duplicate", "relabelled"),
        ("smallest", "elimination"),
    ],
)
def test_each_family_finds_the_shortcut_it_is_built_for(rule, family):
    chance, found = scores(Blocks(rule=rule))
    best = {
        f: max(b.score for b in found.values() if b.family == f) for f in audit.GENERIC_FAMILIES
    }
    assert best[family] > 0.95, best
    if rule in ("first", "count"):  # what no raw window holds
        assert best["windows"] < chance + 0.2, best


def test_the_best_fixed_lag_is_chosen_on_training_data():
    chance, found = scores(Toy(rule="back2"))  # the answer is the token read before last
    assert found["lag 1"].score == 1.0 and found["lag 1"].family == "fixed positions"


def test_occurrence_counts_against_python():
    rng = np.random.default_rng(0)
    # PAD is negative; large ids; ids further apart than a table of every id would hold
    for low, high in ((0, 5), (-1, 3), (100, 400), (0, 70_000), (0, 2**40)):
        inputs = rng.integers(low, high, size=(7, 30))
        expected = [[list(row[: i + 1]).count(row[i]) for i in range(30)] for row in inputs]
        assert shortcuts.occurrences(inputs).tolist() == expected


def test_elimination_against_python():
    """The remaining multiset: prompt tokens read so far minus the answers given, among the
    answer vocabulary; argmax (smallest id on ties) and the share of the answer in it."""
    rng = np.random.default_rng(1)
    n, L = 40, 16
    inputs = torch.from_numpy(rng.integers(0, 6, size=(n, L)))
    targets = torch.where(torch.from_numpy(rng.random((n, L)) < 0.4), inputs.roll(-1, 1), IGNORE)
    targets[:, -1] = IGNORE
    train = test = shortcuts.Answers.of(Batch(inputs, targets))
    streams = shortcuts.Streams(train, test, np.zeros(len(test), dtype=np.int64))
    argmax, draw = shortcuts.elimination(streams, 6)
    vocab = set(test.answer.tolist())
    rights, shares = [], []
    for e, i, a in zip(test.example, test.position, test.answer, strict=True):
        bag = Counter()
        for p in range(i + 1):
            given = p > 0 and targets[e, p - 1] != IGNORE
            bag[int(inputs[e, p])] += -1 if given else 1
        bag = {t: max(c, 0) for t, c in bag.items() if t in vocab and c > 0}
        total = sum(bag.values())
        guess = min(bag, key=lambda t: (-bag[t], t)) if total else 0
        rights.append(guess == a)
        shares.append(bag.get(int(a), 0) / total if total else float(a == 0))
    assert argmax.score == pytest.approx(test.score(np.array(rights)))
    assert draw.score == pytest.approx(test.score(np.array(shares)))


def test_row_keys_tell_every_distinct_context_apart():
    rng = np.random.default_rng(2)
    rows = np.unique(rng.integers(-2, 300, size=(200_000, 8)), axis=0)
    assert len(np.unique(shortcuts.row_keys(rows))) == len(rows)


def test_a_family_a_task_computes_is_shown_but_is_no_shortcut():
    result = audit.audit("copy", **SMALL)  # copy is a fixed-offset copy by definition
    assert result.best("fixed positions").score == 1.0 and result.passed
    assert "1.00*" in audit.markdown_table([result])

    class Claims(Toy):
        computes = {"magic": "no such family"}

    with pytest.raises(
        ValueError, match=r"Claims declares computes \['magic'\], .* \(families: windows"
    ):
        audit.shortcut_baselines(Claims(), **SMALL)


LEAKY_FIXTURES = Path(__file__).parent / "fixtures" / "leaky_tasks.py"


@pytest.mark.slow
def test_suite_v2s_leaky_layouts_are_flagged_by_the_generic_families():
    """Each fixture is flagged by the generic family that finds its rule, not only by the
    task's own rules (a plugin has none), with a line naming family, score and chance."""
    code = (
        "import runpy, json\n"
        "from synthbench.core.task import TASKS\n"
        "from synthbench.integrity.audit import audit\n"
        f"runpy.run_path({str(LEAKY_FIXTURES)!r})\n"
        "out = {}\n"
        "for e in TASKS.entries():\n"
        "    if e.name.startswith('leaky-'):\n"
        "        a = audit(e.name, train_answers=100_000, test_answers=20_000)\n"
        "        out[e.name] = [e.metadata['leaky_family'], [b.family for b in a.shortcuts],"
        " a.findings()]\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(found) == 5
    for name, (family, flagged, lines) in found.items():
        assert family in flagged, (name, flagged)
        assert any(line.startswith(f"{name} (default): {family}, ") for line in lines)
        assert all("> chance" in line for line in lines)


# -- every built-in task ---------------------------------------------------------------------


def builtin_cases() -> list:
    """Every preset of every built-in task (ladder levels included), at full size: the slow
    tier, each case on a worker of its own (pytest-xdist: an audit at full size takes
    seconds). Presets that resolve to the same parameters (a difficulty that is also a ladder
    level: 135 presets, 117 settings) are one case, audited once: an audit reads the task's
    parameters, not its preset's name. The fast tier audits at small sizes above."""
    settings: dict[tuple[str, str], list[str]] = {}
    for name in sorted(TASKS.names()):
        if TASKS.entry(name).source == "builtin":
            task = TASKS.get(name)
            for preset in task.presets():
                params = json.dumps(task.from_difficulty(preset).param_dict(), sort_keys=True)
                settings.setdefault((name, params), []).append(preset)
    return [
        pytest.param(
            name,
            tuple(presets),
            id=f"{name}-{'='.join(presets)}",
            marks=(pytest.mark.slow, pytest.mark.xdist_group(f"audit-{presets[0]}")),
        )
        for (name, _), presets in settings.items()
    ]


TASKS_DOC = Path(__file__).parents[1] / "docs" / "TASKS.md"
REGENERATE = "regenerate: python -m synthbench.integrity.audit"


@functools.cache  # read once per worker, not once per audited preset
def docs_audit_rows() -> tuple[str, ...]:
    """The rows of docs/TASKS.md's audit table, header lines first."""
    lines = TASKS_DOC.read_text().splitlines()
    header = audit.markdown_table([]).splitlines()[0]
    start = lines.index(header)
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return tuple(lines[start:end])


@pytest.mark.parametrize(("name", "presets"), builtin_cases())
def test_no_builtin_task_has_a_shortcut_and_the_docs_show_its_audit(name, presets):
    result = audit.audit(name, presets[0])  # at the sizes `synthbench audit` uses
    if not result.control:  # a control task is one by its shortcut
        assert not result.shortcuts, [(b.name, round(b.score, 3)) for b in result.shortcuts]
    assert result.passed
    for preset in presets:
        (row,) = audit.markdown_table([replace(result, difficulty=preset)]).splitlines()[2:]
        assert row in docs_audit_rows(), REGENERATE


def test_the_docs_audit_table_holds_every_builtin_preset_once_in_order():
    """Its rows are the registered presets, as builtin_markdown_table orders them (each
    row's figures are checked by the case above that audits it)."""
    header, rule, *rows = docs_audit_rows()
    assert [header, rule] == audit.markdown_table([]).splitlines()
    shown = [tuple(cell.strip() for cell in row.strip("|").split("|")[:2]) for row in rows]
    expected = [
        (e.name, preset)
        for e in sorted(TASKS.entries(), key=lambda e: e.name)
        if e.source == "builtin"
        for preset in e.obj.presets()
    ]
    assert shown == expected, REGENERATE


def test_a_control_task_passes_with_its_shortcut():
    result = audit.audit("bigram", **SMALL)
    assert result.control and result.shortcuts and result.passed


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
    assert result.exit_code == 1 and "shortcut: windows (token)" in result.output
    assert "sort (default): windows, token: 0.5" in result.output  # a finding per line
    result = cli_runner.invoke(app, ["audit", "srot"])
    assert result.exit_code == 2 and "did you mean sort" in result.output
    result = cli_runner.invoke(app, ["audit", "sort", "--difficulty", "medium"])
    assert result.exit_code == 2 and "presets: default, easy, hard" in result.output
