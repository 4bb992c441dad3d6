"""GRU: input projection + unidirectional multi-layer GRU + linear classifier."""
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import nn

from toolkit.tasks.kws.models.base import MODELS, GlobalCMVN, ModelConfigBase, StreamingModel


@MODELS.register("gru")
class GRU(StreamingModel):
    """The cache is the GRU hidden state. It is declared as one cache entry of shape
    (hidden_dim, num_layers), i.e. the layer index plays the role of the "frames" axis,
    so the flat (B, cache_size) convention and split_cache/join_cache still apply."""

    streaming = True   # unidirectional: chunked inference with the state equals the whole pass

    @dataclass
    class Config(ModelConfigBase):
        hidden_dim: int = 48          # GRU units per layer
        num_layers: int = 2           # stacked unidirectional GRU layers
        dropout: float = 0.1          # between layers

    def __init__(self, config: "GRU.Config"):
        super().__init__(config)
        h = config.hidden_dim
        self.cmvn = GlobalCMVN(config.input_dim)
        self.input_proj = nn.Sequential(nn.Linear(config.input_dim, h), nn.ReLU())
        # nn.GRU applies its dropout between layers only; it warns when there is one layer.
        self.gru = nn.GRU(h, h, config.num_layers, batch_first=True,
                          dropout=config.dropout if config.num_layers > 1 else 0.0)
        self.dropout = nn.Dropout(config.dropout)
        self._build_heads(h)
        self._finalize_cache([(h, config.num_layers)])

    def receptive_field(self) -> int:
        # Recurrent: every past frame can influence the output. -1 means unbounded.
        return -1

    def encode(self, feats: torch.Tensor,
               cache: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        if cache is None:
            cache = torch.zeros(feats.size(0), self.cache_size, device=feats.device)
        # (B, hidden, layers) -> the (layers, B, hidden) layout nn.GRU expects.
        h0 = self.split_cache(cache)[0].permute(2, 0, 1).contiguous()
        x = self.input_proj(self.cmvn(feats))
        y, hn = self.gru(x, h0)
        return self.dropout(y), self.join_cache([hn.permute(1, 2, 0)])
