"""multihop, retrieval, selective_copy, stack, noisy_copy and compression: layouts checked
against plain-Python references, vocabularies and token names, defined oracle behaviour on
garbage, parameter validation, and property tests over the knobs."""

from __future__ import annotations

import hashlib
from itertools import groupby

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_tasks import answered, check_batch, generator, rows, seeds

from synthbench.core.task import IGNORE, TASKS

NAMES = ("multihop", "retrieval", "selective_copy", "stack", "noisy_copy", "compression")


# -- layouts against plain-Python references ----------------------------------------------


def chains_of(edges: list[tuple[int, int]]) -> list[list[int]]:
    """The node lists of the disjoint paths that the edges form."""
    succ = dict(edges)
    heads = set(succ) - set(succ.values())
    chains = []
    for head in heads:
        chain = [head]
        while chain[-1] in succ:
            chain.append(succ[chain[-1]])
        chains.append(chain)
    return chains


def test_multihop_compose_layout():
    """walk=False, one query: suite v1's layout (s, then the node ``hops`` away)."""
    task = TASKS.get("multihop")(pairs=7, hops=3, nodes=20, walks=1, walk=False)
    assert task.vocab_size == 21 and task.seq_len == 16 and task.sep == 20
    assert task.target_metric == "token_acc"
    used = set()
    for row, target in rows(task, 200):
        edges = list(zip(row[0:14:2], row[1:14:2], strict=True))
        assert row[14] == task.sep and all(0 <= t < 20 for t in row[:14] + row[15:])
        chains = chains_of(edges)
        # two chains of 3 edges and a 1-edge distractor, all nodes distinct
        assert sorted(len(c) - 1 for c in chains) == [1, 3, 3]
        nodes = [v for c in chains for v in c]
        assert len(nodes) == len(set(nodes)) == 10
        start = row[15]
        (chain,) = [c for c in chains if c[0] == start]
        assert len(chain) == 4
        assert answered(target) == {15: chain[3]}
        used.add(start)
    assert len(used) == 20  # any node can be a start


def test_multihop_walk_layout():
    task = TASKS.get("multihop")(pairs=9, hops=3, nodes=20, walks=2)
    assert task.seq_len == 18 + 2 * 4 and task.target_metric == "free_token_acc"
    for row, target in rows(task, 200):
        full = row + [target[-1]]
        succ = dict(zip(full[0:18:2], full[1:18:2], strict=True))
        assert full[18] == task.sep
        walks = [full[19:23], full[23:27]]
        assert walks[0][0] != walks[1][0]  # distinct chains
        expected = {}
        for w, walk in enumerate(walks):
            assert walk[0] not in succ.values()  # a chain's head
            for k in range(3):
                assert walk[k + 1] == succ[walk[k]]
                expected[18 + 4 * w + 1 + k] = walk[k + 1]
        assert walks[0][-1] not in succ  # the chain's end: a full-length chain
        assert answered(target) == expected


def test_multihop_compose_hops_are_real():
    task = TASKS.get("multihop")(walk=False)  # pairs 16, hops 2, 4 queries
    for row, target in rows(task):
        succ = dict(zip(row[0:32:2], row[1:32:2], strict=True))
        for start in (33, 35, 37, 39):
            assert succ[row[start]] != target[start] == succ[succ[row[start]]]


def test_retrieval_layout():
    task = TASKS.get("retrieval")(n=12, vocab=5, needles=3)
    assert task.vocab_size == 8 and task.seq_len == 17
    assert task.special_tokens == {"M1": 5, "M2": 6, "M3": 7}
    for row, target in rows(task, 300):
        full = row + [target[-1]]
        haystack, queries = full[:12], full[12:]
        places = {t: i for i, t in enumerate(haystack) if t >= 5}
        assert sorted(places) == [5, 6, 7] and max(places.values()) <= 10  # each marker once
        assert all(0 <= t < 5 for t in haystack if t < 5)
        assert sorted(queries[0::2]) == [5, 6, 7]  # every marker queried once
        expected = {12 + 2 * j: haystack[places[m] + 1] for j, m in enumerate(queries[0::2])}
        assert answered(target) == expected


def test_retrieval_one_needle_layout():
    """needles=1: suite v1's layout."""
    task = TASKS.get("retrieval")(n=10, vocab=5, needles=1)
    assert task.vocab_size == 6 and task.seq_len == 11 and task.marker == 5
    places = set()
    for row, target in rows(task, 300):
        haystack = row[:10]
        places.update(i for i, t in enumerate(haystack) if t == task.marker)
        (p,) = [i for i, t in enumerate(haystack) if t == task.marker]
        assert p <= 8 and row[10] == task.marker
        assert all(0 <= t < 5 for i, t in enumerate(haystack) if i != p)
        assert answered(target) == {10: haystack[p + 1]}
    assert places == set(range(9))


def test_selective_copy_layout():
    task = TASKS.get("selective_copy")(length=12, k=3, vocab=4, tail=2)
    assert task.vocab_size == 6 and task.seq_len == 15
    assert (task.blank, task.sep) == (4, 5)
    for row, target in rows(task):
        data = [t for t in row[:12] if t != task.blank]  # the first 3 copied, 2 more not
        assert len(data) == 5 and all(0 <= t < 4 for t in data) and row[12] == task.sep
        assert answered(target) == {12: data[0], 13: data[1], 14: data[2]}
        assert row[13:] == data[:2]


def test_stack_layout():
    """Suite v3: a climb, then an unwinding; asked are the POPs whose value was pushed
    before a dip (a POP that a PUSH followed) with at least 4 values on the stack."""
    task = TASKS.get("stack")(ops=24, values=5)
    assert task.vocab_size == 7 and task.seq_len == 47 and (task.push, task.pop) == (5, 6)
    pushes_first_half, pushes_second_half, asked, deepest = 0, 0, 0, 0
    for row, target in rows(task, 300):
        full = row + [target[-1]]
        stack, expected, previous, dip = [], {}, None, -1
        for i in range(24):
            op, operand = full[2 * i], full[2 * i + 1]
            if op == task.push:
                assert i < 23 or not stack
                if previous == task.pop:
                    dip = i - 1
                stack.append((operand, i))
                if i < 12:
                    pushes_first_half += 1
                else:
                    pushes_second_half += 1
            else:
                assert op == task.pop and stack
                depth = len(stack)
                popped, pushed_at = stack.pop()
                if previous == task.pop and dip > pushed_at and depth >= 4:
                    expected[2 * i] = popped
                # (the last operand is no input: known only where it is asked)
                assert operand == popped or (i == 23 and 2 * i not in expected)
            previous = op
            deepest = max(deepest, len(stack))
        assert answered(target) == expected and expected
        asked += len(expected)
    assert deepest >= 8 and asked > 300
    # PUSH with p 0.7 in the first half and 0.3 in the second (less the forced ops)
    assert 0.62 < pushes_first_half / (300 * 12) < 0.8
    assert 0.2 < pushes_second_half / (300 * 12) < 0.42


def test_stack_practices_every_pop_and_scores_the_asked_ones():
    """Batch.practice: the value of every POP that is not asked (a training learns it, no
    metric scores it); none with practice=false, nor where every POP is asked (suite v1)."""
    task = TASKS.get("stack")(ops=24, values=5)
    batch = task.generate(300, torch.Generator().manual_seed(0))
    inputs, targets, practice = batch.inputs, batch.targets, batch.practice
    pops = torch.zeros_like(inputs, dtype=torch.bool)
    pops[:, 0::2] = inputs[:, 0::2] == task.pop  # the POP tokens; each is followed by its value
    assert bool((practice[batch.answer_mask] == IGNORE).all())
    assert torch.equal(practice != IGNORE, pops & ~batch.answer_mask)
    assert torch.equal(batch.training_targets != IGNORE, pops)
    # each label is the popped value: the next input token wherever that is an input
    shown = practice[:, :-1] != IGNORE
    assert torch.equal(practice[:, :-1][shown], inputs[:, 1:][shown])
    assert 2 * int(batch.answer_mask.sum()) < int(shown.sum())  # most POPs are the easy ones
    for params in ({"practice": False}, {"every_pop": True}):
        other = TASKS.get("stack")(ops=24, values=5, **params)
        assert other.generate(8, torch.Generator().manual_seed(0)).practice is None
    unpractised = TASKS.get("stack")(ops=24, values=5, practice=False)
    again = unpractised.generate(300, torch.Generator().manual_seed(0))
    assert torch.equal(again.inputs, inputs) and torch.equal(again.targets, targets)


# stack's streams as its op-by-op torch simulation drew them (seed 5, 64 examples, inputs,
# targets and training targets): the numpy simulation that replaced it (3x faster at a
# training batch) must draw the very same data in every layout
STACK_DATA = {
    (): "45df1febe2",
    (("climb", 0), ("nested", False), ("ops", 16), ("values", 16)): "60dfc2b19f",  # v2
    (("every_pop", True),): "3113a6959d",  # v1
    (("practice", False), ("ops", 96)): "545854ca30",
}


@pytest.mark.parametrize("params", sorted(STACK_DATA))
def test_stack_draws_the_data_of_the_torch_simulation(params):
    batch = TASKS.get("stack")(**dict(params)).generate(64, torch.Generator().manual_seed(5))
    data = b"".join(
        t.numpy().tobytes() for t in (batch.inputs, batch.targets, batch.training_targets)
    )
    assert hashlib.sha1(data).hexdigest()[:10] == STACK_DATA[params]


def test_stack_refuses_a_layout_that_asks_nothing():
    with pytest.raises(ValueError, match="stack needs ops >= 16"):
        TASKS.get("stack")(ops=12)
    with pytest.raises(ValueError, match=r"climb in \[0.5, 0.9\]"):
        TASKS.get("stack")(climb=0.95)
    task = TASKS.get("stack")(ops=16, climb=0.9)  # allowed, and rare: one stream in many
    try:
        task.generate(64, torch.Generator().manual_seed(0))
    except ValueError as error:  # a clear error, never an endless redraw
        assert "asks a POP too rarely" in str(error)


def test_stack_v2_layout():
    task = TASKS.get("stack")(ops=8, values=5, climb=0, nested=False)
    assert task.vocab_size == 7 and task.seq_len == 15 and (task.push, task.pop) == (5, 6)
    deepest, asked, given_pops, repeats, changes = 0, 0, 0, 0, 0
    for row, target in rows(task, 300):
        full = row + [target[-1]]
        stack, expected, previous = [], {}, None
        assert full[0] == task.push
        for i in range(8):
            op, operand = full[2 * i], full[2 * i + 1]
            if op == task.push:
                assert i < 7 or not stack  # the last op pushes only onto an empty stack
                assert 0 <= operand < 5
                stack.append(operand)
            else:
                assert op == task.pop and stack
                popped = stack.pop()
                # (the last operand is no input: known only where it is asked)
                assert operand == popped or (i == 7 and previous == task.push)
                if previous == task.pop:  # asked only where it is not the value just read
                    expected[2 * i] = operand
                    asked += 1
                else:
                    given_pops += 1
            if previous is not None:
                repeats, changes = repeats + (op == previous), changes + (op != previous)
            previous = op
            deepest = max(deepest, len(stack))
        assert answered(target) == expected and expected
    assert deepest >= 4 and asked > 0.35 * (asked + given_pops)
    assert 0.55 < repeats / (repeats + changes) < 0.8  # runs (p 0.75, less the forced ops)


def test_stack_oracle_on_garbage():
    task = TASKS.get("stack")(ops=6, values=3, climb=0, nested=False)
    push, pop = task.push, task.pop
    # POP on an empty stack: no answer; a value as op: no-op; PUSH of the POP token: pushed;
    # a POP after a PUSH is not asked, a POP after a POP is
    inputs = torch.tensor([[pop, 1, 2, 0, push, pop, push, 0, pop, 0, pop]])
    assert task.solve(inputs).tolist() == [[IGNORE] * 10 + [pop]]
    inputs = torch.tensor([[push, 1, push, 2, pop, 2, pop, 1, pop]])
    assert task.solve(inputs).tolist() == [[IGNORE] * 6 + [1, IGNORE, IGNORE]]
    # suite v3: asked only past a dip with 4 values on the stack (the popped one included)
    task = TASKS.get("stack")(ops=16, values=9)
    push, pop = task.push, task.pop
    ops = [push, 1, push, 2, push, 3, push, 4, push, 5, pop, 5, push, 6, pop, 6, pop, 4, pop]
    targets = task.solve(torch.tensor([ops]))[0].tolist()
    assert [t for t in targets if t != IGNORE] == [4]  # not 3: only 3 values left on it


def test_multihop_oracle_on_garbage():
    task = TASKS.get("multihop")(pairs=2, hops=2, nodes=6, walks=1, walk=False)
    # from 0: the first listed edge 0 -> 1 is followed, then 1 has no successor and stays
    inputs = torch.tensor([[0, 1, 0, 2, 6, 0]])
    assert task.solve(inputs).tolist() == [[IGNORE] * 5 + [1]]
    # walking: one hop from each token read, whatever the walk so far
    task = TASKS.get("multihop")(pairs=2, hops=2, nodes=6, walks=1)
    inputs = torch.tensor([[0, 1, 0, 2, 6, 0, 5]])
    assert task.solve(inputs).tolist() == [[IGNORE] * 5 + [1, 5]]


def test_noisy_copy_layout():
    task = TASKS.get("noisy_copy")(n=8, rate=0.25, vocab=5, noise_vocab=3)
    assert task.n_noise == 2 and task.vocab_size == 9 and task.seq_len == 18 and task.sep == 8
    for row, target in rows(task):
        prompt = row[:10]
        noise = [t for t in prompt if t >= 5]
        x = [t for t in prompt if t < 5]
        assert len(noise) == 2 and all(t < 8 for t in noise) and row[10] == task.sep
        assert answered(target) == {10 + j: t for j, t in enumerate(x)}
        assert row[11:] == x[:7]


def test_compression_layout():
    task = TASKS.get("compression")(k=3, n=12, vocab=5, max_pad=2)
    assert (task.vocab_size, task.seq_len, task.sep, task.blank) == (7, 15, 5, 6)
    leads, trails = set(), set()
    for row, target in rows(task, 400):
        prompt = row[:12]
        lead = next(i for i, t in enumerate(prompt) if t != task.blank)
        trail = next(i for i, t in enumerate(reversed(prompt)) if t != task.blank)
        leads.add(lead)
        trails.add(trail)
        runs = [v for v, _ in groupby(prompt[lead : 12 - trail])]
        assert task.blank not in runs and len(runs) == 3 and len(set(runs)) == 3
        assert answered(target) == {12: runs[0], 13: runs[1], 14: runs[2]}
    assert leads == trails == {0, 1, 2}


def test_compression_v2_layout():
    task = TASKS.get("compression")(k=3, n=7, vocab=5, max_pad=0)
    assert task.vocab_size == 6 and task.seq_len == 10 and task.sep == 5
    compositions = set()
    for row, target in rows(task, 400):
        runs = [(value, len(list(group))) for value, group in groupby(row[:7])]
        values = [v for v, _ in runs]
        assert len(runs) == 3 and len(set(values)) == 3 and all(0 <= v < 5 for v in values)
        assert row[7] == task.sep and row[8:] == values[:2]
        assert answered(target) == {7: values[0], 8: values[1], 9: values[2]}
        compositions.add(tuple(length for _, length in runs))
    assert len(compositions) == 15  # every composition of 7 into 3 positive parts


# -- vocabularies, token names, presets ---------------------------------------------------


def test_token_names():
    def names(task):
        return [task.token_name(t) for t in range(task.vocab_size)]

    task = TASKS.get("multihop")(pairs=2, hops=1, nodes=4, walks=1)
    assert names(task) == ["0", "1", "2", "3", "SEP"]
    assert names(TASKS.get("retrieval")(vocab=3, needles=1)) == ["0", "1", "2", "MARKER"]
    assert names(TASKS.get("retrieval")(vocab=2, needles=2)) == ["0", "1", "M1", "M2"]
    assert names(TASKS.get("selective_copy")(vocab=2)) == ["0", "1", "BLANK", "SEP"]
    assert names(TASKS.get("stack")(values=2)) == ["0", "1", "PUSH", "POP"]
    assert names(TASKS.get("noisy_copy")(vocab=2, noise_vocab=2)) == [
        "0",
        "1",
        "NOISE0",
        "NOISE1",
        "SEP",
    ]
    assert names(TASKS.get("compression")(k=2, vocab=2)) == ["0", "1", "SEP", "BLANK"]
    assert names(TASKS.get("compression")(k=2, vocab=2, max_pad=0)) == ["0", "1", "SEP"]


@pytest.mark.parametrize("name", NAMES)
def test_presets_scale_to_twice_the_length(name):
    cls = TASKS.get(name)
    for difficulty in ("default", *cls.difficulties):
        task = cls.from_difficulty(difficulty)
        longer = task.at_length(2)  # valid parameters, same vocabulary
        assert longer.vocab_size == task.vocab_size and longer.seq_len > task.seq_len


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("multihop", {"hops": 0}),
        ("multihop", {"walks": 0}),
        ("multihop", {"pairs": 4, "hops": 2, "walks": 3}),  # 2 full chains
        ("multihop", {"pairs": 3, "hops": 4}),
        ("multihop", {"pairs": 4, "hops": 2, "nodes": 5}),
        ("multihop", {"pairs": 5, "hops": 2, "nodes": 7}),  # 2 chains and a distractor need 8
        ("retrieval", {"n": 1}),
        ("retrieval", {"vocab": 1}),
        ("retrieval", {"n": 10, "needles": 6}),
        ("selective_copy", {"k": 0}),
        ("selective_copy", {"length": 4, "k": 5}),
        ("selective_copy", {"vocab": 1}),
        ("stack", {"ops": 3}),
        ("stack", {"values": 1}),
        ("noisy_copy", {"n": 0}),
        ("noisy_copy", {"rate": -0.5}),
        ("noisy_copy", {"n": 4, "rate": 0.1}),  # round(0.4) = 0 noise tokens
        ("noisy_copy", {"rate": float("nan")}),
        ("noisy_copy", {"rate": float("inf")}),
        ("noisy_copy", {"vocab": 1}),
        ("noisy_copy", {"noise_vocab": 0}),
        ("compression", {"k": 0}),
        ("compression", {"k": 9, "n": 8}),
        ("compression", {"k": 5, "vocab": 4}),
    ],
)
def test_invalid_params_are_refused(name, params):
    with pytest.raises(ValueError, match=name):
        TASKS.get(name)(**params)


# -- property tests over the knobs --------------------------------------------------------


@st.composite
def multihop_params(draw):
    hops = draw(st.integers(1, 4))
    pairs = draw(st.integers(hops, 12))
    chains = -(-pairs // hops)
    return {
        "hops": hops,
        "pairs": pairs,
        "nodes": draw(st.integers(pairs + chains, 40)),
        "walks": draw(st.integers(1, pairs // hops)),
        "walk": draw(st.booleans()),
    }


@settings(max_examples=20, deadline=None)
@given(params=multihop_params(), seed=seeds)
def test_multihop_property(params, seed):
    task = TASKS.get("multihop")(**params)
    answers = params["walks"] * (params["hops"] if params["walk"] else 1)
    assert task.seq_len == 2 * params["pairs"] + params["walks"] + answers
    batch = task.generate(8, generator(seed))
    check_batch(task, batch, 8)
    assert bool((batch.answer_mask.sum(dim=1) == answers).all())


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 40), vocab=st.integers(2, 16), needles=st.integers(1, 20), seed=seeds)
def test_retrieval_property(n, vocab, needles, seed):
    needles = min(needles, n // 2)
    task = TASKS.get("retrieval")(n=n, vocab=vocab, needles=needles)
    batch = task.generate(8, generator(seed))
    check_batch(task, batch, 8)
    for marker in range(vocab, vocab + needles):  # once in the haystack, once as a query
        assert bool(((batch.inputs == marker).sum(dim=1) == 2).all())
    assert bool((batch.answer_mask.sum(dim=1) == needles).all())


@st.composite
def selective_copy_params(draw):
    length = draw(st.integers(1, 30))
    k = draw(st.integers(1, length))
    return {
        "length": length,
        "k": k,
        "tail": draw(st.integers(0, length - k)),
        "vocab": draw(st.integers(2, 10)),
    }


@settings(max_examples=20, deadline=None)
@given(params=selective_copy_params(), seed=seeds)
def test_selective_copy_property(params, seed):
    task = TASKS.get("selective_copy")(**params)
    assert task.seq_len == params["length"] + params["k"]
    batch = task.generate(8, generator(seed))
    check_batch(task, batch, 8)
    assert bool((batch.answer_mask.sum(dim=1) == params["k"]).all())


@settings(max_examples=20, deadline=None)
@given(ops=st.integers(16, 40), values=st.integers(2, 10), seed=seeds)
def test_stack_property(ops, values, seed):
    task = TASKS.get("stack")(ops=ops, values=values)
    batch = task.generate(8, generator(seed))
    check_batch(task, batch, 8)
    after_pop = torch.zeros_like(batch.answer_mask)
    after_pop[:, 2:] = batch.inputs[:, :-2] == task.pop
    # every answer is a POP after a POP (suite v3 asks only some of them)
    assert not (batch.answer_mask & ~((batch.inputs == task.pop) & after_pop)).any()


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(1, 20),
    rate=st.floats(0.0, 1.5),
    vocab=st.integers(2, 10),
    noise_vocab=st.integers(1, 4),
    seed=seeds,
)
def test_noisy_copy_property(n, rate, vocab, noise_vocab, seed):
    assume(round(rate * n) >= 1)
    task = TASKS.get("noisy_copy")(n=n, rate=rate, vocab=vocab, noise_vocab=noise_vocab)
    assert task.seq_len == 2 * n + round(rate * n)
    batch = task.generate(8, generator(seed))
    check_batch(task, batch, 8)
    assert bool((batch.answer_mask.sum(dim=1) == n).all())


@st.composite
def compression_params(draw):
    vocab = draw(st.integers(2, 12))
    k = draw(st.integers(1, vocab))
    max_pad = draw(st.integers(0, 6))
    return {
        "vocab": vocab,
        "k": k,
        "n": draw(st.integers(k + 2 * max_pad, k + 15 + 2 * max_pad)),
        "max_pad": max_pad,
    }


@settings(max_examples=20, deadline=None)
@given(params=compression_params(), seed=seeds)
def test_compression_property(params, seed):
    task = TASKS.get("compression")(**params)
    assert task.seq_len == params["n"] + params["k"]
    batch = task.generate(8, generator(seed))
    check_batch(task, batch, 8)
    assert bool((batch.answer_mask.sum(dim=1) == params["k"]).all())
