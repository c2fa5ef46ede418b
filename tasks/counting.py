"""counting: ``x_1 .. x_n SEP q_1 c_1 .. q_m c_m``: how often each query token occurs in x.

Dense layout (the default): m = ``queries`` distinct query tokens q_j (given, in random
order after SEP), each followed by its count c_j in x (the answer). Each query's count is
drawn uniformly from 0..C, C = n // m, so the answers are balanced; x holds the queries that
many times and is filled up with the other tokens, uniformly, in random order. Unlike
histogram (Patterns), which asks for the profile of a skewed x, the counts here are the
point: uniform over 0..C, none following from the others.

``queries=0`` is suite v1's one-answer layout ``x q SEP c``: the count of q, uniform over
0..n. With one label per sequence and a count that needs an MLP to read off, softmax reached
0.23 under quick, and a rule on the most frequent token's count, ignoring q, scored 0.87.

Data tokens are 0..vocab-1, SEP is ``vocab`` and the number tokens ``vocab + 1 + c`` for the
counts c = 0..C (0..n in the one-answer layout) come last, so a longer task keeps every id.

Known solution: at q_j the model attends to the tokens of x equal to q_j; softmax averages,
so a sink (a position every query also attends to, with a fixed score) makes the weight left
on the sink 1 / (1 + c), which the readout turns into the count.
"""

from dataclasses import dataclass

import torch

from synthbench.core.task import (
    TASKS,
    Batch,
    Ladder,
    SepTask,
    answered_pairs,
    batch_from_parts,
    require_at_least,
    targets_at,
)


@dataclass(frozen=True)
class CountingParams:
    # n 64 over 32 tokens: counts to 8, where softmax's proportions blur (quick: softmax 0.77,
    # linear 0.89; at n 32 over 16 tokens both reach 0.99); kept deliberately hard
    n: int = 64  # length of x
    vocab: int = 32  # number of data tokens
    queries: int = 8  # distinct query tokens, each asked once (0: suite v1's one answer)

    def __post_init__(self):
        require_at_least("counting", self, n=1, vocab=2, queries=0)
        if self.queries and not self.queries < self.vocab:
            raise ValueError(
                f"counting needs queries < vocab (x is filled with other tokens), got "
                f"queries={self.queries}, vocab={self.vocab}"
            )
        if self.queries > self.n:
            raise ValueError(f"counting needs queries <= n, got {self.queries}, n={self.n}")


@TASKS.register(
    "counting",
    category="Arithmetic",
    description="x SEP q_1 c_1 .. q_m c_m: count the occurrences of each query token in x",
)
class Counting(SepTask):
    Params = CountingParams
    difficulties = {"easy": {"n": 32, "vocab": 16}, "hard": {"n": 128, "vocab": 64}}
    # n: counts up to n // queries, where softmax's proportions blur; vocab: more tokens for
    # the match to tell a query from. queries: more queries cap the counts lower (C = n //
    # queries) and give more answers per sequence, so fewer is harder; 0 is suite v1's
    # one-answer layout (counts over 0..n), at that hard end.
    harder = {"n": "larger", "vocab": "larger", "queries": "smaller"}
    # The range of the counts (n // queries): softmax's proportions 1/(1 + c) crowd as c
    # grows, a count-readout limit measured here: counts to 4 all three mechanisms measured
    # read (0.98-0.995), counts to 8 softmax 0.77 and linear attention 0.89 (docs/TASKS.md).
    ladder = Ladder(
        axis=("n",),
        source="measured here: docs/TASKS.md, counting, 'Kept hard'",
        baseline={"n": 32},
        steps=({"n": 64}, {"n": 128}),
    )
    length_param = "n"
    computes = {"counts": "the answer is the number of times the query occurs in x"}

    def number(self, count: int) -> int:
        """The token of the count ``count``."""
        return self.params.vocab + 1 + count

    @property
    def max_count(self) -> int:
        """C: the largest count asked (n // queries; n in the one-answer layout)."""
        return self.params.n // self.params.queries if self.params.queries else self.params.n

    @property
    def vocab_size(self) -> int:
        return self.params.vocab + 1 + self.max_count + 1

    @property
    def seq_len(self) -> int:
        p = self.params
        return p.n + 2 * p.queries if p.queries else p.n + 2

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, dev = self.params, generator.device
        if not p.queries:
            return self._generate_one_answer(n, generator, device)
        m, C = p.queries, self.max_count
        tokens = torch.rand(n, p.vocab, generator=generator, device=dev).argsort(dim=1)
        queried, others = tokens[:, :m], tokens[:, m:]
        counts = torch.randint(C + 1, (n, m), generator=generator, device=dev)
        # slot k of x belongs to query j while k < counts_1 + .. + counts_j, then to filler
        ends = counts.cumsum(dim=1)
        slot = torch.arange(p.n, device=dev).expand(n, -1).contiguous()
        owner = torch.searchsorted(ends, slot, right=True)  # m: filler
        filler_pick = torch.randint(p.vocab - m, (n, p.n), generator=generator, device=dev)
        filler = others.gather(1, filler_pick)
        x = torch.where(owner < m, queried.gather(1, owner.clamp(max=m - 1)), filler)
        x = x.gather(1, torch.rand(n, p.n, generator=generator, device=dev).argsort(dim=1))
        pairs, is_count = answered_pairs(queried, self.number(0) + counts)  # the q_j given
        return batch_from_parts([x, self.sep], [pairs], device, answer_mask=is_count)

    def _generate_one_answer(self, n: int, generator: torch.Generator, device) -> Batch:
        p, dev = self.params, generator.device
        q = torch.randint(p.vocab, (n, 1), generator=generator, device=dev)
        count = torch.randint(p.n + 1, (n, 1), generator=generator, device=dev)
        # a random rank per position: the c positions of lowest rank hold q
        rank = torch.rand(n, p.n, generator=generator, device=dev).argsort(dim=1).argsort(dim=1)
        # q + 1..vocab-1 mod vocab is uniform over the tokens other than q
        shift = torch.randint(1, p.vocab, (n, p.n), generator=generator, device=dev)
        x = torch.where(rank < count, q, (q + shift) % p.vocab)
        return batch_from_parts([x, q, self.sep], [self.number(0) + count], device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        p = self.params
        if not p.queries:
            count = (inputs[:, : p.n] == inputs[:, p.n : p.n + 1]).sum(dim=1)
            return targets_at(inputs, p.n + 1, self.number(0) + count)  # SEP answers
        query_pos = torch.arange(p.n + 1, p.n + 2 * p.queries, 2, device=inputs.device)
        queried = inputs[:, query_pos]
        counts = (queried.unsqueeze(2) == inputs[:, : p.n].unsqueeze(1)).sum(dim=2)
        # a count above C (garbage input only) is clipped to the largest number token
        return targets_at(inputs, query_pos, self.number(0) + counts.clamp(max=self.max_count))

    def token_name(self, token: int) -> str:
        if token > self.sep:
            return f"#{token - self.number(0)}"
        return super().token_name(token)
