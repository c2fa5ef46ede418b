"""Standard scaled dot-product attention, softmax(q k^T / sqrt(d)) v, through torch's SDPA
(fused kernels on GPU)."""

import torch.nn.functional as F

from synthbench.mechanism import MECHANISMS, Mechanism


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
