"""multihop: follow a pointer chain ``hops`` edges from a start node.

Layout ``a_1 b_1 .. a_P b_P SEP s t``: P = ``pairs`` edges ``a -> b`` in a random order, then
a start node s and the answer t, the node reached from s after ``hops`` hops. The edges form
``pairs // hops`` chains of exactly ``hops`` edges plus, when ``pairs % hops`` is not 0, one
shorter distractor chain with the remaining edges; every node occurs in one chain only, so a
node has at most one successor and one predecessor. s is the head of a random full-length
chain, so t is its tail and, with ``hops >= 2``, never s's direct successor: the hops are
real. Nodes are tokens 0..nodes-1, SEP is ``nodes``.

Known solution: one hop is an induction head (a previous-token head writes each ``a`` into
the position of its ``b``; at s a matching head copies the ``b`` whose ``a`` equals s). Every
further hop needs another matching layer on top of the previous hop's result, so the plain
circuit needs ``hops + 1`` layers and a 2-layer model solves hops 1 only.
"""

from dataclasses import dataclass

import torch

from synthbench.task import TASKS, Batch, Task, batch_from_parts, targets_at


@dataclass(frozen=True)
class MultihopParams:
    pairs: int = 16  # edges in the context
    hops: int = 2  # edges between the start node and the answer
    nodes: int = 64  # size of the node vocabulary

    def __post_init__(self):
        if not 1 <= self.hops <= self.pairs:
            raise ValueError(
                f"multihop needs 1 <= hops <= pairs, got hops={self.hops}, pairs={self.pairs}"
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
    description="follow a chain of pointers for a fixed number of hops",
)
class Multihop(Task):
    Params = MultihopParams
    difficulties = {
        "easy": {"hops": 1},
        "hard": {"hops": 4, "pairs": 32, "nodes": 128},
    }
    length_param = "pairs"

    @property
    def special_tokens(self) -> dict[str, int]:
        return {"SEP": self.params.nodes}

    @property
    def vocab_size(self) -> int:
        return self.params.nodes + 1

    @property
    def seq_len(self) -> int:
        return 2 * self.params.pairs + 2

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
        head = (h + 1) * torch.randint(P // h, (n, 1), generator=generator, device=dev)
        start, answer = node.gather(1, head), node.gather(1, head + h)
        edges = torch.stack([src, dst], dim=2).reshape(n, 2 * P)
        return batch_from_parts([edges, self.sep, start], [answer], device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        P = self.params.pairs
        src, dst = inputs[:, 0 : 2 * P : 2], inputs[:, 1 : 2 * P : 2]
        node = inputs[:, 2 * P + 1]
        for _ in range(self.params.hops):
            match = src == node.unsqueeze(1)
            # On garbage input a node may have no outgoing edge (it stays put) or several
            # (the first listed one is followed); generated inputs have exactly one.
            first = match.long().argmax(dim=1, keepdim=True)
            node = torch.where(match.any(dim=1), dst.gather(1, first).squeeze(1), node)
        return targets_at(inputs, 2 * P + 1, node)
