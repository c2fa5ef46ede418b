"""kv_recall: multi-query associative recall (MQAR, as in Zoology, Arora et al. 2023).

Layout ``k_1 v_1 ... k_P v_P SEP q_1 a_1 ... q_m a_m``: P key-value pairs with distinct keys,
then m distinct queried keys, each followed by its value. Keys are tokens 0..keys-1, values
keys..keys+values-1 (disjoint halves of the vocabulary), SEP is keys+values. At a query the
model must find that key earlier in the context and emit the token after it: an induction
head (a previous-token head feeding a matching head).

Suite v2 asks m = ``queries`` (by default half the pairs: 12 of the 24) and binds distinct values
(``distinct_values``). Suite v1 (``queries=0 distinct_values=false``, which the slay-paper
protocol runs) asked every key once, with values drawn independently, so "the most frequent
context value not answered yet", which never reads a key, scored 0.39 (the task's
elimination rule in ``synthbench audit``); it scores about 1/(pairs - j) at the j-th query
now.
"""

from dataclasses import dataclass

import torch

from synthbench.core.task import (
    TASKS,
    Batch,
    ShortcutRule,
    Task,
    answered_pairs,
    batch_from_parts,
    require_at_least,
    targets_at,
)


@dataclass(frozen=True)
class KVRecallParams:
    # key-value pairs in the context: 24, beyond what linear attention's state holds at the
    # quick model's width (it stays at chance where softmax reaches 1.00; at 8 pairs both do)
    pairs: int = 24
    # queried keys per sequence, distinct; 0 queries every key once (suite v1); None (the
    # default): half the pairs, rounded down (12 of the 24; every preset asks half too), so a
    # sweep over pairs alone keeps the ratio (the resolved value is what a run id holds)
    queries: int | None = None
    keys: int = 64  # size of the key vocabulary
    values: int = 64  # size of the value vocabulary
    distinct_values: bool = True  # no value bound to two keys (suite v1: drawn independently)

    def __post_init__(self):
        if self.queries is None:  # frozen: set once, here, to the value it stands for
            object.__setattr__(self, "queries", self.pairs // 2 if isinstance(self.pairs, int)
                               and not isinstance(self.pairs, bool) else None)  # fmt: skip
        if isinstance(self.queries, bool) or not isinstance(self.queries, int):
            raise ValueError(f"kv_recall parameter queries must be int, got {self.queries!r}")
        if not 1 <= self.pairs <= self.keys:
            raise ValueError(f"kv_recall needs 1 <= pairs <= keys, got {self.pairs}, {self.keys}")
        if not 0 <= self.queries <= self.pairs:
            raise ValueError(
                f"kv_recall needs 0 <= queries <= pairs, got queries={self.queries}, "
                f"pairs={self.pairs} (with fewer pairs, set queries as well)"
            )
        require_at_least("kv_recall", self, values=2)
        if self.distinct_values and self.values < self.pairs:
            raise ValueError(
                f"kv_recall needs values >= pairs for distinct values, got values="
                f"{self.values}, pairs={self.pairs}"
            )


@TASKS.register(
    "kv_recall",
    aliases=("mqar", "associative_recall"),
    category="Memory",
    description="multi-query associative recall: emit the value bound to each queried key",
)
class KVRecall(Task):
    Params = KVRecallParams
    difficulties = {
        "easy": {"pairs": 8, "queries": 4, "keys": 32, "values": 32},
        "hard": {"pairs": 32, "queries": 16},
    }
    # pairs: the associations to hold; keys, values: more ids to tell apart. queries: each
    # adds an answer of the same kind, and the elimination rule gains as the queried
    # share grows, so fewer is harder; 0 asks every key (queries = pairs): the easy end,
    # not below 1.
    harder = {"pairs": "larger", "queries": "smaller", "keys": "larger", "values": "larger"}
    length_param = "pairs"

    @property
    def n_queries(self) -> int:
        return self.params.queries or self.params.pairs

    @property
    def special_tokens(self) -> dict[str, int]:
        return {"SEP": self.params.keys + self.params.values}

    @property
    def vocab_size(self) -> int:
        return self.params.keys + self.params.values + 1

    @property
    def seq_len(self) -> int:
        return 2 * self.params.pairs + 2 * self.n_queries

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, m, dev = self.params, self.n_queries, generator.device
        keys = torch.rand(n, p.keys, generator=generator, device=dev).argsort(dim=1)[:, : p.pairs]
        if p.distinct_values:
            drawn = torch.rand(n, p.values, generator=generator, device=dev).argsort(dim=1)
            values = p.keys + drawn[:, : p.pairs]
        else:
            values = p.keys + torch.randint(p.values, (n, p.pairs), generator=generator, device=dev)
        asked = torch.rand(n, p.pairs, generator=generator, device=dev).argsort(dim=1)[:, :m]
        context = torch.stack([keys, values], dim=2).reshape(n, 2 * p.pairs)
        queries, is_value = answered_pairs(keys.gather(1, asked), values.gather(1, asked))
        return batch_from_parts([context, self.sep], [queries], device, answer_mask=is_value)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        P = self.params.pairs
        query_pos = torch.arange(2 * P + 1, inputs.shape[1], 2, device=inputs.device)
        context_keys, context_values = inputs[:, 0 : 2 * P : 2], inputs[:, 1 : 2 * P : 2]
        queried = inputs[:, query_pos]  # (n, m)
        match = queried.unsqueeze(2) == context_keys.unsqueeze(1)  # (n, m, P), one True per row
        answers = (match.long() * context_values.unsqueeze(1)).sum(dim=2)
        return targets_at(inputs, query_pos, answers)

    def shortcut_rules(self):
        P, first_value = self.params.pairs, self.params.keys

        def eliminate(inputs: torch.Tensor) -> torch.Tensor:
            values = inputs[:, 1 : 2 * P : 2]
            ids = torch.arange(first_value, self.sep, device=inputs.device)
            left = (values.unsqueeze(2) == ids).sum(dim=1)  # (n, values): context counts
            guess = torch.full_like(inputs, first_value)
            for i in range(2 * P + 1, inputs.shape[1], 2):  # the query positions, in order
                guess[:, i] = first_value + left.argmax(dim=1)
                if i + 1 < inputs.shape[1]:  # its answer, read back: one fewer left
                    answered = (inputs[:, i + 1] - first_value).clamp(0, len(ids) - 1)
                    left.scatter_add_(1, answered.unsqueeze(1), -torch.ones_like(left[:, :1]))
            return guess

        description = "the most frequent context value not answered yet (never reads a key)"
        return [ShortcutRule("elimination", description, eliminate)]

    def token_name(self, token: int) -> str:
        keys = self.params.keys
        if token < keys:
            return f"k{token}"
        return f"v{token - keys}" if token < self.sep else super().token_name(token)
