"""sort, reverse, long_copy, first_token, distant_match, induction and pattern: layouts
against plain-Python references, vocabularies, parameter validation, and property tests over
the knobs (the generic checks of every registered task live in test_tasks.py)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tasks import answered, check_batch, generator, rows, seeds

from synthbench.core.task import IGNORE, TASKS


def answers_at(target: list[int], positions) -> bool:
    """Targets are IGNORE exactly outside ``positions``."""
    positions = set(positions)
    return all((t != IGNORE) == (i in positions) for i, t in enumerate(target))


def check_causal(task, inputs: torch.Tensor, seed: int) -> None:
    """Garbage after a cut point leaves the oracle's answers up to it unchanged."""
    g = generator(seed)
    solved = task.solve(inputs)
    L = inputs.shape[1]
    for t in torch.randint(L, (3,), generator=g).tolist():
        scrambled = inputs.clone()
        scrambled[:, t + 1 :] = torch.randint(
            task.vocab_size, (len(inputs), L - t - 1), generator=g
        )
        assert torch.equal(task.solve(scrambled)[:, : t + 1], solved[:, : t + 1])


# -- sort ---------------------------------------------------------------------------------


def test_sort_layout():
    task = TASKS.get("sort")(n=6, vocab=9)
    assert task.vocab_size == 10 and task.seq_len == 12 and task.sep == 9
    for row, target in rows(task):
        x = row[:6]
        assert len(set(x)) == 6 and all(0 <= t < 9 for t in x) and row[6] == 9
        expected, previous = [], -1
        for _ in range(6):  # the smallest token of x above the previous answer
            previous = min(t for t in x if t > previous)
            expected.append(previous)
        assert target[6:] == expected and row[7:] == expected[:-1]
        assert answers_at(target, range(6, 12))
    assert [task.token_name(t) for t in (0, 8, 9)] == ["0", "8", "SEP"]


def test_sort_presets_and_length():
    assert TASKS.get("sort").from_difficulty("hard").param_dict() == {"n": 32, "vocab": 256}
    assert TASKS.get("sort")().at_length(2).param_dict() == {"n": 32, "vocab": 128}
    with pytest.raises(ValueError, match="sort"):
        TASKS.get("sort")().at_length(16)  # 256 distinct tokens out of 128


# -- reverse ------------------------------------------------------------------------------


def test_reverse_layout():
    task = TASKS.get("reverse")(n=7, vocab=3)
    assert task.vocab_size == 4 and task.seq_len == 14 and task.sep == 3
    for row, target in rows(task):
        x = row[:7]
        assert all(0 <= t < 3 for t in x) and row[7] == 3
        assert target[7:] == [x[7 - 1 - j] for j in range(7)] and row[8:] == target[7:-1]
        assert answers_at(target, range(7, 14))
    assert [task.token_name(t) for t in (2, 3)] == ["2", "SEP"]


# -- long_copy ----------------------------------------------------------------------------


def test_long_copy_is_copy_with_longer_defaults():
    cls, copy = TASKS.get("long_copy"), TASKS.get("copy")
    assert issubclass(cls, copy) and TASKS.entry("long_copy").metadata["category"] == "Long-Range"
    assert cls().param_dict() == {"n": 128, "vocab": 32}
    assert cls.from_difficulty("easy").params.n == 64
    assert cls.from_difficulty("hard").params.n == 256
    assert cls.length_param == "n" and cls().at_length(2).params.n == 256
    task = cls(n=5, vocab=4)
    assert task.vocab_size == 5 and task.seq_len == 10 and task.token_name(4) == "SEP"
    for row, target in rows(task):
        assert row[5] == 4 and target[5:] == row[:5] and answers_at(target, range(5, 10))


# -- first_token --------------------------------------------------------------------------


def test_first_token_layout():
    task = TASKS.get("first_token")(n=9, vocab=5)
    assert task.vocab_size == 6 and task.seq_len == 10 and task.sep == 5
    for row, target in rows(task):
        assert all(0 <= t < 5 for t in row[:9]) and row[9] == 5
        assert target[9] == row[0] and answers_at(target, [9])
    assert task.token_name(5) == "SEP"


# -- distant_match ------------------------------------------------------------------------


def test_distant_match_dense_layout():
    task = TASKS.get("distant_match")(n=10, vocab=4, probes=3)
    assert task.vocab_size == 7 and task.seq_len == 16
    verdicts = Counter()
    for row, target in rows(task, n=400):
        full = row + [target[-1]]
        x, probes = full[:10], full[11::2]
        assert all(0 <= t < 4 for t in x + probes) and full[10] == 4
        expected = {11 + 2 * j: 6 if probes[j] == x[j] else 5 for j in range(3)}
        assert answered(target) == expected
        verdicts.update(expected.values())
    assert 0.45 < verdicts[6] / sum(verdicts.values()) < 0.55


def test_distant_match_one_answer_layout():
    """probes=0: suite v1's layout."""
    task = TASKS.get("distant_match")(n=10, vocab=4, probes=0)
    assert task.vocab_size == 7 and task.seq_len == 11
    assert (task.sep, task.no, task.yes) == (4, 5, 6)
    assert [task.token_name(t) for t in (3, 4, 5, 6)] == ["3", "SEP", "NO", "YES"]
    for row, target in rows(task):
        assert all(0 <= t < 4 for t in row[:10]) and row[10] == 4
        assert target[10] == (6 if row[0] == row[9] else 5) and answers_at(target, [10])


def test_distant_match_classes_are_balanced():
    task = TASKS.get("distant_match")(n=6, vocab=5, probes=0)
    data = rows(task, n=4000, seed=1)
    verdicts = Counter(target[6] for _, target in data)
    assert 0.45 < verdicts[task.yes] / len(data) < 0.55
    # a NO example's last token is any token other than the first, each about equally often
    others = Counter((row[5] - row[0]) % 5 for row, target in data if target[6] == task.no)
    assert sorted(others) == [1, 2, 3, 4] and min(others.values()) > 0.2 * verdicts[task.no]


# -- induction ----------------------------------------------------------------------------


def test_induction_one_answer_layout():
    """dense=False: suite v1's layout."""
    task = TASKS.get("induction")(n=8, vocab=5, dense=False)
    assert task.vocab_size == 5 and task.seq_len == 8
    first_positions = Counter()
    for row, target in rows(task, n=500):
        a = row[-1]
        where = [i for i, t in enumerate(row) if t == a]
        assert len(where) == 2 and where[1] == 7 and where[0] <= 8 - 3
        first_positions[where[0]] += 1
        assert target[7] == row[where[0] + 1] != a and answers_at(target, [7])
    assert sorted(first_positions) == list(range(6))  # every p in [0, n-3] occurs
    assert task.token_name(4) == "4"


def test_induction_smallest():
    task = TASKS.get("induction")(n=3, vocab=2, dense=False)
    for row, target in rows(task):
        assert row[0] == row[2] != row[1] and target == [IGNORE, IGNORE, row[1]]


def test_induction_dense_layout():
    task = TASKS.get("induction")(n=20, vocab=12, keys=4, triggers=2, repeats=3, fixed_repeats=True)
    assert task.vocab_size == 12 and task.seq_len == 19
    for row, target in rows(task, n=300):
        full = row + [target[-1]]  # the last token is known where it is an answer
        places = [i for i, t in enumerate(full) if 0 <= t < 4]  # key tokens
        keys = Counter(full[i] for i in places)
        assert len(keys) == 2 and set(keys.values()) == {3}
        successor = {}
        expected = {}
        for i in places:
            if full[i + 1] == IGNORE:  # the unasked last token: a first successor
                assert full[i] not in successor
                continue
            assert 4 <= full[i + 1] < 12  # followed by a filler token, the same every time
            if full[i] in successor:
                assert full[i + 1] == successor[full[i]]
                expected[i] = full[i + 1]
            successor[full[i]] = full[i + 1]
        assert answered(target) == expected and len(expected) == 4


def test_induction_random_occurrences():
    """Suite v3: every key once, the other occurrences to keys drawn at random, so counts
    vary; every repeat is still answered with the successor of the key's first occurrence."""
    task = TASKS.get("induction")(n=40, vocab=16, keys=6, triggers=4, repeats=2)
    counts = Counter()
    for row, target in rows(task, n=300):
        full = row + [target[-1]]
        keys = Counter(t for t in full if 0 <= t < 6)
        assert len(keys) == 4 and sum(keys.values()) == 8
        counts.update(keys.values())
        successor, expected = {}, {}
        for i, t in enumerate(full[:-1]):
            if 0 <= t < 6:
                if t in successor:
                    expected[i] = successor[t]
                successor.setdefault(t, full[i + 1])
        assert answered(target) == expected and len(expected) == 4
    assert {1, 2, 3} <= set(counts)  # some keys once, some twice, some more


def test_induction_dense_needs_room():
    with pytest.raises(ValueError, match="n >= 2 \\* triggers \\* repeats"):
        TASKS.get("induction")(n=10, triggers=2, repeats=3)
    with pytest.raises(ValueError, match="triggers <= keys < vocab"):
        TASKS.get("induction")(keys=64)


# -- pattern ------------------------------------------------------------------------------


def smallest_period(prompt: list[int]) -> int:
    return next(
        q
        for q in range(1, len(prompt) + 1)
        if all(prompt[i] == prompt[i - q] for i in range(q, len(prompt)))
    )


def test_pattern_layout():
    task = TASKS.get("pattern")(n=12, min_period=2, max_period=5, k=7, vocab=6)
    assert task.vocab_size == 7 and task.seq_len == 19 and task.sep == 6
    periods = Counter()
    for row, target in rows(task, n=300):
        prompt = row[:12]
        q = smallest_period(prompt)
        periods[q] += 1
        motif = prompt[:q]
        assert len(set(motif)) == q and all(0 <= t < 6 for t in motif) and row[12] == 6
        assert target[12:] == [motif[(12 + j) % q] for j in range(7)]
        assert row[13:] == target[12:-1] and answers_at(target, range(12, 19))
    assert sorted(periods) == [2, 3, 4, 5]
    assert task.token_name(6) == "SEP"


def test_pattern_presets():
    cls = TASKS.get("pattern")
    default = cls().params
    assert (default.n, default.min_period, default.max_period, default.k) == (64, 20, 32, 16)
    easy = cls.from_difficulty("easy").params  # suite v2's first default, longer periods
    assert (easy.n, easy.min_period, easy.max_period, easy.k, easy.vocab) == (32, 9, 16, 8, 16)
    hard = cls.from_difficulty("hard").params
    assert (hard.min_period, hard.max_period, hard.vocab, hard.n) == (40, 64, 128, 128)
    assert cls.length_param == "n" and cls().at_length(2).params.n == 128


# -- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("sort", {"n": 0}),
        ("sort", {"vocab": 1, "n": 1}),
        ("sort", {"n": 33, "vocab": 32}),
        ("reverse", {"n": 0}),
        ("reverse", {"vocab": 1}),
        ("long_copy", {"n": 0}),
        ("long_copy", {"vocab": 1}),
        ("first_token", {"n": 0}),
        ("first_token", {"vocab": 1}),
        ("distant_match", {"n": 1}),
        ("distant_match", {"vocab": 1}),
        ("distant_match", {"n": 8, "probes": 9}),
        ("induction", {"n": 2}),
        ("induction", {"vocab": 1}),
        ("pattern", {"min_period": 1}),
        ("pattern", {"min_period": 5, "max_period": 4}),
        ("pattern", {"max_period": 17, "vocab": 16, "n": 40}),
        ("pattern", {"n": 15, "max_period": 8}),
        ("pattern", {"k": 0}),
    ],
)
def test_invalid_params_are_refused(name, params):
    with pytest.raises(ValueError, match=name):
        TASKS.get(name)(**params)


# -- no attention, no solution -----------------------------------------------------------


def no_mixing_accuracy(task, n: int = 4000) -> float:
    """Held-out accuracy of the best predictor that sees only the current token and its
    position (a model without token mixing), estimated by counting on a first sample."""
    V, L = task.vocab_size, task.seq_len

    def pairs(seed):
        batch = task.generate(n, generator(seed))
        key = torch.arange(L) * V + batch.inputs
        return key[batch.answer_mask], batch.targets[batch.answer_mask]

    key, target = pairs(10)
    best = torch.bincount(key * V + target, minlength=L * V * V).view(L * V, V).argmax(dim=1)
    key, target = pairs(11)
    return (best[key] == target).double().mean().item()


@pytest.mark.parametrize(
    ("name", "bound"),
    [
        ("sort", 0.2),  # guessing y + 1 after y is right (n - 1)/(vocab - 1) of the time
        ("reverse", 0.05),
        ("long_copy", 0.05),
        ("first_token", 0.05),
        ("distant_match", 0.55),
        ("induction", 0.03),
        ("pattern", 0.09),
    ],
)
def test_not_solvable_without_attention(name, bound):
    assert no_mixing_accuracy(TASKS.get(name)()) < bound


# -- property tests over the knobs --------------------------------------------------------


def check(task, seed: int, answers_per_row: int) -> None:
    batch = task.generate(8, generator(seed))
    check_batch(task, batch, 8)
    assert bool((batch.answer_mask.sum(dim=1) == answers_per_row).all())
    check_causal(task, batch.inputs, seed)


@st.composite
def sort_params(draw):
    n = draw(st.integers(1, 24))
    return {"n": n, "vocab": draw(st.integers(max(n, 2), 32))}


@settings(max_examples=20, deadline=None)
@given(params=sort_params(), seed=seeds)
def test_sort_property(params, seed):
    task = TASKS.get("sort")(**params)
    assert task.vocab_size == params["vocab"] + 1 and task.seq_len == 2 * params["n"]
    check(task, seed, params["n"])


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 24), vocab=st.integers(2, 24), seed=seeds)
def test_reverse_property(n, vocab, seed):
    task = TASKS.get("reverse")(n=n, vocab=vocab)
    assert task.vocab_size == vocab + 1 and task.seq_len == 2 * n
    check(task, seed, n)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 40), vocab=st.integers(2, 24), seed=seeds)
def test_long_copy_property(n, vocab, seed):
    task = TASKS.get("long_copy")(n=n, vocab=vocab)
    assert task.vocab_size == vocab + 1 and task.seq_len == 2 * n
    check(task, seed, n)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 40), vocab=st.integers(2, 24), seed=seeds)
def test_first_token_property(n, vocab, seed):
    task = TASKS.get("first_token")(n=n, vocab=vocab)
    assert task.vocab_size == vocab + 1 and task.seq_len == n + 1
    check(task, seed, 1)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 40), vocab=st.integers(2, 16), probes=st.integers(0, 40), seed=seeds)
def test_distant_match_property(n, vocab, probes, seed):
    probes = min(probes, n)
    task = TASKS.get("distant_match")(n=n, vocab=vocab, probes=probes)
    assert task.vocab_size == vocab + 3
    assert task.seq_len == (n + 2 * probes if probes else n + 1)
    check(task, seed, probes or 1)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(3, 40), vocab=st.integers(2, 32), seed=seeds)
def test_induction_one_answer_property(n, vocab, seed):
    task = TASKS.get("induction")(n=n, vocab=vocab, dense=False)
    assert task.vocab_size == vocab and task.seq_len == n
    check(task, seed, 1)


@settings(max_examples=20, deadline=None)
@given(
    triggers=st.integers(1, 4),
    repeats=st.integers(2, 4),
    extra=st.integers(0, 10),
    filler=st.integers(1, 8),
    seed=seeds,
)
def test_induction_dense_property(triggers, repeats, extra, filler, seed):
    n = 2 * triggers * repeats + extra
    task = TASKS.get("induction")(
        n=n, vocab=triggers + filler, keys=triggers, triggers=triggers, repeats=repeats
    )
    assert task.seq_len == n - 1
    check(task, seed, triggers * (repeats - 1))


@st.composite
def pattern_params(draw):
    max_period = draw(st.integers(2, 12))
    return {
        "max_period": max_period,
        "min_period": draw(st.integers(2, max_period)),
        "vocab": draw(st.integers(max_period, 24)),
        "n": draw(st.integers(2 * max_period, 40)),
        "k": draw(st.integers(1, 12)),
    }


@settings(max_examples=20, deadline=None)
@given(params=pattern_params(), seed=seeds)
def test_pattern_property(params, seed):
    task = TASKS.get("pattern")(**params)
    assert task.vocab_size == params["vocab"] + 1
    assert task.seq_len == params["n"] + params["k"]
    check(task, seed, params["k"])
