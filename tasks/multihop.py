"""multihop: follow pointer chains, hop by hop (``walk``) or ``hops`` edges at once.

Layout ``a_1 b_1 .. a_P b_P SEP`` then ``walks`` queries. P = ``pairs`` edges ``a -> b`` in a
random order form ``pairs // hops`` chains of exactly ``hops`` edges plus, when ``pairs %
hops`` is not 0, one shorter distractor chain with the remaining edges; every node occurs
in one chain only, so a node has at most one successor and one predecessor. Each query
starts at the head s of a distinct random full-length chain (given):

- ``walk`` (the default): ``s n_1 .. n_hops``, the walk along the chain, every node an
  answer. Each answer is one hop from the node before it; the target metric is the
  free-running token accuracy, so the chain counts as followed only where the model walks
  it on its own answers (teacher-forced, each hop is handed the right previous node).
- ``walk=False``: ``s t``, t the tail of s's chain, ``hops`` edges away with no intermediate
  step (with ``walks=1``, suite v1's one-answer layout, which the slay-paper protocol runs).

Nodes are tokens 0..nodes-1, SEP is ``nodes``. ``gap`` BLANK tokens (``nodes + 1``) between
SEP and the first query (suite v4's ladder) put every hop at least gap + 2 positions after the
edge it follows, beyond the suite's windows; 0 (the default) starts the queries after SEP.

Known solution: one hop is an induction head (a previous-token head writes each ``a`` into
the position of its ``b``; at a node a matching head copies the ``b`` whose ``a`` equals it),
so a 2-layer model can walk any chain. Composing h hops without intermediate steps needs
another matching layer per hop on top of the previous hop's result: h + 1 layers in the
plain circuit, so a 2-layer model solves ``walk=False`` at hops 1 only. Suite v1 asked that
at hops 2 with one answer per sequence, and softmax stayed below chance.
"""

from dataclasses import dataclass

import torch

from synthbench.core.task import IGNORE, TASKS, Batch, Ladder, Task, batch_from_parts


@dataclass(frozen=True)
class MultihopParams:
    pairs: int = 16  # edges in the context
    hops: int = 2  # edges between the start node and the answer
    nodes: int = 64  # size of the node vocabulary
    walks: int = 4  # queries after SEP, each from the head of a distinct full chain
    walk: bool = True  # answer every node on the way (False: only the node hops away)
    # BLANK tokens between SEP and the first query (suite v4's ladder: 32, every hop beyond
    # the windows' reach); 0: the queries right after SEP, as before
    gap: int = 0

    def __post_init__(self):
        if isinstance(self.gap, bool) or not isinstance(self.gap, int) or self.gap < 0:
            raise ValueError(f"multihop needs gap >= 0, got gap={self.gap!r}")
        if not 1 <= self.hops <= self.pairs:
            raise ValueError(
                f"multihop needs 1 <= hops <= pairs, got hops={self.hops}, pairs={self.pairs}"
            )
        if not 1 <= self.walks <= self.pairs // self.hops:
            raise ValueError(
                f"multihop needs 1 <= walks <= pairs // hops (the full chains), got "
                f"walks={self.walks}, pairs={self.pairs}, hops={self.hops}"
            )
        chains = -(-self.pairs // self.hops)  # full chains plus a shorter distractor
        if self.nodes < self.pairs + chains:
            raise ValueError(
                f"multihop needs nodes >= pairs + chains = {self.pairs + chains} distinct "
                f"nodes, got nodes={self.nodes}"
            )


@TASKS.register(
    "multihop",
    category="Long-Range",
    description="edges SEP s n_1 .. n_h: walk chains of pointers, hop by hop",
)
class Multihop(Task):
    Params = MultihopParams
    difficulties = {
        "easy": {"hops": 1},
        "hard": {"hops": 4, "pairs": 32, "nodes": 128},
    }
    # pairs: more edges to hold; hops: a longer walk; nodes: more node ids. walks: each
    # adds answers of the same kind (from a given start), so fewer is harder.
    harder = {"pairs": "larger", "hops": "larger", "nodes": "larger", "walks": "smaller",
              "gap": "larger"}  # fmt: skip
    length_param = "pairs"
    # Multi-hop recall: each hop is an associative lookup, and a longer walk is a longer
    # chain of lookups, each on the previous answer (Zoology, Arora et al. 2023, Sec. 5,
    # multi-query associative recall; Olsson et al. 2022's induction head per hop). The
    # walk is scored free-running from 2 hops on, so an early slip ends the chain.
    ladder = Ladder(
        axis=("hops",),
        source="Zoology (Arora et al. 2023), multi-query associative recall; "
        "Olsson et al. 2022, one induction head per hop",
        baseline={"pairs": 24, "hops": 1, "gap": 32},
        steps=({"hops": 2}, {"hops": 4}),
    )

    @property
    def special_tokens(self) -> dict[str, int]:
        sep = self.params.nodes
        return {"SEP": sep, "BLANK": sep + 1} if self.params.gap else {"SEP": sep}

    @property
    def vocab_size(self) -> int:
        return self.params.nodes + 1 + (self.params.gap > 0)

    @property
    def first_query(self) -> int:
        """The input position of the first query's start node."""
        return 2 * self.params.pairs + 1 + self.params.gap

    def recall_distance(self) -> int:
        """The first start node against the last edge's destination, 2P - 1: gap + 2."""
        return self.first_query - (2 * self.params.pairs - 1)

    @property
    def query_len(self) -> int:
        """Tokens per query: the start and its answers."""
        return 1 + (self.params.hops if self.params.walk else 1)

    @property
    def seq_len(self) -> int:
        return self.first_query + self.params.walks * self.query_len - 1

    @property
    def target_metric(self) -> str:
        return "free_token_acc" if self.params.walk and self.params.hops > 1 else "token_acc"

    def _edge_slots(self) -> tuple[list[int], list[int]]:
        """Edges as (source, destination) indices into the example's list of used nodes:
        chain j of full length owns nodes j*(hops+1) .. j*(hops+1)+hops, the distractor the
        rest."""
        P, h = self.params.pairs, self.params.hops
        src, dst = [], []
        for j in range(P // h):
            src += [j * (h + 1) + i for i in range(h)]
        base = (P // h) * (h + 1)
        src += [base + i for i in range(P % h)]
        dst = [i + 1 for i in src]
        return src, dst

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, dev = self.params, generator.device
        P, h = p.pairs, p.hops
        used = P + -(-P // h)
        # a random injection of chain slots into node ids keeps every node distinct
        node = torch.rand(n, p.nodes, generator=generator, device=dev).argsort(dim=1)[:, :used]
        src_slot, dst_slot = (torch.tensor(s, device=dev) for s in self._edge_slots())
        order = torch.rand(n, P, generator=generator, device=dev).argsort(dim=1)
        src = node[:, src_slot].gather(1, order)
        dst = node[:, dst_slot].gather(1, order)
        edges = torch.stack([src, dst], dim=2).reshape(n, 2 * P)
        # distinct full chains, their nodes from the head on: (n, walks, hops + 1)
        chain = torch.rand(n, P // h, generator=generator, device=dev).argsort(dim=1)[:, : p.walks]
        along = (h + 1) * chain.unsqueeze(2) + torch.arange(h + 1, device=dev)
        walked = node.gather(1, along.flatten(1)).view(n, p.walks, h + 1)
        queries = walked if p.walk else walked[:, :, [0, h]]
        is_answer = torch.arange(self.query_len, device=dev) > 0  # the start is given
        blanks = torch.full((n, p.gap), self.sep + 1, dtype=torch.long, device=dev)
        return batch_from_parts(
            [edges, self.sep, blanks],
            [queries.flatten(1)],
            device,
            answer_mask=is_answer.repeat(p.walks),
        )

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        P, h = self.params.pairs, self.params.hops
        src, dst = inputs[:, 0 : 2 * P : 2], inputs[:, 1 : 2 * P : 2]
        targets = torch.full_like(inputs, IGNORE)
        for w in range(self.params.walks):
            start = self.first_query + w * self.query_len  # the input position of its start
            # walk: every answer is one hop from the token just read; else h hops from s
            for i, steps in ([(start + k, 1) for k in range(h)] if self.params.walk else
                             [(start, h)]):  # fmt: skip
                if i < inputs.shape[1]:
                    targets[:, i] = self._follow(src, dst, inputs[:, i], steps)
        return targets

    @staticmethod
    def _follow(src: torch.Tensor, dst: torch.Tensor, node: torch.Tensor, steps: int):
        for _ in range(steps):
            match = src == node.unsqueeze(1)
            # On garbage input a node may have no outgoing edge (it stays put) or several
            # (the first listed one is followed); generated inputs have exactly one.
            first = match.long().argmax(dim=1, keepdim=True)
            node = torch.where(match.any(dim=1), dst.gather(1, first).squeeze(1), node)
        return node
