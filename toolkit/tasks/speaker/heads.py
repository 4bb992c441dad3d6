"""Speaker classification heads, kept apart from the embedding network so that export
drops them and fine-tuning can replace them for another speaker set.

Every head is called as `head(embeddings (B, E), labels (B,), margin) -> logits (B, K)`.
The margin comes with each call because the trainer ramps it over training; the margin
heads with margin 0 give plain scaled cosine logits s * cos(theta).
"""
import math
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from toolkit.config import ConfigError, Ramp
from toolkit.registry import Registry


def default_margin() -> Ramp:
    # 0 -> 0.2 over 10-30 % of training, fast then settling: a margin from the start keeps
    # a fresh network from separating classes at all (WeSpeaker ramps epochs 20-40 of 150).
    return Ramp(initial=0.0, final=0.2, start=0.1, end=0.3, shape="exponential")

SPEAKER_HEADS: Registry = Registry("speaker head")


def check_head_config(config) -> None:
    if config.num_classes <= 0:
        raise ConfigError(f"head.num_classes must be resolved (> 0) before building, "
                          f"got {config.num_classes}")


@SPEAKER_HEADS.register("softmax")
class SoftmaxHead(nn.Module):
    """A plain linear classifier over the raw embedding; it has no margin, so a non-zero
    margin in the config or in a call is an error rather than silently ignored."""

    @dataclass
    class Config:
        type: str = ""            # the registered head this section builds
        num_classes: int = 0      # training speakers; 0: taken from the speaker inventory
        # Must stay 0 (a linear layer has no margin); present so that every head's margin
        # is read the same way.
        margin: Ramp = field(default_factory=lambda: Ramp.constant(0.0))
        bias: bool = True         # give the linear layer a bias

    def __init__(self, config: "SoftmaxHead.Config", embed_dim: int):
        super().__init__()
        check_head_config(config)
        if not (config.margin.is_constant and config.margin.final == 0.0):
            raise ConfigError(f"head.margin must be 0 for the softmax head, got {config.margin}")
        self.config = config
        self.linear = nn.Linear(embed_dim, config.num_classes, bias=config.bias)

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight              # (num_classes, E)

    def reset_parameters(self) -> None:
        self.linear.reset_parameters()

    def forward(self, embeddings: torch.Tensor, labels: Optional[torch.Tensor] = None,
                margin: float = 0.0) -> torch.Tensor:
        if margin != 0.0:
            raise ValueError(f"the softmax head has no margin; got margin={margin}")
        return self.linear(embeddings.float())


class CosineMarginHead(nn.Module):
    """Shared part of the margin heads: s * cos(theta) between the length-normalised
    embedding and each class's normalised weight vector, with `target_logit` moving the
    target class's cosine by the margin. labels=None (scoring a validation set without a
    margin) returns s * cos(theta) for every class."""

    def __init__(self, config, embed_dim: int):
        super().__init__()
        check_head_config(config)
        if config.scale <= 0:
            raise ConfigError(f"head.scale must be > 0, got {config.scale}")
        self.config = config
        self.weight = nn.Parameter(torch.empty(config.num_classes, embed_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Only the directions matter: the weights are normalised in forward.
        nn.init.xavier_uniform_(self.weight)

    def cosine(self, embeddings: torch.Tensor) -> torch.Tensor:
        # fp32 even under autocast: cosines near +-1 and the margin need the precision.
        return F.linear(F.normalize(embeddings.float(), dim=1),
                        F.normalize(self.weight.float(), dim=1)).clamp(-1.0, 1.0)

    def target_logit(self, cos: torch.Tensor, margin: float) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, embeddings: torch.Tensor, labels: Optional[torch.Tensor] = None,
                margin: float = 0.0) -> torch.Tensor:
        cos = self.cosine(embeddings)
        if labels is None:
            return self.config.scale * cos
        target = F.one_hot(labels.long(), cos.size(1)).bool()
        return self.config.scale * torch.where(target, self.target_logit(cos, margin), cos)


@SPEAKER_HEADS.register("am_softmax")
class AMSoftmaxHead(CosineMarginHead):
    """Additive margin softmax (CosFace): the target logit is s * (cos(theta) - m)."""

    @dataclass
    class Config:
        type: str = ""            # the registered head this section builds
        num_classes: int = 0      # training speakers; 0: taken from the speaker inventory
        # Logit scale s: cosines lie in [-1, 1], too flat for softmax without it; 32 is the
        # usual speaker setting (WeSpeaker, Hyperion).
        scale: float = 32.0
        # Margin m over training (a number for a constant one); each call passes the
        # current value.
        margin: Ramp = field(default_factory=default_margin)

    def target_logit(self, cos: torch.Tensor, margin: float) -> torch.Tensor:
        return cos - margin


@SPEAKER_HEADS.register("aam_softmax")
class AAMSoftmaxHead(CosineMarginHead):
    """Additive angular margin softmax (ArcFace): the target logit is s * cos(theta + m)."""

    @dataclass
    class Config:
        type: str = ""            # the registered head this section builds
        num_classes: int = 0      # training speakers; 0: taken from the speaker inventory
        # Logit scale s: cosines lie in [-1, 1], too flat for softmax without it; 32 is the
        # usual speaker setting (WeSpeaker, Hyperion).
        scale: float = 32.0
        # Angular margin m in radians over training (a number for a constant one); each call
        # passes the current value.
        margin: Ramp = field(default_factory=default_margin)

    def target_logit(self, cos: torch.Tensor, margin: float) -> torch.Tensor:
        # cos(theta + m) = cos*cos(m) - sin*sin(m), with sin(theta) = sqrt(1 - cos^2) >= 0
        # since theta is in [0, pi]. The floor keeps the gradient of sqrt finite at
        # cos = +-1 (acos itself would have an infinite derivative there).
        sin = (1.0 - cos * cos).clamp(min=1e-7).sqrt()
        shifted = cos * math.cos(margin) - sin * math.sin(margin)
        # Past theta = pi - m, cos(theta + m) turns upwards again (theta + m > pi), so moving
        # the embedding further from its class would raise the target logit. There the
        # target logit continues as cos(theta) - m*sin(m) instead: the first-order expansion
        # cos(theta + m) ~ cos(theta) - m*sin(theta) with sin(theta) frozen at its value
        # sin(pi - m) = sin(m) at the switch point. It keeps decreasing in theta, stays
        # below cos(theta) (a penalty, as a margin should be), and lies within m*sin(m)
        # of -1 at the switch, so the logit is monotone in theta everywhere.
        return torch.where(cos > math.cos(math.pi - margin), shifted,
                           cos - margin * math.sin(margin))


def build_speaker_head(config, embed_dim: int) -> nn.Module:
    """Instantiates the registered head for `config` on embeddings of size `embed_dim`."""
    if config.type not in SPEAKER_HEADS:
        raise ConfigError(f"head.type: unknown '{config.type}' "
                          f"(one of: {', '.join(SPEAKER_HEADS.names())})")
    if embed_dim <= 0:
        raise ConfigError(f"the head's embedding size must be > 0, got {embed_dim}")
    return SPEAKER_HEADS.get(config.type)(config, embed_dim)
