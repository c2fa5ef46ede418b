"""histogram: ``x_1 .. x_n SEP x_1 c_1 x_2 c_2 .. x_n c_n``. Each c_i counts x_i in x.

After SEP every x_i is repeated and followed by the number of its occurrences in x (the
answers are the c_i; the repeated x_i are given). Data tokens are 0..vocab-1, SEP = vocab,
and the number tokens ``vocab + c`` for c = 1..n come last. Each example draws x from its own
random distribution over the vocabulary (a softmax of Gaussian logits with a large scale), so
that counts from 1 to n all occur. At the repeated x_i the model must attend to the tokens
of x (before SEP: the copies after SEP match too) equal to the current one, and turn that
attention into a count with a sink (SEP, say, given the score of a match): the weight left
on the sink is 1 / (1 + c), which an MLP can read off.
"""

from dataclasses import dataclass

import torch

from synthbench.task import TASKS, Batch, SepTask, batch_from_parts, require_at_least, targets_at

# Scale of the Gaussian logits of each example's token distribution: peaked enough that
# counts up to n (every token equal) occur, flat enough that small counts occur as well.
LOGIT_SCALE = 3.0


@dataclass(frozen=True)
class HistogramParams:
    n: int = 16  # length of x
    vocab: int = 8  # number of data tokens

    def __post_init__(self):
        require_at_least("histogram", self, n=1, vocab=2)


@TASKS.register(
    "histogram",
    category="Patterns",
    description="x SEP x_1 c_1 .. x_n c_n: the count of each token of x",
)
class Histogram(SepTask):
    Params = HistogramParams
    difficulties = {"easy": {"n": 8}, "hard": {"n": 32}}
    length_param = "n"

    def number(self, count: int) -> int:
        """The token of the count ``count`` (1..n)."""
        return self.params.vocab + count

    @property
    def vocab_size(self) -> int:
        return self.params.vocab + 1 + self.params.n

    @property
    def seq_len(self) -> int:
        return 3 * self.params.n

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, dev = self.params, generator.device
        logits = LOGIT_SCALE * torch.randn(n, p.vocab, generator=generator, device=dev)
        x = torch.multinomial(logits.softmax(dim=1), p.n, replacement=True, generator=generator)
        counts = (x.unsqueeze(2) == x.unsqueeze(1)).sum(dim=2)  # (n, n): count of each x_i
        pairs = torch.stack([x, self.number(0) + counts], dim=2).reshape(n, 2 * p.n)
        is_count = torch.arange(2 * p.n, device=dev) % 2 == 1  # the c_i answer, the x_i are given
        return batch_from_parts([x, self.sep], [pairs], device, answer_mask=is_count)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        n = self.params.n
        query_pos = torch.arange(n + 1, 3 * n, 2, device=inputs.device)  # the repeated x_i
        queried = inputs[:, query_pos]  # (batch, n)
        # the count of the token just read among x (before SEP); 0 only for garbage input
        counts = (queried.unsqueeze(2) == inputs[:, :n].unsqueeze(1)).sum(dim=2)
        return targets_at(inputs, query_pos, self.number(0) + counts)

    def token_name(self, token: int) -> str:
        if token > self.sep:
            return f"#{token - self.sep}"
        return super().token_name(token)
