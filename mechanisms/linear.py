"""Linear attention with the ELU+1 feature map (eps 1e-6 as in SLAY 001, Table 9)."""

import torch.nn.functional as F

from synthbench.core.mechanism import MECHANISMS, FeatureMapMechanism


@MECHANISMS.register(
    "linear",
    aliases=("elu", "linear-elu"),
    complexity="linear",
    family="feature-map",
    reference="Katharopoulos et al. 2020, Transformers are RNNs",
)
class ELULinearAttention(FeatureMapMechanism):
    def feature_map(self, x, is_query):
        return F.elu(x) + 1.0

    @property
    def feature_dim(self) -> int:
        return self.head_dim
