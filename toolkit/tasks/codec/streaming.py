"""Streaming a causal codec (toolkit.tasks.codec.model, `causal=True`): `StreamingEncoder`
takes audio in chunks of any size and `StreamingDecoder` codes in chunks of frames, each
re-running the model over the new input plus a left context that covers its receptive
field, so that the codes and the audio equal those of the whole signal at once."""
import math
from typing import Optional

import torch

from toolkit.tasks.codec.model import CodecModel, decoder_context_frames, history_length


def _require_causal(model: CodecModel) -> None:
    if not model.config.causal:
        raise ValueError("streaming needs a model built with causal=True")


class StreamingEncoder:
    """Feeds audio in arbitrary chunks, returns the codes of every frame completed so far.

    Each call re-runs the encoder over the new samples plus a left context that covers the
    encoder's receptive field (rounded up to whole frames, which keeps the stride grid
    aligned), so the codes equal those of encoding the whole signal at once."""

    def __init__(self, model: CodecModel, n_q: Optional[int] = None):
        _require_causal(model)
        self.model, self.n_q = model, n_q or model.config.n_codebooks
        hop = model.hop
        self.context = int(math.ceil(history_length(model.encoder) / hop)) * hop + hop
        self._buffer: Optional[torch.Tensor] = None   # (B, 1, samples) from _buffer_start on
        self._buffer_start = 0                          # absolute index of _buffer[..., 0]
        self._frames_done = 0

    @torch.no_grad()
    def push(self, chunk: torch.Tensor) -> torch.Tensor:
        """chunk (B, 1, n) -> codes (B, n_q, new complete frames), possibly zero frames."""
        chunk = chunk.unsqueeze(1) if chunk.dim() == 2 else chunk
        self._buffer = chunk if self._buffer is None else torch.cat([self._buffer, chunk], -1)
        hop = self.model.hop
        total_frames = (self._buffer_start + self._buffer.shape[-1]) // hop
        if total_frames == self._frames_done:
            return chunk.new_zeros(chunk.shape[0], self.n_q, 0, dtype=torch.long)
        start = max(0, self._frames_done * hop - self.context)   # a multiple of the hop
        window = self._buffer[..., start - self._buffer_start:total_frames * hop - self._buffer_start]
        z = self.model.encoder(window)[..., self._frames_done - start // hop:]
        _, codes, _, _ = self.model.quantizer.quantize(z, self.n_q)
        self._frames_done = total_frames
        keep_from = max(0, total_frames * hop - self.context)    # drop what no frame needs
        self._buffer = self._buffer[..., keep_from - self._buffer_start:]
        self._buffer_start = keep_from
        return codes


class StreamingDecoder:
    """Feeds codes in chunks of frames, returns frames * decoder_hop new samples per call, equal to
    the matching samples of decoding all codes at once (left context = receptive field)."""

    def __init__(self, model: CodecModel):
        _require_causal(model)
        self.model = model
        self.context = decoder_context_frames(model)   # in frames
        self._codes: Optional[torch.Tensor] = None    # the last `context` frames seen

    @torch.no_grad()
    def push(self, codes: torch.Tensor) -> torch.Tensor:
        """codes (B, n_q, f) -> audio (B, 1, f * decoder_hop)."""
        hop = self.model.decoder_hop
        new = codes.shape[-1]
        self._codes = codes if self._codes is None else torch.cat([self._codes, codes], -1)
        audio = self.model.decode(self._codes)[..., -new * hop:] if new else \
            codes.new_zeros(codes.shape[0], 1, 0, dtype=torch.float32)
        self._codes = self._codes[..., max(0, self._codes.shape[-1] - self.context):]
        return audio


def encode_streaming(model: CodecModel, wav: torch.Tensor, chunk_samples: int,
                     n_q: Optional[int] = None) -> torch.Tensor:
    """Encodes `wav` (B, 1, T) `chunk_samples` at a time; returns all codes (B, n_q, T // hop)."""
    encoder = StreamingEncoder(model, n_q)
    return torch.cat([encoder.push(wav[..., i:i + chunk_samples])
                      for i in range(0, wav.shape[-1], chunk_samples)], dim=-1)


def decode_streaming(model: CodecModel, codes: torch.Tensor, chunk_frames: int) -> torch.Tensor:
    """Decodes `codes` (B, n_q, frames) `chunk_frames` at a time; returns (B, 1, frames *
    decoder_hop)."""
    decoder = StreamingDecoder(model)
    return torch.cat([decoder.push(codes[..., i:i + chunk_frames])
                      for i in range(0, codes.shape[-1], chunk_frames)], dim=-1)
