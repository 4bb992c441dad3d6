"""Neural codec building blocks: spectral front end, generator, RVQ, discriminators, losses,
metrics and signal-processing baselines. Sizes are kept tiny so the file runs in well under a
minute on one core."""
import math
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from toolkit.config import ConfigError
from toolkit.nn.spectral import (empty_mel_filters, hz_to_mel, log_mel_spectrogram,
                                 mel_band_edges, mel_filterbank, mel_to_hz, reflect_pad, stft,
                                 stft_magnitude)
from toolkit.tasks.codec.baselines import mulaw_codec, mulaw_decode, mulaw_encode, melgl_codec
from toolkit.tasks.codec.discriminators import (MultiPeriodDiscriminator,
                                                MultiPeriodDiscriminatorConfig,
                                                MultiResolutionSTFTDiscriminator,
                                                MultiResolutionSTFTDiscriminatorConfig)
from toolkit.tasks.codec.losses import (CompressedComplexSTFTLoss, MultiResolutionMelLoss,
                                        MultiResolutionSTFTLoss,
                                        discriminator_loss, feature_matching_loss,
                                        fitting_mel_count, generator_adversarial_loss)
from toolkit.tasks.codec.metrics import evaluate_pair, mel_distance, si_sdr, stoi
from toolkit.tasks.codec.model import CodecConfig, CodecModel, InverseSTFT, remove_weight_norm
from toolkit.tasks.codec.quantizer import ResidualVectorQuantizer, VectorQuantizer
from toolkit.tasks.codec.streaming import StreamingDecoder, decode_streaming, encode_streaming

SR = 16000


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    np.random.seed(0)


def tiny_config(**overrides) -> CodecConfig:
    base = dict(channels=8, strides=[2, 4, 5, 8], n_codebooks=8, codebook_size=64)
    base.update(overrides)
    return CodecConfig(**base)


def tones(seconds=1.0, freqs=(440.0, 1250.0), sr=SR) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    return (sum(0.3 * np.sin(2 * np.pi * f * t) for f in freqs) / len(freqs)).astype(np.float32)


# --------------------------------------------------------------------------- spectral

def test_slaney_mel_scale_constants():
    # Linear at 200/3 Hz per mel below 1 kHz, 27 mels per factor 6.4 above.
    assert hz_to_mel(1000.0) == pytest.approx(15.0)
    assert hz_to_mel(500.0) == pytest.approx(7.5)
    assert hz_to_mel(6400.0) == pytest.approx(42.0)
    assert mel_to_hz(hz_to_mel(3210.0)) == pytest.approx(3210.0)


def test_mel_filterbank_matches_hand_computed_triangle():
    # One filter over 0..8 kHz on 1 kHz bins: edges 0 Hz, centre mel_to_hz(mel(8k)/2), 8 kHz.
    top_mel = 15.0 + 27.0 * math.log(8.0) / math.log(6.4)
    centre = 1000.0 * math.exp(math.log(6.4) / 27.0 * (top_mel / 2 - 15.0))
    assert centre == pytest.approx(1689.0, abs=1.0)
    bank = mel_filterbank(1, 16, SR, norm=None)[0].double()
    expected = [0.0, 1000 / centre] + [(8000 - f) / (8000 - centre) for f in range(2000, 9000, 1000)]
    assert torch.allclose(bank, torch.tensor(expected, dtype=torch.float64), atol=1e-6)
    slaney = mel_filterbank(1, 16, SR)[0].double()
    assert torch.allclose(slaney, bank * 2.0 / 8000.0, atol=1e-9)


def test_mel_filterbank_shape_peaks_and_unit_area():
    n_mels, n_fft = 40, 4096
    bank = mel_filterbank(n_mels, n_fft, SR)
    assert bank.shape == (n_mels, n_fft // 2 + 1) and bank.dtype == torch.float32
    bin_hz = SR / n_fft
    centres = mel_band_edges(n_mels, SR)[1:-1]
    peaks = bank.argmax(dim=1).numpy()
    assert np.all(np.abs(peaks - centres / bin_hz) <= 1.0)  # each triangle peaks at its centre bin
    assert np.all(np.diff(peaks) > 0)
    # Slaney normalisation: unit area in Hz.
    assert np.allclose(bank.sum(dim=1).numpy() * bin_hz, 1.0, atol=0.02)
    assert empty_mel_filters(40, 32, SR) > 0 and empty_mel_filters(10, 32, SR) == 0


def test_stft_and_log_mel_shapes_and_fp32_under_autocast():
    x = torch.randn(2, 1, 4000)
    mag = stft_magnitude(x, 512, 128)
    assert mag.shape == (2, 257, 4000 // 128 + 1)
    assert torch.equal(stft_magnitude(x[:, 0], 512, 128), mag)
    reference = log_mel_spectrogram(x, SR, 512, 128, n_mels=40)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = log_mel_spectrogram(x.bfloat16(), SR, 512, 128, n_mels=40)
    assert under.dtype == torch.float32 and under.shape == (2, 40, 32)
    # The bf16 input is the only rounding: computing on its fp32 copy matches exactly.
    assert torch.allclose(under, log_mel_spectrogram(x.bfloat16().float(), SR, 512, 128,
                                                     n_mels=40), atol=1e-6)
    assert (under - reference).abs().max() < 0.1


# --------------------------------------------------------------------------- generator

def test_generator_round_trip_shapes_and_codes():
    model = CodecModel(tiny_config())
    wav = 0.1 * torch.randn(2, 1, SR)
    out = model(wav)
    assert out["audio"].shape == (2, 1, SR)
    assert out["codes"].shape == (2, 8, SR // 320) and out["codes"].dtype == torch.int64
    assert int(out["codes"].min()) >= 0 and int(out["codes"].max()) < 64
    assert out["audio"].abs().max() <= 1.0                      # tanh output
    for key in ("commit_loss", "codebook_loss"):
        assert out[key].dim() == 0 and torch.isfinite(out[key]) and out[key] > 0
    model.eval()
    codes = model.encode(wav, n_q=3)
    assert codes.shape == (2, 3, 50)
    assert model.decode(codes).shape == (2, 1, SR)
    # A length that is not a multiple of the hop is padded internally and trimmed back.
    odd = wav[..., :SR - 123]
    assert model(odd)["audio"].shape == (2, 1, SR - 123)
    assert model.encode(odd).shape[-1] == math.ceil((SR - 123) / 320)


def test_bitrate_of_default_config():
    config = CodecConfig()
    assert config.hop == 320
    model = CodecModel(tiny_config(codebook_size=1024))
    assert model.frames_per_second == 50.0
    assert model.bitrate() == pytest.approx(50 * 8 * 10)        # 4 kbit/s
    assert model.bitrate(n_q=1) == pytest.approx(500.0)
    assert model.bitrate(sample_rate=24000) == pytest.approx(75 * 8 * 10)


def test_config_validation_names_the_key():
    with pytest.raises(ConfigError, match="model.activation"):
        CodecModel(tiny_config(activation="relu6"))
    with pytest.raises(ConfigError, match="model.quantizer_dropout"):
        CodecModel(tiny_config(quantizer_dropout=1.5))


def test_straight_through_gradient_reaches_encoder():
    model = CodecModel(tiny_config(channels=4))
    out = model(0.1 * torch.randn(1, 1, 3200), n_q=2)
    out["audio"].pow(2).mean().backward()                       # no commitment term
    grads = [p.grad for p in model.encoder.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert all(g.abs().sum() > 0 for g in grads)


def test_straight_through_equals_gradient_of_the_projections():
    stage = VectorQuantizer(6, codebook_size=16, codebook_dim=3)
    z = torch.randn(2, 6, 10, requires_grad=True)
    weights = torch.randn(2, 6, 10)
    (stage(z)[0] * weights).sum().backward()
    z_ref = z.detach().clone().requires_grad_(True)
    (stage.out_proj(stage.in_proj(z_ref)) * weights).sum().backward()
    assert torch.allclose(z.grad, z_ref.grad, atol=1e-6)


def test_elu_and_plain_convs_and_remove_weight_norm():
    model = CodecModel(tiny_config(channels=4, activation="elu")).eval()
    wav = 0.1 * torch.randn(1, 1, 3200)
    before = model(wav, n_q=4)["audio"]
    remove_weight_norm(model)
    assert not any("parametrizations" in name for name, _ in model.named_parameters())
    assert torch.allclose(model(wav, n_q=4)["audio"], before, atol=1e-6)


def test_causal_prefix_property_and_streaming():
    model = CodecModel(tiny_config(channels=4, causal=True, n_codebooks=2)).eval()
    wav = 0.1 * torch.randn(1, 1, SR)
    codes = model.encode(wav)
    full = model.decode(codes)
    prefix = model.decode(codes[..., :20])
    assert (full[..., :20 * 320] - prefix).abs().max() < 1e-5
    # Changing the second half of the audio leaves the codes of the first half alone.
    changed = wav.clone()
    changed[..., SR // 2:] += 0.5
    assert torch.equal(model.encode(changed)[..., :25], codes[..., :25])
    assert torch.equal(encode_streaming(model, wav, chunk_samples=1234), codes)
    assert (decode_streaming(model, codes, chunk_frames=7) - full).abs().max() < 1e-5
    # The left context is what makes chunks exact: far too little of it breaks equality.
    short = StreamingDecoder(model)
    short.context = 2
    chunks = torch.cat([short.push(codes[..., i:i + 7]) for i in range(0, 50, 7)], dim=-1)
    assert (chunks - full).abs().max() > 1e-3


def test_non_causal_model_has_no_prefix_property_and_refuses_streaming():
    model = CodecModel(tiny_config(channels=4, n_codebooks=2)).eval()
    codes = model.encode(0.1 * torch.randn(1, 1, SR))
    assert (model.decode(codes)[..., :20 * 320] - model.decode(codes[..., :20])).abs().max() > 1e-4
    with pytest.raises(ValueError, match="causal"):
        decode_streaming(model, codes, 5)


# --------------------------------------------------------------------------- rates, decoders

@pytest.mark.parametrize("rate, strides", [(24000, [5, 4, 3, 8]), (44100, [7, 7, 6, 3])])
@pytest.mark.parametrize("decoder", ["conv", "istft"])
def test_encoder_and_output_rates_differ(rate, strides, decoder):
    """16 kHz in, `rate` out: the same 50 frames/s and bitrate, decoder_hop output samples
    per frame, output length the input's duration at the output rate."""
    extra = {"decoder_strides": strides} if decoder == "conv" else {
        "istft_dim": 32, "istft_layers": 2}
    model = CodecModel(tiny_config(channels=4, n_codebooks=2, sample_rate=rate,
                                   encoder_sample_rate=SR, decoder=decoder, **extra))
    hop_out = 320 * rate // SR
    assert (model.hop, model.decoder_hop, model.frames_per_second) == (320, hop_out, 50.0)
    assert model.bitrate() == pytest.approx(50 * 2 * 6)
    wav = 0.1 * torch.randn(2, 1, 20 * 320)
    out = model(wav, first_stage=True)
    assert out["audio"].shape == (2, 1, 20 * hop_out)
    assert out["codes"].shape == (2, 2, 20)
    assert out["latent"].shape == out["first_stage"].shape == (2, 4 * 2 ** 4, 20)
    model.eval()
    assert model.decode(model.encode(wav)).shape == (2, 1, 20 * hop_out)
    # A length that is not a whole frame: padded to frames, trimmed to its duration.
    assert model(wav[..., :20 * 320 - 123])["audio"].shape[-1] == \
        math.ceil((20 * 320 - 123) * rate / SR)


def test_rate_and_decoder_config_errors_name_the_key():
    def refused(key, **overrides):
        with pytest.raises(ConfigError, match=key):
            CodecModel(tiny_config(channels=4, **overrides))
    # 16 -> 24 kHz needs decoder strides multiplying to 480, not the encoder's 320.
    refused(r"model.decoder_strides.*480", sample_rate=24000, encoder_sample_rate=SR)
    refused(r"model.decoder_strides", decoder_strides=[4, 4, 4, 4])
    refused(r"model.strides", sample_rate=22050, encoder_sample_rate=SR, strides=[2, 2])
    refused(r"model.decoder:? ", decoder="wavenet")
    refused(r"model.istft_n_fft", decoder="istft", istft_n_fft=400)
    refused(r"model.istft_kernel_size", decoder="istft", istft_kernel_size=4)
    refused(r"model.decoder_strides", decoder="istft", decoder_strides=[8, 5, 4, 2])


def test_inverse_stft_reconstructs_and_its_matmul_form_matches_the_fft():
    """An STFT in the decoder's framing (frame t centred on samples [t hop, (t+1) hop))
    comes back exactly; the fixed-basis matmul (the exported form) equals irfft."""
    n_fft, hop, frames = 128, 32, 25
    istft = InverseSTFT(n_fft, hop)
    x = torch.randn(3, frames * hop, dtype=torch.float32)
    padded = torch.nn.functional.pad(x, (istft.trim_left, istft.trim_right + n_fft))
    windows = padded.unfold(-1, n_fft, hop)[:, :frames] * istft.window
    spec = torch.fft.rfft(windows, dim=-1).transpose(1, 2)
    y = istft(spec.real, spec.imag)
    assert y.shape == (3, 1, frames * hop)
    assert (y[:, 0] - x).abs().max() < 1e-5
    istft.use_fft = False
    assert (istft(spec.real, spec.imag) - y).abs().max() < 1e-5


def test_causal_inverse_stft_renders_its_frames_one_window_late():
    """Causal framing: frame t holds the input's n_fft samples ending at (t + 1) * hop and
    lands at output samples [t * hop, t * hop + n_fft), so once the first window has filled
    the output is the input n_fft - hop samples late, exactly; and no output block needs a
    later frame (the first k frames give the first k blocks)."""
    n_fft, hop, frames = 128, 32, 25
    istft = InverseSTFT(n_fft, hop, causal=True)
    x = torch.randn(2, frames * hop, dtype=torch.float32)
    padded = torch.nn.functional.pad(x, (n_fft - hop, 0))
    windows = padded.unfold(-1, n_fft, hop)[:, :frames] * istft.window
    spec = torch.fft.rfft(windows, dim=-1).transpose(1, 2)
    y = istft(spec.real, spec.imag)
    delay = n_fft - hop
    assert y.shape == (2, 1, frames * hop)
    assert (y[:, 0, delay:] - x[:, :-delay]).abs().max() < 1e-5
    first = istft(spec.real[..., :10], spec.imag[..., :10])
    assert torch.equal(first, y[..., :10 * hop])
    istft.use_fft = False
    assert (istft(spec.real, spec.imag) - y).abs().max() < 1e-5


def test_causal_istft_decoder_streams_and_its_forward_is_aligned():
    """A causal istft codec: prefix property, chunked decoding equal to whole, and forward
    (training) output equal to the decoded stream with its lag dropped, input aligned."""
    model = CodecModel(tiny_config(channels=4, causal=True, n_codebooks=2, decoder="istft",
                                   istft_dim=16, istft_layers=2, istft_n_fft=640)).eval()
    assert (model.delay_samples, model.delay_frames) == (320, 1)
    wav = 0.1 * torch.randn(1, 1, SR)
    codes = model.encode(wav)
    full = model.decode(codes)
    assert (model.decode(codes[..., :20]) - full[..., :20 * 320]).abs().max() < 1e-6
    for chunk in (1, 7):
        assert (decode_streaming(model, codes, chunk_frames=chunk) - full).abs().max() < 1e-5
    short = StreamingDecoder(model)
    short.context = 2
    chunks = torch.cat([short.push(codes[..., i:i + 7]) for i in range(0, 50, 7)], dim=-1)
    assert (chunks - full).abs().max() > 1e-3
    out = model(wav)["audio"]
    assert out.shape == wav.shape
    flushed = model.decode(model.encode(torch.nn.functional.pad(wav, (0, 320))))
    assert (out - flushed[..., 320:320 + SR]).abs().max() < 1e-5
    # A conv decoder has no lag.
    assert CodecModel(tiny_config(channels=4, causal=True)).delay_samples == 0


# --------------------------------------------------------------------------- quantizer

def test_quantizer_fp32_island_under_bf16_autocast():
    rvq = ResidualVectorQuantizer(16, n_codebooks=4, codebook_size=32).eval()
    z = torch.randn(2, 16, 20)
    ref_q, ref_codes, ref_commit, _ = rvq.quantize(z)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z_q, codes, commit, codebook = rvq.quantize(z)
        decoded = rvq.decode_codes(codes)
    assert z_q.dtype == commit.dtype == codebook.dtype == decoded.dtype == torch.float32
    assert torch.equal(codes, ref_codes)
    assert torch.allclose(z_q, ref_q, atol=1e-6) and torch.allclose(commit, ref_commit)
    assert torch.allclose(decoded, ref_q, atol=1e-5)


def _fit_rvq(rvq, z, steps=100):
    optimiser = torch.optim.Adam(rvq.parameters(), lr=1e-2)
    rvq.train()
    for _ in range(steps):
        z_q, _, commit, codebook = rvq.quantize(z)
        loss = (z_q - z).pow(2).mean() + 0.25 * commit + codebook
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    rvq.eval()


@pytest.mark.parametrize("ema_decay", [0.0, 0.9])
def test_more_codebooks_quantise_a_fixed_latent_better(ema_decay):
    # Residual stages only help once trained (random projections add noise), so fit first;
    # quantizer dropout trains every prefix of stages.
    z = torch.randn(4, 16, 64)
    rvq = ResidualVectorQuantizer(16, n_codebooks=8, codebook_size=32, codebook_dim=4,
                                  ema_decay=ema_decay)
    _fit_rvq(rvq, z)
    with torch.no_grad():
        errors = [float((rvq.quantize(z, n)[0] - z).pow(2).mean()) for n in (1, 2, 4, 8)]
        z_q, codes, commit, codebook = rvq.quantize(z)
    assert all(a > b for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 0.5 * errors[0]
    assert torch.isfinite(commit) and torch.isfinite(codebook)
    assert torch.allclose(rvq.decode_codes(codes), z_q, atol=1e-5)


def test_codebook_and_commitment_losses_are_separate():
    rvq = ResidualVectorQuantizer(8, n_codebooks=2, codebook_size=16, codebook_dim=4)
    z = torch.randn(2, 8, 12)
    _, _, commit, codebook = rvq.quantize(z, n_q=2)
    assert torch.allclose(commit, codebook)                   # same value, different gradients
    codebook.backward()
    assert rvq.stages[0].codebook.grad.abs().sum() > 0
    assert rvq.stages[0].in_proj.weight.grad is None          # the codebook loss spares the encoder side
    rvq.zero_grad(set_to_none=True)
    _, _, commit, _ = rvq.quantize(z, n_q=2)
    commit.backward()
    assert rvq.stages[0].codebook.grad is None
    assert rvq.stages[0].in_proj.weight.grad.abs().sum() > 0


def test_quantizer_dropout_uses_prefixes_of_stages():
    rvq = ResidualVectorQuantizer(8, n_codebooks=8, codebook_size=16, codebook_dim=4,
                                  quantizer_dropout=1.0).train()
    z = torch.randn(16, 8, 5)
    with torch.no_grad():
        z_q, codes, _, _ = rvq.quantize(z)
        assert codes.shape == (16, 8, 5)
        used = []
        for item in range(16):
            matches = [k for k in range(1, 9) if torch.allclose(
                rvq.decode_codes(codes[item:item + 1, :k]), z_q[item:item + 1], atol=1e-5)]
            assert matches, f"item {item} is no prefix sum of stages"
            used.append(matches[0])
        assert min(used) < 8 and len(set(used)) > 2
        # Eval mode and an explicit n_q never drop stages.
        rvq.eval()
        assert torch.allclose(rvq.quantize(z)[0], rvq.decode_codes(rvq.quantize(z)[1]), atol=1e-5)


def test_ema_codebooks_update_without_gradients_and_reseed_dead_entries():
    stage = VectorQuantizer(4, codebook_size=16, codebook_dim=4, ema_decay=0.9)
    assert "codebook" not in dict(stage.named_parameters())    # a buffer, not trained by loss
    with torch.no_grad():                                        # identity projection: lookup sees z
        stage.in_proj.weight.copy_(torch.eye(4)[:, :, None])
        stage.in_proj.bias.zero_()
    z = torch.rand(4, 4, 32) + 0.1                               # all in the positive orthant
    flat = z.transpose(1, 2).reshape(-1, 4)
    stage.train()
    with torch.no_grad():
        random_start = stage.codebook.clone()
        stage(z)                                                 # first batch initialises from data
        assert bool(stage.initialised) and not torch.equal(stage.codebook, random_start)
        assert float(stage.codebook.min()) > 0                   # now inside the data's orthant
        # Entry 0 made unreachable (cosine -1 to every vector) and unused: dead.
        stage.codebook[0] = -1.0
        stage.embed_sum[0] = 0.0
        stage.cluster_size[0] = 0.0
        before = stage.codebook.clone()
        _, codes, _, codebook_loss = stage(z)
    assert int((codes == 0).sum()) == 0
    assert not torch.equal(stage.codebook[1:], before[1:])      # moved towards assigned means
    assert float(codebook_loss.abs().sum()) == 0.0
    # The dead entry was re-seeded with one of this batch's vectors.
    assert torch.cdist(stage.codebook[:1], flat).min() < 1e-6
    # Eval mode leaves the codebook alone.
    stage.eval()
    frozen = stage.codebook.clone()
    with torch.no_grad():
        stage(z)
    assert torch.equal(stage.codebook, frozen)


# --------------------------------------------------------------------------- discriminators

def test_multi_period_discriminator_outputs():
    config = MultiPeriodDiscriminatorConfig(channels_scale=1 / 32)
    disc = MultiPeriodDiscriminator(config)
    logits, features = disc(torch.randn(2, 1, 4001))
    assert len(logits) == len(features) == 5
    for period, out, feats in zip([2, 3, 5, 7, 11], logits, features):
        assert out.shape[0] == 2 and out.dim() == 2
        assert len(feats) == 5 and [f.shape[1] for f in feats] == [1, 4, 16, 32, 32]
        assert all(f.shape[-1] == period for f in feats)
        # Time axis: ceil(4001 / p) folded rows, then four stride-3 layers.
        rows = math.ceil(4001 / period)
        for _ in range(4):
            rows = (rows - 1) // 3 + 1
        assert feats[-1].shape[2] == rows and out.shape[1] == rows * period


def test_multi_resolution_stft_discriminator_outputs_and_fp32_stft():
    disc = MultiResolutionSTFTDiscriminator(MultiResolutionSTFTDiscriminatorConfig(filters=4))
    audio = torch.randn(2, 1, 4000)
    logits, features = disc(audio)
    assert len(logits) == len(features) == 3
    for n_fft, out, feats in zip([1024, 512, 256], logits, features):
        frames, bins = 4000 // (n_fft // 4) + 1, n_fft // 2 + 1
        assert feats[0].shape == (2, 4, frames, bins)
        assert len(feats) == 5 and out.shape[0] == 2
        for _ in range(3):                                     # three stride-2 frequency layers
            bins = (bins - 1) // 2 + 1
        assert feats[-1].shape == (2, 4, frames, bins) and out.shape[1] == frames * bins
    with torch.autocast("cpu", dtype=torch.bfloat16):
        spec = disc.discriminators[0].spectrogram(audio.bfloat16())
    assert spec.dtype == torch.float32 and spec.shape[1] == 2


# --------------------------------------------------------------------------- losses

def test_lsgan_losses_at_known_inputs():
    ones, zeros = [torch.ones(2, 7), torch.ones(3, 4)], [torch.zeros(2, 7), torch.zeros(3, 4)]
    assert float(discriminator_loss(ones, zeros)) == 0.0
    assert float(discriminator_loss(ones, ones)) == pytest.approx(1.0)
    assert float(discriminator_loss(zeros, zeros)) == pytest.approx(1.0)
    assert float(generator_adversarial_loss(ones)) == 0.0
    assert float(generator_adversarial_loss(zeros)) == pytest.approx(1.0)
    assert float(generator_adversarial_loss(torch.full((4,), 3.0))) == pytest.approx(4.0)


def test_feature_matching_loss():
    real = [[torch.randn(2, 3, 5), torch.randn(2, 4)], [torch.randn(2, 6)]]
    assert float(feature_matching_loss(real, [[f.clone() for f in d] for d in real])) == 0.0
    constant = [[torch.ones(2, 3)], [torch.full((4,), -2.0)]]
    tripled = [[torch.full((2, 3), 3.0)], [torch.full((4,), -6.0)]]
    # |3 - 1| / 1 = 2 and |-6 + 2| / 2 = 2: mean 2.
    assert float(feature_matching_loss(constant, tripled)) == pytest.approx(2.0)
    fake = [[f.clone().requires_grad_(True) for f in d] for d in real]
    feature_matching_loss(real, [[f * 1.5 for f in d] for d in fake]).backward()
    assert all(f.grad is not None for d in fake for f in d)


def test_multi_resolution_mel_loss():
    loss = MultiResolutionMelLoss(SR)
    assert loss.n_mels == [5, 10, 20, 40, 80, 160, 320]        # all fit at 16 kHz
    assert fitting_mel_count(20, 32, SR) < 20
    assert empty_mel_filters(fitting_mel_count(20, 32, SR), 32, SR) == 0
    x = torch.from_numpy(tones(0.25))[None, None]
    assert float(loss(x, x)) == 0.0
    noisy = x + 0.05 * torch.randn_like(x)
    quiet = x + 0.005 * torch.randn_like(x)
    assert float(loss(noisy, x)) > float(loss(quiet, x)) > 0.0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss(noisy.bfloat16(), x)
    assert value.dtype == torch.float32
    with_mag = MultiResolutionMelLoss(SR, mag_weight=1.0)
    assert float(with_mag(noisy, x)) > float(loss(noisy, x))


def test_compressed_complex_stft_loss_hears_phase_that_magnitudes_miss():
    """Zero on a copy; a polarity flip (every phase off by pi, magnitudes equal) costs
    nothing to the mel loss and the most to this one; gradients stay finite on silence."""
    loss, mel = CompressedComplexSTFTLoss(), MultiResolutionMelLoss(SR)
    t = np.arange(SR // 2) / SR          # a 150 Hz buzz of 39 harmonics over a noise floor
    buzz = 0.1 * sum(np.sin(2 * np.pi * k * 150 * t) / k for k in range(1, 40))
    x = torch.tensor(buzz, dtype=torch.float32)[None, None]
    x = x + 0.003 * torch.randn_like(x)
    assert float(loss(x, x)) == 0.0
    assert float(mel(-x, x)) < 1e-6
    flipped, noisy = float(loss(-x, x)), float(loss(x + 0.003 * torch.randn_like(x), x))
    assert flipped > 5 * noisy > 0
    silent = torch.zeros(1, 1, 4000, requires_grad=True)
    loss(silent, torch.zeros(1, 1, 4000)).backward()
    assert torch.isfinite(silent.grad).all()
    with pytest.raises(ValueError, match="power"):
        CompressedComplexSTFTLoss(power=0.0)


def test_multi_resolution_stft_loss():
    loss = MultiResolutionSTFTLoss()
    x = torch.from_numpy(tones(0.25))[None]
    sc, mag = loss(x, x)
    assert float(sc) == 0.0 and float(mag) == 0.0
    sc, mag = loss(x * 0.5, x)
    # Spectral convergence of a half-scaled copy is 1/2 (up to the sqrt's eps).
    assert float(sc) == pytest.approx(0.5, abs=1e-3) and float(mag) > 0


def test_one_gan_step_under_bf16_autocast():
    generator = CodecModel(tiny_config(channels=4, n_codebooks=2, codebook_size=16))
    mpd = MultiPeriodDiscriminator(MultiPeriodDiscriminatorConfig(channels_scale=1 / 32))
    mstftd = MultiResolutionSTFTDiscriminator(MultiResolutionSTFTDiscriminatorConfig(filters=4))
    mel = MultiResolutionMelLoss(SR)
    real = 0.1 * torch.randn(2, 1, 3200)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = generator(real)
        real_logits, real_feats = [a + b for a, b in zip(mpd(real), mstftd(real))]
        fake_logits, fake_feats = [a + b for a, b in zip(mpd(out["audio"]), mstftd(out["audio"]))]
        disc = discriminator_loss(real_logits, [f.detach() for f in fake_logits])
        gen = (15 * mel(out["audio"], real) + generator_adversarial_loss(fake_logits)
               + 2 * feature_matching_loss(real_feats, fake_feats)
               + 0.25 * out["commit_loss"] + out["codebook_loss"])
    assert len(fake_logits) == 8
    assert gen.dtype == disc.dtype == torch.float32
    assert torch.isfinite(gen) and torch.isfinite(disc)
    gen.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in generator.parameters())


def test_reflect_padding_and_stft_match_torch_bitwise():
    x = torch.randn(3, 1, 101)
    for left, right in [(7, 7), (0, 9), (100, 0), (50, 100)]:
        assert torch.equal(reflect_pad(x, left, right), F.pad(x, (left, right), mode="reflect"))
    with pytest.raises(ValueError, match="needs more than 101 samples"):
        reflect_pad(x, 101, 0)
    window = torch.hann_window(256, periodic=True)
    for length in (1000, 129, 128, 40):           # 128 and below: too short, zero padded
        wave = torch.randn(2, length)
        mode = "reflect" if length > 128 else "constant"
        expected = torch.stft(wave, 256, 64, 256, window, center=True, pad_mode=mode,
                              return_complex=True)
        assert torch.equal(stft(wave, 256, 64), expected)


# --------------------------------------------------------------------------- metrics

def test_si_sdr():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(SR)
    assert si_sdr(x, 2 * x) >= 99.0                             # scale invariant
    assert si_sdr(x, x + 3.0) >= 99.0                            # zero-mean
    noise = rng.standard_normal(SR)
    for snr_db in (0.0, 10.0, 20.0):
        scaled = noise * np.sqrt(np.sum(x ** 2) / np.sum(noise ** 2) / 10 ** (snr_db / 10))
        assert si_sdr(x, x + scaled) == pytest.approx(snr_db, abs=0.5)
    assert si_sdr(x, -x) >= 99.0 and si_sdr(x, noise) < -10.0


def test_evaluate_pair_aligns_lengths():
    ref = tones(0.5)
    dec = np.concatenate([ref + 0.01 * np.random.randn(len(ref)).astype(np.float32),
                          np.zeros(100, np.float32)])
    result = evaluate_pair(ref, dec, SR, with_stoi=False)
    assert set(result) == {"mel_distance", "stft_distance", "si_sdr"}
    assert 10.0 < result["si_sdr"] < 40.0
    assert result["mel_distance"] > 0 and result["stft_distance"] > 0
    same = evaluate_pair(ref, ref, SR, with_stoi=False)
    assert same["mel_distance"] == 0.0 and same["si_sdr"] >= 99.0


def test_stoi_wrapper():
    rng = np.random.default_rng(2)
    # Speech-like: noise bursts modulated at a syllable rate.
    t = np.arange(2 * SR) / SR
    speech = rng.standard_normal(len(t)) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t)) * 0.1
    assert stoi(speech, speech, SR) == pytest.approx(1.0, abs=1e-3)
    noisy = speech + 0.3 * rng.standard_normal(len(t))
    assert stoi(speech, noisy, SR) < 0.9


def test_stoi_refuses_a_pair_too_short_for_its_segments():
    """Issue 34, fault 5: pystoi scores a perfect copy of a 0.35 s clip 1e-5, with only a
    warning, and the evaluation averaged that in. Too little speech for one 384 ms segment
    is a MetricError, as PESQ and ViSQOL refuse pairs too short for them; counted after
    pystoi drops the silent frames, so a long clip of mostly silence is refused too."""
    import warnings
    from toolkit.tasks.codec.metrics import MetricError
    rng = np.random.default_rng(2)
    t = np.arange(SR) / SR
    speech = rng.standard_normal(len(t)) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t)) * 0.1
    short = speech[:int(0.35 * SR)]
    mostly_silent = np.concatenate([np.zeros(SR), short, np.zeros(SR)])
    for ref in (short, mostly_silent):
        for extended, name in ((False, "STOI"), (True, "ESTOI")):
            with warnings.catch_warnings():
                warnings.simplefilter("error")          # pystoi's warning is not let through
                with pytest.raises(MetricError, match=rf"^{name} is undefined for "
                                                      rf"{len(ref) / SR:.2f} s of audio: less "
                                                      r"than one 384 ms segment"):
                    stoi(ref, ref.copy(), SR, extended=extended)
        with pytest.raises(MetricError, match="STOI is undefined"):
            evaluate_pair(ref, ref, SR, metrics=["stoi"])
    # Long enough: a perfect copy scores 1, warnings or not.
    for ref in (speech[:int(0.5 * SR)], np.concatenate([np.zeros(SR), speech, np.zeros(SR)])):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert stoi(ref, ref, SR) == pytest.approx(1.0, abs=1e-6)


def test_stoi_names_the_missing_package(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "pystoi", None)            # makes `import pystoi` fail
    from toolkit.errors import UserError
    with pytest.raises(UserError, match="pip install pystoi"):
        stoi(np.ones(100), np.ones(100), SR)
    with pytest.raises(UserError, match="tools/install.sh"):
        evaluate_pair(tones(0.2), tones(0.2), SR)
    assert "stoi" not in evaluate_pair(tones(0.2), tones(0.2), SR, with_stoi=False)


# --------------------------------------------------------------------------- baselines

def test_mulaw_levels_and_bitrate():
    x = np.linspace(-1, 1, 101)
    levels = mulaw_encode(x, 8)
    assert levels.min() == 0 and levels.max() == 255
    assert np.abs(mulaw_decode(levels, 8) - x).max() < 0.03
    assert mulaw_decode(mulaw_encode(np.array([0.0]), 8), 8)[0] == pytest.approx(0.0, abs=1e-2)
    _, bitrate = mulaw_codec(tones(0.1), SR, 8000, 8)
    assert bitrate == 64000.0


def test_mulaw_codec_improves_with_bits():
    ref = tones(0.5, freqs=(300.0, 1100.0, 2500.0))           # below the 4 kHz band edge
    scores = []
    for bits in (2, 4, 8):
        decoded, bitrate = mulaw_codec(ref, SR, 8000, bits)
        assert decoded.shape == ref.shape and decoded.dtype == np.float32
        assert bitrate == 8000 * bits
        scores.append(si_sdr(ref, decoded))
    assert scores[0] < scores[1] < scores[2], scores
    assert scores[2] > 25.0


def test_mel_griffin_lim_codec():
    ref = tones(0.5, freqs=(500.0, 1500.0))
    decoded, bitrate = melgl_codec(ref, SR, n_mels=32, frame_rate=50, bits=5)
    assert bitrate == 50 * 32 * 5
    assert decoded.shape == ref.shape and np.all(np.isfinite(decoded))
    # The tones come back where they were: the two strongest bins of the long-term spectrum.
    spectrum = np.abs(np.fft.rfft(decoded))
    bin_hz = SR / len(decoded)
    strongest = sorted(np.argsort(spectrum)[-2:] * bin_hz)
    # 32 mel bands are ~100-300 Hz wide here: the peak lands within its band.
    assert abs(strongest[0] - 500) < 150 and abs(strongest[1] - 1500) < 300
    coarse, _ = melgl_codec(ref, SR, n_mels=32, frame_rate=50, bits=1)
    assert mel_distance(ref, decoded, SR) < mel_distance(ref, coarse, SR)
    with pytest.raises(ValueError, match="multiple"):
        melgl_codec(ref, SR, n_mels=32, frame_rate=48, bits=5)


def test_ema_codebooks_ignore_zero_weight_steps():
    """A rank without data runs a stand-in batch at weight 0 (the trainer's
    frozen_norm_stats around it): EMA counts, sums and codebook stay as they were, and a
    first stand-in batch does not initialise the codebook from its silence-like vectors."""
    from toolkit.trainer.context import frozen_norm_stats
    rvq = ResidualVectorQuantizer(8, n_codebooks=2, codebook_size=16, codebook_dim=4,
                                  quantizer_dropout=0.0, ema_decay=0.9)
    rvq.train()
    stand_in = torch.full((1, 8, 20), 0.01)
    with torch.no_grad(), frozen_norm_stats([rvq]):
        rvq.quantize(stand_in)
    assert not any(bool(s.initialised) for s in rvq.stages)
    assert all(s.statistics_frozen is False for s in rvq.stages)     # restored afterwards
    with torch.no_grad():
        rvq.quantize(torch.randn(4, 8, 20))                          # a real batch initialises
    state = {k: v.clone() for k, v in rvq.state_dict().items()}
    with torch.no_grad(), frozen_norm_stats([rvq]):
        rvq.quantize(stand_in)
    for key, value in rvq.state_dict().items():
        assert torch.equal(value, state[key]), key
    with torch.no_grad():
        rvq.quantize(torch.randn(4, 8, 20))
    assert not torch.equal(rvq.stages[0].codebook, state["stages.0.codebook"])


def _ema_rank(out):
    """One of the two gloo ranks of the test below (`python -m test_codec_modules OUT`)."""
    import torch.distributed as dist
    from toolkit.trainer.context import frozen_norm_stats
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    rvq = ResidualVectorQuantizer(8, n_codebooks=2, codebook_size=16, codebook_dim=4,
                                  quantizer_dropout=0.0, ema_decay=0.9).train()
    real = torch.randn(3, 4, 8, 20, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        for step in range(3):
            if rank == 0 and step > 0:      # rank 0 runs out of data: stand-in batches
                with frozen_norm_stats([rvq]):
                    rvq.quantize(torch.full((1, 8, 20), 0.01))
            else:
                rvq.quantize(real[step])
    torch.save({k: v.clone() for k, v in rvq.state_dict().items()}, f"{out}.{rank}")
    dist.destroy_process_group()


if __name__ == "__main__":
    _ema_rank(sys.argv[1])


def test_ema_codebooks_with_a_stand_in_rank_stay_in_sync(tmp_path):
    """Two gloo ranks, rank 0 on stand-in batches after its first step: the collectives
    still meet, the codebooks stay identical, and only rank 1's vectors move them."""
    from train_utils import run_train
    out = str(tmp_path / "state")
    # Ranks forked from the test zygote (torchrun's environment and store, no fresh
    # interpreters, no port guessed); ranks disagreeing on a collective hang: the timeout
    # kills them and fails the test.
    result = run_train(["-m", "test_codec_modules", out], nproc=2, timeout=120,
                       cwd=os.path.dirname(os.path.abspath(__file__)))
    assert result.returncode == 0, result.stderr[-3000:]
    a, b = torch.load(f"{out}.0"), torch.load(f"{out}.1")
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # Steps 2 and 3 saw rank 1's vectors only: the stand-in tone added no counts.
    total = float(a["stages.0.cluster_size"].sum())
    n = 4 * 20                  # vectors of one real batch
    decay = 0.9
    # init (2 ranks' first batches counted as rank 0's rows), then three EMA updates with
    # 2n, n, n vectors: the sum of the decayed counts.
    expected = (((n * decay + 2 * n * (1 - decay)) * decay + n * (1 - decay)) * decay
                + n * (1 - decay))
    assert total == pytest.approx(expected, rel=1e-4)


def test_code_parity_counts_frames_and_tolerates_only_near_tie_flips():
    """Export parity of codes: the share of frames whose codes differ (a flip in one
    codebook carries into the later ones of that frame, which counts once); a graph that
    changes more than CODE_FRAME_TOLERANCE of the frames is refused."""
    from toolkit.export import ParityError, compare
    from toolkit.tasks.codec.export import CODE_FRAME_TOLERANCE, differing_frames
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 1024, (1, 12, 500))
    flipped = codes.copy()
    flipped[0, 3:, 17] = (flipped[0, 3:, 17] + 1) % 1024      # one near-tie, carried on
    assert differing_frames((codes,), (codes,)) == (0.0, None)
    assert differing_frames((codes,), (flipped,)) == (1 / 500, None)
    share, why = differing_frames((codes,), (codes[:, :, :-1],))
    assert share == 1.0 and "shape" in why
    shuffled = rng.integers(0, 1024, codes.shape)               # a wrong graph
    case = [(np.zeros(1, np.float32),)]
    assert compare(lambda _: codes, {"onnx": lambda _: flipped}, case, CODE_FRAME_TOLERANCE,
                   difference=differing_frames)["onnx"] == 1 / 500
    with pytest.raises(ParityError, match="onnx 1"):
        compare(lambda _: codes, {"onnx": lambda _: shuffled}, case, CODE_FRAME_TOLERANCE,
                difference=differing_frames)
