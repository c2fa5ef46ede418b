"""Shortcut families: generic rules that answer a task without the computation it tests.

Each family is a set of baselines fitted on one generated stream of a task and scored on
another with the task's metric (token accuracy per example, averaged over examples). None
knows anything about the task: they see the inputs, which positions are answers, and the
answers of the training stream, so they run on every task, plugins included.

- ``windows``: count tables on the last tokens read: the token alone, jointly with its
  position, and windows of 2, 4 and 8 tokens, each backing off to shorter windows.
- ``fixed positions``: copy the token at a fixed place: a table from the answer's index
  (its rank among its example's answers) to the source position, or to the lag behind the
  answer, that held the answer most often in training; and the one best lag d for every
  answer (d = 0 is the token just read).
- ``counts``: tables on how often the token read (or the one before it) has occurred so far,
  alone and jointly with the token or the position.
- ``relabelled``: count tables on windows of up to 8 tokens whose data tokens (those of
  the answer vocabulary) are renamed by their order of first appearance in the window,
  latest first, so that a pattern is counted whatever its values; a table predicts which
  slot of the window holds the answer. This finds rules about where, among the last tokens,
  the answer sits (the value of the PUSH two ops back), which raw windows are too sparse
  to learn.
- ``elimination``: the multiset of prompt tokens read so far (the answer vocabulary's) minus
  the answers already given: its most frequent token (ties: the smallest id), and a draw
  from it in proportion to the counts (scored by its expected accuracy).

Every table predicts, for a context, the answer seen most often with it in training (ties:
the smallest code). A context never seen in training backs off along its chain, and finally
to the position's constant, so no baseline scores below chance for want of data. ``seen`` is
the share of test answers whose longest context occurs in training.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from synthbench.core.task import IGNORE, Batch

PAD = -1  # a token before the sequence start, in a window key
MAX_COUNT = 63  # counts above this share a key
# the most elements of one table or block (memory): answers x positions in the fixed-position
# tables, rows x tokens in the running counts, keys x answers in a count table
CHUNK = 1 << 22
EXACT_KEYS = 1 << 40  # contexts of at most this many value combinations are coded exactly
LONG_WINDOWS = (8, 6, 4, 3, 2, 1)  # the back-off chain of the 8-token windows
WIDEST = max(LONG_WINDOWS)
MARGIN = 0.2  # a baseline above chance + MARGIN is a shortcut
MIN_SEEN = 0.9  # below this share of seen test contexts a table cannot show a baseline weak


@dataclass(frozen=True)
class Baseline:
    family: str
    name: str
    score: float  # token accuracy on the test stream
    seen: float | None  # share of test answers whose full context was seen (None: a rule)

    def verdict(self, chance: float) -> str:
        if self.score > chance + MARGIN:
            return "shortcut"
        if self.seen is not None and self.seen < MIN_SEEN:
            return "undersampled"
        return "weak"


@dataclass
class Answers:
    """The answers of a generated batch, flattened in (example, position) order."""

    example: np.ndarray
    position: np.ndarray  # the input position whose next token is the answer
    answer: np.ndarray
    index: np.ndarray  # the answer's rank among its example's answers (0, 1, ...)
    inputs: np.ndarray  # (n, L)
    is_answer: np.ndarray  # (n, L): inputs[:, p] holds an earlier answer (teacher forced)

    @classmethod
    def of(cls, batch: Batch, in_stream: bool = True) -> Answers:
        """``in_stream``: the task's answers are tokens of the stream (``is_answer`` marks
        them); False for labels that never enter it (``Task.answers_in_stream``)."""
        mask = batch.targets != IGNORE
        example, position = mask.nonzero(as_tuple=True)
        example, position = example.numpy(), position.numpy()
        first = np.searchsorted(example, example)  # each example's first answer
        is_answer = np.zeros(mask.shape, dtype=bool)
        is_answer[:, 1:] = mask[:, :-1].numpy() & in_stream
        return cls(
            example,
            position,
            batch.targets[mask].numpy(),
            np.arange(len(example)) - first,
            batch.inputs.numpy(),
            is_answer,
        )

    def __len__(self) -> int:
        return len(self.answer)

    def token_at(self, position: np.ndarray) -> np.ndarray:
        """The input token at ``position`` of each answer's example (PAD before the start)."""
        flat, row_start = self._flat
        token = flat.take(row_start + np.maximum(position, 0))
        return np.where(position >= 0, token, PAD)

    @cached_property
    def _flat(self) -> tuple[np.ndarray, np.ndarray]:
        """The inputs flattened, and where each answer's example starts in them (a 1-D take
        is faster than a 2-D fancy index)."""
        return np.ascontiguousarray(self.inputs).reshape(-1), self.example * self.inputs.shape[1]

    def window(self, width: int) -> np.ndarray:
        """(N, width): the last ``width`` tokens read at each answer, the latest first (a
        read-only view: a narrower window is the first columns of a wider one)."""
        return self._widest[:, :width] if width <= WIDEST else self._stacked(width)

    def _stacked(self, width: int) -> np.ndarray:
        return np.stack([self.token_at(self.position - back) for back in range(width)], axis=1)

    @cached_property
    def _widest(self) -> np.ndarray:
        """The widest window the families read, built once per stream."""
        widest = self._stacked(WIDEST)
        widest.flags.writeable = False
        return widest

    @cached_property
    def narrow(self) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, answer) as int16 where every id fits: the fixed-position tables compare
        each answer with its whole example, and read a quarter of the bytes so (1.5x to 5x
        faster, the longer the examples the more)."""
        ids = (self.inputs, self.answer)
        if all(a.size == 0 or (a.min() >= -(2**15) and a.max() < 2**15) for a in ids):
            return self.inputs.astype(np.int16), self.answer.astype(np.int16)
        return ids

    @cached_property
    def first_slots(self) -> np.ndarray:
        """(N, WIDEST): for each slot of the widest window, the first slot (the latest token
        first) that holds the same token: at most the slot itself."""
        window = self._widest
        return (window[:, None, :] == window[:, :, None]).argmax(axis=2)

    @cached_property
    def occurred(self) -> np.ndarray:
        """(n, L): how often each position's token has occurred so far (MAX_COUNT at most)."""
        return np.minimum(occurrences(self.inputs), MAX_COUNT)

    def score(self, right: np.ndarray) -> float:
        """Token accuracy: the mean over examples of the share of right answers; ``right``
        is a boolean, or a probability of being right, per answer."""
        return float(self._per_example(right).mean())

    def exact_match(self, predicted: np.ndarray) -> float:
        """The share of examples whose every answer is right."""
        return float((self._per_example(predicted == self.answer) == 1).mean())

    def _per_example(self, right: np.ndarray) -> np.ndarray:
        n_examples = self.inputs.shape[0]
        hits = np.bincount(self.example, right.astype(float), minlength=n_examples)
        total = np.bincount(self.example, minlength=n_examples)
        answered = total > 0
        return hits[answered] / total[answered]


# -- count tables ----------------------------------------------------------------------------


def fit(
    keys: np.ndarray, answers: np.ndarray, n_keys: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The most frequent answer of every key (ties: the smallest answer), keys sorted.
    ``n_keys``: the keys are codes 0 to n_keys - 1 (``ContextKeys``): no renaming, and where
    a table of every (code, answer) is no larger than the data, counted in it, unsorted."""
    answers = answers.astype(np.int64)
    lowest = int(answers.min()) if answers.size else 0
    span = int(answers.max()) - lowest + 1 if answers.size else 1
    if n_keys is not None and n_keys * span <= len(keys):
        table = np.bincount(keys * span + answers - lowest, minlength=n_keys * span)
        table = table.reshape(n_keys, span)
        present = np.flatnonzero(table.any(axis=1))
        return present, table[present].argmax(axis=1) + lowest  # argmax: the first highest
    if n_keys is not None and n_keys * span < 2**62:  # their pairs below fit in an int64
        unique_keys, key_index = None, keys
    else:
        unique_keys, key_index = np.unique(keys, return_inverse=True)
    # each (key, answer) as one number, ordered by key then answer: one sort, not a lexsort
    pairs, counts = np.unique(
        key_index.astype(np.int64) * span + answers - lowest, return_counts=True
    )
    pair_keys, pair_answers = pairs // span, pairs % span + lowest
    if not len(pairs):  # no answers: an empty table
        return keys[:0], pair_answers
    # the pairs come sorted by key, then answer: each key's first pair of its highest count
    # holds the most frequent answer, the smallest of a tie
    starts = np.flatnonzero(np.r_[True, pair_keys[1:] != pair_keys[:-1]])
    highest = np.repeat(np.maximum.reduceat(counts, starts), np.diff(np.r_[starts, len(pairs)]))
    at_highest = np.flatnonzero(counts == highest)
    first = at_highest[np.r_[True, pair_keys[at_highest][1:] != pair_keys[at_highest][:-1]]]
    first_keys = pair_keys[first]
    return first_keys if unique_keys is None else unique_keys[first_keys], pair_answers[first]


def lookup(table: tuple[np.ndarray, np.ndarray], keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(answer, found) for every key; answer is meaningless where not found."""
    table_keys, table_answers = table
    if len(table_keys) == 0:
        return np.zeros_like(keys), np.zeros(len(keys), dtype=bool)
    index = np.minimum(np.searchsorted(table_keys, keys), len(table_keys) - 1)
    return table_answers[index], table_keys[index] == keys


class ContextKeys:
    """Int64 keys for the rows of (N, w) contexts, set by the training stream's contexts
    (``train``: their keys). Where the columns take few enough values, a row's key is its
    exact code in base ``radix`` (the span of the training contexts' values, all columns
    alike: one pass over them), 0 to n_keys - 1, and -1 for a later row with a value outside
    that span; otherwise a hash of the row (``row_keys``; n_keys None)."""

    def __init__(self, train_columns: np.ndarray):
        columns = train_columns.reshape(len(train_columns), -1)
        self.n_keys: int | None = None
        if len(columns):
            self.low = int(columns.min())
            self.radix = int(columns.max()) - self.low + 1
            combinations = self.radix ** columns.shape[1]
            self.n_keys = combinations if combinations <= EXACT_KEYS else None
        self.train = row_keys(columns) if self.n_keys is None else self._code(columns)

    def of(self, columns: np.ndarray) -> np.ndarray:
        """The keys of another stream's contexts."""
        columns = columns.reshape(len(columns), -1)
        if self.n_keys is None:
            return row_keys(columns)
        inside = ((columns >= self.low) & (columns < self.low + self.radix)).all(axis=1)
        return np.where(inside, self._code(columns), -1)

    def _code(self, columns: np.ndarray) -> np.ndarray:
        code = np.zeros(len(columns), dtype=np.int64)
        for column in columns.T:
            code = code * self.radix + (column - self.low)
        return code


def row_keys(columns: np.ndarray) -> np.ndarray:
    """One 64-bit key per row of an (N, w) context, any width and any token ids (a base-V
    number would overflow): an FNV-style hash of the columns; with at most a few million
    distinct contexts a collision has a chance of about 1e-7."""
    key = np.full(len(columns), 0xCBF29CE484222325, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in columns.reshape(len(columns), -1).T:
            key ^= (column + 3).astype(np.uint64)  # PAD is negative
            key *= np.uint64(0x100000001B3)
            key ^= key >> np.uint64(29)
    return key.view(np.int64)


def _columns(*arrays: np.ndarray) -> np.ndarray:
    """The arrays side by side as the columns of one (N, w) context."""
    return np.concatenate([a.reshape(len(a), -1) for a in arrays], axis=1)


# -- the families ----------------------------------------------------------------------------


# A context: its name (a table is fitted once per name and set of codes) and its (N, w)
# columns at each answer of a stream
Chain = Sequence[tuple[str, Callable[[Answers], np.ndarray]]]


@dataclass
class Streams:
    """The audit's two streams and the position constant every baseline falls back to."""

    train: Answers
    test: Answers
    constant: np.ndarray  # the best constant answer per position, at every test answer
    # (context name, codes) -> (predicted code, found) at every test answer
    looked_up: dict = field(default_factory=dict)

    def answer_vocab(self, size: int) -> np.ndarray:
        """(size,): which token ids are answers in the training stream."""
        vocab = np.zeros(size, dtype=bool)
        vocab[np.unique(self.train.answer)] = True
        return vocab

    def backed_off(
        self, chain: Chain, codes: str, train_codes: np.ndarray, fallback: np.ndarray
    ) -> tuple[np.ndarray, float]:
        """(predicted codes at the test answers, seen): each answer takes the table of the
        longest context of ``chain`` seen in training, else ``fallback``. ``codes`` names
        what the tables predict (``train_codes``), so that a table is fitted once."""
        predicted, decided = fallback.copy(), np.zeros(len(fallback), dtype=bool)
        seen = 0.0
        for depth, (name, context) in enumerate(chain):
            if (name, codes) not in self.looked_up:
                keys = ContextKeys(context(self.train))
                table = fit(keys.train, train_codes, keys.n_keys)
                self.looked_up[name, codes] = lookup(table, keys.of(context(self.test)))
            answer, found = self.looked_up[name, codes]
            take = found & ~decided
            predicted[take] = answer[take]
            decided |= found
            if depth == 0:
                seen = float(found.mean()) if len(found) else 0.0
        return predicted, seen

    def baseline(self, family: str, name: str, predicted: np.ndarray, seen: float | None):
        return Baseline(family, name, self.test.score(predicted == self.test.answer), seen)

    def table(self, family: str, name: str, chain: Chain) -> Baseline:
        """The baseline of a back-off chain of contexts on the raw answers."""
        predicted, seen = self.backed_off(chain, "answers", self.train.answer, self.constant)
        return self.baseline(family, name, predicted, seen)


def windows(s: Streams) -> list[Baseline]:
    def last(width: int):
        return f"last {width}", lambda a: a.window(width)

    position_x_token = ("position x token", lambda a: _columns(a.position, a.window(1)[:, 0]))
    return [
        s.table("windows", "token", [last(1)]),
        s.table("windows", "position x token", [position_x_token]),
        s.table("windows", "last 2", [last(2), last(1)]),
        s.table("windows", "last 4", [last(w) for w in (4, 3, 2, 1)]),
        s.table("windows", "last 8", [last(w) for w in LONG_WINDOWS]),
    ]


def _hits_by_place(answers: Answers, rows: np.ndarray) -> np.ndarray:
    """(len(rows), L): where, at or before each answer's position, its example holds the
    answer token."""
    inputs, answer = answers.narrow
    before = np.arange(inputs.shape[1]) <= answers.position[rows, None]
    return (inputs[answers.example[rows]] == answer[rows, None]) & before


def fixed_positions(s: Streams) -> list[Baseline]:
    train, test = s.train, s.test
    L = train.inputs.shape[1]
    n_index = int(max(train.index.max(initial=0), test.index.max(initial=0))) + 1
    by_place = np.zeros((n_index, L))  # answer index x source position: hits in training
    by_lag = np.zeros((n_index, L))  # answer index x lag behind the answer
    rows_per_block = max(1, CHUNK // L)
    for start in range(0, len(train), rows_per_block):
        rows = np.arange(start, min(start + rows_per_block, len(train)))
        e, p = _hits_by_place(train, rows).nonzero()
        index, lag = train.index[rows][e], train.position[rows][e] - p
        by_place += np.bincount(index * L + p, minlength=n_index * L).reshape(n_index, L)
        by_lag += np.bincount(index * L + lag, minlength=n_index * L).reshape(n_index, L)

    def copied(place: np.ndarray, known: np.ndarray) -> np.ndarray:
        ok = known & (place >= 0) & (place <= test.position)
        return np.where(ok, test.token_at(np.clip(place, 0, None)), s.constant)

    index_seen = by_place.sum(axis=1)[test.index] > 0
    best_lag = int(by_lag.sum(axis=0).argmax())
    return [
        s.baseline(
            "fixed positions",
            "index -> position",
            copied(by_place.argmax(axis=1)[test.index], index_seen),
            float(index_seen.mean()),
        ),
        s.baseline(
            "fixed positions",
            "index -> lag",
            copied(test.position - by_lag.argmax(axis=1)[test.index], index_seen),
            float(index_seen.mean()),
        ),
        s.baseline(
            "fixed positions",
            f"lag {best_lag}",
            copied(test.position - best_lag, np.ones(len(test), dtype=bool)),
            1.0,
        ),
    ]


def occurrences(inputs: np.ndarray) -> np.ndarray:
    """(n, L): how often each position's token has occurred in its row up to there (1 at
    its first occurrence)."""
    n, L = inputs.shape
    token, distinct = _renamed(inputs)
    # each row's running count of every token, a block of rows at a time, read along the
    # positions: O(n L), 1.5x faster than a stable sort of every (row, token, position)
    counts = np.empty((n, L), dtype=np.int64)
    rows_per_block = max(1, CHUNK // max(distinct, 1))
    for start in range(0, n, rows_per_block):
        block = token[start : start + rows_per_block]
        seen = np.zeros(len(block) * distinct, dtype=np.int64)
        row_start = np.arange(len(block)) * distinct
        for p in range(L):
            at = row_start + block[:, p]
            seen[at] += 1  # one token per row at p: no two additions meet
            counts[start : start + len(block), p] = seen[at]
    return counts


def _renamed(tokens: np.ndarray) -> tuple[np.ndarray, int]:
    """The tokens renamed 0, 1, ... in the order of their ids, and how many are distinct."""
    if not tokens.size:
        return tokens.astype(np.int64), 0
    shifted = tokens.astype(np.int64) - int(tokens.min())
    span = int(shifted.max()) + 1
    if span > CHUNK:  # ids far apart: a sort, not a table of every id between
        distinct_ids, renamed = np.unique(shifted, return_inverse=True)
        return renamed.reshape(tokens.shape), len(distinct_ids)
    present = np.zeros(span, dtype=bool)
    present[shifted] = True
    return (np.cumsum(present) - 1)[shifted], int(present.sum())


def counts(s: Streams) -> list[Baseline]:
    def count(a: Answers, back: int) -> np.ndarray:
        """How often the token ``back`` places before the answer has occurred so far."""
        place = a.position - back
        return np.where(place >= 0, a.occurred[a.example, np.maximum(place, 0)], 0)

    current = ("count", lambda a: count(a, 0))
    previous = ("previous count", lambda a: count(a, 1))
    return [
        s.table("counts", "count", [current]),
        s.table(
            "counts",
            "token x count",
            [("token x count", lambda a: _columns(a.window(1)[:, 0], count(a, 0))), current],
        ),
        s.table(
            "counts",
            "position x count",
            [("position x count", lambda a: _columns(a.position, count(a, 0))), current],
        ),
        s.table(
            "counts",
            "previous token x count",
            [
                ("previous token x count", lambda a: _columns(a.window(2)[:, 1], count(a, 1))),
                previous,
            ],
        ),
    ]


def _equality_pattern(answers: Answers, is_data_token: np.ndarray) -> np.ndarray:
    """(N, WIDEST): each data token of the widest window renamed by the first slot that holds
    it (the latest token first); every other token keeps its id, shifted past the slots. A
    narrower window's pattern is its first columns."""
    window = answers.window(WIDEST)
    return np.where(is_data_token[window], answers.first_slots, WIDEST + window + 3)


def relabelled(s: Streams, vocab: int) -> list[Baseline]:
    """Count tables on windows whose data tokens (the answer vocabulary's) are renamed by
    the order in which the window shows them, latest first: value-independent patterns,
    well sampled where raw windows are not. A table predicts the slot of the window that
    holds the answer, or an answer token outside the window (another token's id)."""
    answer_vocab = s.answer_vocab(vocab + 1)  # and a False for PAD, at index -1
    # each stream's widest pattern, built once (a context reads the stream it is given)
    widest = {id(a): _equality_pattern(a, answer_vocab) for a in (s.train, s.test)}

    def pattern(a: Answers, width: int) -> np.ndarray:
        return widest[id(a)][:, :width]

    # what a table predicts: the first slot of the last 8 tokens that holds the answer, or
    # 8 + the answer's id where none does
    train_window = s.train.window(8)
    holds = train_window == s.train.answer[:, None]
    slots = np.where(holds.any(axis=1), holds.argmax(axis=1), 8 + s.train.answer)
    test_window = s.test.window(8)

    def read_back(codes: np.ndarray) -> np.ndarray:
        slot = np.clip(codes, 0, 7)
        token = np.where(codes < 8, test_window[np.arange(len(codes)), slot], codes - 8)
        return np.where((codes >= 0) & (token >= 0), token, s.constant)

    def baseline(name: str, chain: Chain) -> Baseline:
        predicted, seen = s.backed_off(chain, "slots", slots, np.full(len(s.test), -1))
        return s.baseline("relabelled", name, read_back(predicted), seen)

    def last(width: int):
        return f"pattern {width}", lambda a: pattern(a, width)

    index_x_last_4 = ("index x pattern 4", lambda a: _columns(a.index, pattern(a, 4)))
    return [
        baseline("relabelled last 8", [last(w) for w in LONG_WINDOWS]),
        baseline("relabelled index x last 4", [index_x_last_4, last(4), last(2), last(1)]),
    ]


def elimination(s: Streams, vocab: int) -> list[Baseline]:
    """The remaining multiset of prompt tokens at each test answer (the answer vocabulary's:
    the tokens that are answers in training), its argmax and a proportional draw."""
    test = s.test
    n, L = test.inputs.shape
    answer_vocab = s.answer_vocab(vocab)
    remaining = np.zeros((n, vocab))
    rows = np.arange(n)
    argmax = np.empty(len(test), dtype=np.int64)
    right_share = np.empty(len(test))
    for p in range(L):
        token = test.inputs[:, p]
        # a prompt token adds to the multiset, an answer given (teacher forced) takes away
        np.add.at(remaining, (rows, token), np.where(test.is_answer[:, p], -1.0, 1.0))
        at = np.flatnonzero(test.position == p)
        if not len(at):
            continue
        bag = np.clip(remaining[test.example[at]], 0, None) * answer_vocab
        total = bag.sum(axis=1)
        argmax[at] = np.where(total > 0, bag.argmax(axis=1), s.constant[at])
        own = bag[np.arange(len(at)), test.answer[at]]
        fallback_right = (s.constant[at] == test.answer[at]).astype(float)
        right_share[at] = np.where(total > 0, own / np.maximum(total, 1), fallback_right)
    return [
        s.baseline("elimination", "elimination argmax", argmax, None),
        Baseline("elimination", "elimination draw", test.score(right_share), None),
    ]
