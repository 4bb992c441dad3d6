"""A codec whose encoder reads another rate than it reconstructs (16 kHz codes, 24 or 44.1 kHz
audio out), and the Vocos-style istft decoder: examples cut so that both rates start at the
same instant and hold whole code frames, short clips zero padded; a training step and dev
metrics at the output rate; training through the binary, export parity of both decoders
(ONNX and TorchScript), the metadata naming both rates, and encode/decode of sound files at
either rate with `toolkit.bin.codec`."""
import copy
import json
import os

import numpy as np
import pytest
import soundfile as sf
import torch

from toolkit.data.pipeline import FeaturePipeline

from speaker_data import speaker_list
from test_codec_task import CONFIG, RecordingContext
from train_utils import latest_payload, run_train

ENCODER_RATE = 16000
# Encoder hop 160 (100 frames/s at 16 kHz); the decoder's strides multiply to the samples of
# one code frame at the output rate.
DECODER_STRIDES = {24000: [5, 4, 3, 4], 44100: [7, 7, 3, 3]}


def dual_config(rate: int, **model) -> dict:
    raw = copy.deepcopy(CONFIG)
    raw["dataset"].update(sample_rate=rate, speed_perturb=[], volume_range=[])
    raw["model"].update(sample_rate=rate, encoder_sample_rate=ENCODER_RATE, strides=[2, 4, 5, 4],
                        decoder_strides=DECODER_STRIDES[rate], causal=False)
    raw["model"].update(model)
    raw["loss"].update(mel_window_lengths=[64, 256, 1024], mel_n_mels=[10, 40, 80])
    return raw


def task_for(raw: dict):
    import toolkit.tasks  # noqa: F401
    from toolkit.config import validate
    from toolkit.tasks.codec.task import CodecTask
    return CodecTask(validate(copy.deepcopy(raw)))


def two_tones(t: np.ndarray) -> np.ndarray:
    return (0.3 * np.sin(2 * np.pi * 310.0 * t) + 0.2 * np.sin(2 * np.pi * 1730.0 * t))


@pytest.mark.parametrize("rate", [24000, 44100])
def test_examples_align_both_rates_and_pad_short_clips(rate, tmp_path):
    """The encoder-rate samples of an example are the target-rate excerpt at the same
    instants: checked against the analytic signal, away from the excerpt's first samples
    (where resampling sees the cut)."""
    task = task_for(dual_config(rate))
    frames = task.segment_frames
    assert (task.segment, task.encoder_segment) == (frames * rate // 100, frames * 160)
    step = rate // np.gcd(rate, ENCODER_RATE)
    assert task.segment % step == 0
    long_path, short_path = str(tmp_path / "long.wav"), str(tmp_path / "short.wav")
    long_wave = two_tones(np.arange(rate) / rate).astype(np.float32)
    sf.write(long_path, long_wave, rate, subtype="FLOAT")
    sf.write(short_path, long_wave[:rate // 10], rate, subtype="FLOAT")
    builder = task.example_builder(FeaturePipeline(task.cfg.dataset, seed=1, train=True))
    target, encoder = builder({"key": "long", "wav": long_path, "duration": 1.0}, epoch=0)
    assert target.shape == (task.segment,) and encoder.shape == (task.encoder_segment,)
    start = next(s for s in range(rate - task.segment + 1)
                 if np.array_equal(long_wave[s:s + task.segment], target))
    times = start / rate + np.arange(task.encoder_segment) / ENCODER_RATE
    assert np.abs(encoder - two_tones(times))[200:].max() < 5e-3
    # A clip shorter than the segment: zeros after it at both rates.
    target, encoder = builder({"key": "short", "wav": short_path, "duration": 0.1}, epoch=0)
    assert target.shape == (task.segment,) and np.all(target[rate // 10:] == 0)
    assert np.abs(encoder[ENCODER_RATE // 10 + 100:]).max() < 1e-3
    # Dev examples: the start of the utterance, cut to whole periods of both rates.
    dev = task.example_builder(FeaturePipeline(task.cfg.dataset, seed=1, train=False))
    examples = [dev({"key": k, "wav": p, "duration": d}, epoch=0)
                for k, p, d in (("long", long_path, 1.0), ("short", short_path, 0.1))]
    for target, encoder in examples:
        assert len(target) % step == 0 and len(encoder) == len(target) * ENCODER_RATE // rate
        assert np.abs(encoder - two_tones(np.arange(len(encoder)) / ENCODER_RATE))[
            200:-200].max() < 5e-3
    batch = dev.collate(examples, ["long", "short"], 1.1, None)
    assert batch.encoder_lengths.tolist() == [len(e) for _, e in examples]
    assert batch.lengths.tolist() == [len(t) for t, _ in examples]


@pytest.mark.parametrize("rate", [24000, 44100])
@pytest.mark.parametrize("decoder", ["conv", "istft"])
def test_training_step_and_dev_metrics_at_the_output_rate(rate, decoder):
    extra = {} if decoder == "conv" else {"decoder": "istft", "decoder_strides": [],
                                           "istft_dim": 16, "istft_layers": 2}
    task = task_for(dual_config(rate, **extra))
    torch.manual_seed(0)
    modules = task.build_modules()
    rng = np.random.default_rng(0)
    t = np.arange(task.segment) / rate
    waves = np.stack([two_tones(t + rng.uniform(0, 1)) for _ in range(2)]).astype(np.float32)
    batch = task.batch_of(waves, ["a", "b"])
    assert batch.encoder_audio.shape == (2, task.encoder_segment)
    seen = []
    modules["generator"].register_forward_hook(lambda m, i, o: seen.append(o["audio"].shape))
    stats = task.train_step(batch, RecordingContext(modules, 3, 4))
    assert seen == [(2, 1, task.segment)]
    assert all(np.isfinite(v) for v in stats.values()) and "d_loss" in stats
    with torch.no_grad():                                     # as the trainer validates
        metrics = task.eval_step(batch, RecordingContext(
            {k: m.eval() for k, m in modules.items()}, 3, 4))
    assert set(metrics) == {"mel_distance", "stft_distance", "si_sdr"}
    assert all(np.isfinite(v) for v in metrics.values())


def test_istft_decoder_learns_a_fixed_batch():
    """Twelve optimizer steps on one batch lower the mel loss of the istft decoder (its
    gradient reaches the encoder through the inverse STFT and the quantizer)."""
    raw = dual_config(24000, decoder="istft", decoder_strides=[], istft_dim=32, istft_layers=2,
                      quantizer_dropout=0.0)
    task = task_for(raw)
    torch.manual_seed(0)
    generator = task.build_modules()["generator"]
    optimizer = torch.optim.Adam(generator.parameters(), lr=3e-3)
    t = np.arange(task.segment) / 24000
    batch = task.batch_of(np.stack([two_tones(t), two_tones(t + 0.3)]).astype(np.float32),
                          ["a", "b"])
    real = batch.audio.unsqueeze(1)
    losses = []
    for _ in range(12):                     # the last loss is about 0.65 x the first
        out = generator(batch.encoder_audio.unsqueeze(1))
        loss = task._mel(out["audio"], real) + out["commit_loss"] + out["codebook_loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(task._mel(out["audio"], real).detach()))
    assert losses[-1] < 0.8 * losses[0], losses


# --------------------------------------------------------------------------- binaries

class Corpus:
    def __init__(self, root: str):
        self.root = root
        self.train = speaker_list(root, "train", range(3), 3, 1, {})
        self.dev = speaker_list(root, "dev", range(10, 12), 1, 2, {})

    def args(self, exp: str, config: str, *overrides: str):
        return ["-m", "toolkit.bin.train", "--config", config, "--exp-dir", exp,
                "--train-data", self.train, "--dev-data", self.dev, *overrides]


@pytest.fixture(scope="module")
def dual_run(tmp_path_factory):
    """3 steps of a causal 16 -> 24 kHz codec (conv decoder) with validation, exported."""
    import yaml
    root = str(tmp_path_factory.mktemp("codec_rates"))
    corpus = Corpus(root)
    raw = dual_config(24000, causal=True)
    raw["loss"].update(adversarial=0.0, feature_matching=0.0)
    raw["training"].update(max_steps=3, val_interval_steps=3)
    config = os.path.join(root, "dual.yaml")
    with open(config, "w") as f:
        yaml.safe_dump(raw, f)
    exp = os.path.join(root, "exp")
    result = run_train(corpus.args(exp, config))
    assert result.returncode == 0, result.stderr[-3000:]
    out = os.path.join(root, "export")
    from toolkit.trainer.checkpoint import latest_valid
    exported = run_train(["-m", "toolkit.bin.export_model", "--checkpoint",
                          latest_valid(exp).path, "--exp-dir", exp, "--out-dir", out,
                          "--test-data", corpus.dev, "--num-check", "2"])
    assert exported.returncode == 0, exported.stderr[-3000:]
    return corpus, exp, out, result.stderr


def test_dual_rate_training_validates_and_exports_both_rates(dual_run):
    from toolkit.export import read_metadata
    corpus, exp, out, log = dual_run
    assert "16000 Hz in, 24000 Hz out" in log
    assert latest_payload(exp)["step"] == 3
    dev_line = [line for line in log.splitlines() if "mel_distance" in line]
    assert dev_line, log[-2000:]
    meta = read_metadata(os.path.join(out, "encoder.onnx"))
    assert (meta["sample_rate"], meta["hop"], meta["encoder_sample_rate"], meta["encoder_hop"],
            meta["frame_rate"], meta["format_version"]) == (24000, 240, 16000, 160, 100.0, 2)
    assert meta["bitrate"] == 100 * 2 * 4
    assert json.load(open(os.path.join(out, "config.json")))["model"]["decoder_strides"] == \
        DECODER_STRIDES[24000]


def test_codec_cli_round_trip_at_the_output_rate(dual_run, tmp_path, capsys):
    """A 16 kHz file (the encoder's rate: streamed, through the CLI) and a 24 kHz file
    (resampled whole) both decode to 24 kHz WAVs of their durations; streamed codes and
    audio equal the whole-signal ones."""
    from toolkit.bin import codec as codec_bin
    from toolkit.data.audio import resample
    from toolkit.tasks.codec.runtime import ExportedCodec, decode_file, encode_file, read_codes
    corpus, _, out, _ = dual_run
    wav16 = json.loads(open(corpus.dev).readline())["wav"]
    original, rate = sf.read(wav16, dtype="float32")
    assert rate == ENCODER_RATE
    wav24 = str(tmp_path / "in24.wav")
    sf.write(wav24, resample(original, 16000, 24000), 24000, subtype="FLOAT")
    codec = ExportedCodec(out, "onnx")
    assert (codec.sample_rate, codec.encoder_sample_rate) == (24000, 16000)
    paths = {name: (str(tmp_path / f"{name}.codes"), str(tmp_path / f"{name}.wav"))
             for name in ("from16", "from24")}
    # The binary in process (its @cli wrapper included), as test_codec_cli.py runs it.
    assert codec_bin.main(["encode", "--model", out, "--chunk-seconds", "0.2", wav16,
                           paths["from16"][0]]) == 0, capsys.readouterr().err[-2000:]
    assert codec_bin.main(["decode", "--model", out, "--backend", "torch", "--chunk-seconds",
                           "0.3", *paths["from16"]]) == 0, capsys.readouterr().err[-2000:]
    encode_file(codec, wav24, paths["from24"][0])
    decode_file(codec, *paths["from24"])
    for name, expected_codes in (("from16", codec.encode(original, 16000)),
                                 ("from24", codec.encode(sf.read(wav24, dtype="float32")[0]))):
        codes_path, decoded_path = paths[name]
        data = read_codes(codes_path, codec)
        assert np.array_equal(data["codes"], expected_codes), name
        decoded, decoded_rate = sf.read(decoded_path, dtype="float32")
        assert decoded_rate == 24000
        assert len(decoded) == data["length"] == -(-len(original) * 3 // 2), name
        whole = np.clip(codec.decode(data["codes"], data["length"]), -1, 1)
        assert np.abs(decoded - whole).max() < 2e-4, name


@pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export")
@pytest.mark.parametrize("rate", [16000, 44100])
def test_istft_decoder_exports_with_parity(rate, tmp_path):
    """ONNX and TorchScript graphs of an istft generator (its inverse FFT as a basis
    matmul) give PyTorch's codes and audio; the runtime reads both rates from them."""
    from toolkit.tasks.codec.export import export_codec
    from toolkit.tasks.codec.model import CodecConfig, CodecModel, remove_weight_norm
    from toolkit.tasks.codec.runtime import ExportedCodec
    torch.manual_seed(0)
    model = CodecModel(CodecConfig(sample_rate=rate, encoder_sample_rate=ENCODER_RATE,
                                   channels=4, strides=[2, 4, 5, 4], n_codebooks=3,
                                   codebook_size=16, codebook_dim=4, decoder="istft",
                                   istft_dim=16, istft_layers=2))
    model = remove_weight_norm(model.eval())
    rng = np.random.default_rng(1)
    cases = [(rng.uniform(-0.3, 0.3, (1, 1, n * 160)).astype(np.float32),) for n in (7, 31)]
    worst = export_codec(model, str(tmp_path), cases, tolerance=1e-4)
    assert set(worst) >= {"decoder_onnx", "decoder_torchscript", "encoder_onnx_other_frames"}
    assert max(v for k, v in worst.items() if k.startswith("decoder")) < 1e-4
    wave = two_tones(np.arange(int(0.37 * rate)) / rate).astype(np.float32)
    from toolkit.data.audio import resample
    with torch.no_grad():
        encoder_wave = torch.from_numpy(resample(wave, rate, ENCODER_RATE))
        expected = model.decode(model.encode(encoder_wave[None, None]), len(wave))[0, 0]
    for backend in ("onnx", "torch"):
        codec = ExportedCodec(str(tmp_path), backend)
        assert (codec.sample_rate, codec.hop, codec.encoder_hop) == (rate, rate // 100, 160)
        codes = codec.encode(wave)
        decoded = codec.decode(codes, len(wave))
        assert decoded.shape == wave.shape
        assert np.abs(decoded - expected.numpy()).max() < 1e-4, backend
        # Fewer codebooks decode through the safetensors generator, at the same rate.
        assert codec.decode(codes[:1], len(wave)).shape == wave.shape


@pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export")
def test_causal_istft_export_flushes_and_drops_its_lag(tmp_path):
    """A causal istft codec's export records its lag; the runtime's whole-signal and
    chunked paths, on every backend, flush it on encoding and drop it on decoding, so the
    decoded audio lines up with PyTorch's forward on the input, sample for sample."""
    from toolkit.tasks.codec.export import export_codec
    from toolkit.tasks.codec.model import CodecConfig, CodecModel, remove_weight_norm
    from toolkit.tasks.codec.runtime import ExportedCodec
    torch.manual_seed(0)
    model = CodecModel(CodecConfig(channels=4, strides=[2, 4, 5, 8], n_codebooks=3,
                                   codebook_size=16, codebook_dim=4, causal=True,
                                   decoder="istft", istft_dim=16, istft_layers=2,
                                   istft_n_fft=640))
    model = remove_weight_norm(model.eval())
    rng = np.random.default_rng(1)
    cases = [(rng.uniform(-0.3, 0.3, (1, 1, n * 320)).astype(np.float32),) for n in (7, 31)]
    export_codec(model, str(tmp_path), cases, tolerance=1e-4)
    wave = two_tones(np.arange(int(0.73 * 16000)) / 16000).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(wave)[None, None])["audio"][0, 0].numpy()
    for backend in ("onnx", "torch", "safetensors"):
        codec = ExportedCodec(str(tmp_path), backend)
        assert (codec.delay, codec.flush_frames, codec.metadata["format_version"]) == (320, 1, 3)
        codes = codec.encode(wave)
        assert codes.shape == (3, -(-len(wave) // 320) + 1)
        decoded = codec.decode(codes, len(wave))
        assert np.abs(decoded - expected).max() < 1e-4, backend
        chunked = np.concatenate(list(codec.encode_chunks(
            wave[i:i + 1000] for i in range(0, len(wave), 1000))), axis=1)
        assert np.array_equal(chunked, codes), backend
        audio = np.concatenate(list(codec.decode_chunks(
            codes[:, i:i + 4] for i in range(0, codes.shape[1], 4))))[:len(wave)]
        assert np.abs(audio - decoded).max() < 1e-4, backend
