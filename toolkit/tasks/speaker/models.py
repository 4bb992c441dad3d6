"""Speaker-embedding extractors: x-vector TDNN, ResNet and ECAPA-TDNN.

Every model maps fbank features (B, T, D) to one embedding per utterance (B, E). The
classification head lives in `heads.py`, so an exported extractor carries no speaker
inventory. Forward passes contain no shape-dependent Python control flow: a traced ONNX
export keeps the time axis dynamic.
"""
import math
from dataclasses import dataclass, field
from typing import List

import torch
from torch import nn

from toolkit.config import ConfigError
from toolkit.registry import Registry

SPEAKER_MODELS: Registry = Registry("speaker model")

INPUT_NORMS = ("none", "utterance_mean")

# Variance floor of the pooled standard deviation: a one-frame (or constant) utterance
# has zero variance, and the gradient of sqrt at 0 is infinite.
# Standard deviations are floored at sqrt(1e-6) (written inline: TorchScript reads no globals).


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def check_common_config(config) -> None:
    """Checks the fields every speaker model Config shares."""
    name = config.type or type(config).__qualname__
    if config.input_dim <= 0:
        raise ConfigError(f"model.input_dim must be > 0 for {name}, got {config.input_dim}")
    if config.embed_dim <= 0:
        raise ConfigError(f"model.embed_dim must be > 0 for {name}, got {config.embed_dim}")
    if config.input_norm not in INPUT_NORMS:
        raise ConfigError(f"model.input_norm: unknown '{config.input_norm}' "
                          f"(one of: {', '.join(INPUT_NORMS)})")


def normalize_input(feats: torch.Tensor, mode: str) -> torch.Tensor:
    """Per-utterance mean subtraction over time (B, T, D), done inside the model so an
    exported extractor needs nothing but raw fbank. Padding frames are included in the
    mean: batch utterances of similar length."""
    if mode == "utterance_mean":
        return feats - feats.mean(dim=1, keepdim=True)
    return feats


def mean_and_std(x: torch.Tensor) -> torch.Tensor:
    """(B, C, T) -> (B, 2C): mean and (biased) standard deviation over time."""
    mean = x.mean(dim=-1)
    var = (x - mean.unsqueeze(-1)).pow(2).mean(dim=-1)
    return torch.cat([mean, var.clamp(min=1e-6).sqrt()], dim=1)


class StatisticsPooling(nn.Module):
    """Mean and standard deviation over time: (B, C, T) -> (B, 2C)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mean_and_std(x)


class AttentiveStatisticsPooling(nn.Module):
    """Attention-weighted mean and standard deviation over time (Okabe et al. 2018), with
    ECAPA's global context: the attention of each frame also sees the utterance's plain
    mean and std, so it can weigh frames against the whole recording. Weights are
    computed per channel. (B, C, T) -> (B, 2C)."""

    def __init__(self, channels: int, bottleneck: int, global_context: bool):
        super().__init__()
        self.global_context = global_context
        in_ch = channels * 3 if global_context else channels
        self.attention = nn.Sequential(
            nn.Conv1d(in_ch, bottleneck, 1), nn.Tanh(), nn.Conv1d(bottleneck, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.global_context:
            mean, std = mean_and_std(x).chunk(2, dim=1)
            # expand_as keeps the time axis symbolic in a traced export
            context = torch.cat([x, mean.unsqueeze(-1).expand_as(x),
                                 std.unsqueeze(-1).expand_as(x)], dim=1)
        else:
            context = x
        weights = torch.softmax(self.attention(context), dim=-1)   # (B, C, T), sums to 1 over T
        mean = (weights * x).sum(dim=-1)
        # centred form: E_w[x^2] - mean^2 loses precision when |mean| >> std
        var = (weights * (x - mean.unsqueeze(-1)).pow(2)).sum(dim=-1)
        return torch.cat([mean, var.clamp(min=1e-6).sqrt()], dim=1)


# ----------------------------------------------------------------------------- x-vector

@SPEAKER_MODELS.register("tdnn_xvector")
class XVectorTDNN(nn.Module):
    """The x-vector network of Snyder et al. (2018): five frame-level TDNN layers
    (Conv1d -> ReLU -> BatchNorm, Kaldi's order), statistics pooling, and one affine
    segment layer whose output is the embedding (Kaldi's "embedding a").

    The frame layers use no padding, as Kaldi's TDNN does, so an utterance needs at least
    `min_frames` frames (15 with the default contexts)."""

    @dataclass
    class Config:
        type: str = ""                    # the registered model this section builds
        input_dim: int = 80               # fbank bins of the input features
        embed_dim: int = 512              # embedding size, the segment-6 layer of the paper
        # none | utterance_mean: subtract each utterance's mean over time in forward
        input_norm: str = "utterance_mean"
        # Output channels of the frame layers; 1500 in the last widens the pooled
        # statistics (3000-d), as in the paper.
        frame_channels: List[int] = field(default_factory=lambda: [512, 512, 512, 512, 1500])
        # Kernel of each frame layer; with frame_dilations these give the paper's
        # contexts [-2..2], {-2,0,2}, {-3,0,3}, {0}, {0}.
        frame_kernels: List[int] = field(default_factory=lambda: [5, 3, 3, 1, 1])
        # Dilation of each frame layer (see frame_kernels)
        frame_dilations: List[int] = field(default_factory=lambda: [1, 2, 3, 1, 1])

    def __init__(self, config: "XVectorTDNN.Config"):
        super().__init__()
        check_common_config(config)
        sizes = {len(config.frame_channels), len(config.frame_kernels),
                 len(config.frame_dilations)}
        if len(sizes) != 1 or not config.frame_channels:
            raise ConfigError("model.frame_channels, frame_kernels and frame_dilations must be "
                              "non-empty lists of the same length")
        self.config = config
        layers: List[nn.Module] = []
        in_ch = config.input_dim
        for out_ch, kernel, dilation in zip(config.frame_channels, config.frame_kernels,
                                            config.frame_dilations):
            layers += [nn.Conv1d(in_ch, out_ch, kernel, dilation=dilation), nn.ReLU(),
                       nn.BatchNorm1d(out_ch)]
            in_ch = out_ch
        self.frame_layers = nn.Sequential(*layers)
        self.pool = StatisticsPooling()
        self.embedding = nn.Linear(2 * in_ch, config.embed_dim)
        self.min_frames = self.min_input_frames(config)

    @staticmethod
    def min_input_frames(config: "XVectorTDNN.Config") -> int:
        """Frames the unpadded frame layers consume: 1 + the summed context."""
        return 1 + sum((k - 1) * d for k, d in zip(config.frame_kernels, config.frame_dilations))

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        x = normalize_input(feats, self.config.input_norm).transpose(1, 2)   # (B, D, T)
        return self.embedding(self.pool(self.frame_layers(x)))


# ------------------------------------------------------------------------------- ResNet

class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual; a strided or widening block projects its
    shortcut with a 1x1 convolution."""

    def __init__(self, in_ch: int, out_ch: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(out_ch))
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + self.shortcut(x))


@SPEAKER_MODELS.register("resnet")
class SpeakerResNet(nn.Module):
    """2-D ResNet over (frequency, time) as WeSpeaker and Hyperion use it for speakers:
    a 3x3 stem, four stages of BasicBlocks (strided in both frequency and time), then
    statistics pooling over time of the flattened (channels x frequency) map and a linear
    embedding layer. `num_blocks` [3, 4, 6, 3] is ResNet34, [2, 2, 2, 2] ResNet18.

    All convolutions are zero-padded, so any T >= 1 frame runs (`min_frames` = 1); the
    pooled time axis has ceil(T / 8) frames with the default strides."""

    @dataclass
    class Config:
        type: str = ""                    # the registered model this section builds
        input_dim: int = 80               # fbank bins; sets the frequency size of the flattened map
        embed_dim: int = 256              # embedding size (WeSpeaker's ResNet34 uses 256)
        # none | utterance_mean: subtract each utterance's mean over time in forward
        input_norm: str = "utterance_mean"
        # BasicBlocks per stage: [3, 4, 6, 3] ResNet34 (6.63 M parameters), [2, 2, 2, 2] ResNet18
        num_blocks: List[int] = field(default_factory=lambda: [3, 4, 6, 3])
        # Channels of the stem and first stage; each later stage doubles them (32/64/128/256),
        # half the width of the image ResNet, which is the usual speaker setting.
        base_channels: int = 32
        # Stride of each stage in both frequency and time; 80 bins end as 10 after 1,2,2,2
        stage_strides: List[int] = field(default_factory=lambda: [1, 2, 2, 2])

    def __init__(self, config: "SpeakerResNet.Config"):
        super().__init__()
        check_common_config(config)
        if not config.num_blocks or len(config.num_blocks) != len(config.stage_strides):
            raise ConfigError("model.num_blocks and model.stage_strides must be non-empty "
                              "lists of the same length")
        if config.base_channels <= 0 or min(config.num_blocks) < 1:
            raise ConfigError("model.base_channels and every model.num_blocks entry must be >= 1")
        self.config = config
        ch = config.base_channels
        self.stem = nn.Sequential(nn.Conv2d(1, ch, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(ch), nn.ReLU())
        stages: List[nn.Module] = []
        freq = config.input_dim
        in_ch = ch
        for i, (blocks, stride) in enumerate(zip(config.num_blocks, config.stage_strides)):
            out_ch = ch * 2 ** i
            stage = [BasicBlock(in_ch, out_ch, stride)]
            stage += [BasicBlock(out_ch, out_ch, 1) for _ in range(blocks - 1)]
            stages.append(nn.Sequential(*stage))
            in_ch = out_ch
            freq = math.ceil(freq / stride)        # 3x3, padding 1, stride s
        self.stages = nn.Sequential(*stages)
        self.pool = StatisticsPooling()
        self.embedding = nn.Linear(2 * in_ch * freq, config.embed_dim)
        self.min_frames = self.min_input_frames(config)

    @staticmethod
    def min_input_frames(config) -> int:
        return 1               # zero-padded convolutions: any length runs

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        x = normalize_input(feats, self.config.input_norm).transpose(1, 2).unsqueeze(1)
        x = self.stages(self.stem(x))                       # (B, C, F', T')
        return self.embedding(self.pool(x.flatten(1, 2)))


# --------------------------------------------------------------------------- ECAPA-TDNN

class ConvReluBN(nn.Module):
    """Conv1d (zero "same" padding) -> ReLU -> BatchNorm, the TDNN unit of ECAPA."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int = 1, dilation: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(in_ch, out_ch, kernel, dilation=dilation,
                              padding=dilation * (kernel - 1) // 2)
        self.relu = nn.ReLU()
        self.bn = nn.BatchNorm1d(out_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.relu(self.conv(x)))


class Res2Conv(nn.Module):
    """Res2Net convolution: the channels are cut into `scale` groups; the first passes
    through, each later one is convolved after adding the previous group's output, so
    the groups see growing receptive fields at the cost of one narrow conv each."""

    def __init__(self, channels: int, kernel: int, dilation: int, scale: int):
        super().__init__()
        self.width = channels // scale
        self.convs = nn.ModuleList(ConvReluBN(self.width, self.width, kernel, dilation)
                                   for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        groups = torch.split(x, self.width, dim=1)
        outputs = [groups[0]]
        previous = None
        for conv, group in zip(self.convs, groups[1:]):
            previous = conv(group if previous is None else group + previous)
            outputs.append(previous)
        return torch.cat(outputs, dim=1)


class SqueezeExcitation(nn.Module):
    """Channel gates from the utterance mean: (B, C, T) scaled by sigmoid(MLP(mean))."""

    def __init__(self, channels: int, bottleneck: int):
        super().__init__()
        self.gate = nn.Sequential(nn.Linear(channels, bottleneck), nn.ReLU(),
                                  nn.Linear(bottleneck, channels), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(x.mean(dim=-1)).unsqueeze(-1)


class SERes2Block(nn.Module):
    """1x1 conv -> dilated Res2Net conv -> 1x1 conv -> squeeze-excitation, residual."""

    def __init__(self, channels: int, kernel: int, dilation: int, scale: int, se_bottleneck: int):
        super().__init__()
        self.body = nn.Sequential(
            ConvReluBN(channels, channels),
            Res2Conv(channels, kernel, dilation, scale),
            ConvReluBN(channels, channels),
            SqueezeExcitation(channels, se_bottleneck))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


@SPEAKER_MODELS.register("ecapa_tdnn")
class ECAPATDNN(nn.Module):
    """ECAPA-TDNN (Desplanques et al. 2020): Conv1d stem, SE-Res2Net blocks, multi-layer
    feature aggregation (the blocks' outputs concatenated, then a 1x1 conv), attentive
    statistics pooling with global context, BatchNorm, linear embedding, BatchNorm.
    channels=512 has 6.19 M parameters, channels=1024 14.66 M (paper: 6.2 M / 14.7 M).

    Convolutions are zero-padded, so any T >= 1 frame runs (`min_frames` = 1)."""

    @dataclass
    class Config:
        type: str = ""                    # the registered model this section builds
        input_dim: int = 80               # fbank bins of the input features
        embed_dim: int = 192              # embedding size, 192 as in the paper
        # none | utterance_mean: subtract each utterance's mean over time in forward
        input_norm: str = "utterance_mean"
        channels: int = 512               # C of the paper: 512 (6.2 M) or 1024 (14.7 M)
        stem_kernel: int = 5              # kernel of the first Conv1d
        block_kernel: int = 3             # kernel of the dilated Res2Net convolutions
        # One SE-Res2Net block per entry, with this dilation
        block_dilations: List[int] = field(default_factory=lambda: [2, 3, 4])
        res2net_scale: int = 8            # Res2Net groups per block; must divide channels
        se_bottleneck: int = 128          # hidden units of the squeeze-excitation gate
        # Output channels of the aggregation conv over the concatenated block outputs.
        # 1536 for both C=512 and C=1024, as in the paper, SpeechBrain and WeSpeaker;
        # this is what gives 14.7 M at C=1024 (3*C = 3072 there would give 20.8 M).
        mfa_channels: int = 1536
        attention_bottleneck: int = 128   # hidden channels of the pooling attention
        # Let the attention see the utterance's mean and std next to each frame (ECAPA's
        # "context-dependent" pooling); false: frame features only
        global_context: bool = True

    def __init__(self, config: "ECAPATDNN.Config"):
        super().__init__()
        check_common_config(config)
        if config.channels <= 0 or config.res2net_scale < 2 \
                or config.channels % config.res2net_scale:
            raise ConfigError(f"model.res2net_scale ({config.res2net_scale}) must be >= 2 and "
                              f"divide model.channels ({config.channels})")
        if not config.block_dilations:
            raise ConfigError("model.block_dilations must list at least one block")
        if config.stem_kernel % 2 == 0 or config.block_kernel % 2 == 0:
            raise ConfigError("model.stem_kernel and model.block_kernel must be odd "
                              "(symmetric 'same' padding)")
        self.config = config
        c = config.channels
        self.stem = ConvReluBN(config.input_dim, c, config.stem_kernel)
        self.blocks = nn.ModuleList(
            SERes2Block(c, config.block_kernel, d, config.res2net_scale, config.se_bottleneck)
            for d in config.block_dilations)
        self.aggregate = nn.Sequential(
            nn.Conv1d(c * len(config.block_dilations), config.mfa_channels, 1), nn.ReLU())
        self.pool = AttentiveStatisticsPooling(config.mfa_channels, config.attention_bottleneck,
                                               config.global_context)
        self.pool_norm = nn.BatchNorm1d(2 * config.mfa_channels)
        self.embedding = nn.Linear(2 * config.mfa_channels, config.embed_dim)
        self.embed_norm = nn.BatchNorm1d(config.embed_dim)
        self.min_frames = self.min_input_frames(config)

    @staticmethod
    def min_input_frames(config) -> int:
        return 1               # zero-padded convolutions: any length runs

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        x = self.stem(normalize_input(feats, self.config.input_norm).transpose(1, 2))
        outputs = []
        for block in self.blocks:
            x = block(x)
            outputs.append(x)
        x = self.aggregate(torch.cat(outputs, dim=1))
        return self.embed_norm(self.embedding(self.pool_norm(self.pool(x))))


def min_input_frames(config) -> int:
    """The fewest fbank frames the model of `config` accepts (every model declares it;
    the data path skips shorter utterances instead of crashing the forward pass)."""
    return int(SPEAKER_MODELS.get(config.type).min_input_frames(config))


def build_speaker_model(config) -> nn.Module:
    """Instantiates the registered speaker model for `config` (a model's Config)."""
    if not config.type:
        raise ConfigError(f"model.type is required (one of: {', '.join(SPEAKER_MODELS.names())})")
    if config.type not in SPEAKER_MODELS:
        raise ConfigError(f"model.type: unknown '{config.type}' "
                          f"(one of: {', '.join(SPEAKER_MODELS.names())})")
    cls = SPEAKER_MODELS.get(config.type)
    if not isinstance(config, cls.Config):
        raise ConfigError(f"model.type '{config.type}' needs a {cls.__name__}.Config, "
                          f"got {type(config).__qualname__}")
    return cls(config)
