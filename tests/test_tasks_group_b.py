"""counting, parity, addition, modular, bigram, majority and histogram: layouts checked
against plain-Python references, vocabularies and token names, parameter validation, and
property tests over the knobs."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_tasks import answered, check_batch, generator, rows, seeds

from synthbench.core.task import IGNORE, TASKS

# -- layouts against plain-Python references ----------------------------------------------


def test_counting_dense_layout():
    task = TASKS.get("counting")(n=12, vocab=6, queries=3)
    assert task.vocab_size == 6 + 1 + 5 and task.seq_len == 18 and task.max_count == 4
    counts = Counter()
    for row, target in rows(task, 400):
        full = row + [target[-1]]
        x, queries = full[:12], full[13::2]
        assert all(0 <= t < 6 for t in x + queries) and full[12] == task.sep == 6
        assert len(set(queries)) == 3
        expected = {13 + 2 * j: 7 + x.count(q) for j, q in enumerate(queries)}
        assert answered(target) == expected
        counts.update(x.count(q) for q in queries)
    assert sorted(counts) == [0, 1, 2, 3, 4]  # uniform over 0..C
    assert min(counts.values()) > 0.15 * sum(counts.values())


def test_counting_one_answer_layout():
    """queries=0: suite v1's layout."""
    task = TASKS.get("counting")(n=10, vocab=4, queries=0)
    assert task.vocab_size == 4 + 1 + 11 and task.seq_len == 12
    counts = []
    for row, target in rows(task, 200):
        x, q, sep = row[:10], row[10], row[11]
        assert all(0 <= t < 4 for t in x) and 0 <= q < 4 and sep == task.sep == 4
        c = sum(t == q for t in x)
        assert answered(target) == {11: 5 + c}
        counts.append(c)
    assert set(counts) == set(range(11))  # every count, 0 and n included


def test_counting_tokens():
    task = TASKS.get("counting")(n=5, vocab=3, queries=0)
    names = [task.token_name(t) for t in range(task.vocab_size)]
    assert names == ["0", "1", "2", "SEP", "#0", "#1", "#2", "#3", "#4", "#5"]
    # scaled to a longer length, every id keeps its meaning; new counts come last
    longer = task.at_length(2)
    assert [longer.token_name(t) for t in range(task.vocab_size)] == names
    assert longer.vocab_size == task.vocab_size + 5


def test_parity_layout():
    task = TASKS.get("parity")(n=7)
    assert task.vocab_size == 3 and task.seq_len == 14
    assert task.target_metric == "free_token_acc"
    for row, target in rows(task):
        full = row + [target[-1]]
        assert set(row[:7]) <= {0, 1} and row[7] == task.sep == 2
        assert answered(target) == {7 + i: sum(row[: i + 1]) % 2 for i in range(7)}
        assert full[8:] == [sum(row[: i + 1]) % 2 for i in range(7)]
    assert [task.token_name(t) for t in range(3)] == ["0", "1", "SEP"]


def test_parity_one_answer_layout():
    task = TASKS.get("parity")(n=7, dense=False)
    assert task.seq_len == 8 and task.target_metric == "token_acc"
    for row, target in rows(task):
        assert set(row[:7]) <= {0, 1} and row[7] == task.sep == 2
        assert answered(target) == {7: sum(row[:7]) % 2}


def test_running_parity_answers_follow_the_bits_not_the_answers_before():
    task = TASKS.get("parity")(n=3)
    inputs = torch.tensor([[1, 1, 0, 2, 0]])  # a wrong first answer (0, not 1) read back
    assert task.solve(inputs).tolist() == [[IGNORE] * 3 + [1, 0]]


def _digits_of(value: int, width: int) -> list[int]:
    """``value`` as ``width`` decimal digits, least significant first."""
    return [int(ch) for ch in reversed(f"{value:0{width}d}")]


def _number(digits: list[int]) -> int:
    return int("".join(map(str, reversed(digits))))


def test_addition_streamed_layout():
    task = TASKS.get("addition")(digits=4)
    assert task.vocab_size == 21 and task.seq_len == 12
    assert task.target_metric == "free_token_acc"
    for row, target in rows(task):
        full = row + [target[-1]]
        a, b, totals = full[0:4], full[5::2], full[6::2]
        assert full[4] == task.plus == 20 and all(0 <= t <= 9 for t in a + b)
        # column j's total: the digits' sum plus whether the lower columns overflow
        mod = [10**j for j in range(4)]
        carries = [int(_number(a) % m + _number(b) % m >= m) for m in mod]
        assert totals == [a[j] + b[j] + carries[j] for j in range(4)]
        # the totals hold the sum: its digits mod 10, its top digit the last carry
        assert [t % 10 for t in totals] + [totals[-1] // 10] == _digits_of(
            _number(a) + _number(b), 5
        )
        assert answered(target) == {4 + 2 * j + 1: totals[j] for j in range(4)}  # read at b_j
    assert [task.token_name(t) for t in (0, 19, 20)] == ["0", "19", "+"]


def test_addition_streamed_totals_carry_from_the_total_read_back():
    task = TASKS.get("addition")(digits=3)
    # a = 5 9 1, b = 7 0 .. read back with totals 12 and (a wrong) 3
    inputs = torch.tensor([[5, 9, 1, 20, 7, 12, 0, 3, 4]])
    # 5 + 7 = 12; 9 + 0 + carry(12) = 10; 1 + 4 + carry(3) = 5
    assert task.solve(inputs)[0].tolist() == [IGNORE] * 4 + [12, IGNORE, 10, IGNORE, 5]


def test_addition_one_answer_per_digit_layout():
    """streamed=False: suite v1's layout, the carries left to the model."""
    task = TASKS.get("addition")(digits=4, streamed=False)
    assert task.vocab_size == 12 and task.seq_len == 14
    for row, target in rows(task):
        a, b = row[0:4], row[5:9]
        assert row[4] == task.plus == 10 and row[9] == task.eq == 11
        assert all(0 <= t <= 9 for t in a + b)
        value = int("".join(map(str, reversed(a)))) + int("".join(map(str, reversed(b))))
        s = [int(ch) for ch in reversed(f"{value:05d}")]  # 5 digits, least significant first
        assert answered(target) == {9 + j: s[j] for j in range(5)}
        assert row[10:14] == s[:4]
    assert [task.token_name(t) for t in (0, 9, 10, 11)] == ["0", "9", "+", "="]


def test_addition_carries_through_a_chain_of_nines():
    task = TASKS.get("addition")(digits=5, streamed=False)
    inputs = torch.tensor([[1, 9, 9, 9, 9, 10, 9, 0, 0, 0, 0, 11, 0, 0, 0, 0, 0]])
    # 99991 + 9 = 100000, least significant first 0 0 0 0 0 1
    assert task.solve(inputs)[0, 11:].tolist() == [0, 0, 0, 0, 0, 1]


def test_modular_layout():
    task = TASKS.get("modular")(n=9, p=5)
    assert task.vocab_size == 6 and task.seq_len == 18
    for row, target in rows(task):
        assert all(0 <= t < 5 for t in row[:9]) and row[9] == task.sep == 5
        assert answered(target) == {9 + i: sum(row[: i + 1]) % 5 for i in range(9)}
    assert [task.token_name(t) for t in range(6)] == ["0", "1", "2", "3", "4", "SEP"]


def test_modular_one_answer_layout():
    task = TASKS.get("modular")(n=9, p=5, dense=False)
    assert task.vocab_size == 6 and task.seq_len == 10
    for row, target in rows(task):
        assert all(0 <= t < 5 for t in row[:9]) and row[9] == task.sep == 5
        assert answered(target) == {9: sum(row[:9]) % 5}


def test_bigram_layout_and_table():
    task = TASKS.get("bigram")(n=6, vocab=5)
    assert task.vocab_size == 5 and task.seq_len == 11
    table = task.table.tolist()
    for row, target in rows(task):
        full = row + [target[-1]]
        xs, successors = full[0::2], full[1::2]
        assert all(0 <= t < 5 for t in xs) and successors == [table[t] for t in xs]
        assert answered(target) == {2 * i: table[t] for i, t in enumerate(xs)}
    assert [task.token_name(t) for t in range(5)] == ["0", "1", "2", "3", "4"]


def test_bigram_table_depends_on_table_seed_only():
    bigram = TASKS.get("bigram")
    task = bigram(vocab=64)
    assert torch.equal(task.table, bigram(vocab=64, n=3).table)  # shared across data sets
    assert torch.equal(task.table, task.at_length(2).table)
    assert not torch.equal(task.table, bigram(vocab=64, table_seed=1).table)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    bigram(vocab=64)
    assert torch.equal(torch.get_rng_state(), before), "the table touched the global RNG"


def test_majority_layout():
    task = TASKS.get("majority")(n=6, vocab=3)
    assert task.vocab_size == 4 and task.seq_len == 7
    modes = []
    for row, target in rows(task, 300):
        x = row[:6]
        assert all(0 <= t < 3 for t in x) and row[6] == task.sep == 3
        ranked = Counter(x).most_common()
        assert len(ranked) == 1 or ranked[0][1] > ranked[1][1], f"mode not unique in {x}"
        assert answered(target) == {6: ranked[0][0]}
        modes.append(ranked[0][0])
    assert set(modes) == {0, 1, 2}
    assert [task.token_name(t) for t in range(4)] == ["0", "1", "2", "SEP"]


def test_histogram_layout():
    task = TASKS.get("histogram")(n=5, vocab=4, queries=3)
    assert task.vocab_size == 4 + 1 + 6 and task.seq_len == 5 + 6
    counts, queried = set(), set()
    for row, target in rows(task, 500):
        full = row + [target[-1]]
        x, queries = full[:5], full[6::2]
        assert all(0 <= t < 4 for t in x) and full[5] == task.sep == 4
        assert len(set(queries)) == 3 and all(0 <= q < 4 for q in queries)  # distinct tokens
        expected = {6 + 2 * j: 5 + x.count(q) for j, q in enumerate(queries)}
        assert answered(target) == expected
        counts |= {x.count(q) for q in queries}
        queried |= set(queries)
    assert counts == set(range(6)) and queried == {0, 1, 2, 3}
    names = [task.token_name(t) for t in range(task.vocab_size)]
    assert names == ["0", "1", "2", "3", "SEP", "#0", "#1", "#2", "#3", "#4", "#5"]
    longer = task.at_length(2)
    assert [longer.token_name(t) for t in range(task.vocab_size)] == names


def test_histogram_queries_at_most_the_vocabulary():
    with pytest.raises(ValueError, match="queries <= vocab"):
        TASKS.get("histogram")(vocab=3, queries=4)


# -- parameter validation -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("counting", {"n": 0}),
        ("counting", {"vocab": 1}),
        ("counting", {"queries": -1}),
        ("parity", {"n": 0}),
        ("addition", {"digits": 0}),
        ("modular", {"n": 0}),
        ("modular", {"p": 1}),
        ("bigram", {"n": 0}),
        ("bigram", {"vocab": 1}),
        ("bigram", {"table_seed": -1}),
        ("majority", {"n": 0}),
        ("majority", {"vocab": 1}),
        ("histogram", {"n": 0}),
        ("histogram", {"vocab": 1}),
        ("histogram", {"queries": -1}),
    ],
)
def test_invalid_params_are_refused(name, params):
    ((key, value),) = params.items()
    with pytest.raises(ValueError, match=rf"^{name} needs .*\b{key}={value}\b"):
        TASKS.get(name)(**params)


def test_a_parameter_of_the_wrong_type_is_refused():
    with pytest.raises(ValueError, match="digits must be int"):
        TASKS.get("addition")(digits=2.5)


# -- property tests over the knobs --------------------------------------------------------


def check(name: str, params: dict, seed: int, answers_per_row: int):
    task = TASKS.get(name)(**params)
    batch = task.generate(8, generator(seed))
    check_batch(task, batch, 8)
    assert bool((batch.answer_mask.sum(dim=1) == answers_per_row).all())
    return task


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 40), vocab=st.integers(2, 20), queries=st.integers(0, 19), seed=seeds)
def test_counting_property(n, vocab, queries, seed):
    queries = min(queries, vocab - 1, n)
    task = check("counting", {"n": n, "vocab": vocab, "queries": queries}, seed, queries or 1)
    if queries:
        assert task.vocab_size == vocab + n // queries + 2 and task.seq_len == n + 2 * queries
    else:
        assert task.vocab_size == vocab + n + 2 and task.seq_len == n + 2


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 64), dense=st.booleans(), seed=seeds)
def test_parity_property(n, dense, seed):
    task = check("parity", {"n": n, "dense": dense}, seed, n if dense else 1)
    assert task.seq_len == (2 * n if dense else n + 1)


@settings(max_examples=20, deadline=None)
@given(digits=st.integers(1, 30), streamed=st.booleans(), seed=seeds)
def test_addition_property(digits, streamed, seed):
    params = {"digits": digits, "streamed": streamed}
    task = check("addition", params, seed, digits if streamed else digits + 1)
    assert task.seq_len == (3 * digits if streamed else 3 * digits + 2)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 40), p=st.integers(2, 20), dense=st.booleans(), seed=seeds)
def test_modular_property(n, p, dense, seed):
    task = check("modular", {"n": n, "p": p, "dense": dense}, seed, n if dense else 1)
    assert task.vocab_size == p + 1 and task.seq_len == (2 * n if dense else n + 1)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 40), vocab=st.integers(2, 200), table_seed=seeds, seed=seeds)
def test_bigram_property(n, vocab, table_seed, seed):
    params = {"n": n, "vocab": vocab, "table_seed": table_seed}
    task = check("bigram", params, seed, n)
    assert task.vocab_size == vocab and task.seq_len == 2 * n - 1


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 64), vocab=st.integers(2, 20), seed=seeds)
def test_majority_property(n, vocab, seed):
    task = check("majority", {"n": n, "vocab": vocab}, seed, 1)
    inputs = task.generate(32, generator(seed)).inputs
    counts = torch.stack([(inputs[:, :n] == t).sum(dim=1) for t in range(vocab)], dim=1)
    top2 = counts.topk(min(2, vocab), dim=1).values
    assert bool((top2[:, 0] > top2[:, -1]).all()), "a tied mode"


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 40), vocab=st.integers(2, 20), queries=st.integers(1, 20), seed=seeds)
def test_histogram_property(n, vocab, queries, seed):
    assume(queries <= vocab)
    task = check("histogram", {"n": n, "vocab": vocab, "queries": queries}, seed, queries)
    assert task.vocab_size == vocab + 2 + n and task.seq_len == n + 2 * queries
