"""retrieval: find the marked values in a haystack (needles in a haystack).

Layout ``x_0 .. x_{n-1} [BLANK x gap] M_1 v_1 .. M_k v_k``: a haystack of n data tokens in
which k = ``needles`` distinct marker tokens each occur once, at random non-overlapping
places, each followed by its value (a haystack token, drawn like the rest, so nothing but its
place tells it apart); then ``gap`` BLANK tokens; then every marker once more, in random
order, as a query, each followed by its value (the answers). Data tokens are 0..vocab-1, the
markers ``vocab .. vocab + k - 1`` (named MARKER when k = 1, else M1 .. Mk), BLANK
``vocab + k`` (only where gap > 0). The gap (suite v4's ladder) puts every query at least
gap + 1 positions after the value it asks for, beyond the suite's windows.

``needles=1`` is suite v1's one-answer layout (one MARKER, one query). With one label per
sequence seeds either solved it or sat at chance (softmax 0.81 +- 0.32 under quick). At 8
needles over 32 tokens softmax, linear attention and cosFormer all reached 0.99 at their own
best lr; at 24 over 64 cosFormer falls behind (docs/TASKS.md).

Known solution: an induction head. A previous-token head writes "my previous token is M_i"
into the value's position; at the query M_i a matching head attends there and copies the
value (two layers). Without attention a query carries no information about its value.
"""

from dataclasses import dataclass

import torch

from synthbench.core.task import (
    TASKS,
    Batch,
    Ladder,
    Task,
    answered_pairs,
    batch_from_parts,
    pair_places,
    require_at_least,
    targets_at,
)


@dataclass(frozen=True)
class RetrievalParams:
    n: int = 64  # haystack length, marker and value included
    vocab: int = 64  # number of data tokens
    needles: int = 24  # marked values in the haystack, all queried (1: suite v1's layout)
    # BLANK tokens between the haystack and the first query (suite v4's ladder: 32, every
    # answer beyond the windows' reach); 0: the queries right after the haystack, as before
    gap: int = 0

    def __post_init__(self):
        require_at_least("retrieval", self, n=2, vocab=2, needles=1, gap=0)
        if 2 * self.needles > self.n:
            raise ValueError(
                f"retrieval needs n >= 2 * needles (each marker and its value), got "
                f"n={self.n}, needles={self.needles}"
            )


@TASKS.register(
    "retrieval",
    category="Memory",
    description="haystack with k marked values, then each marker: emit the value it marked",
)
class Retrieval(Task):
    Params = RetrievalParams
    difficulties = {"easy": {"n": 32, "vocab": 32, "needles": 8}, "hard": {"n": 256}}
    # needles: more marker-value associations to hold (8 over 32 tokens: all solved; 24
    # over 64: cosFormer behind); n: a longer haystack; vocab: more values
    harder = {"n": "larger", "vocab": "larger", "needles": "larger", "gap": "larger"}
    length_param = "n"
    # Needle in a haystack at a growing distance: Zoology (Arora et al. 2023, Sec. 3) and
    # Based (Arora et al. 2024, Sec. 3) find recall falling with the distance to the key for
    # mechanisms whose state decays (RetNet, Mamba, GLA's gates) but not for attention; the
    # pairs' capacity is kv_recall's axis. 16 needles at every level.
    ladder = Ladder(
        axis=("n",),
        source="Zoology (Arora et al. 2023), Sec. 3; Based (Arora et al. 2024), Sec. 3",
        baseline={"n": 64, "needles": 16, "gap": 32},
        steps=({"n": 128}, {"n": 192}),
    )

    @property
    def marker(self) -> int:
        """The first marker (the only one when needles = 1)."""
        return self.params.vocab

    @property
    def special_tokens(self) -> dict[str, int]:
        k = self.params.needles
        markers = {"MARKER": self.marker} if k == 1 else {
            f"M{i + 1}": self.marker + i for i in range(k)}  # fmt: skip
        return {**markers, "BLANK": self.marker + k} if self.params.gap else markers

    @property
    def vocab_size(self) -> int:
        return self.params.vocab + self.params.needles + (self.params.gap > 0)

    @property
    def first_query(self) -> int:
        """The input position of the first query (its answer is predicted there)."""
        return self.params.n + self.params.gap

    @property
    def seq_len(self) -> int:
        return self.first_query + 2 * self.params.needles - 1

    def recall_distance(self) -> int:
        """The first query against a value at the haystack's end, n - 1: gap + 1."""
        return self.first_query - (self.params.n - 1)

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, dev = self.params, generator.device
        k = p.needles
        haystack = torch.randint(p.vocab, (n, p.n), generator=generator, device=dev)
        where = pair_places(n, p.n, k, generator)  # each marker and its value
        markers = self.marker + torch.rand(n, k, generator=generator, device=dev).argsort(dim=1)
        haystack.scatter_(1, where, markers)
        values = haystack.gather(1, where + 1)
        order = torch.rand(n, k, generator=generator, device=dev).argsort(dim=1)
        queries, is_value = answered_pairs(markers.gather(1, order), values.gather(1, order))
        blanks = torch.full((n, p.gap), self.marker + k, dtype=torch.long, device=dev)
        return batch_from_parts([haystack, blanks], [queries], device, answer_mask=is_value)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        n = self.params.n
        query_pos = torch.arange(self.first_query, self.seq_len, 2, device=inputs.device)
        queried = inputs[:, query_pos]  # (batch, k)
        # the first place of each queried marker among positions 0..n-2; on garbage input
        # without one, argmax returns 0 and the answer is x_1
        found = inputs[:, : n - 1].unsqueeze(1) == queried.unsqueeze(2)  # (batch, k, n-1)
        where = found.long().argmax(dim=2)
        return targets_at(inputs, query_pos, inputs.gather(1, where + 1))
