"""Shared pieces of the streaming models: config base, CMVN layer, causal convolution."""
import dataclasses
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from torch import nn

from toolkit.registry import Registry

MODELS: Registry = Registry("model")


@dataclass
class ModelConfigBase:
    type: str = ""          # the registered model this section builds
    input_dim: int = 0      # 0: taken from dataset.feature.num_mel_bins
    num_outputs: int = 0    # 0: taken from the class/keyword inventory
    cmvn_file: str = ""     # global CMVN JSON; its statistics become model buffers
    # Units of an extra CTC output on the same hidden features, trained by a `ctc` loss
    # component; 0: none, or taken from the unit list when the loss has a ctc component.
    # Deployment uses the keyword output only.
    ctc_outputs: int = 0


class GlobalCMVN(nn.Module):
    """(x - mean) * inv_std with statistics stored as buffers, so exported models carry
    their own normalisation and a runtime only has to compute raw fbank."""

    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("inv_std", torch.ones(dim))

    def load_stats(self, mean, inv_std) -> None:
        mean = torch.as_tensor(mean, dtype=torch.float32)
        inv_std = torch.as_tensor(inv_std, dtype=torch.float32)
        if mean.shape != self.mean.shape:
            raise ValueError(f"CMVN dimension {mean.shape[0]} does not match the model input "
                             f"dimension {self.mean.shape[0]}")
        self.mean.copy_(mean)
        self.inv_std.copy_(inv_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # CMVN stays in fp32 even under autocast.
        return (x.float() - self.mean) * self.inv_std


class CausalConv1d(nn.Module):
    """Conv1d that only looks back. In streaming the last `context` input frames are
    carried in a cache; zeros stand for the frames before the start, which is exactly
    the left padding of the whole-utterance pass, so both agree frame by frame."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, dilation: int = 1,
                 groups: int = 1, bias: bool = True):
        super().__init__()
        self.in_ch = in_ch
        self.context = (kernel - 1) * dilation
        self.conv = nn.Conv1d(in_ch, out_ch, kernel, dilation=dilation, groups=groups, bias=bias)

    def forward(self, x: torch.Tensor, cache: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        # x: (B, C, T); cache: (B, C, context)
        if self.context == 0:
            return self.conv(x), cache
        full = torch.cat([cache, x], dim=2)
        return self.conv(full), full[:, :, full.size(2) - self.context:]


class CausalConv2d(nn.Module):
    """Conv2d over (frequency, time) that only looks back in time; frequency is padded
    on both sides and may be strided. The cache holds the last `context` input frames
    as (channels * bins, context), the shape the flat model cache stores."""

    def __init__(self, in_ch: int, out_ch: int, bins: int, freq_kernel: int = 3,
                 time_kernel: int = 3, freq_stride: int = 1, groups: int = 1):
        super().__init__()
        self.in_ch, self.bins = in_ch, bins
        self.context = time_kernel - 1
        self.out_bins = (bins + 2 * (freq_kernel // 2) - freq_kernel) // freq_stride + 1
        self.conv = nn.Conv2d(in_ch, out_ch, (freq_kernel, time_kernel),
                              stride=(freq_stride, 1), padding=(freq_kernel // 2, 0),
                              groups=groups)

    def forward(self, x: torch.Tensor, cache: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        # x: (B, C, F, T); cache: (B, C * F, context)
        past = cache.reshape(cache.size(0), self.in_ch, self.bins, self.context)
        full = torch.cat([past, x], dim=3)
        new = full[:, :, :, full.size(3) - self.context:]
        return self.conv(full), new.reshape(new.size(0), self.in_ch * self.bins, self.context)


class MemberCombiner(nn.Module):
    """Keyword logits of an ensemble's members (B, T, M, K) -> one logit per keyword
    (B, T, K): the members' posteriors, each first maximised over its last `window`
    frames, are averaged. The window matters: each member's posterior is a spike of one
    to three frames, and the members' spikes need not fall on the same frame, so a plain
    frame-wise mean can halve a keyword that every member detects.

    The window's past frames are carried as softplus(logit) = -log(1 - p): zero, the
    value of a fresh cache, is p = 0 (no detection) exactly, and values near p = 1 keep
    their precision, which a stored probability would round to 1. The result is
    log(mean p) - log(mean (1 - p)), exact in log space even when every p is 0.9999."""

    def __init__(self, members: int, num_outputs: int, window: int):
        super().__init__()
        if window < 1:
            raise ValueError(f"the members' combination window must be >= 1 frame, got {window}")
        self.members, self.num_outputs, self.window = members, num_outputs, window
        # the model's cache keeps these past frames (none for a window of 1)
        self.cache_shape = (members * num_outputs, window - 1)

    def forward(self, logits: torch.Tensor, cache: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        # logits: (B, T, M, K); cache: (B, M * K, window - 1), unused when window == 1
        b, t = logits.size(0), logits.size(1)
        full = nn.functional.softplus(logits.float()).reshape(b, t, -1).transpose(1, 2)
        if self.window > 1:
            full = torch.cat([cache, full], dim=2)
            cache = full[:, :, full.size(2) - (self.window - 1):]
            full = nn.functional.max_pool1d(full, self.window, stride=1)
        log_miss = -full.reshape(b, self.members, self.num_outputs, t)
        # log(1 - e^-s); s = 0 (p = 0) is clamped to p = 1e-30 rather than -inf.
        log_hit = torch.log((1.0 - torch.exp(log_miss)).clamp_min(1e-30))
        out = torch.logsumexp(log_hit, dim=1) - torch.logsumexp(log_miss, dim=1)
        return out.transpose(1, 2), cache


class StreamingModel(nn.Module):
    """Base of causal models: forward(feats (B,T,D), cache (B,cache_size)) ->
    (logits (B,T,K), new_cache). A None cache means "start of stream" (zeros).
    Subclasses implement `encode` (-> hidden features (B,T,H), new_cache) and call
    `_build_heads(H)`; the keyword classifier and the optional CTC head share `encode`.

    Subclasses list their per-layer cache shapes in `cache_shapes` as (channels, frames);
    the flat cache is their concatenation, a single tensor that ONNX and TorchScript
    runtimes carry between chunks without knowing the model's inner structure."""

    # Causal models stream; utterance classifiers (BC-ResNet) set this to False.
    streaming: bool = True

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.cache_shapes: List[Tuple[int, int]] = []
        self.cache_size = 0

    def _build_heads(self, hidden_dim: int) -> None:
        self.classifier = nn.Linear(hidden_dim, self.config.num_outputs)
        self.ctc_head = (nn.Linear(hidden_dim, self.config.ctc_outputs)
                         if self.config.ctc_outputs > 0 else None)

    def encode(self, feats: torch.Tensor,
               cache: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def forward(self, feats: torch.Tensor,
                cache: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        hidden, cache = self.encode(feats, cache)
        return self.classifier(hidden), cache

    def _finalize_cache(self, shapes: List[Tuple[int, int]]) -> None:
        self.cache_shapes = [(int(c), int(f)) for c, f in shapes]
        self.cache_size = sum(c * f for c, f in self.cache_shapes)

    def zero_cache(self, batch: int, device: Optional[torch.device] = None) -> torch.Tensor:
        return torch.zeros(batch, self.cache_size, device=device)

    def split_cache(self, cache: torch.Tensor) -> List[torch.Tensor]:
        parts: List[torch.Tensor] = []
        offset = 0
        for channels, frames in self.cache_shapes:
            n = channels * frames
            parts.append(cache[:, offset:offset + n].reshape(cache.size(0), channels, frames))
            offset += n
        return parts

    @staticmethod
    def join_cache(parts: List[torch.Tensor]) -> torch.Tensor:
        return torch.cat([p.reshape(p.size(0), -1) for p in parts], dim=1)

    def receptive_field(self) -> int:
        """Frames of context an output depends on; recurrent models return -1 (unbounded)."""
        return 1 + sum(f for _, f in self.cache_shapes)


def build_model(config, cmvn: Optional[dict] = None) -> nn.Module:
    """Instantiates the registered model for `config` (a validated model Config)."""
    if config.input_dim <= 0 or config.num_outputs <= 0:
        raise ValueError("model.input_dim and model.num_outputs must be resolved before building")
    model = MODELS.get(config.type)(config)
    if config.ctc_outputs > 0 and getattr(model, "ctc_head", None) is None:
        raise ValueError(f"model type {config.type} has no CTC head (model.ctc_outputs="
                         f"{config.ctc_outputs}); use a streaming model")
    if cmvn is not None:
        model.cmvn.load_stats(cmvn["mean"], cmvn["inv_std"])
    return model


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def config_to_dict(config) -> dict:
    return dataclasses.asdict(config)
