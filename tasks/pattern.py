"""pattern: a periodic prompt ``m_0 .. m_{p-1} m_0 ..`` (n tokens) ``SEP`` and its next k.

Each example draws a period p uniformly from [min_period, max_period] and a motif of p
distinct data tokens, repeats the motif to fill n prompt tokens (position i holds
m_{i mod p}), then after SEP continues the cycle for k answer tokens, m_{(n+j) mod p} for
j = 0..k-1. Data tokens are 0..vocab-1 and SEP is ``vocab``. Since n >= 2 max_period,
every motif is seen at least twice, and since its tokens are distinct the smallest period
of the prompt is p; the oracle infers it from the prompt alone. Distinct motif tokens
also make every token's successor unique, so an induction head solves it without
computing p: at an answer position the model copies the token that followed the current
token in the prompt; at SEP it queries with the previous token (x_n, brought in by a
previous-token head) instead, matching keys that also carry their previous token (two
layers). Without attention the model sees only the current token and its position, which
do not determine the continuation (the motif, its period and the phase are random).

Periods start at 5: once a whole period has been emitted, an answer is the token p back, so
in suite v1 (periods from 2) a table over the last 4 tokens continued the short motifs
without reading the prompt (0.29 at the default preset, 0.78 at easy). The default motifs are
long (20 to 32 of 64 tokens, seen two or three times): a successor table that large is what
a fixed-size state cannot hold (docs/TASKS.md).
"""

from dataclasses import dataclass

import torch

from synthbench.core.task import TASKS, Batch, Ladder, SepTask, batch_from_parts, targets_at


@dataclass(frozen=True)
class PatternParams:
    n: int = 64  # prompt length
    min_period: int = 20  # shortest motif (at least 5: a window of 4 never holds a whole one)
    max_period: int = 32  # longest motif
    k: int = 16  # continuation tokens to emit after SEP
    vocab: int = 64  # number of data tokens

    def __post_init__(self):
        if not 2 <= self.min_period <= self.max_period <= self.vocab:
            raise ValueError(
                "pattern needs 2 <= min_period <= max_period <= vocab, got "
                f"min_period={self.min_period}, max_period={self.max_period}, vocab={self.vocab}"
            )
        if self.n < 2 * self.max_period or self.k < 1:
            raise ValueError(
                "pattern needs n >= 2 * max_period (every motif seen twice) and k >= 1, got "
                f"n={self.n}, max_period={self.max_period}, k={self.k}"
            )


@TASKS.register(
    "pattern",
    category="Reasoning",
    description="periodic prompt SEP continuation: infer the motif and extend it",
)
class Pattern(SepTask):
    Params = PatternParams
    difficulties = {
        # easy: short periods, 9 to 16 (suite v3: suite v2's 5 to 8 shared so many common
        # multiples that one fixed lag scored 0.50); hard: every size doubled
        "easy": {"n": 32, "min_period": 9, "max_period": 16, "k": 8, "vocab": 16},
        "hard": {"n": 128, "min_period": 40, "max_period": 64, "k": 32, "vocab": 128},
    }
    # min_period, max_period: longer motifs, a larger successor table seen fewer times;
    # vocab: more ids. n: with the periods fixed, a longer prompt repeats the motif more
    # (each successor shown n / p times, nothing new to hold), so shorter is harder. k:
    # each adds an answer of the same kind, and past a whole period an answer is also the
    # one p back, so fewer is harder.
    harder = {
        "n": "smaller",
        "min_period": "larger",
        "max_period": "larger",
        "k": "smaller",
        "vocab": "larger",
    }
    # Longer motifs: a larger successor table, each successor seen fewer times, against state
    # size (Zoology, Arora et al. 2023, Fig. 2): at periods 5..8 all three mechanisms
    # measured continued the motif, at 20..32 linear attention fell to 0.27 (docs/TASKS.md).
    # Ranges of 13 periods: over 16..20 both bounds divide 80, and the token 80 back scored
    # 0.41 (the audit's fixed lag).
    ladder = Ladder(
        axis=("min_period", "max_period"),
        source="Zoology (Arora et al. 2023), Fig. 2; measured here: docs/TASKS.md, pattern",
        baseline={"n": 96, "min_period": 16, "max_period": 28},
        steps=({"min_period": 24, "max_period": 36}, {"min_period": 32, "max_period": 44}),
    )
    length_param = "n"

    @property
    def seq_len(self) -> int:
        return self.params.n + self.params.k

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, dev = self.params, generator.device
        period = torch.randint(
            p.min_period, p.max_period + 1, (n, 1), generator=generator, device=dev
        )
        # the first max_period columns of a random permutation; a motif uses the first p
        motif = torch.rand(n, p.vocab, generator=generator, device=dev).argsort(dim=1)
        motif = motif[:, : p.max_period]
        cycle = motif.gather(1, torch.arange(p.n + p.k, device=dev) % period)
        return batch_from_parts([cycle[:, : p.n], self.sep], [cycle[:, p.n :]], device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        n, k = self.params.n, self.params.k
        prompt = inputs[:, :n]
        # the smallest q <= n // 2 for which the prompt is q-periodic; n (no period seen)
        # if there is none, which only garbage prompts reach
        period = torch.full((len(inputs), 1), n, dtype=torch.long, device=inputs.device)
        for q in range(n // 2, 0, -1):
            periodic = (prompt[:, q:] == prompt[:, :-q]).all(dim=1, keepdim=True)
            period = torch.where(periodic, q, period)
        steps = torch.arange(n, n + k, device=inputs.device)
        # position n + j: m_{(n+j) mod p}
        return targets_at(inputs, slice(n, None), prompt.gather(1, steps % period))
