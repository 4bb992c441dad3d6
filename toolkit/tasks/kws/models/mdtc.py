"""MDTC: multi-scale depthwise temporal convolution (after Hou et al., 2021).

Stacks of dilated depthwise-separable causal blocks (dilations 1, 2, ..., 2^(L-1) inside
each stack). Each stack reads the previous stack's output, and the outputs of all stacks
are summed before the classifier, so the classifier sees features of several receptive
field sizes at once (multi-scale aggregation)."""
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from torch import nn

from toolkit.tasks.kws.models.base import MODELS, CausalConv1d, GlobalCMVN, ModelConfigBase, StreamingModel


class DTCBlock(nn.Module):
    """Depthwise causal dilated conv -> BN -> ReLU -> pointwise conv -> BN -> dropout,
    added to the input, then ReLU."""

    def __init__(self, channels: int, kernel: int, dilation: int, dropout: float):
        super().__init__()
        self.depthwise = CausalConv1d(channels, channels, kernel, dilation, groups=channels,
                                      bias=False)
        self.norm1 = nn.BatchNorm1d(channels)
        self.pointwise = nn.Conv1d(channels, channels, 1, bias=False)
        self.norm2 = nn.BatchNorm1d(channels)
        self.act = nn.ReLU()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, cache: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        y, cache = self.depthwise(x, cache)
        y = self.act(self.norm1(y))
        y = self.dropout(self.norm2(self.pointwise(y)))
        return self.act(x + y), cache


@MODELS.register("mdtc")
class MDTC(StreamingModel):
    streaming = True   # causal: chunked inference with the cache equals the whole-utterance pass

    @dataclass
    class Config(ModelConfigBase):
        num_stacks: int = 3           # stacks whose outputs are summed (multi-scale context)
        num_layers_per_stack: int = 4  # dilated blocks per stack, dilation doubling
        hidden_dim: int = 48          # channels of every block
        kernel_size: int = 5          # depthwise causal kernel, in frames
        dropout: float = 0.1          # after each block's activation

    def __init__(self, config: "MDTC.Config"):
        super().__init__(config)
        if config.num_stacks < 1 or config.num_layers_per_stack < 1:
            raise ValueError("mdtc: num_stacks and num_layers_per_stack must be >= 1")
        h = config.hidden_dim
        self.cmvn = GlobalCMVN(config.input_dim)
        # Front end: a depthwise-separable causal conv from the fbank bins to hidden_dim.
        self.front_depthwise = CausalConv1d(config.input_dim, config.input_dim,
                                            config.kernel_size, groups=config.input_dim,
                                            bias=False)
        self.front_pointwise = nn.Sequential(
            nn.Conv1d(config.input_dim, h, 1, bias=False), nn.BatchNorm1d(h), nn.ReLU())
        # All blocks in one flat list (stack-major): TorchScript iterates a ModuleList
        # easily, nested ones less so. `stack_ends` marks each stack's last block.
        self.blocks = nn.ModuleList()
        ends: List[bool] = []
        for _ in range(config.num_stacks):
            for layer in range(config.num_layers_per_stack):
                self.blocks.append(DTCBlock(h, config.kernel_size, 2 ** layer, config.dropout))
                ends.append(layer == config.num_layers_per_stack - 1)
        self.stack_ends: List[bool] = ends
        self._build_heads(h)
        self._finalize_cache([(config.input_dim, self.front_depthwise.context)]
                             + [(h, b.depthwise.context) for b in self.blocks])

    def encode(self, feats: torch.Tensor,
               cache: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        if cache is None:
            cache = torch.zeros(feats.size(0), self.cache_size, device=feats.device)
        caches = self.split_cache(cache)
        x, c = self.front_depthwise(self.cmvn(feats).transpose(1, 2), caches[0])
        new_caches: List[torch.Tensor] = [c]
        x = self.front_pointwise(x)
        total = torch.zeros_like(x)
        for i, block in enumerate(self.blocks):
            x, c = block(x, caches[i + 1])
            new_caches.append(c)
            if self.stack_ends[i]:
                total = total + x
        return total.transpose(1, 2), self.join_cache(new_caches)
