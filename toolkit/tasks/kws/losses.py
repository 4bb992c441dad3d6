"""Training criteria. Each takes (logits, lengths, labels, keyword_end=None) and returns
(loss, metrics); keyword_end holds each utterance's keyword end frame (-1: unknown) for the
criteria that use it. Criteria with `uses_ctc_head` take (ctc_logits, lengths, tokens,
token_lengths) instead."""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from toolkit.config import ConfigError, Ramp, build_dataclass
from toolkit.nn.ctc import ctc_loss
from toolkit.registry import Registry

LOSSES: Registry = Registry("loss")


@dataclass
class LossConfigBase:
    type: str = ""                # the registered criterion this section builds


def valid_frame_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


@LOSSES.register("max_pooling")
class MaxPoolingLoss(nn.Module):
    """Max-pooling loss for wake words: per utterance and keyword, only the frame with
    the highest score matters. The keyword an utterance contains is pushed up at its best
    frame; every other keyword (all of them for fillers, label -1) is pushed down at its
    worst frame. Whole batch at once: masks replace a per-utterance loop."""

    @dataclass
    class Config(LossConfigBase):
        # A keyword cannot be complete in its first frames: its positive maximum is taken
        # from frame `min_duration` on (falling back to all frames for shorter inputs).
        min_duration: int = 0
        # Focal weighting (1 - p_target)^gamma of each pooled term: utterances the model
        # already gets right (most fillers, clear keywords) count less, the near misses
        # (confusables scoring high, keywords scoring low) more. 0: plain cross-entropy.
        focal_gamma: float = 0.0
        # [first, last] frame relative to the keyword's end (data list `kw_end`) where its
        # positive maximum is taken, e.g. [-5, 50]. Unaligned max pooling lets a causal
        # model fire as soon as "hey sni" is heard, so "hey snip" and "hey sneeps" fire
        # too; anchored at the end, the keyword must be heard whole. Utterances without
        # `kw_end` fall back to `min_duration`. Empty: no anchoring.
        end_window: List[int] = field(default_factory=list)

        def __post_init__(self):
            if self.focal_gamma < 0:
                raise ConfigError("loss.focal_gamma must be >= 0")
            if self.end_window and (len(self.end_window) != 2
                                    or self.end_window[0] > self.end_window[1]):
                raise ConfigError(f"loss.end_window: expected [first, last] frames relative "
                                  f"to the keyword end, got {self.end_window}")

    def __init__(self, config: "MaxPoolingLoss.Config"):
        super().__init__()
        self.min_duration = config.min_duration
        self.focal_gamma = config.focal_gamma
        self.end_window = list(config.end_window)

    def forward(self, logits: torch.Tensor, lengths: torch.Tensor, labels: torch.Tensor,
                keyword_end: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        logits = logits.float()                                     # loss always in fp32
        if logits.dim() == 4:
            # (B, T, M, K): the members of an ensemble, each trained as if it were alone.
            b, t, m, k = logits.shape
            logits = logits.transpose(1, 2).reshape(b * m, t, k)
            lengths, labels = lengths.repeat_interleave(m), labels.repeat_interleave(m)
            if keyword_end is not None:
                keyword_end = keyword_end.repeat_interleave(m)
        batch, frames, num_kw = logits.shape
        valid = valid_frame_mask(lengths, frames)                   # (B, T)
        neg_inf = torch.finfo(logits.dtype).min
        max_all = logits.masked_fill(~valid[:, :, None], neg_inf).amax(dim=1)   # (B, K)
        t = torch.arange(frames, device=logits.device)[None, :]
        late = valid & (t >= self.min_duration)
        if self.end_window and keyword_end is not None:
            end = keyword_end[:, None]
            window = valid & (end >= 0) & (t >= end + self.end_window[0]) \
                & (t <= end + self.end_window[1])
            late = torch.where(window.any(dim=1, keepdim=True), window, late)
        has_late = late.any(dim=1, keepdim=True)                    # (B, 1)
        max_late = logits.masked_fill(~late[:, :, None], neg_inf).amax(dim=1)
        max_late = torch.where(has_late, max_late, max_all)
        target = F.one_hot(labels.clamp(min=0), num_kw).float() * (labels >= 0).float()[:, None]
        # Positive targets use the guarded maximum, negative targets any frame.
        pooled = torch.where(target > 0, max_late, max_all)
        loss = F.binary_cross_entropy_with_logits(pooled, target, reduction="none")
        if self.focal_gamma > 0:
            # 1 - p_target = sigmoid(-z) for a target 1, sigmoid(z) for a target 0.
            p_wrong = torch.sigmoid(torch.where(target > 0, -pooled, pooled))
            loss = loss * p_wrong.pow(self.focal_gamma)
        loss = loss.sum(dim=1)
        with torch.no_grad():
            detected = pooled > 0                                   # sigmoid > 0.5
            correct = torch.where(labels >= 0,
                                  detected.gather(1, labels.clamp(min=0)[:, None]).squeeze(1)
                                  & (detected.sum(dim=1) == 1),
                                  ~detected.any(dim=1))
        return loss.mean(), {"acc": correct.float().mean()}


@LOSSES.register("cross_entropy")
class CrossEntropyLoss(nn.Module):
    """Utterance classification (command words). Frame-level logits are averaged over
    the valid frames; (B, K) logits are used as they are."""

    @dataclass
    class Config(LossConfigBase):
        label_smoothing: float = 0.0  # target mass spread over the other classes; 0: none

    def __init__(self, config: "CrossEntropyLoss.Config"):
        super().__init__()
        self.label_smoothing = config.label_smoothing

    def forward(self, logits: torch.Tensor, lengths: torch.Tensor, labels: torch.Tensor,
                keyword_end: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        logits = logits.float()
        if logits.dim() == 3:
            valid = valid_frame_mask(lengths, logits.size(1)).float()[:, :, None]
            logits = (logits * valid).sum(dim=1) / valid.sum(dim=1).clamp(min=1.0)
        loss = F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing)
        acc = (logits.argmax(dim=1) == labels).float().mean()
        return loss, {"acc": acc}


@LOSSES.register("ctc")
class CTCLoss(nn.Module):
    """Connectionist temporal classification over unit (phone or character) targets, on
    the model's CTC head (`model.ctc_outputs` units, blank = 0). Used as a component
    of `weighted_sum` next to the keyword loss: the phone sequence teaches the shared
    layers what distinguishes a keyword from a near-homophone ("hey snips" vs "hey
    sneeps"), which one score per utterance alone does not."""

    uses_ctc_head = True

    @dataclass
    class Config(LossConfigBase):
        pass

    def __init__(self, config: "CTCLoss.Config"):
        super().__init__()

    def forward(self, ctc_logits: torch.Tensor, lengths: torch.Tensor, tokens: torch.Tensor,
                token_lengths: torch.Tensor) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        log_probs = F.log_softmax(ctc_logits.float(), dim=-1).transpose(0, 1)   # (T, B, U)
        # Summed per utterance, averaged over the batch; an utterance too short for its
        # targets contributes zero instead of infinity.
        per_utt = ctc_loss(log_probs, tokens, lengths, token_lengths, blank=0,
                           zero_infinity=True)
        loss = per_utt.sum() / max(1, ctc_logits.size(0))
        return loss, {"ctc_per_unit": (per_utt.sum() / token_lengths.sum().clamp(min=1)).detach()}


def uses_ctc_head(loss_fn: nn.Module) -> bool:
    """True when a criterion (or a component of it) needs the CTC head and targets."""
    return any(getattr(m, "uses_ctc_head", False) for m in loss_fn.modules())


@LOSSES.register("weighted_sum")
class WeightedSumLoss(nn.Module):
    """Several criteria on the same output, each weighted by a number or a ramp over
    training progress (`toolkit.config.Ramp`); `start_fraction` switches a component on
    at that fraction of max_steps. E.g. cross-entropy first, max-pooling from 30 %:

        loss:
          type: weighted_sum
          components:
            - {type: cross_entropy, weight: 1.0}
            - {type: max_pooling, weight: 1.0, start_fraction: 0.3, min_duration: 20}
    """

    @dataclass
    class Config(LossConfigBase):
        # Each: a criterion's own keys plus `weight` (number or ramp) and `start_fraction`.
        components: List[Dict[str, Any]] = field(default_factory=list)

        def __post_init__(self):
            if not self.components:
                raise ConfigError("loss.components: at least one component is required")
            self.parsed = []
            for i, raw in enumerate(self.components):
                if not isinstance(raw, dict):
                    raise ConfigError(f"loss.components[{i}]: expected a mapping, got {raw!r}")
                raw = dict(raw)
                path = f"loss.components[{i}]"
                weight = _coerce_ramp(raw.pop("weight", 1.0), f"{path}.weight")
                start = float(raw.pop("start_fraction", 0.0))
                kind = raw.get("type")
                if kind not in LOSSES or kind == "weighted_sum":
                    raise ConfigError(f"{path}.type: unknown '{kind}' (one of: "
                                      + ", ".join(n for n in LOSSES.names() if n != "weighted_sum") + ")")
                if not 0.0 <= start < 1.0:
                    raise ConfigError(f"{path}.start_fraction must be in [0, 1)")
                if start > 0:
                    if not weight.is_constant:
                        raise ConfigError(f"{path}: give either start_fraction or a ramped "
                                          "weight, not both")
                    weight = Ramp(initial=0.0, final=weight.final, start=start, end=start,
                                  shape="step")
                sub = build_dataclass(LOSSES.get(kind).Config, raw, path)
                self.parsed.append((sub, weight))

    def __init__(self, config: "WeightedSumLoss.Config"):
        super().__init__()
        self.parts = nn.ModuleList(LOSSES.get(sub.type)(sub) for sub, _ in config.parsed)
        self.weights = [w for _, w in config.parsed]
        self.names = [f"loss_{i}_{sub.type}" for i, (sub, _) in enumerate(config.parsed)]

    def switches_parts(self) -> bool:
        """True when the set of components in use changes during training."""
        return any(not w.is_constant or w.final == 0.0 for w in self.weights)

    def forward(self, logits, lengths, labels, ctc_logits=None, tokens=None, token_lengths=None,
                keyword_end=None, step: int = 0, total_steps: int = 1):
        """`step` of `total_steps`: the training progress the component weights follow."""
        total = None
        metrics: Dict[str, torch.Tensor] = {}
        for i, (part, ramp) in enumerate(zip(self.parts, self.weights)):
            weight = ramp.value(step, total_steps)
            if weight == 0.0:
                continue
            loss, m = self._run_part(i, logits, lengths, labels, ctc_logits, tokens,
                                     token_lengths, keyword_end)
            total = weight * loss if total is None else total + weight * loss
            metrics.update({f"{k}_{i}" if k in metrics else k: v for k, v in m.items()})
            metrics[self.names[i]] = loss.detach()
        if total is None:     # nothing switched on yet: the earliest component counts
            first = int(np.argmin([w.active_from() for w in self.weights]))
            return self._run_part(first, logits, lengths, labels, ctc_logits, tokens,
                                  token_lengths, keyword_end)
        return total, metrics

    def _run_part(self, i, logits, lengths, labels, ctc_logits, tokens, token_lengths,
                  keyword_end):
        """Component i on what it consumes: the keyword output or the CTC head."""
        part = self.parts[i]
        if getattr(part, "uses_ctc_head", False):
            return part(ctc_logits, lengths, tokens, token_lengths)
        return part(logits, lengths, labels, keyword_end=keyword_end)


def _coerce_ramp(value, path: str) -> Ramp:
    from toolkit.config import coerce
    return coerce(value, Ramp, path)


def build_loss(config) -> nn.Module:
    return LOSSES.get(config.type)(config)
