"""TCN: causal dilated temporal convolution network with full (non-separable) convolutions."""
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch
from torch import nn

from toolkit.tasks.kws.models.base import MODELS, CausalConv1d, GlobalCMVN, ModelConfigBase, StreamingModel


class TCNBlock(nn.Module):
    """Causal dilated conv -> BatchNorm -> ReLU -> dropout, with a residual connection.
    A full conv mixes channels and time in one step: more parameters than the
    depthwise-separable DS-TCN block for the same width, but fewer layers needed."""

    def __init__(self, channels: int, kernel: int, dilation: int, dropout: float):
        super().__init__()
        # No conv bias: BatchNorm follows and has its own shift.
        self.conv = CausalConv1d(channels, channels, kernel, dilation, bias=False)
        self.norm = nn.BatchNorm1d(channels)
        self.act = nn.ReLU()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, cache: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        y, cache = self.conv(x, cache)
        y = self.dropout(self.act(self.norm(y)))
        return x + y, cache


@MODELS.register("tcn")
class TCN(StreamingModel):
    streaming = True   # causal: chunked inference with the cache equals the whole-utterance pass

    @dataclass
    class Config(ModelConfigBase):
        hidden_dim: int = 32          # channels of every causal convolution
        num_layers: int = 6           # dilated causal convolution layers
        kernel_size: int = 3          # kernel of each layer, in frames
        dilations: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])  # one per layer
        dropout: float = 0.1          # after each layer's activation

    def __init__(self, config: "TCN.Config"):
        super().__init__(config)
        dilations = list(config.dilations) or [1]
        # Dilations repeat cyclically when there are more layers than entries.
        dilations = [dilations[i % len(dilations)] for i in range(config.num_layers)]
        self.cmvn = GlobalCMVN(config.input_dim)
        self.input_proj = nn.Sequential(
            nn.Conv1d(config.input_dim, config.hidden_dim, 1, bias=False),
            nn.BatchNorm1d(config.hidden_dim), nn.ReLU())
        self.blocks = nn.ModuleList(
            TCNBlock(config.hidden_dim, config.kernel_size, d, config.dropout) for d in dilations)
        self._build_heads(config.hidden_dim)
        self._finalize_cache([(config.hidden_dim, b.conv.context) for b in self.blocks])

    def encode(self, feats: torch.Tensor,
               cache: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        if cache is None:
            cache = torch.zeros(feats.size(0), self.cache_size, device=feats.device)
        x = self.input_proj(self.cmvn(feats).transpose(1, 2))
        caches = self.split_cache(cache)
        new_caches: List[torch.Tensor] = []
        for i, block in enumerate(self.blocks):
            x, c = block(x, caches[i])
            new_caches.append(c)
        return x.transpose(1, 2), self.join_cache(new_caches)
