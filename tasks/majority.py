"""majority: ``x_1 .. x_n SEP m``. The answer m is the most frequent token of x, unique.

Data tokens are 0..vocab-1 and SEP = vocab; the answer reuses the data tokens. x is drawn
uniformly; where the top count is tied, one of the tied tokens is chosen at random as the
mode and one occurrence of another tied token is overwritten with it, so the mode wins by at
least one. At SEP one uniform attention head over x puts the histogram of x (the mean of
the one-hot embeddings) into the residual stream, and an MLP takes its argmax (margin at
least 1/n). Without attention the model sees only SEP and is at chance.
"""

from dataclasses import dataclass

import torch

from synthbench.core.task import (
    TASKS,
    Batch,
    Ladder,
    SepTask,
    batch_from_parts,
    require_at_least,
    targets_at,
)


@dataclass(frozen=True)
class MajorityParams:
    # 64 (suite v3): at 32 over 8 values the mode of the last 8 tokens alone scored 0.33
    # against chance 0.12 (the audit's relabelled family)
    n: int = 64  # length of x
    vocab: int = 8  # number of data tokens

    def __post_init__(self):
        require_at_least("majority", self, n=1, vocab=2)


@TASKS.register(
    "majority",
    category="Patterns",
    description="x SEP m: the most frequent token of x",
)
class Majority(SepTask):
    Params = MajorityParams
    difficulties = {"easy": {"vocab": 4}, "hard": {"n": 128, "vocab": 16}}
    # n: the mode wins by as little as 1/n of x; vocab: more counts to take the argmax of
    harder = {"n": "larger", "vocab": "larger"}
    # More classes to count and take the argmax of at a fixed length: the mode wins by less.
    # Linear attention and cosFormer found the mode of 128 over 16 at quick's grown lr
    # (docs/TASKS.md), so the ladder starts there.
    ladder = Ladder(
        axis=("vocab",),
        source="measured here: docs/TASKS.md, 'What suite v3 changed' (at the ceiling)",
        baseline={"n": 128, "vocab": 16},
        steps=({"vocab": 32}, {"vocab": 64}),
    )
    length_param = "n"
    computes = {
        "elimination": "the answer is the most frequent token of x: its multiset's argmax",
        "counts": "the mode is found by counting each token's occurrences",
    }

    @property
    def seq_len(self) -> int:
        return self.params.n + 1

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, dev = self.params, generator.device
        x = torch.randint(p.vocab, (n, p.n), generator=generator, device=dev)
        counts = torch.zeros(n, p.vocab, dtype=torch.long, device=dev)
        counts.scatter_add_(1, x, torch.ones_like(x))
        tied = counts == counts.max(dim=1, keepdim=True).values
        # a random tied token becomes the mode, another random tied one (if any) the rival
        order = torch.rand(n, p.vocab, generator=generator, device=dev).masked_fill(~tied, -1.0)
        mode = order.argmax(dim=1, keepdim=True)
        rival = order.scatter(1, mode, -1.0).argmax(dim=1, keepdim=True)
        has_rival = tied.sum(dim=1, keepdim=True) > 1
        # one random occurrence of the rival is overwritten with the mode
        pick = torch.rand(n, p.n, generator=generator, device=dev).masked_fill(x != rival, -1.0)
        overwrite = torch.zeros_like(x, dtype=torch.bool).scatter(1, pick.argmax(1, True), True)
        x = torch.where(overwrite & has_rival, mode, x)
        return batch_from_parts([x, self.sep], [mode], device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        n, vocab = self.params.n, self.params.vocab
        x = inputs[:, :n]
        tokens = torch.arange(vocab, device=inputs.device)
        counts = (x.unsqueeze(2) == tokens).sum(dim=1)  # (batch, vocab)
        return targets_at(inputs, n, counts.argmax(dim=1))  # the SEP position answers the mode
