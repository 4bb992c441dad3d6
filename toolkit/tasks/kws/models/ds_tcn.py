"""DS-TCN: depthwise-separable causal temporal convolution network."""
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch
from torch import nn

from toolkit.nn.lean import conv_bn_relu, use_lean_pass
from toolkit.tasks.kws.models.base import (MODELS, CausalConv1d, CausalConv2d, GlobalCMVN,
                                 MemberCombiner, ModelConfigBase, StreamingModel)


class ConvFrontend(nn.Module):
    """Two causal 3x3 convolutions over (frequency, time), each halving the frequency
    bins, then a 1x1 projection to the hidden size. Shared kernels along frequency see a
    formant pattern the same wherever a talker's vocal tract puts it, which a dense
    projection of the mel bins does not. With `members` > 1 every layer is split into
    that many independent groups (one per ensemble member) that share only the input."""

    def __init__(self, bins: int, channels: int, hidden: int, members: int = 1):
        super().__init__()
        ch = channels * members
        self.conv1 = CausalConv2d(1, ch, bins, freq_stride=2)
        self.conv2 = CausalConv2d(ch, ch, self.conv1.out_bins, freq_stride=2, groups=members)
        self.norm1, self.norm2 = nn.BatchNorm2d(ch), nn.BatchNorm2d(ch)
        self.act = nn.ReLU()
        # Flattening (B, C*M, F, T) keeps each member's C*F values contiguous, which is
        # the channel split of a grouped convolution.
        self.proj = nn.Sequential(nn.Conv1d(ch * self.conv2.out_bins, hidden * members, 1,
                                            groups=members),
                                  nn.BatchNorm1d(hidden * members), nn.ReLU())
        self.cache_shapes = [(bins, self.conv1.context),
                             (ch * self.conv1.out_bins, self.conv2.context)]

    def forward(self, x: torch.Tensor, caches: List[torch.Tensor]
                ) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        # x: (B, F, T) -> (B, hidden * members, T)
        y, c1 = self.conv1(x.unsqueeze(1), caches[0])
        y, c2 = self.conv2(self.act(self.norm1(y)), caches[1])
        y = self.act(self.norm2(y))
        return self.proj(y.flatten(1, 2)), [c1, c2]


class DSConvBlock(nn.Module):
    """Depthwise causal conv -> pointwise conv -> BatchNorm -> ReLU -> dropout, residual."""

    def __init__(self, channels: int, kernel: int, dilation: int, dropout: float,
                 members: int = 1):
        super().__init__()
        self.depthwise = CausalConv1d(channels, channels, kernel, dilation, groups=channels)
        self.pointwise = nn.Conv1d(channels, channels, 1, groups=members)
        self.norm = nn.BatchNorm1d(channels)
        self.act = nn.ReLU()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, cache: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if not torch.jit.is_scripting():
            if use_lean_pass(x, self.training):
                return self._lean_forward(x, cache)
        y, cache = self.depthwise(x, cache)
        y = self.dropout(self.act(self.norm(self.pointwise(y))))
        return x + y, cache

    @torch.jit.unused
    def _lean_forward(self, x: torch.Tensor, cache: torch.Tensor
                      ) -> Tuple[torch.Tensor, torch.Tensor]:
        """The same block keeping a fifth of its activations (toolkit.nn.lean)."""
        context = self.depthwise.context
        left = cache if context > 0 else None
        y = conv_bn_relu(x, [self.depthwise.conv, self.pointwise], self.norm, self.dropout.p,
                         residual=True, lefts=[left, None])
        if context > 0:
            cache = torch.cat([cache, x[:, :, max(0, x.size(2) - context):]],
                              dim=2)[:, :, -context:]
        return y, cache


@MODELS.register("ds_tcn")
class DSTCN(StreamingModel):
    @dataclass
    class Config(ModelConfigBase):
        hidden_dim: int = 64          # channels of each TCN block (per ensemble member)
        # 5 layers, kernel 8, dilations up to 16: a 218-frame (2.2 s) receptive field, so the
        # end of a two-word keyword still sees its start.
        num_layers: int = 5
        kernel_size: int = 8          # depthwise causal kernel, in frames
        dilations: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])  # one per layer
        dropout: float = 0.1          # after each block's activation
        # Channels of a convolutional front end over (frequency, time) that replaces the
        # dense projection of the mel bins; 0: the dense projection.
        frontend_channels: int = 0
        # A deep ensemble in one model: `members` independent networks (grouped
        # convolutions, so one pass runs them all), each trained by the loss as if alone;
        # their chance false alarms rarely coincide.
        members: int = 1
        # Deployment scores the mean of the members' posteriors, each maximised over its
        # last `member_window` frames (their spikes need not fall on the same frame).
        member_window: int = 10
        # Initial scale (BatchNorm weight) of every block's residual branch: a small value
        # such as 0.1 starts the blocks near the identity, so that blocks added to a
        # trained network (training.init_checkpoint with init_allow_missing) change its
        # function little at first; the loaded blocks take their trained values.
        block_init_gain: float = 1.0

    def __init__(self, config: "DSTCN.Config"):
        super().__init__(config)
        dilations = list(config.dilations) or [1]
        # Dilations repeat cyclically when there are more layers than entries.
        dilations = [dilations[i % len(dilations)] for i in range(config.num_layers)]
        if config.frontend_channels < 0:
            raise ValueError(f"model.frontend_channels must be >= 0 (0: no front end), "
                             f"got {config.frontend_channels}")
        if config.members < 1:
            raise ValueError(f"model.members must be >= 1, got {config.members}")
        if config.member_window < 1:
            raise ValueError(f"model.member_window must be >= 1 frame, got {config.member_window}")
        if config.members > 1 and config.ctc_outputs > 0:
            raise ValueError("model.members > 1 cannot be combined with a CTC head "
                             "(model.ctc_outputs); use members: 1")
        members = self.members = config.members
        self.member_window = config.member_window   # plain ints: TorchScript reads them
        self.num_keywords = config.num_outputs
        width = config.hidden_dim * members
        self.cmvn = GlobalCMVN(config.input_dim)
        self.frontend: Optional[ConvFrontend] = None
        front_shapes: List[Tuple[int, int]] = []
        if config.frontend_channels > 0:
            self.frontend = ConvFrontend(config.input_dim, config.frontend_channels,
                                         config.hidden_dim, members)
            front_shapes = self.frontend.cache_shapes
        else:
            self.input_proj = nn.Sequential(
                nn.Conv1d(config.input_dim, width, 1),
                nn.BatchNorm1d(width), nn.ReLU())
        self.num_front_caches = len(front_shapes)
        self.blocks = nn.ModuleList(
            DSConvBlock(width, config.kernel_size, d, config.dropout, members) for d in dilations)
        if config.block_init_gain <= 0:
            raise ValueError(f"model.block_init_gain must be > 0, got {config.block_init_gain}")
        for block in self.blocks:
            nn.init.constant_(block.norm.weight, config.block_init_gain)
        shapes = front_shapes + [(width, b.depthwise.context) for b in self.blocks]
        self.combiner: Optional[MemberCombiner] = None
        if members > 1:
            # One classifier per member: a grouped 1x1 convolution over the members' features.
            self.classifier = nn.Conv1d(width, members * config.num_outputs, 1, groups=members)
            self.ctc_head = None
            self.combiner = MemberCombiner(members, config.num_outputs, config.member_window)
            if config.member_window > 1:
                shapes.append(self.combiner.cache_shape)
        else:
            self._build_heads(config.hidden_dim)
        self._finalize_cache(shapes)

    def encode(self, feats: torch.Tensor,
               cache: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        if cache is None:
            cache = torch.zeros(feats.size(0), self.cache_size, device=feats.device)
        x = self.cmvn(feats).transpose(1, 2)
        caches = self.split_cache(cache)
        n = self.num_front_caches
        new_caches: List[torch.Tensor] = []
        if self.frontend is not None:
            x, new_caches = self.frontend(x, caches[:n])
        else:
            x = self._input_projection(x)
        for i, block in enumerate(self.blocks):
            x, c = block(x, caches[n + i])
            new_caches.append(c)
        # The combiner's window (the cache's last part, if any) is forward's to update.
        return x.transpose(1, 2), self.join_cache(new_caches)

    def _input_projection(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_scripting():
            if use_lean_pass(x, self.training):
                return self._lean_input_projection(x)
        return self.input_proj(x)

    @torch.jit.unused
    def _lean_input_projection(self, x: torch.Tensor) -> torch.Tensor:
        return conv_bn_relu(x, [self.input_proj[0]], self.input_proj[1])

    def forward(self, feats: torch.Tensor,
                cache: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Keyword logits (B, T, K) and the new cache. An ensemble (members > 1) returns
        its members' logits (B, T, M, K) in training mode, for the loss to train each."""
        if cache is None:
            cache = torch.zeros(feats.size(0), self.cache_size, device=feats.device)
        hidden, new_cache = self.encode(feats, cache)
        if self.combiner is None:
            return self.classifier(hidden), new_cache
        b, t = hidden.size(0), hidden.size(1)
        k = self.num_keywords
        logits = self.classifier(hidden.transpose(1, 2)).reshape(b, self.members, k, t)
        logits = logits.permute(0, 3, 1, 2)                            # (B, T, M, K)
        window = cache[:, new_cache.size(1):]
        combined, window = self.combiner(
            logits, window.reshape(b, self.members * k, window.size(1) // (self.members * k)))
        if self.member_window > 1:
            new_cache = torch.cat([new_cache, window.reshape(b, -1)], dim=1)
        return (logits if self.training else combined), new_cache
