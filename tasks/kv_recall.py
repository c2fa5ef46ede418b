"""kv_recall: multi-query associative recall (MQAR, as in Zoology, Arora et al. 2023).

Layout ``k_1 v_1 ... k_P v_P SEP q_1 a_1 ... q_m a_m``: P key-value pairs with distinct keys,
then m distinct queried keys, each followed by its value. Keys are tokens 0..keys-1, values
keys..keys+values-1 (disjoint halves of the vocabulary), SEP is keys+values. At a query the
model must find that key earlier in the context and emit the token after it: an induction
head (a previous-token head feeding a matching head).
"""

from dataclasses import dataclass

import torch

from synthbench.task import TASKS, Batch, Task, batch_from_parts, require_at_least, targets_at


@dataclass(frozen=True)
class KVRecallParams:
    pairs: int = 8  # key-value pairs in the context
    queries: int = 0  # queried keys per sequence; 0 queries every key once
    keys: int = 32  # size of the key vocabulary
    values: int = 32  # size of the value vocabulary

    def __post_init__(self):
        if not 1 <= self.pairs <= self.keys:
            raise ValueError(f"kv_recall needs 1 <= pairs <= keys, got {self.pairs}, {self.keys}")
        if not 0 <= self.queries <= self.pairs:
            raise ValueError(f"kv_recall needs 0 <= queries <= pairs, got {self.queries}")
        require_at_least("kv_recall", self, values=2)


@TASKS.register(
    "kv_recall",
    aliases=("mqar", "associative_recall"),
    category="Memory",
    description="multi-query associative recall: emit the value bound to each queried key",
)
class KVRecall(Task):
    Params = KVRecallParams
    difficulties = {
        "easy": {"pairs": 4},
        "hard": {"pairs": 16, "keys": 64, "values": 64},
    }
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
        values = p.keys + torch.randint(p.values, (n, p.pairs), generator=generator, device=dev)
        asked = torch.rand(n, p.pairs, generator=generator, device=dev).argsort(dim=1)[:, :m]
        context = torch.stack([keys, values], dim=2).reshape(n, 2 * p.pairs)
        queries = torch.stack([keys.gather(1, asked), values.gather(1, asked)], dim=2)
        is_value = torch.arange(2 * m, device=dev) % 2 == 1  # the a_j answer, the q_j are given
        return batch_from_parts(
            [context, self.sep], [queries.reshape(n, 2 * m)], device, answer_mask=is_value
        )

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        P = self.params.pairs
        query_pos = torch.arange(2 * P + 1, inputs.shape[1], 2, device=inputs.device)
        context_keys, context_values = inputs[:, 0 : 2 * P : 2], inputs[:, 1 : 2 * P : 2]
        queried = inputs[:, query_pos]  # (n, m)
        match = queried.unsqueeze(2) == context_keys.unsqueeze(1)  # (n, m, P), one True per row
        answers = (match.long() * context_values.unsqueeze(1)).sum(dim=2)
        return targets_at(inputs, query_pos, answers)

    def token_name(self, token: int) -> str:
        keys = self.params.keys
        if token < keys:
            return f"k{token}"
        return f"v{token - keys}" if token < self.sep else super().token_name(token)
