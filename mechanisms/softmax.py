"""Standard scaled dot-product attention, softmax(q k^T / sqrt(d)) v, through torch's SDPA
(fused kernels on GPU).

Recurrent form: the KV cache. The state is the keys and values seen so far, (batch, heads,
t, head_dim) each; a step appends k_t and v_t and attends q_t over the cache with the same
scale 1/sqrt(head_dim). The state grows by 2 x head_dim numbers per head and token
(``state_size``): what ``synthbench bench decode`` sets beside the constant states of the
linear mechanisms.
"""

import torch
import torch.nn.functional as F

from synthbench.core.mechanism import MECHANISMS, Mechanism


@MECHANISMS.register(
    "softmax",
    aliases=("standard", "sdpa"),
    complexity="quadratic",
    family="softmax",
    reference="Vaswani et al. 2017, Attention Is All You Need",
)
class SoftmaxAttention(Mechanism):
    def forward(self, q, k, v, causal: bool = True):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def initial_state(self, batch: int, device, dtype: torch.dtype):
        """An empty KV cache: keys and values (batch, heads, 0, head_dim)."""
        empty = torch.empty(batch, self.n_heads, 0, self.head_dim, device=device, dtype=dtype)
        return empty, empty.clone()

    def step(self, state, q, k, v):
        """Append k, v (batch, heads, head_dim) to the cache; q attends over all of it."""
        keys = torch.cat([state[0], k.unsqueeze(-2)], dim=-2)
        values = torch.cat([state[1], v.unsqueeze(-2)], dim=-2)
        out = F.scaled_dot_product_attention(q.unsqueeze(-2), keys, values)
        return out.squeeze(-2), (keys, values)

    def prefill(self, q, k, v):
        """The state after the tokens of (batch, heads, L, head_dim) q, k, v, as L steps would
        leave it (the cache holds k and v; q does not enter it), without the L copies."""
        contiguous = torch.contiguous_format
        return k.clone(memory_format=contiguous), v.clone(memory_format=contiguous)
