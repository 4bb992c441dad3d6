"""BC-ResNet: broadcasted residual learning for command-word classification
(after Kim et al., 2021).

Each block has a 2-D path (frequency-wise depthwise conv + sub-spectral norm) and a 1-D
path that averages over frequency, runs a temporal depthwise conv and is broadcast back
over frequency; most of the computation is 1-D, which keeps the model small.

Not streaming: convolutions look both ways in time and the output is one (B, K) logit
vector per utterance, averaged over all frames (padding included: the model is not given
lengths, so batches should hold similar lengths, as fixed 1 s command clips do). The
forward keeps the (output, cache) signature of the streaming models with an empty
(B, 0) cache so training, export and loading code need no special case.
"""
import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from torch import nn

from toolkit.tasks.kws.models.base import MODELS, GlobalCMVN, ModelConfigBase, StreamingModel

# Channels of BC-ResNet-1 (scaled by `scale`): stem, the four stages, final 1x1 conv.
STEM_CHANNELS = 16
STAGE_CHANNELS = [8, 12, 16, 20]
STAGE_BLOCKS = [2, 2, 4, 4]
STAGE_FREQ_STRIDE = [1, 2, 2, 1]
STAGE_DILATION = [1, 2, 4, 8]
HEAD_CHANNELS = 32


class SubSpectralNorm(nn.Module):
    """BatchNorm with separate statistics per frequency sub-band: the F bins are cut into
    `sub_bands` groups and each (channel, group) pair is normalised on its own, because
    low and high frequency bands have different statistics."""

    def __init__(self, channels: int, sub_bands: int):
        super().__init__()
        self.sub_bands = sub_bands
        self.norm = nn.BatchNorm2d(channels * sub_bands)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, f, t = x.shape
        y = self.norm(x.reshape(b, c * self.sub_bands, f // self.sub_bands, t))
        return y.reshape(b, c, f, t)


class BCResBlock(nn.Module):
    """Broadcasted residual block. A transition block (channel change) starts with a
    1x1 conv and has no identity shortcut; a normal block adds its input back."""

    def __init__(self, in_ch: int, out_ch: int, freq: int, freq_stride: int, dilation: int,
                 sub_bands: int, dropout: float):
        super().__init__()
        self.transition = in_ch != out_ch
        if self.transition:
            self.expand = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, bias=False),
                                        nn.BatchNorm2d(out_ch), nn.ReLU())
        else:
            self.expand = nn.Identity()
        # f2: frequency-wise depthwise conv (3x1), optionally strided in frequency.
        self.freq_conv = nn.Conv2d(out_ch, out_ch, (3, 1), stride=(freq_stride, 1),
                                   padding=(1, 0), groups=out_ch, bias=False)
        self.out_freq = (freq + 2 - 3) // freq_stride + 1
        # Sub-band count must divide the frequency size; gcd falls back to plain
        # BatchNorm (1 band) for sizes that 5 does not divide.
        self.ssn = SubSpectralNorm(out_ch, math.gcd(sub_bands, self.out_freq))
        # f1: on the frequency-averaged map, temporal depthwise conv ("same" padding).
        self.time_conv = nn.Conv2d(out_ch, out_ch, (1, 3), padding=(0, dilation),
                                   dilation=(1, dilation), groups=out_ch, bias=False)
        self.time_norm = nn.BatchNorm2d(out_ch)
        self.swish = nn.SiLU()
        self.pointwise = nn.Conv2d(out_ch, out_ch, 1, bias=False)
        self.dropout = nn.Dropout2d(dropout)   # channel-wise dropout
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.expand(x)
        aux = self.ssn(self.freq_conv(x))                     # (B, C, F', T)
        y = aux.mean(dim=2, keepdim=True)                     # (B, C, 1, T)
        y = self.swish(self.time_norm(self.time_conv(y)))
        y = self.dropout(self.pointwise(y))
        out = aux + y                                         # broadcast over frequency
        if not self.transition:
            out = out + x
        return self.act(out)


@MODELS.register("bcresnet")
class BCResNet(StreamingModel):
    streaming = False   # utterance classifier: (B, K) logits, empty cache

    @dataclass
    class Config(ModelConfigBase):
        scale: float = 1.0        # width multiplier (BC-ResNet-1, -1.5, -2, -3, -6, -8)
        sub_bands: int = 5        # sub-spectral norm groups (1: plain BatchNorm)
        dropout: float = 0.1      # before the classifier

    def __init__(self, config: "BCResNet.Config"):
        super().__init__(config)
        if config.scale <= 0:
            raise ValueError("bcresnet: scale must be > 0")

        def width(c: int) -> int:
            return max(1, int(round(c * config.scale)))

        self.cmvn = GlobalCMVN(config.input_dim)
        stem = width(STEM_CHANNELS)
        # Stem: 5x5 conv, stride 2 in frequency.
        self.stem = nn.Sequential(
            nn.Conv2d(1, stem, 5, stride=(2, 1), padding=2, bias=False),
            nn.BatchNorm2d(stem), nn.ReLU())
        freq = (config.input_dim + 4 - 5) // 2 + 1
        blocks: List[nn.Module] = []
        in_ch = stem
        for s, out in enumerate(STAGE_CHANNELS):
            out_ch = width(out)
            for i in range(STAGE_BLOCKS[s]):
                stride = STAGE_FREQ_STRIDE[s] if i == 0 else 1
                block = BCResBlock(in_ch, out_ch, freq, stride, STAGE_DILATION[s],
                                   config.sub_bands, config.dropout)
                blocks.append(block)
                freq, in_ch = block.out_freq, out_ch
        self.blocks = nn.Sequential(*blocks)
        head = width(HEAD_CHANNELS)
        # Depthwise conv spanning all remaining frequency bins without padding collapses
        # frequency to 1 (5x5 for 40 mel bins, as in the paper).
        self.head = nn.Sequential(
            nn.Conv2d(in_ch, in_ch, (freq, 5), padding=(0, 2), groups=in_ch, bias=False),
            nn.BatchNorm2d(in_ch), nn.ReLU(),
            nn.Conv2d(in_ch, head, 1, bias=False), nn.BatchNorm2d(head), nn.ReLU())
        self.classifier = nn.Linear(head, config.num_outputs)
        self._finalize_cache([])

    def forward(self, feats: torch.Tensor,
                cache: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        # (B, T, D) -> (B, 1, D, T): frequency is the image height, time the width.
        x = self.cmvn(feats).transpose(1, 2).unsqueeze(1)
        x = self.head(self.blocks(self.stem(x)))              # (B, C, 1, T)
        logits = self.classifier(x.mean(dim=(2, 3)))          # average over time
        if cache is None:
            cache = torch.zeros(feats.size(0), 0, device=feats.device)
        return logits, cache
