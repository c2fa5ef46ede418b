"""histogram: ``x_1 .. x_n SEP q_1 c_1 .. q_m c_m``. Each c_j counts q_j in x.

After SEP, m distinct tokens q_j (``queries``, drawn uniformly from the vocabulary, so a
queried token may be absent from x) are each followed by the number of its occurrences in x
(the answers are the c_j; the q_j are given). Data tokens are 0..vocab-1, SEP = vocab, and
the number tokens ``vocab + 1 + c`` for c = 0..n come last. Each example draws x from its
own distribution over the vocabulary, a softmax of Gaussian logits times a scale drawn
uniformly from [0, MAX_LOGIT_SCALE]: flat examples give small counts, peaked ones large
counts, so every count 0..n occurs and the most common one (0) is about 40% of the answers.
(Suite v1's scale of 3 for every example, with queried tokens, left "0" at 0.63.)

``queries=0`` is suite v1's layout ``x SEP x_1 c_1 .. x_n c_n`` (every x_i repeated with its
count, the scale 3 for every example), which the slay-paper protocol runs.

Suite v1 repeated every x_i after SEP, so most answers were the count of a token already
answered for (copying it scored 0.87); the queries are now distinct, and fewer than the
vocabulary by default, so no count follows from the others either (they would sum to n).

Known solution: at q_j the model attends to the tokens of x (before SEP) equal to q_j and
turns that attention into a count with a sink (SEP, say, given the score of a match): the
weight left on the sink is 1 / (1 + c), which an MLP can read off.
"""

from dataclasses import dataclass

import torch

from synthbench.core.task import (
    TASKS,
    Batch,
    Ladder,
    SepTask,
    ShortcutRule,
    answered_pairs,
    batch_from_parts,
    require_at_least,
    targets_at,
)

# Largest scale of an example's Gaussian logits (each example draws its own, uniformly;
# suite v1's layout uses it for every example)
MAX_LOGIT_SCALE = 3.0


@dataclass(frozen=True)
class HistogramParams:
    n: int = 64  # length of x
    vocab: int = 32  # number of data tokens
    queries: int = 8  # distinct tokens whose count is asked for, at most vocab (0: suite v1)

    def __post_init__(self):
        require_at_least("histogram", self, n=1, vocab=2, queries=0)
        if self.queries > self.vocab:
            raise ValueError(
                f"histogram needs queries <= vocab, got queries={self.queries}, vocab={self.vocab}"
            )


@TASKS.register(
    "histogram",
    category="Patterns",
    description="x SEP q_1 c_1 .. q_m c_m: the count in x of each of m distinct query tokens",
)
class Histogram(SepTask):
    Params = HistogramParams
    difficulties = {
        "easy": {"n": 16, "vocab": 8, "queries": 4},  # suite v2's first default
        "hard": {"n": 128, "vocab": 32, "queries": 16},
    }
    # n: counts up to n, the large ones crowded. vocab: the n tokens spread over more ids,
    # so the counts are smaller (and 0 commoner) and easier to read, so fewer is harder.
    # queries: each adds an answer of the same kind (and at queries = vocab the counts
    # sum to n), so fewer is harder; 0 is suite v1's layout (every x_i, n answers).
    harder = {"n": "larger", "vocab": "smaller", "queries": "smaller"}
    # Larger counts to read off attention weights, as counting's (docs/TASKS.md): x grows at
    # a fixed vocab and number of queries.
    ladder = Ladder(
        axis=("n",),
        source="measured here: docs/TASKS.md, counting, 'Kept hard'",
        baseline={"n": 32},
        steps=({"n": 64}, {"n": 128}),
    )
    length_param = "n"
    computes = {"counts": "the answer is the number of times the query occurs in x"}

    def number(self, count: int) -> int:
        """The token of the count ``count`` (0..n)."""
        return self.params.vocab + 1 + count

    @property
    def vocab_size(self) -> int:
        return self.params.vocab + 1 + self.params.n + 1

    @property
    def asked(self) -> int:
        """Tokens whose count is asked: the queries, or every x_i in suite v1's layout."""
        return self.params.queries or self.params.n

    @property
    def seq_len(self) -> int:
        return self.params.n + 2 * self.asked

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, dev = self.params, generator.device
        if p.queries:
            scale = MAX_LOGIT_SCALE * torch.rand(n, 1, generator=generator, device=dev)
        else:
            scale = torch.full((n, 1), MAX_LOGIT_SCALE, device=dev)
        logits = scale * torch.randn(n, p.vocab, generator=generator, device=dev)
        x = torch.multinomial(logits.softmax(dim=1), p.n, replacement=True, generator=generator)
        if p.queries:  # distinct tokens, uniformly
            order = torch.rand(n, p.vocab, generator=generator, device=dev).argsort(dim=1)
            queried = order[:, : p.queries]
        else:
            queried = x
        counts = (queried.unsqueeze(2) == x.unsqueeze(1)).sum(dim=2)
        pairs, is_count = answered_pairs(queried, self.number(0) + counts)  # the q_j given
        return batch_from_parts([x, self.sep], [pairs], device, answer_mask=is_count)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        p = self.params
        query_pos = torch.arange(p.n + 1, p.n + 2 * self.asked, 2, device=inputs.device)
        queried = inputs[:, query_pos]  # (batch, queries)
        counts = (queried.unsqueeze(2) == inputs[:, : p.n].unsqueeze(1)).sum(dim=2)
        return targets_at(inputs, query_pos, self.number(0) + counts)

    def shortcut_rules(self):
        n = self.params.n

        def repeat_last_count(inputs: torch.Tensor) -> torch.Tensor:
            guess = torch.full_like(inputs, self.number(0))
            guess[:, n + 3 :: 2] = inputs[:, n + 2 : -1 : 2]  # at q_j, the c_(j-1) before it
            return guess

        description = "the count answered just before (suite v1's copy of an earlier count)"
        return [ShortcutRule("repeat last count", description, repeat_last_count)]

    def token_name(self, token: int) -> str:
        if token > self.sep:
            return f"#{token - self.number(0)}"
        return super().token_name(token)
