"""Published layers: a mechanism as its paper's whole token-mixing layer (the block track).

In the ``core`` track a mechanism is its mixing rule alone, on (batch, heads, length,
head_dim) q, k and v that the model projects (synthbench/core/mechanism.py). A published
layer is the whole mixer its paper and reference code define around that rule: its own
projections, short convolution, feature maps, gates, per-head norm and output projection,
from (batch, length, d_model) to the same shape. The ``block`` track (``arch=block``,
synthbench/core/model.py) puts it in flash-linear-attention's block, the same for every
mechanism: an RMSNorm before the mixer and before the MLP, a final RMSNorm before the head,
fla's gated SwiGLU MLP and fla's N(0, 0.02) initialisation (``arch=block-plain`` keeps the
older plain block: no norm before the mixer, a LayerNorm-GELU MLP, PyTorch's init).

A mechanism class names its layer in ``layer`` (a class attribute, set in the mechanism's own
module). A mechanism without one, the attention family and most plugins, enters the block
track as its core inside the model's plain multi-head projections.

**Interface.** A layer is built as ``cls(d_model, n_heads, **options)``: its options are its
constructor's keywords, the core's own parameters among them; ``--mech-param`` sets them in
the block track (``layer_params`` checks them, naming the close matches of an unknown one).
``forward(x, causal=True)`` maps (batch, length, d_model) to the same shape. The recurrent
form covers the whole layer: ``initial_state(batch, device, dtype)`` and ``step(state, x)``
on one position, x (batch, d_model) -> (y, state); ``recurrent_layer_forward`` runs it over
a sequence, and tests prove it equals ``forward`` in float64.

The parts several layers share live here: ``ShortConvolution`` (with its own step),
``RMSNorm`` and ``GatedRMSNorm`` (both orders of norm and gate that the papers use); and
``BaseConv``, the gated convolution of Zoology's "Based recipe" (``arch=block-conv``).
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from synthbench.core.params import REQUIRED, check_int, resolve_params

# the archs whose blocks take a mechanism's published layer (synthbench/core/model.py):
# ``block`` (fla's block), ``block-plain`` (the block before recipe v2) and ``block-conv``,
# fla's block with the Based recipe (``BaseConv``)
LAYER_ARCHS = ("block", "block-plain", "block-conv")


class Layer(nn.Module):
    """Base class of a published layer (see the module docstring)."""

    # forward(causal=False) raises: a recurrence has no two-sided form
    causal_only: ClassVar[bool] = True

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        check_int("d_model", d_model, 1)
        check_int("n_heads", n_heads, 1)
        self.d_model, self.n_heads = d_model, n_heads

    def forward(self, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        raise NotImplementedError

    def initial_state(self, batch: int, device, dtype: torch.dtype) -> Any:
        raise NotImplementedError

    def step(self, state: Any, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    def state_size(self, seq_len: int) -> int:
        """Numbers the whole layer carries from one token to the next when decoding."""
        raise NotImplementedError

    def check_causal(self, causal: bool) -> None:
        if not causal and self.causal_only:
            raise ValueError(f"{type(self).__name__} is causal only: it is a recurrence")


def recurrent_layer_forward(layer: Layer, x: torch.Tensor) -> torch.Tensor:
    """The layer's causal output computed token by token through ``step``: x (batch, length,
    d_model) -> the same shape. The reference the parallel ``forward`` must equal."""
    state = layer.initial_state(x.shape[0], x.device, x.dtype)
    outs = []
    for t in range(x.shape[1]):
        y, state = layer.step(state, x[:, t])
        outs.append(y)
    return torch.stack(outs, dim=1)


def layer_of(mechanism_cls: type) -> type[Layer] | None:
    """The published layer a mechanism class names, or None (it enters as its core)."""
    layer = getattr(mechanism_cls, "layer", None)
    return layer if isinstance(layer, type) and issubclass(layer, Layer) else None


def layer_params(owner: str, cls: type[Layer], overrides: dict[str, Any] | None = None) -> dict:
    """The full options of layer ``cls``: its constructor defaults updated with ``overrides``.
    Raises ValueError naming an unknown option (with the close matches), a wrong type or a
    missing value."""
    defaults = {
        name: REQUIRED if p.default is inspect.Parameter.empty else p.default
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if name not in ("self", "d_model", "n_heads")
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }
    return resolve_params(owner, defaults, dict(overrides or {}))


class ShortConvolution(nn.Module):
    """A depthwise causal convolution over the last ``kernel`` positions of each channel,
    then SiLU (``activation``): flash-linear-attention's ``ShortConvolution`` (fla/modules/
    convolution.py, ``bias=False``, ``activation='silu'``), as its DeltaNet, GLA and Gated
    DeltaNet layers and mamba_ssm's Mamba2 (``conv1d``, with a bias there) apply it.
    Position i sees i - kernel + 1 .. i; the recurrent state is the last kernel - 1 inputs."""

    def __init__(self, channels: int, kernel: int = 4, activation: bool = True, bias: bool = False):
        super().__init__()
        check_int("conv_size", kernel, 1)
        self.channels, self.kernel, self.activation = channels, kernel, activation
        self.conv = nn.Conv1d(channels, channels, kernel, groups=channels, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (batch, length, channels) -> the same shape."""
        y = self.conv(F.pad(x.transpose(1, 2), (self.kernel - 1, 0))).transpose(1, 2)
        return F.silu(y) if self.activation else y

    def initial_state(self, batch: int, device, dtype: torch.dtype) -> torch.Tensor:
        """The kernel - 1 inputs before the first position: zeros (batch, kernel - 1, channels)."""
        return torch.zeros(batch, self.kernel - 1, self.channels, device=device, dtype=dtype)

    def step(self, state: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One position: x (batch, channels) -> (y (batch, channels), the new state)."""
        window = torch.cat([state, x.unsqueeze(1)], dim=1)  # (batch, kernel, channels)
        weight = self.conv.weight.squeeze(1).t()  # (kernel, channels)
        y = (window * weight).sum(dim=1)
        if self.conv.bias is not None:
            y = y + self.conv.bias
        return (F.silu(y) if self.activation else y), window[:, 1:]


def rms_normalise(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dimension, in at least float32."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    x32 = x.to(dtype)
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class RMSNorm(nn.Module):
    """RMS normalisation with a learned scale (ones at the start) over the last ``dim``
    numbers: fla's ``RMSNorm`` (fla/modules/layernorm.py), used per head by its layers."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_normalise(x, self.eps) * self.weight


class GatedRMSNorm(nn.Module):
    """A norm and a SiLU gate, in the order the layer's source uses:

    - ``norm_before_gate=True``: rmsnorm(x) * weight * silu(g), fla's ``FusedRMSNormGated``
      (the output gate of its GLA, DeltaNet and Gated DeltaNet layers, per head);
    - ``norm_before_gate=False``: rmsnorm(x * silu(g)) * weight, mamba_ssm's
      ``RMSNormGated(norm_before_gate=False)`` in Mamba2, normalised over groups of
      ``group_size`` channels (default: all of ``dim``).
    """

    def __init__(
        self, dim: int, eps: float = 1e-5, norm_before_gate: bool = True, group_size: int = 0
    ):
        super().__init__()
        group_size = group_size or dim
        if dim % group_size:
            raise ValueError(f"group_size {group_size} must divide the norm's width {dim}")
        self.eps, self.norm_before_gate, self.group_size = eps, norm_before_gate, group_size
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        if not self.norm_before_gate:
            x = x * F.silu(g)
        shape = x.shape
        grouped = x.reshape(*shape[:-1], shape[-1] // self.group_size, self.group_size)
        y = rms_normalise(grouped, self.eps).reshape(shape) * self.weight
        return y * F.silu(g) if self.norm_before_gate else y


class BaseConv(Layer):
    """Zoology's gated short convolution (zoology/mixers/base_conv.py ``BaseConv`` with
    ``kernel_size`` 3 and ``use_act`` False, as its MQAR configs build it):

        y = conv(u) * (u W + b) + u

    conv a depthwise causal convolution over the last ``kernel`` positions with a bias
    (zoology/mixers/convolution.py ``ShortConvolution``), W a d_model x d_model projection.
    Zoology pairs every mixer with it for fairness ("the Based recipe": its ``Hybrid`` mixer
    with configs [BaseConv, mixer] makes layer i a BaseConv for even i, the mixer for odd i),
    which gives each mixer a cheap look at the last few tokens. Causal and recurrent: its
    state is the last kernel - 1 inputs. ``n_heads`` is unused."""

    def __init__(self, d_model: int, n_heads: int = 1, kernel: int = 3) -> None:
        super().__init__(d_model, n_heads)
        self.conv = ShortConvolution(d_model, kernel, activation=False, bias=True)
        self.projection = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        self.check_causal(causal)
        return self.conv(x) * self.projection(x) + x

    def initial_state(self, batch: int, device, dtype: torch.dtype) -> torch.Tensor:
        return self.conv.initial_state(batch, device, dtype)

    def step(self, state: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        convolved, state = self.conv.step(state, x)
        return convolved * self.projection(x) + x, state

    def state_size(self, seq_len: int) -> int:
        return (self.conv.kernel - 1) * self.d_model
