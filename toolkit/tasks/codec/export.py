"""Export of a trained codec generator: the encoder graph (waveform -> codes) and decoder
graph (codes -> waveform) as ONNX and TorchScript with graph-friendly copies of the conv
layers (and of the istft decoder, whose inverse FFT becomes a fixed-basis matmul), the
safetensors inference checkpoint (weight norm folded in), the metadata every file carries
(encoder and output rates, codebooks, bitrate, causal context, weights fingerprint), and the
parity check of every format against PyTorch. Running an export: toolkit.tasks.codec.runtime.

Format 2 (two rates): `encoder_sample_rate` / `encoder_hop` describe the encoder's input,
`sample_rate` / `hop` the decoder's output (samples per code frame at sample_rate); a
format-1 export has one rate for both.
"""
import copy
import dataclasses
import hashlib
import logging
import math
import os
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from toolkit.tasks.codec.model import (CodecConfig, CodecConv1d, CodecConvTranspose1d,
                                       CodecModel, IstftDecoder, decoder_context_frames,
                                       history_length, remove_weight_norm)

logger = logging.getLogger(__name__)

# 3: a decoder may lag its input (decoder_delay_samples); exports without a lag stay 2, so
# that toolkits which know only 2 still read them.
EXPORT_FORMAT_VERSION = 3
GRAPH_FILES = {"onnx": ("encoder.onnx", "decoder.onnx"), "torch": ("encoder.zip", "decoder.zip")}
SAFETENSORS_NAME = "model.safetensors"


class _PaddedConv(nn.Module):
    """CodecConv1d with its padding as two ints (TorchScript's F.pad takes a list)."""

    def __init__(self, layer: CodecConv1d):
        super().__init__()
        self.conv = layer.conv
        self.left, self.right = int(layer.padding[0]), int(layer.padding[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, [self.left, self.right]))


class _TrimmedConvTranspose(nn.Module):
    """CodecConvTranspose1d trimming by constant offsets from both ends, so a traced
    graph keeps a dynamic length (slicing to `shape - right` would bake the length in)."""

    def __init__(self, layer: CodecConvTranspose1d):
        super().__init__()
        self.conv = layer.conv
        self.left, self.right = int(layer.trim[0]), int(layer.trim[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if self.right > 0:
            return y[:, :, self.left:-self.right]
        return y[:, :, self.left:]


class _IstftDecoderGraph(nn.Module):
    """IstftDecoder without autocast islands, its inverse FFT as the fixed-basis matmul
    (InverseSTFT.use_fft = False): the same function, in ops that ONNX and TorchScript hold."""

    def __init__(self, decoder: IstftDecoder):
        super().__init__()
        decoder = copy.deepcopy(decoder)
        self.embed_pad = int(decoder.embed_pad)
        self.embed, self.norm, self.blocks = decoder.embed, decoder.norm, decoder.blocks
        self.final_norm, self.head, self.istft = decoder.final_norm, decoder.head, decoder.istft
        self.istft.use_fft = False
        self.output_tanh = bool(decoder.output_tanh)
        self.max_log_magnitude = float(decoder.MAX_LOG_MAGNITUDE)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if self.embed_pad:
            z = F.pad(z, [self.embed_pad, 0])
        x = self.norm(self.embed(z).transpose(1, 2)).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        x = self.head(self.final_norm(x.transpose(1, 2))).transpose(1, 2)
        log_mag, phase = x.chunk(2, dim=1)
        mag = torch.exp(log_mag.clamp(max=self.max_log_magnitude))
        audio = self.istft(mag * torch.cos(phase), mag * torch.sin(phase))
        if self.output_tanh:
            audio = torch.tanh(audio)
        return audio


def _exportable(module: nn.Module) -> nn.Module:
    """A copy of an encoder/decoder stack with graph-friendly conv wrappers (same weights)."""
    if isinstance(module, IstftDecoder):
        return _IstftDecoderGraph(module)
    module = copy.deepcopy(module)

    def walk(parent: nn.Module) -> None:
        for name, child in parent.named_children():
            if isinstance(child, CodecConv1d):
                setattr(parent, name, _PaddedConv(child))
            elif isinstance(child, CodecConvTranspose1d):
                setattr(parent, name, _TrimmedConvTranspose(child))
            else:
                walk(child)
    walk(module)
    return module


class _StageGraph(nn.Module):
    """One VQ stage at inference: the same operations as VectorQuantizer (cosine nearest
    entry, straight-through sum), so the graph picks the same codes as PyTorch."""

    def __init__(self, stage):
        super().__init__()
        self.in_proj = copy.deepcopy(stage.in_proj)
        self.out_proj = copy.deepcopy(stage.out_proj)
        codebook = stage.codebook.detach().clone().float()
        self.register_buffer("codebook", codebook)
        self.register_buffer("keys", F.normalize(codebook, dim=1).t().contiguous())

    def forward(self, residual: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        z_e = self.in_proj(residual)                                   # (B, d, frames)
        sims = torch.matmul(F.normalize(z_e.transpose(1, 2), dim=2), self.keys)
        codes = sims.argmax(dim=2)                                     # (B, frames)
        q = F.embedding(codes, self.codebook).transpose(1, 2)
        q = z_e + (q - z_e)
        return codes, self.out_proj(q)


class EncoderGraph(nn.Module):
    """wav (B, 1, T), T a multiple of the hop -> codes (B, n_codebooks, T / hop) int64."""

    def __init__(self, model: CodecModel):
        super().__init__()
        self.encoder = _exportable(model.encoder)
        self.stages = nn.ModuleList(_StageGraph(s) for s in model.quantizer.stages)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        residual = self.encoder(wav)
        codes: List[torch.Tensor] = []
        for stage in self.stages:
            stage_codes, q = stage(residual)
            residual = residual - q
            codes.append(stage_codes)
        return torch.stack(codes, dim=1)


class _StageDecode(nn.Module):
    def __init__(self, stage: _StageGraph):
        super().__init__()
        self.out_proj = stage.out_proj
        self.register_buffer("codebook", stage.codebook)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.out_proj(F.embedding(codes, self.codebook).transpose(1, 2))


class DecoderGraph(nn.Module):
    """codes (B, n_codebooks, frames) int64 -> wav (B, 1, frames * decoder_hop) float32 at
    the output rate."""

    def __init__(self, model: CodecModel):
        super().__init__()
        stages = [_StageDecode(_StageGraph(s)) for s in model.quantizer.stages]
        self.first = stages[0]
        self.rest = nn.ModuleList(stages[1:])
        self.decoder = _exportable(model.decoder)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        z_q = self.first(codes[:, 0])
        for i, stage in enumerate(self.rest):
            z_q = z_q + stage(codes[:, i + 1])
        return self.decoder(z_q)


def weights_fingerprint(model: nn.Module) -> str:
    """Short hash of the inference weights: a codes file names the model it needs."""
    h = hashlib.sha256()
    for key, value in sorted(model.state_dict().items()):
        t = value.detach().cpu().contiguous()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


def encoder_context_samples(model: CodecModel) -> int:
    """Left context (a multiple of the hop) that makes chunked encoding of a causal model
    exact: its receptive field, rounded up to whole frames, plus one frame."""
    hop = model.hop
    return int(math.ceil(history_length(model.encoder) / hop)) * hop + hop


def codec_metadata(model: CodecModel) -> dict:
    cfg = model.config
    causal = bool(cfg.causal)
    return {
        "format_version": EXPORT_FORMAT_VERSION if model.delay_samples else 2, "task": "codec",
        "sample_rate": int(cfg.sample_rate), "hop": int(model.decoder_hop),
        "encoder_sample_rate": int(model.encoder_sample_rate), "encoder_hop": int(model.hop),
        "decoder_type": cfg.decoder,
        "frame_rate": float(model.frames_per_second), "n_codebooks": int(cfg.n_codebooks),
        "codebook_size": int(cfg.codebook_size), "bitrate": float(model.bitrate()),
        "causal": causal, "fingerprint": weights_fingerprint(model),
        "encoder_context_samples": encoder_context_samples(model) if causal else None,
        "decoder_context_frames": decoder_context_frames(model) if causal else None,
        "decoder_delay_samples": int(model.delay_samples),
        "weight_norm": "removed (folded into the weights)",
        "encoder": "wav (batch, 1, samples), samples a multiple of encoder_hop, mono in [-1, 1] "
                   "at encoder_sample_rate -> codes (batch, n_codebooks, samples / encoder_hop) "
                   "int64",
        "decoder": "codes (batch, n_codebooks, frames) int64 -> wav (batch, 1, frames * hop) "
                   "at sample_rate, decoder_delay_samples behind the encoded audio (encode "
                   "that many samples of silence after it; drop that many first samples)",
    }


def pad_to_hop(wave: np.ndarray, hop: int) -> np.ndarray:
    """float32 `wave` with zeros after it up to a multiple of `hop` (the graphs take whole
    frames)."""
    wave = np.asarray(wave, dtype=np.float32)
    extra = (-len(wave)) % hop
    return np.pad(wave, (0, extra)) if extra else wave


# Share of frames whose codes may differ from PyTorch's. Another runtime's convolutions
# round differently, and where a residual lies almost as near two codebook entries the
# nearest one flips, and with it the later codebooks' residuals in that frame: measured on
# the shipped 12 x 1024 codec, ONNX Runtime against PyTorch on 20 test utterances, at most
# 2 frames in 1,000. A wrong graph (weights, padding, a missing layer) changes most frames.
CODE_FRAME_TOLERANCE = 0.01


def differing_frames(expected, got) -> Tuple[float, Optional[str]]:
    """Share of frames (over codebooks, batch and outputs) where `got`'s codes are not
    `expected`'s: 1.0 and the reason when shapes or counts disagree."""
    expected, got = tuple(expected), tuple(got)
    if len(got) != len(expected):
        return 1.0, f"{len(got)} outputs, PyTorch {len(expected)}"
    differing = total = 0
    for i, (e, g) in enumerate(zip(expected, got)):
        e, g = np.asarray(e), np.asarray(g)
        if g.shape != e.shape:
            return 1.0, f"output {i} has shape {g.shape}, PyTorch {e.shape}"
        frames = (e != g).any(axis=-2) if e.ndim >= 2 else e != g
        differing += int(frames.sum())
        total += int(frames.size)
    return (differing / total if total else 0.0), None


def export_codec(model: CodecModel, out_dir: str, cases: List[Tuple[np.ndarray]],
                 tolerance: float) -> Dict[str, float]:
    """Writes every format of `model` (eval mode, weight norm removed) to `out_dir` and
    checks them: codes equal to `model.encode`'s, audio within `tolerance` of
    `model.decode`'s. Returns the worst differences by format."""
    from toolkit import export as writers
    from toolkit.export import compare, onnx_runner, torch_runner
    os.makedirs(out_dir, exist_ok=True)
    metadata = codec_metadata(model)
    config = dataclasses.asdict(model.config)
    writers.export_safetensors(model, os.path.join(out_dir, SAFETENSORS_NAME), metadata, config)
    encoder, decoder = EncoderGraph(model).eval(), DecoderGraph(model).eval()
    paths = {}
    for backend, (enc_name, dec_name) in GRAPH_FILES.items():
        paths[backend] = (os.path.join(out_dir, enc_name), os.path.join(out_dir, dec_name))
    frames = 8
    wav = torch.zeros(1, 1, frames * model.hop)
    codes = torch.zeros(1, model.config.n_codebooks, frames, dtype=torch.long)
    writers.export_onnx(encoder, (wav,), paths["onnx"][0], ["wav"], ["codes"],
                        {"wav": {0: "batch", 2: "samples"}, "codes": {0: "batch", 2: "frames"}},
                        metadata)
    writers.export_onnx(decoder, (codes,), paths["onnx"][1], ["codes"], ["wav"],
                        {"codes": {0: "batch", 2: "frames"}, "wav": {0: "batch", 2: "samples"}},
                        metadata)
    writers.export_torchscript(encoder, paths["torch"][0], metadata)
    writers.export_torchscript(decoder, paths["torch"][1], metadata)

    reloaded = load_safetensors_model(os.path.join(out_dir, SAFETENSORS_NAME))

    def run_encode(m):
        return lambda wav_: (m.encode(torch.from_numpy(wav_)).numpy(),)

    def run_decode(m):
        return lambda codes_: (m.decode(torch.from_numpy(codes_)).numpy(),)
    worst = {}
    got = compare(run_encode(model), {
        "onnx": onnx_runner(paths["onnx"][0]),
        "torchscript": torch_runner(torch.jit.load(paths["torch"][0]).eval()),
        "safetensors": run_encode(reloaded)}, cases, CODE_FRAME_TOLERANCE,
        "exported codec encoder (codes)", difference=differing_frames,
        measure="share of frames with other codes")
    worst.update({f"encoder_{k}_other_frames": v for k, v in got.items()})
    code_cases = [run_encode(model)(*case) for case in cases]
    got = compare(run_decode(model), {
        "onnx": onnx_runner(paths["onnx"][1]),
        "torchscript": torch_runner(torch.jit.load(paths["torch"][1]).eval()),
        "safetensors": run_decode(reloaded)}, code_cases, tolerance, "exported codec decoder")
    worst.update({f"decoder_{k}": v for k, v in got.items()})
    logger.info("codec export %s: %s, %g kbit/s, fingerprint %s", out_dir,
                ", ".join(sorted(os.listdir(out_dir))), metadata["bitrate"] / 1000,
                metadata["fingerprint"])
    return worst


def load_safetensors_model(path: str) -> CodecModel:
    """The generator of an export (model.safetensors + config.json), eval mode."""
    from safetensors.torch import load_file
    from toolkit.export import read_metadata
    meta = read_metadata(path)
    raw = dict(meta.get("model") or {})
    names = {f.name for f in dataclasses.fields(CodecConfig)}
    model = CodecModel(CodecConfig(**{k: v for k, v in raw.items() if k in names}))
    model = remove_weight_norm(model.eval())
    model.load_state_dict(load_file(path))
    return model
