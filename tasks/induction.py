"""induction: ``.. A B .. A`` -> ``B``: at every repeat of a key token, the token that
followed its first occurrence.

Dense layout (the default): n tokens over 0..vocab-1 with no special tokens. The first
``keys`` ids are key tokens, the others filler. Each example picks ``triggers`` distinct
keys A_i, gives each a successor B_i (a filler token), and places triggers x ``repeats``
key occurrences, each followed by its B_i, at random non-overlapping places: every key
once, each other occurrence to a key drawn uniformly (``fixed_repeats``: every key exactly
``repeats`` times, suite v2's layout); every other token is filler, uniform. The answers
are the B_i after every occurrence of A_i but its first: the token that followed A_i
before, as an induction head copies it. ``triggers * (repeats - 1)``
answers per sequence (20 at the defaults). Suite v2 placed every key exactly twice with no
filler, so the keys still open were known, and the successor of any open key, whichever
key was current, scored 0.23 against chance 0.02; that rule is the task's own audit rule.

``dense=False`` is suite v1's one-answer layout: A occurs exactly twice, at a uniform place
p in [0, n-3] and as the last token; B = x_{p+1} differs from A; every other token is
uniform over the vocab - 1 tokens other than A; only the last position has an answer.
Suite v1 used it as the default: with one label per sequence the circuit formed only after
a long plateau, and softmax stayed at chance under quick (0.02).

This is the induction-head circuit of Olsson et al. (2022): a previous-token head writes
each token into the position after it, and at a repeat a matching head with query A attends
to the position whose previous token is A and copies its token, B (two layers). Without
attention the model sees only A and its position: about chance.
"""

from dataclasses import dataclass

import torch

from synthbench.core.task import (
    IGNORE,
    TASKS,
    Batch,
    Ladder,
    ShortcutRule,
    Task,
    pair_places,
    require_at_least,
    teacher_forced,
)


@dataclass(frozen=True)
class InductionParams:
    n: int = 112  # sequence length
    vocab: int = 64  # number of tokens
    keys: int = 20  # the first `keys` ids are key tokens, the rest filler (dense layout)
    # keys used per sequence, each with its own successor (dense layout): 20 associations to
    # hold at once, where cosFormer's state blurs them (at 4, all three mechanisms reach 0.99)
    triggers: int = 20
    # occurrences per key on average (triggers x repeats in all); every occurrence but a
    # key's first is an answer (dense layout)
    repeats: int = 2
    # True: every key exactly `repeats` times (suite v2); False: every key once, the other
    # occurrences to keys drawn at random, so no key is known to be done with
    fixed_repeats: bool = False
    dense: bool = True  # False: suite v1's one-answer layout (n and vocab only)

    def __post_init__(self):
        require_at_least("induction", self, n=3, vocab=2)
        if not self.dense:
            return
        require_at_least("induction", self, keys=1, triggers=1, repeats=2)
        if self.triggers > self.keys or self.vocab - self.keys < 1:
            raise ValueError(
                f"induction needs triggers <= keys < vocab, got triggers={self.triggers}, "
                f"keys={self.keys}, vocab={self.vocab}"
            )
        if 2 * self.triggers * self.repeats > self.n:
            raise ValueError(
                f"induction needs n >= 2 * triggers * repeats (each occurrence and its "
                f"successor), got n={self.n}, triggers={self.triggers}, repeats={self.repeats}"
            )


@TASKS.register(
    "induction",
    category="Reasoning",
    description="... A B ... A -> B: at every repeat of a key, the token that followed it",
)
class Induction(Task):
    Params = InductionParams
    difficulties = {
        "easy": {"triggers": 10},
        "hard": {"n": 256, "keys": 32, "triggers": 32, "repeats": 3},
    }
    # n: more filler and distance; vocab: more successors (filler ids); triggers: more
    # associations held at once. keys: the successors are the vocab - keys filler ids, so
    # more keys leave fewer (one at keys = vocab - 1): smaller is harder. repeats: more
    # showings of each association, so fewer is harder.
    harder = {
        "n": "larger",
        "vocab": "larger",
        "keys": "smaller",
        "triggers": "larger",
        "repeats": "smaller",
    }
    # Associations held at once against state size (Zoology, Arora et al. 2023, Fig. 2; the
    # induction head of Olsson et al. 2022): more keys, each with its own successor, in a
    # sequence of the same length.
    ladder = Ladder(
        axis=("triggers",),
        source="Zoology (Arora et al. 2023), Fig. 2; Olsson et al. 2022",
        baseline={"n": 128, "keys": 32, "triggers": 10},
        steps=({"triggers": 20}, {"triggers": 30}),
    )
    length_param = "n"

    @property
    def vocab_size(self) -> int:
        return self.params.vocab

    @property
    def seq_len(self) -> int:
        return self.params.n - 1 if self.params.dense else self.params.n

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        if not self.params.dense:
            return self._generate_one_answer(n, generator, device)
        p, dev = self.params, generator.device
        occurrences = p.triggers * p.repeats
        key = torch.rand(n, p.keys, generator=generator, device=dev).argsort(dim=1)[:, : p.triggers]
        filler = p.vocab - p.keys
        successor = p.keys + torch.randint(filler, (n, p.triggers), generator=generator, device=dev)
        x = p.keys + torch.randint(filler, (n, p.n), generator=generator, device=dev)
        place = pair_places(n, p.n, occurrences, generator)  # each key and its successor
        # which key each place gets, in random order: every key `repeats` times (suite v2),
        # or every key once and the other occurrences to keys drawn uniformly
        if p.fixed_repeats:
            owner = torch.arange(p.triggers, device=dev).repeat_interleave(p.repeats).expand(n, -1)
        else:
            extra = torch.randint(
                p.triggers, (n, occurrences - p.triggers), generator=generator, device=dev
            )
            owner = torch.cat([torch.arange(p.triggers, device=dev).expand(n, -1), extra], dim=1)
        owner = owner.gather(
            1, torch.rand(n, occurrences, generator=generator, device=dev).argsort(dim=1)
        )
        x.scatter_(1, place, key.gather(1, owner))
        x.scatter_(1, place + 1, successor.gather(1, owner))
        # answers: each successor but the one after its key's first occurrence
        seen_before = (owner.unsqueeze(2) == owner.unsqueeze(1)).tril(diagonal=-1).any(dim=2)
        answer = torch.zeros_like(x, dtype=torch.bool)
        answer.scatter_(1, place + 1, seen_before)
        return teacher_forced(x, answer).to(device)

    def _generate_one_answer(self, n: int, generator: torch.Generator, device) -> Batch:
        p, dev = self.params, generator.device
        rows = torch.arange(n, device=dev)
        a = torch.randint(p.vocab, (n,), generator=generator, device=dev)
        # every other token uniform over the vocab - 1 tokens other than A
        shift = 1 + torch.randint(p.vocab - 1, (n, p.n), generator=generator, device=dev)
        x = (a.unsqueeze(1) + shift) % p.vocab
        first = torch.randint(p.n - 2, (n,), generator=generator, device=dev)
        x[rows, first] = a
        x[:, -1] = a
        b = x[rows, first + 1]
        sequences = torch.cat([x, b.unsqueeze(1)], dim=1)
        answer = torch.zeros_like(sequences, dtype=torch.bool)
        answer[:, -1] = True
        return teacher_forced(sequences, answer).to(device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        L = inputs.shape[1]
        # at position i, the earliest earlier occurrence j < i of the token read, if any;
        # the answer is the token after it (j + 1 <= i, so in the prefix)
        same = inputs.unsqueeze(2) == inputs.unsqueeze(1)  # (batch, i, j)
        earlier = same & torch.ones(L, L, dtype=torch.bool, device=inputs.device).tril(-1)
        has_earlier = earlier.any(dim=2)
        first = earlier.to(torch.uint8).argmax(dim=2)  # the first True (uint8: 1/8 of long)
        copied = inputs.gather(1, (first + 1).clamp(max=L - 1))
        if self.params.dense:  # every repeat of a key token is an answer
            asked = has_earlier & (inputs < self.params.keys)
        else:  # only the last position
            asked = has_earlier & (torch.arange(L, device=inputs.device) == L - 1)
        return torch.where(asked, copied, IGNORE)

    def shortcut_rules(self):
        if not self.params.dense:
            return []
        keys = self.params.keys

        def open_successor(latest: bool):
            def predict(inputs: torch.Tensor) -> torch.Tensor:
                # an open key: its first occurrence is before i and it has not recurred
                # before i (its repeat at i is the current token), whichever key i reads
                n, L = inputs.shape
                order = torch.arange(L, device=inputs.device)
                row, column = order.view(1, L, 1), order.view(1, 1, L)
                same = inputs.unsqueeze(2) == inputs.unsqueeze(1)  # (n, row, column)
                later = same & (column > row)
                first = ~(same & (column < row)).any(dim=2)
                recur = torch.where(later.any(dim=2), later.to(torch.uint8).argmax(dim=2), L)
                # at answer position i (a row), the candidates p (columns)
                candidate = (
                    (first & (inputs < keys)).unsqueeze(1)
                    & (column < row)
                    & (recur.unsqueeze(1) >= row)
                )
                # int32 scores: the (n, L, L) tensor at half of int64's bytes
                rank = (column if latest else L - column).to(torch.int32)
                score = torch.where(candidate, rank, -1)
                chosen = score.argmax(dim=2)
                successor = inputs.gather(1, (chosen + 1).clamp(max=L - 1))
                return torch.where(candidate.any(dim=2), successor, 0)

            return predict

        description = (
            "the successor of an open key (seen once, not yet repeated), whichever key is current"
        )
        return [
            ShortcutRule("earliest open key's successor", description, open_successor(False)),
            ShortcutRule("latest open key's successor", description, open_successor(True)),
        ]
