"""kv_recall: multi-query associative recall (MQAR, as in Zoology, Arora et al. 2023).

Layout ``k_1 v_1 ... k_P v_P SEP [BLANK x gap] q_1 a_1 ... q_m a_m``: P key-value pairs with
distinct keys, then ``gap`` BLANK tokens, then m distinct queried keys, each followed by its
value. Keys are tokens 0..keys-1, values keys..keys+values-1 (disjoint halves of the
vocabulary), SEP is keys+values, BLANK keys+values+1 (only where gap > 0). At a query the
model must find that key earlier in the context and emit the token after it: an induction
head (a previous-token head feeding a matching head).

The gap (suite v4, the ladder's levels) puts every query at least gap + 2 positions after the
value it asks for, beyond the reach of the suite's windows (docs/TASKS.md, "Windows below
the recall distance"); as in Zoology's MQAR, whose queries follow the pairs at a distance.
Without it the first queries could ask for the last pairs, a few positions back.

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
    Ladder,
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
    # BLANK tokens between SEP and the first query (suite v4's ladder: 32, every answer
    # beyond the windows' reach); 0: the queries right after SEP, as before
    gap: int = 0

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
        require_at_least("kv_recall", self, values=2, gap=0)
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
    # Zoology (Arora et al. 2023, Fig. 2) and Based (Arora et al. 2024, Fig. 2): associative
    # recall fails for a fixed-size state once the pairs outgrow it, while attention keeps
    # them all; the queries ask for half the pairs at every level. At 8 pairs softmax,
    # linear attention and cosFormer all recall (quick, seeds 0-2), at 16 linear attention
    # and cosFormer split by seed, at 24 they sit at chance (docs/TASKS.md).
    ladder = Ladder(
        axis=("pairs",),
        source="Zoology (Arora et al. 2023), Fig. 2; Based (Arora et al. 2024), Fig. 2",
        baseline={"pairs": 8, "gap": 32},
        steps=({"pairs": 16}, {"pairs": 24}),
    )
    # pairs: the associations to hold; keys, values: more ids to tell apart. queries: each
    # adds an answer of the same kind, and the elimination rule gains as the queried
    # share grows, so fewer is harder; 0 asks every key (queries = pairs): the easy end,
    # not below 1.
    harder = {"pairs": "larger", "queries": "smaller", "keys": "larger", "values": "larger",
              "gap": "larger"}  # fmt: skip
    length_param = "pairs"

    @property
    def n_queries(self) -> int:
        return self.params.queries or self.params.pairs

    @property
    def special_tokens(self) -> dict[str, int]:
        sep = self.params.keys + self.params.values
        return {"SEP": sep, "BLANK": sep + 1} if self.params.gap else {"SEP": sep}

    @property
    def vocab_size(self) -> int:
        return self.params.keys + self.params.values + 1 + (self.params.gap > 0)

    @property
    def first_query(self) -> int:
        """The input position of the first query (its answer is predicted there)."""
        return 2 * self.params.pairs + 1 + self.params.gap

    @property
    def seq_len(self) -> int:
        return self.first_query + 2 * self.n_queries - 1

    def recall_distance(self) -> int:
        """The first query against the last pair's value, 2P - 1: gap + 2."""
        return self.first_query - (2 * self.params.pairs - 1)

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
        blanks = torch.full((n, p.gap), self.sep + 1, dtype=torch.long, device=dev)
        return batch_from_parts(
            [context, self.sep, blanks], [queries], device, answer_mask=is_value
        )

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        P = self.params.pairs
        query_pos = torch.arange(self.first_query, inputs.shape[1], 2, device=inputs.device)
        context_keys, context_values = inputs[:, 0 : 2 * P : 2], inputs[:, 1 : 2 * P : 2]
        queried = inputs[:, query_pos]  # (n, m)
        match = queried.unsqueeze(2) == context_keys.unsqueeze(1)  # (n, m, P), one True per row
        answers = (match.long() * context_values.unsqueeze(1)).sum(dim=2)
        return targets_at(inputs, query_pos, answers)

    def shortcut_rules(self):
        P, first_value = self.params.pairs, self.params.keys

        def eliminate(inputs: torch.Tensor) -> torch.Tensor:
            values = inputs[:, 1 : 2 * P : 2]
            ids = torch.arange(first_value, first_value + self.params.values, device=inputs.device)
            left = (values.unsqueeze(2) == ids).sum(dim=1)  # (n, values): context counts
            guess = torch.full_like(inputs, first_value)
            for i in range(self.first_query, inputs.shape[1], 2):  # the queries, in order
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
