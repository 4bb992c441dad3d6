"""Neural speech codec generator: convolutional encoder, residual VQ, mirrored decoder.

Architecture (SEANet/DAC family): a stem conv, then per stride a block of residual units
(dilations 1, 3, 9) followed by a strided conv that doubles the channels; a final conv to the
latent. The decoder mirrors it with transposed convs that halve the channels. With strides
[2, 4, 5, 8] the hop is 320 samples: 50 code frames per second at 16 kHz.

Lengths: `forward` and `encode` right-pad the waveform with zeros to a multiple of the hop,
and `forward` trims the output back, so audio out has the input's length. `decode` returns
frames * hop samples (pass `length` to trim). For T a multiple of the hop nothing is padded.

Two rates (`encoder_sample_rate` below `sample_rate`, e.g. 16 -> 24 kHz): the encoder reads
audio at its own rate with `hop` samples per code frame; the decoder writes `sample_rate`
audio with `decoder_hop` = hop x sample_rate / encoder_sample_rate samples per frame (its
own strides, or the inverse STFT's hop), so one code frame spans the same time on both sides
and `forward` returns ceil(T x decoder_hop / hop) samples at the output rate.

Decoders (`decoder`): `conv` mirrors the encoder with transposed convs, computing at every
intermediate rate up to the output rate; `istft` (Vocos, Siuzdak 2023) keeps all its layers
at the code frame rate (ConvNeXt blocks) and predicts each frame's STFT magnitude and phase,
turned into audio by an inverse STFT whose hop is `decoder_hop`: most of the work runs at
~50 frames/s instead of 16,000+ samples/s.

Causal models (`causal=True`): every conv pads on the left only and every transposed conv
trims its overlap on the right, so output sample n depends on no input after n. Decoding the
first N frames of codes then gives exactly the first N * hop samples of decoding all of them
(the prefix property), and `StreamingEncoder` / `StreamingDecoder`
(toolkit.tasks.codec.streaming) run the model chunk by chunk with a bounded left context
equal to its receptive field.

Output layer: tanh. It bounds the waveform to the PCM range [-1, 1] that the training audio
lives in, so an untrained decoder cannot emit large values that swamp the log-spectral and
adversarial losses in the first steps; the price, slightly compressed peaks near full scale,
does not matter for loudness-normalised speech. `output_tanh: false` gives a linear output
(EnCodec's choice) for material that reaches full scale.
"""
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm as _weight_norm

from toolkit.config import ConfigError
from toolkit.registry import Registry
from toolkit.tasks.codec.quantizer import ResidualVectorQuantizer


@dataclass
class CodecConfig:
    # rate of the audio the codec reconstructs (decoder output, losses, metrics); equals dataset.sample_rate
    sample_rate: int = 16000
    # rate the encoder reads (0: sample_rate); e.g. 16000 with sample_rate 24000: the codes
    # describe 16 kHz input and the decoder upsamples; with the strides it sets frames/s and bitrate
    encoder_sample_rate: int = 0
    channels: int = 32              # encoder stem width, doubled per stride; 32 trains on CPU, DAC uses 64
    # downsampling per encoder block; their product is the hop (320: 50 frames/s at 16 kHz)
    strides: List[int] = field(default_factory=lambda: [2, 4, 5, 8])
    # residual-unit dilations in every block; 1, 3, 9 with kernel 7 covers a block's context without gaps
    dilations: List[int] = field(default_factory=lambda: [1, 3, 9])
    kernel_size: int = 7            # kernel of the stem, residual and output convs (SEANet/DAC value)
    latent_dim: int = 0             # encoder output width; 0: its top width channels * 2^len(strides) (DAC)
    decoder_channels: int = 0       # conv decoder input width, halved per stride; 0: mirror the encoder
    # conv decoder upsampling per block, in order; empty: the encoder strides reversed. Their
    # product is decoder_hop = hop x sample_rate / encoder_sample_rate (e.g. [8, 6, 5, 2] for
    # 16 -> 24 kHz at hop 320; [7, 7, 6, 3] for 16 -> 44.1 kHz)
    decoder_strides: List[int] = field(default_factory=list)
    # conv: transposed convs up to the output rate; istft: ConvNeXt blocks at the frame rate
    # predicting STFT magnitude and phase, then an inverse STFT (Vocos; far less compute)
    decoder: str = "conv"
    istft_dim: int = 256            # istft decoder: ConvNeXt width (Vocos: 512)
    istft_layers: int = 8           # istft decoder: ConvNeXt blocks (Vocos: 8)
    istft_kernel_size: int = 7      # istft decoder: depthwise conv kernel of each block (odd)
    istft_n_fft: int = 0            # istft decoder: FFT size, a multiple of decoder_hop; 0: 4 x decoder_hop
    activation: str = "snake"       # snake (x + sin^2(ax)/a, periodic bias that suits audio) or elu (SEANet)
    weight_norm: bool = True        # weight-normalised convs steady GAN training; remove_weight_norm for export
    causal: bool = False            # left-only padding so the codec can stream; some quality cost at equal size
    output_tanh: bool = True        # tanh bounds the output to [-1, 1] (module docstring); false: linear
    n_codebooks: int = 8            # residual VQ stages: 8 x 10 bits x 50 frames/s = 4 kbit/s at 16 kHz
    codebook_size: int = 1024       # entries per codebook: 10 bits per code
    codebook_dim: int = 8           # lookup dimension (DAC): low-dim L2-normalised search keeps entries in use
    quantizer_dropout: float = 0.5  # share of training items using 1..n stages at random: one model, all bitrates
    ema_decay: float = 0.0          # 0: codebooks learned by the codebook loss (DAC); e.g. 0.99: EMA (EnCodec)
    dead_code_threshold: float = 0.1  # EMA only: re-seed entries used less than this x the uniform share

    @property
    def hop(self) -> int:
        """Encoder input samples per code frame."""
        return math.prod(self.strides)

    @property
    def resolved_encoder_sample_rate(self) -> int:
        return self.encoder_sample_rate or self.sample_rate

    @property
    def frames_per_second(self) -> float:
        return self.resolved_encoder_sample_rate / self.hop

    @property
    def decoder_hop(self) -> int:
        """Output samples per code frame (at sample_rate); floored when the rates do not
        divide (validate refuses that)."""
        return self.hop * self.sample_rate // self.resolved_encoder_sample_rate

    @property
    def resolved_decoder_strides(self) -> List[int]:
        return list(self.decoder_strides) or list(reversed(self.strides))

    @property
    def resolved_istft_n_fft(self) -> int:
        return self.istft_n_fft or 4 * self.decoder_hop

    @property
    def encoder_top_channels(self) -> int:
        return self.channels * 2 ** len(self.strides)

    @property
    def resolved_latent_dim(self) -> int:
        return self.latent_dim or self.encoder_top_channels

    @property
    def resolved_decoder_channels(self) -> int:
        return self.decoder_channels or self.encoder_top_channels

    def validate(self) -> "CodecConfig":
        def need(ok: bool, key: str, message: str):
            if not ok:
                raise ConfigError(f"model.{key}: {message}")
        need(self.sample_rate > 0, "sample_rate", f"must be positive, got {self.sample_rate}")
        need(self.channels > 0, "channels", f"must be positive, got {self.channels}")
        need(len(self.strides) > 0 and all(s >= 1 for s in self.strides), "strides",
             f"must be a non-empty list of integers >= 1, got {self.strides}")
        need(len(self.dilations) > 0 and all(d >= 1 for d in self.dilations), "dilations",
             f"must be a non-empty list of integers >= 1, got {self.dilations}")
        need(self.kernel_size >= 1, "kernel_size", f"must be >= 1, got {self.kernel_size}")
        need(self.latent_dim >= 0, "latent_dim", f"must be >= 0, got {self.latent_dim}")
        need(self.decoder_channels >= 0, "decoder_channels",
             f"must be >= 0, got {self.decoder_channels}")
        need(self.encoder_sample_rate >= 0, "encoder_sample_rate",
             f"must be >= 0 (0: sample_rate), got {self.encoder_sample_rate}")
        encoder_rate = self.resolved_encoder_sample_rate
        need(self.hop * self.sample_rate % encoder_rate == 0, "strides",
             f"hop {self.hop} at the encoder's {encoder_rate} Hz is {self.hop / encoder_rate:g} s "
             f"per code frame, not a whole number of samples at sample_rate={self.sample_rate} "
             f"({self.hop * self.sample_rate / encoder_rate:g}): choose strides whose product is a "
             f"multiple of {encoder_rate // math.gcd(encoder_rate, self.sample_rate)}")
        need(self.decoder in DECODERS, "decoder",
             f"unknown '{self.decoder}'; known: {', '.join(DECODERS.names())}")
        DECODERS.get(self.decoder).check_config(self)
        need(self.activation in ACTIVATIONS, "activation",
             f"unknown '{self.activation}'; known: {', '.join(ACTIVATIONS.names())}")
        need(self.n_codebooks >= 1, "n_codebooks", f"must be >= 1, got {self.n_codebooks}")
        need(self.codebook_size >= 2, "codebook_size", f"must be >= 2, got {self.codebook_size}")
        need(self.codebook_dim >= 1, "codebook_dim", f"must be >= 1, got {self.codebook_dim}")
        need(0.0 <= self.quantizer_dropout <= 1.0, "quantizer_dropout",
             f"must be in [0, 1], got {self.quantizer_dropout}")
        need(0.0 <= self.ema_decay < 1.0, "ema_decay", f"must be in [0, 1), got {self.ema_decay}")
        need(self.dead_code_threshold >= 0.0, "dead_code_threshold",
             f"must be >= 0, got {self.dead_code_threshold}")
        return self


def _factorisation_hint(n: int) -> List[int]:
    """Prime factors of n merged into at most four factors, largest first (a suggestion
    for decoder_strides)."""
    factors, rest, p = [], n, 2
    while p * p <= rest:
        while rest % p == 0:
            factors.append(p)
            rest //= p
        p += 1
    if rest > 1:
        factors.append(rest)
    factors.sort()
    while len(factors) > 4:
        factors = sorted([factors[0] * factors[1]] + factors[2:])
    return sorted(factors, reverse=True)


# --------------------------------------------------------------------------- layers

ACTIVATIONS: Registry = Registry("codec activation")


@ACTIVATIONS.register("snake")
class Snake1d(nn.Module):
    """x + sin^2(alpha x) / alpha with a learned alpha per channel (Ziyin et al. 2020): a
    periodic inductive bias that helps convs generate waveforms (BigVGAN, DAC)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # 1e-9 keeps the reciprocal finite should an alpha be driven to zero.
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x) ** 2


@ACTIVATIONS.register("elu")
class ELU1d(nn.ELU):
    def __init__(self, channels: int):   # same constructor as Snake1d, width unused
        super().__init__()


def _maybe_weight_norm(module: nn.Module, enabled: bool) -> nn.Module:
    return _weight_norm(module) if enabled else module


def remove_weight_norm(module: nn.Module) -> nn.Module:
    """Folds every weight-norm parametrization into a plain weight (in place): same outputs,
    fewer ops, and exporters that do not understand parametrizations see ordinary convs."""
    for sub in module.modules():
        if parametrize.is_parametrized(sub, "weight"):
            parametrize.remove_parametrizations(sub, "weight", leave_parametrized=True)
    return module


class CodecConv1d(nn.Module):
    """Conv1d whose padding makes the output length exactly T / stride (T a multiple of
    stride): (k - 1) * d + 1 - stride zeros in all, all on the left when causal."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 dilation: int = 1, causal: bool = False, weight_norm: bool = True):
        super().__init__()
        total = (kernel_size - 1) * dilation + 1 - stride
        if total < 0:
            raise ValueError(f"kernel {kernel_size} (dilation {dilation}) shorter than stride "
                             f"{stride}")
        self.kernel_size, self.stride, self.dilation = kernel_size, stride, dilation
        self.padding = (total, 0) if causal else (total // 2, total - total // 2)
        self.conv = _maybe_weight_norm(
            nn.Conv1d(in_channels, out_channels, kernel_size, stride=stride, dilation=dilation),
            weight_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(nn.functional.pad(x, self.padding))


class CodecConvTranspose1d(nn.Module):
    """Upsampling by `stride` with kernel 2 * stride; the `stride` samples of overlap beyond
    L * stride are trimmed, on the right only when causal (so no output sees a later input)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, causal: bool = False,
                 weight_norm: bool = True):
        super().__init__()
        self.stride = stride
        self.kernel_size = 2 * stride
        self.trim = (0, stride) if causal else (stride // 2, stride - stride // 2)
        self.conv = _maybe_weight_norm(
            nn.ConvTranspose1d(in_channels, out_channels, self.kernel_size, stride=stride),
            weight_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        left, right = self.trim
        return y[..., left:y.shape[-1] - right]


class ResidualUnit(nn.Module):
    """x + conv1x1(act(conv_k,dilated(act(x)))), width preserved."""

    def __init__(self, channels: int, dilation: int, kernel_size: int, activation: str,
                 causal: bool, weight_norm: bool):
        super().__init__()
        act = ACTIVATIONS.get(activation)
        self.branch = nn.Sequential(
            act(channels),
            CodecConv1d(channels, channels, kernel_size, dilation=dilation, causal=causal,
                        weight_norm=weight_norm),
            act(channels),
            CodecConv1d(channels, channels, 1, weight_norm=weight_norm),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.branch(x)


def _residual_units(channels: int, cfg: CodecConfig) -> List[nn.Module]:
    return [ResidualUnit(channels, d, cfg.kernel_size, cfg.activation, cfg.causal,
                         cfg.weight_norm) for d in cfg.dilations]


class Encoder(nn.Module):
    """(B, 1, T) -> (B, latent_dim, T / hop)."""

    def __init__(self, cfg: CodecConfig):
        super().__init__()
        act = ACTIVATIONS.get(cfg.activation)
        width = cfg.channels
        layers: List[nn.Module] = [CodecConv1d(1, width, cfg.kernel_size, causal=cfg.causal,
                                               weight_norm=cfg.weight_norm)]
        for stride in cfg.strides:
            layers += _residual_units(width, cfg)
            layers += [act(width),
                       CodecConv1d(width, 2 * width, 2 * stride, stride=stride,
                                   causal=cfg.causal, weight_norm=cfg.weight_norm)]
            width *= 2
        layers += [act(width),
                   CodecConv1d(width, cfg.resolved_latent_dim, 3, causal=cfg.causal,
                               weight_norm=cfg.weight_norm)]
        self.layers = nn.Sequential(*layers)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        return self.layers(wav)


DECODERS: Registry = Registry("codec decoder")


@DECODERS.register("conv")
class Decoder(nn.Module):
    """(B, latent_dim, frames) -> (B, 1, frames * decoder_hop)."""

    @staticmethod
    def check_config(cfg: CodecConfig) -> None:
        strides = cfg.resolved_decoder_strides
        if any(s < 1 for s in strides):
            raise ConfigError(f"model.decoder_strides: integers >= 1, got {strides}")
        if math.prod(strides) != cfg.decoder_hop:
            hint = _factorisation_hint(cfg.decoder_hop)
            given = ("the encoder strides reversed" if not cfg.decoder_strides
                     else f"{cfg.decoder_strides}")
            raise ConfigError(
                f"model.decoder_strides: {given} upsample by {math.prod(strides)}, but a code "
                f"frame is {cfg.decoder_hop} samples at sample_rate={cfg.sample_rate} (encoder "
                f"hop {cfg.hop} at {cfg.resolved_encoder_sample_rate} Hz): give strides whose "
                f"product is {cfg.decoder_hop}, e.g. {hint}")
        rest = cfg.resolved_decoder_channels // 2 ** len(strides)
        if rest < 1:
            raise ConfigError(f"model.decoder_channels: {cfg.resolved_decoder_channels} cannot "
                              f"be halved {len(strides)} times")

    def __init__(self, cfg: CodecConfig):
        super().__init__()
        act = ACTIVATIONS.get(cfg.activation)
        width = cfg.resolved_decoder_channels
        layers: List[nn.Module] = [CodecConv1d(cfg.resolved_latent_dim, width, cfg.kernel_size,
                                               causal=cfg.causal, weight_norm=cfg.weight_norm)]
        for stride in cfg.resolved_decoder_strides:
            layers += [act(width),
                       CodecConvTranspose1d(width, width // 2, stride, causal=cfg.causal,
                                            weight_norm=cfg.weight_norm)]
            width //= 2
            layers += _residual_units(width, cfg)
        layers += [act(width),
                   CodecConv1d(width, 1, cfg.kernel_size, causal=cfg.causal,
                               weight_norm=cfg.weight_norm)]
        if cfg.output_tanh:
            layers.append(nn.Tanh())
        self.layers = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.layers(z)


class InverseSTFT(nn.Module):
    """Complex spectra (B, n_fft // 2 + 1, frames) -> waveform (B, 1, frames * hop): periodic
    Hann window, overlap-add divided by the summed squared window, and "same" framing (frame
    t is centred on output samples [t * hop, (t + 1) * hop)); `causal`: frame t starts at
    output sample t * hop, so no output sample waits for a later frame (the decoder then
    renders the input n_fft - hop samples late: IstftDecoder.delay_samples).

    The inverse real FFT is torch.fft.irfft by default; `use_fft = False` computes it as a
    matmul with a fixed (windowed) cosine/sine basis instead, which ONNX and TorchScript
    graphs can hold (same result to float rounding). Overlap-add is n_fft / hop shifted
    sums of reshaped frames: no col2im, and O(n_fft) per frame."""

    def __init__(self, n_fft: int, hop: int, causal: bool = False):
        super().__init__()
        if n_fft % hop or n_fft < 2 * hop:
            raise ValueError(f"n_fft {n_fft} must be a multiple of hop {hop}, at least 2x")
        self.n_fft, self.hop, self.overlap = n_fft, hop, n_fft // hop
        self.causal = causal
        self.trim_left = (n_fft - hop) // 2
        self.trim_right = n_fft - hop - self.trim_left
        self.use_fft = True
        window = torch.hann_window(n_fft, periodic=True, dtype=torch.float64)
        bins = torch.arange(n_fft // 2 + 1, dtype=torch.float64)
        angle = 2 * math.pi * bins[:, None] * torch.arange(n_fft, dtype=torch.float64) / n_fft
        # irfft weights: DC and Nyquist once, every other bin twice (its conjugate twin).
        weight = torch.full_like(bins, 2.0)
        weight[0] = weight[-1] = 1.0
        weight = weight[:, None] / n_fft
        basis = torch.cat([weight * torch.cos(angle), -weight * torch.sin(angle)]) * window
        self.register_buffer("window", window.float(), persistent=False)
        self.register_buffer("window_sq", (window ** 2).float(), persistent=False)
        self.register_buffer("basis", basis.float(), persistent=False)   # (2 bins, n_fft)
        # Causal framing divides by the envelope's steady state (one hop, periodic), so the
        # first blocks, which fewer frames reach, fade in instead of dividing by ~0.
        steady = (window ** 2).reshape(self.overlap, hop).sum(0)
        self.register_buffer("steady_envelope", steady.float(), persistent=False)

    def _overlap_add(self, frames: torch.Tensor) -> torch.Tensor:
        """(B, n_fft, T) -> (B, (T + overlap - 1) * hop): frame t added at t * hop."""
        hop, r = self.hop, self.overlap
        parts = frames.reshape(frames.shape[0], r, hop, -1)
        out = F.pad(parts[:, 0].transpose(1, 2).reshape(frames.shape[0], -1), [0, (r - 1) * hop])
        for j in range(1, r):
            part = parts[:, j].transpose(1, 2).reshape(frames.shape[0], -1)
            out = out + F.pad(part, [j * hop, (r - 1 - j) * hop])
        return out

    def forward(self, real: torch.Tensor, imag: torch.Tensor) -> torch.Tensor:
        if self.use_fft:
            frames = torch.fft.irfft(torch.complex(real, imag), n=self.n_fft, dim=1)
            frames = frames * self.window[None, :, None]
        else:
            frames = torch.matmul(self.basis.t(), torch.cat([real, imag], dim=1))
        audio = self._overlap_add(frames)
        if self.causal:
            # Frame t spans output samples [t * hop, t * hop + n_fft): block t is complete
            # once frame t is known, and the blocks past the last frame are dropped.
            blocks = audio[:, :frames.shape[-1] * self.hop]
            blocks = blocks.reshape(blocks.shape[0], -1, self.hop) / self.steady_envelope
            return blocks.reshape(blocks.shape[0], 1, -1)
        envelope = self._overlap_add(torch.zeros_like(frames[:1]) + self.window_sq[None, :, None])
        # Trimmed before the division: the untrimmed ends hold zeros of the window envelope
        # (0 / 0 there would put NaN into the gradient). trim_right >= 1 (n_fft >= 2 hop): a
        # negative end keeps traced graphs length-free.
        audio = audio[:, self.trim_left:-self.trim_right]
        envelope = envelope[:, self.trim_left:-self.trim_right]
        return (audio / envelope)[:, None]


class ConvNeXtBlock(nn.Module):
    """x + gamma * pointwise_mlp(layer_norm(depthwise_conv(x))) over (B, dim, frames); with
    `causal` the depthwise conv reads the current and past frames only."""

    def __init__(self, dim: int, hidden: int, kernel_size: int, layer_scale: float,
                 causal: bool = False):
        super().__init__()
        self.left_pad = kernel_size - 1 if causal else 0
        self.depthwise = nn.Conv1d(dim, dim, kernel_size, groups=dim,
                                   padding=0 if causal else kernel_size // 2)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.expand = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.project = nn.Linear(hidden, dim)
        self.gamma = nn.Parameter(torch.full((dim,), float(layer_scale)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.depthwise(F.pad(x, [self.left_pad, 0]) if self.left_pad else x)
        y = self.norm(y.transpose(1, 2))
        y = self.project(self.act(self.expand(y))) * self.gamma
        return x + y.transpose(1, 2)


@DECODERS.register("istft")
class IstftDecoder(nn.Module):
    """(B, latent_dim, frames) -> (B, 1, frames * decoder_hop): Vocos. A conv embedding and
    ConvNeXt blocks at the code frame rate, a linear head giving each frame's log magnitude
    and phase for n_fft // 2 + 1 bins, an inverse STFT with hop decoder_hop. Not causal, a
    frame's window reaching (n_fft - hop) / 2 samples into its neighbours; or `causal`: its
    convs read past frames only and frame t (codes up to t) renders the input's last n_fft
    samples at output samples [t * hop, t * hop + n_fft), so the output is the input
    delayed by `delay_samples` = n_fft - hop and streams with the prefix property."""

    @staticmethod
    def check_config(cfg: CodecConfig) -> None:
        if cfg.decoder_strides:
            raise ConfigError("model.decoder_strides: strides belong to the conv decoder; the "
                              "istft decoder's hop is the code frame (decoder_hop)")
        hop, n_fft = cfg.decoder_hop, cfg.resolved_istft_n_fft
        if n_fft % hop or n_fft < 2 * hop:
            raise ConfigError(f"model.istft_n_fft: {n_fft} must be a multiple of the code "
                              f"frame's {hop} output samples, at least 2 x {hop}")
        for key in ("istft_dim", "istft_layers"):
            if getattr(cfg, key) < 1:
                raise ConfigError(f"model.{key}: must be >= 1, got {getattr(cfg, key)}")
        if cfg.istft_kernel_size < 1 or cfg.istft_kernel_size % 2 == 0:
            raise ConfigError(f"model.istft_kernel_size: an odd size >= 1, got "
                              f"{cfg.istft_kernel_size}")

    def __init__(self, cfg: CodecConfig):
        super().__init__()
        dim, kernel = cfg.istft_dim, cfg.istft_kernel_size
        n_fft, causal = cfg.resolved_istft_n_fft, cfg.causal
        self.embed_pad = kernel - 1 if causal else 0
        self.embed = nn.Conv1d(cfg.resolved_latent_dim, dim, kernel,
                               padding=0 if causal else kernel // 2)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        # Vocos' layer scale 1 / layers: each block starts as a small change of the identity.
        self.blocks = nn.ModuleList(ConvNeXtBlock(dim, 3 * dim, kernel, 1.0 / cfg.istft_layers,
                                                  causal) for _ in range(cfg.istft_layers))
        self.final_norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, n_fft + 2)
        self.istft = InverseSTFT(n_fft, cfg.decoder_hop, causal)
        self.delay_samples = n_fft - cfg.decoder_hop if causal else 0
        # Frames of codes a causal output block depends on before its own: the convs'
        # reach, plus the earlier frames whose windows overlap it.
        self.history_frames = (kernel - 1) * (1 + cfg.istft_layers) + n_fft // cfg.decoder_hop - 1
        self.output_tanh = cfg.output_tanh
        for module in self.modules():
            if isinstance(module, (nn.Conv1d, nn.Linear)):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    # exp(log magnitude) is capped at 100 (Vocos): a linear magnitude beyond it is never speech.
    MAX_LOG_MAGNITUDE = math.log(100.0)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        z = F.pad(z, [self.embed_pad, 0]) if self.embed_pad else z
        x = self.norm(self.embed(z).transpose(1, 2)).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        x = self.head(self.final_norm(x.transpose(1, 2))).transpose(1, 2)
        # fp32 island: exp, phase and the inverse FFT lose too much in bf16.
        with torch.autocast(device_type=x.device.type, enabled=False):
            log_mag, phase = x.float().chunk(2, dim=1)
            mag = torch.exp(log_mag.clamp(max=self.MAX_LOG_MAGNITUDE))
            audio = self.istft(mag * torch.cos(phase), mag * torch.sin(phase))
            return torch.tanh(audio) if self.output_tanh else audio


def history_length(module: nn.Module, scale: float = 1.0) -> float:
    """Upper bound on how far back (in units of `module`'s input samples) a causal stack's
    output depends on its input, summed over its convs in registration order. Valid for the
    chains built here, where registration order is execution order and residual branches sit
    in parallel with an identity (their history adds like a chain's)."""
    total = 0.0
    for sub in module.modules():
        if isinstance(sub, CodecConv1d):
            total += (sub.kernel_size - 1) * sub.dilation * scale
            scale *= sub.stride
        elif isinstance(sub, CodecConvTranspose1d):
            # Output n reads inputs floor(n/s) - 1 and floor(n/s): at most 2 input samples back.
            total += 2 * scale
            scale /= sub.stride
    return total


def decoder_context_frames(model: "CodecModel") -> int:
    """Frames of codes a causal decoder re-reads before new ones so that chunked decoding
    equals decoding all at once: its history (conv decoders: history_length) plus one."""
    history = getattr(model.decoder, "history_frames", None)
    if history is None:
        history = history_length(model.decoder)
    return int(math.ceil(history)) + 1


# --------------------------------------------------------------------------- model

class CodecModel(nn.Module):
    """Encoder -> residual VQ -> decoder."""

    def __init__(self, config: Optional[CodecConfig] = None):
        super().__init__()
        self.config = (config or CodecConfig()).validate()
        cfg = self.config
        self.hop = cfg.hop                     # encoder input samples per code frame
        self.decoder_hop = cfg.decoder_hop     # output samples per code frame
        self.encoder = Encoder(cfg)
        self.quantizer = ResidualVectorQuantizer(
            cfg.resolved_latent_dim, cfg.n_codebooks, cfg.codebook_size, cfg.codebook_dim,
            cfg.quantizer_dropout, cfg.ema_decay, cfg.dead_code_threshold)
        self.decoder = DECODERS.get(cfg.decoder)(cfg)
        # Output samples by which the decoder's stream lags its input (a causal istft
        # decoder's framing; 0 otherwise), a whole number of code frames.
        self.delay_samples = int(getattr(self.decoder, "delay_samples", 0))
        self.delay_frames = self.delay_samples // self.decoder_hop

    @property
    def frames_per_second(self) -> float:
        return self.config.frames_per_second

    @property
    def encoder_sample_rate(self) -> int:
        return self.config.resolved_encoder_sample_rate

    def bitrate(self, sample_rate: Optional[int] = None, n_q: Optional[int] = None) -> float:
        """Bits per second: frames_per_s * n_q * log2(codebook_size), the frame rate that of
        the encoder (or of `sample_rate` encoder input)."""
        rate = self.encoder_sample_rate if sample_rate is None else sample_rate
        return self.quantizer.bitrate(rate / self.hop, n_q)

    def output_length(self, input_length: int) -> int:
        """Output samples (at sample_rate) for `input_length` encoder input samples."""
        return -(-input_length * self.decoder_hop // self.hop)

    def _prepare(self, wav: torch.Tensor) -> torch.Tensor:
        """(B, T) or (B, 1, T) -> (B, 1, T') with T' the next multiple of the hop."""
        if wav.dim() == 2:
            wav = wav.unsqueeze(1)
        if wav.dim() != 3 or wav.shape[1] != 1:
            raise ValueError(f"expected (B, 1, T) or (B, T) audio, got {tuple(wav.shape)}")
        extra = (-wav.shape[-1]) % self.hop
        return nn.functional.pad(wav, (0, extra)) if extra else wav

    def forward(self, wav: torch.Tensor, n_q: Optional[int] = None,
                first_stage: bool = False) -> Dict[str, torch.Tensor]:
        """wav (B, 1, T) at the encoder's rate -> {audio (B, 1, output_length(T)) at
        sample_rate, codes (B, n_q, frames), commit_loss, codebook_loss, latent (the encoder
        output, B x latent_dim x frames)}, and with `first_stage` the first VQ stage's output
        (same shape as latent). In training mode with n_q=None, quantizer dropout applies."""
        length = wav.shape[-1]
        wav = self._prepare(wav)
        if self.delay_frames:
            # Frames of silence after the input flush a delayed decoder (as a stream's end
            # does), so that the output covers all of the input, aligned with it.
            wav = nn.functional.pad(wav, (0, self.delay_frames * self.hop))
        z = self.encoder(wav)
        out = {"latent": z}
        if first_stage:
            z_q, codes, commit, codebook, out["first_stage"] = \
                self.quantizer.quantize_with_first_stage(z, n_q)
        else:
            z_q, codes, commit, codebook = self.quantizer.quantize(z, n_q)
        audio = self.decoder(z_q)[..., self.delay_samples:
                                  self.delay_samples + self.output_length(length)]
        out.update(audio=audio, codes=codes, commit_loss=commit, codebook_loss=codebook)
        return out

    @torch.no_grad()
    def encode(self, wav: torch.Tensor, n_q: Optional[int] = None) -> torch.Tensor:
        """wav (B, 1, T) at the encoder's rate -> codes (B, n_q, ceil(T / hop)), n_q
        defaulting to all codebooks. Inference only (no gradients); call in eval mode, or
        EMA codebooks keep updating."""
        z = self.encoder(self._prepare(wav))
        _, codes, _, _ = self.quantizer.quantize(z, n_q or self.config.n_codebooks)
        return codes

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, length: Optional[int] = None) -> torch.Tensor:
        """codes (B, n_q, frames) -> wav (B, 1, frames * decoder_hop) at sample_rate, trimmed
        to `length` if given: the decoder's stream, `delay_samples` behind the audio the
        codes came from (ExportedCodec.encode / decode flush and drop that). Inference only
        (no gradients)."""
        audio = self.decoder(self.quantizer.decode_codes(codes))
        return audio if length is None else audio[..., :length]


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
