"""Every registered task at every difficulty: batch format, oracle, causality, determinism,
vocabulary; parameter validation; property tests over the knobs of copy and kv_recall."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from synthbench.core.task import (
    CATEGORIES,
    IGNORE,
    TASKS,
    Batch,
    Task,
    markdown_table,
    task_set,
    teacher_forced,
)

N = 64
seeds = st.integers(0, 2**31 - 1)  # generator seeds for the property tests
CASES = [
    pytest.param(name, difficulty, id=f"{name}-{difficulty}")
    for name in TASKS.names()
    for difficulty in ("default", *TASKS.get(name).difficulties)
]


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rows(task: Task, n: int = N, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """(inputs row, targets row) pairs as plain lists, for plain-Python reference checks."""
    batch = task.generate(n, generator(seed))
    return list(zip(batch.inputs.tolist(), batch.targets.tolist(), strict=True))


def answered(target: list[int]) -> dict[int, int]:
    """Position -> target at the answer positions of one targets row."""
    return {i: t for i, t in enumerate(target) if t != IGNORE}


def check_batch(task: Task, batch: Batch, n: int) -> None:
    """The contract every batch meets, and the oracle reproduces its targets."""
    inputs, targets = batch.inputs, batch.targets
    assert inputs.dtype == targets.dtype == torch.int64
    assert inputs.shape == targets.shape == (n, task.seq_len)
    assert inputs.min() >= 0 and inputs.max() < task.vocab_size
    answers = batch.answer_mask
    assert bool(((targets[answers] >= 0) & (targets[answers] < task.vocab_size)).all())
    assert bool(answers.any(dim=1).all()), "an example without an answer position"
    # teacher forcing: a target is the next input token wherever that token is in the inputs
    # (not for labels that never enter the stream: the State tasks, tests/test_tasks_state.py)
    shifted = targets[:, :-1]
    if task.answers_in_stream:
        assert torch.equal(shifted[answers[:, :-1]], inputs[:, 1:][answers[:, :-1]])
    assert torch.equal(task.solve(inputs), targets)
    if batch.practice is not None:  # labels a training learns from and no metric scores
        practice = batch.practice
        assert practice.dtype == torch.int64 and practice.shape == targets.shape
        assert bool((practice[answers] == IGNORE).all()), "a practice label at an answer"
        shown = practice[:, :-1] != IGNORE
        assert torch.equal(practice[:, :-1][shown], inputs[:, 1:][shown])
        assert bool((practice[practice != IGNORE] < task.vocab_size).all())


# -- every task, every difficulty ---------------------------------------------------------


@pytest.mark.parametrize(("name", "difficulty"), CASES)
def test_batch_format_and_oracle(name, difficulty):
    task = TASKS.get(name).from_difficulty(difficulty)
    check_batch(task, task.generate(N, generator(0)), N)


@pytest.mark.parametrize(("name", "difficulty"), CASES)
def test_oracle_reads_only_the_causal_prefix(name, difficulty):
    """Scrambling every token after position t leaves every target up to t unchanged."""
    task = TASKS.get(name).from_difficulty(difficulty)
    inputs = task.generate(N, generator(1)).inputs
    solved = task.solve(inputs)
    L = task.seq_len
    g = generator(2)
    # every answer position (at most 48 of them, evenly spread) and a few others
    answer_positions = (solved != IGNORE).any(dim=0).nonzero().flatten().tolist()
    step = max(1, len(answer_positions) // 48)
    cuts = {0, 1, L // 3, L // 2, L // 2 + 1, L - 2, L - 1, *answer_positions[::step]}
    for t in sorted(cuts):
        scrambled = inputs.clone()
        scrambled[:, t + 1 :] = torch.randint(task.vocab_size, (N, L - t - 1), generator=g)
        assert torch.equal(task.solve(scrambled)[:, : t + 1], solved[:, : t + 1]), f"t={t}"


@pytest.mark.parametrize(("name", "difficulty"), CASES)
def test_generation_is_deterministic_and_uses_only_its_generator(name, difficulty):
    task = TASKS.get(name).from_difficulty(difficulty)
    torch.manual_seed(1234)
    global_state = torch.get_rng_state()
    first, again, other = (task.generate(N, generator(seed)) for seed in (5, 5, 6))
    assert torch.equal(torch.get_rng_state(), global_state), "generate touched the global RNG"
    assert torch.equal(first.inputs, again.inputs) and torch.equal(first.targets, again.targets)
    assert not torch.equal(first.inputs, other.inputs)


@pytest.mark.parametrize(("name", "difficulty"), CASES)
def test_every_token_id_is_used(name, difficulty):
    task = TASKS.get(name).from_difficulty(difficulty)
    used = set()
    # up to 20 batches: some ids are rare by design (histogram's largest counts)
    for seed in range(3, 23):
        batch = task.generate(2000, generator(seed))
        ids = torch.cat([batch.inputs.flatten(), batch.targets[batch.answer_mask]]).unique()
        used |= set(ids.tolist())
        if len(used) == task.vocab_size:
            break
    assert sorted(used) == list(range(task.vocab_size))


@pytest.mark.parametrize("name", TASKS.names())
def test_registered_with_metadata_and_presets(name):
    entry = TASKS.entry(name)
    assert entry.metadata["category"] in CATEGORIES and entry.metadata["description"]
    cls = entry.obj
    assert issubclass(cls, Task)
    for overrides in cls.difficulties.values():
        assert cls.from_difficulty("default").param_dict().keys() >= overrides.keys()
    with pytest.raises(ValueError, match="unknown difficulty 'impossible'"):
        cls.from_difficulty("impossible")
    with pytest.raises(ValueError, match="no parameter wobble"):
        cls(wobble=1)


def test_docs_table_matches_the_code():
    doc = Path(__file__).resolve().parent.parent / "docs" / "TASKS.md"
    assert markdown_table() in doc.read_text(), "regenerate docs/TASKS.md's table"


def test_every_builtin_task_is_documented():
    doc = (Path(__file__).resolve().parent.parent / "docs" / "TASKS.md").read_text()
    for name in TASKS.names():
        category = TASKS.entry(name).metadata["category"]
        assert f"### {name} ({category}" in doc, name


def test_the_22_tasks_of_the_suite_in_7_categories():
    by_category = {}
    for name in task_set("all"):
        by_category.setdefault(TASKS.entry(name).metadata["category"], []).append(name)
    assert {c: sorted(n) for c, n in by_category.items()} == {
        "Basic": ["copy", "reverse", "sort"],
        "Arithmetic": ["addition", "counting", "modular", "parity"],
        "Long-Range": ["distant_match", "long_copy", "multihop"],
        "Memory": ["first_token", "kv_recall", "retrieval", "selective_copy"],
        "Patterns": ["bigram", "histogram", "majority"],
        "Reasoning": ["induction", "pattern", "stack"],
        "Robustness": ["compression", "noisy_copy"],
    }


def test_registry_aliases():
    assert TASKS.get("mqar") is TASKS.get("kv_recall") is TASKS.get("associative_recall")


# -- task-specific ------------------------------------------------------------------------


def test_practice_labels_are_trained_on_and_never_scored():
    """teacher_forced's practice mask: labels beside the answers (never at one), which a
    training's loss takes (``training_targets``) and the metrics, reading ``targets``, do
    not."""
    sequences = torch.tensor([[7, 1, 2, 3, 4, 5]])
    answers = torch.tensor([[0, 0, 0, 1, 0, 1]], dtype=torch.bool)
    practice = torch.tensor([[0, 1, 0, 1, 1, 0]], dtype=torch.bool)  # one overlaps an answer
    batch = teacher_forced(sequences, answers, practice)
    assert batch.targets.tolist() == [[IGNORE, IGNORE, 3, IGNORE, 5]]
    assert batch.practice.tolist() == [[1, IGNORE, IGNORE, 4, IGNORE]]
    assert batch.training_targets.tolist() == [[1, IGNORE, 3, 4, 5]]
    assert torch.equal(batch.to("cpu").practice, batch.practice)
    plain = teacher_forced(sequences, answers)
    assert plain.practice is None and torch.equal(plain.training_targets, plain.targets)


def test_copy_vocab_and_layout():
    task = TASKS.get("copy")(n=6, vocab=5)
    assert task.vocab_size == 6 and task.seq_len == 12
    inputs = task.generate(N, generator(0)).inputs
    assert bool((inputs[:, 6] == task.sep).all()) and task.sep == 5
    assert bool((inputs[:, :6] < 5).all()) and task.token_name(5) == "SEP"


def test_kv_recall_vocab_and_layout():
    task = TASKS.get("kv_recall")(pairs=5, queries=3, keys=7, values=6)
    assert task.vocab_size == 7 + 6 + 1 and task.seq_len == 2 * 5 + 2 * 3
    batch = task.generate(N, generator(0))
    for row, target in zip(batch.inputs.tolist(), batch.targets.tolist(), strict=True):
        keys, values = row[0:10:2], row[1:10:2]
        assert len(set(keys)) == 5 and all(0 <= k < 7 for k in keys)
        assert all(7 <= v < 13 for v in values) and row[10] == task.sep == 13
        assert len(set(values)) == 5  # distinct values
        queried = row[11::2]
        assert len(set(queried)) == 3 and set(queried) <= set(keys)
        bound = dict(zip(keys, values, strict=True))
        assert target[11::2] == [bound[k] for k in queried]  # independent of solve()
        assert row[12::2] == target[11:-1:2]
        assert all(x == IGNORE for i, x in enumerate(target) if i < 11 or i % 2 == 0)
    assert [task.token_name(t) for t in (0, 7, 13)] == ["k0", "v0", "SEP"]


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("copy", {"n": 0}),
        ("copy", {"vocab": 1}),
        ("kv_recall", {"pairs": 0}),
        ("kv_recall", {"pairs": 9, "keys": 8}),
        ("kv_recall", {"pairs": 4, "queries": 5}),
        ("kv_recall", {"queries": -1}),
        ("kv_recall", {"values": 1}),
        ("kv_recall", {"pairs": 8, "values": 7}),  # distinct values need values >= pairs
    ],
)
def test_invalid_params_are_refused(name, params):
    with pytest.raises(ValueError):
        TASKS.get(name)(**params)


# -- property tests over the knobs --------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 24), vocab=st.integers(2, 24), seed=seeds)
def test_copy_property(n, vocab, seed):
    task = TASKS.get("copy")(n=n, vocab=vocab)
    assert task.vocab_size == vocab + 1 and task.seq_len == 2 * n
    batch = task.generate(8, generator(seed))
    check_batch(task, batch, 8)
    assert bool((batch.answer_mask.sum(dim=1) == n).all())


@st.composite
def kv_recall_params(draw):
    keys = draw(st.integers(1, 16))
    pairs = draw(st.integers(1, keys))
    return {
        "keys": keys,
        "pairs": pairs,
        "queries": draw(st.integers(0, pairs)),
        "values": draw(st.integers(max(2, pairs), 16)),
        "distinct_values": draw(st.booleans()),
    }


@settings(max_examples=25, deadline=None)
@given(params=kv_recall_params(), seed=seeds)
def test_kv_recall_property(params, seed):
    task = TASKS.get("kv_recall")(**params)
    m = params["queries"] or params["pairs"]
    assert task.vocab_size == params["keys"] + params["values"] + 1
    assert task.seq_len == 2 * params["pairs"] + 2 * m
    batch = task.generate(8, generator(seed))
    check_batch(task, batch, 8)
    assert bool((batch.answer_mask.sum(dim=1) == m).all())
