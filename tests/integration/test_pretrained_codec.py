"""The shipped codecs (toolkit/pretrained/codec-voicebank-v1 and -v2; their cards' sha256 and
damaged weights: test_pretrained.py): their cards' rates, the CLI's --pretrained round trip
(an unknown name refused), chunked decoding equal to whole decoding, and speech that comes
back recognisably (they learned; v2 keeps the voicing that v1 loses); the safetensors
backend that runs a shipped codec gives the ONNX graphs' codes and audio, and a packaged
codec export loads through it."""
import os

import numpy as np
import pytest
import soundfile as sf
import torch

from speaker_data import RATE, speaker_params, voice_wave
from toolkit import pretrained
from toolkit.errors import MissingInputError

CODECS = ["codec-voicebank-v1", "codec-voicebank-v2"]


def _speech(seconds=3.0, index=3, seed=0):
    pitch, formants = speaker_params(index)
    return voice_wave(np.random.default_rng(seed), pitch, formants, seconds).astype(np.float32)


def _cli(capsys, *args):
    """The binary in process (its @cli wrapper included), as test_codec_cli.py runs it."""
    from toolkit.bin import codec as codec_bin
    assert codec_bin.main(list(args)) == 0, capsys.readouterr().err[-3000:]


# --------------------------------------------------------------------------- shipped codec

@pytest.mark.parametrize("CODEC", CODECS)
def test_the_codec_is_shipped_causal_within_its_card(CODEC):
    assert CODEC in pretrained.available()
    meta = pretrained.metadata(CODEC)
    assert meta["task"] == "codec" and meta["causal"] is True
    assert (meta["sample_rate"], meta["n_codebooks"], meta["codebook_size"]) == (16000, 12, 1024)
    assert meta["bitrate"] == 6000.0


@pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export")
@pytest.mark.parametrize("CODEC", CODECS)
def test_pretrained_cli_round_trip_streams_like_whole_decoding(CODEC, tmp_path, capsys):
    from toolkit.tasks.codec.runtime import ExportedCodec, open_codec, read_codes
    wave = _speech(4.0)
    wav = str(tmp_path / "in.wav")
    sf.write(wav, wave, RATE, subtype="FLOAT")
    codes, decoded = str(tmp_path / "in.codes"), str(tmp_path / "out.wav")
    _cli(capsys, "encode", "--pretrained", CODEC, "--chunk-seconds", "0.3", wav, codes)
    _cli(capsys, "decode", "--pretrained", CODEC, "--chunk-seconds", "0.5", codes, decoded)
    codec = ExportedCodec.pretrained(CODEC)
    assert open_codec("pretrained:" + CODEC).fingerprint == codec.fingerprint
    data = read_codes(codes, codec)
    assert np.array_equal(data["codes"], codec.encode(wave))           # streamed = whole
    out, rate = sf.read(decoded, dtype="float32")
    assert rate == RATE and len(out) == len(wave) == data["length"]
    whole = np.clip(codec.decode(data["codes"], len(wave)), -1, 1)
    assert np.abs(out - whole).max() < 2e-4                              # 16-bit rounding
    # The same chunking in memory, without the file layer.
    pieces = np.concatenate(list(codec.decode_chunks(
        data["codes"][:, i:i + 7] for i in range(0, data["codes"].shape[1], 7))))
    assert np.abs(pieces[:len(wave)] - codec.decode(data["codes"], len(wave))).max() < 1e-4
    # ONNX and TorchScript graphs from the shipped weights give the same codes and audio.
    from toolkit.bin import export_model
    out_dir = str(tmp_path / "onnx")
    assert export_model.main(["--pretrained", CODEC, "--out-dir", out_dir,
                              "--num-check", "2"]) == 0, capsys.readouterr().err[-3000:]
    graphs = ExportedCodec(out_dir, "onnx")
    # ONNX Runtime rounds differently: a near-tie may pick the other codebook entry.
    from toolkit.tasks.codec.export import CODE_FRAME_TOLERANCE, differing_frames
    share, _ = differing_frames((data["codes"],), (graphs.encode(wave),))
    assert share <= CODE_FRAME_TOLERANCE, share
    assert np.abs(graphs.decode(data["codes"], len(wave)) - whole).max() < 1e-4


# Per codec: STOI of all codebooks and of the first 4 at least, and the share of the
# input's voiced frames kept at their period at least. Measured on this sentence: v1
# STOI 0.823 / 0.811, voiced frames kept 0.060; v2 0.907 / 0.888, 0.229.
LEARNED = {"codec-voicebank-v1": (0.75, 0.7, 0.0),
           "codec-voicebank-v2": (0.88, 0.86, 0.15)}


@pytest.mark.parametrize("CODEC", CODECS)
def test_the_shipped_codec_learned_speech(CODEC):
    """espeak-ng speech comes back far closer to its input than through an untrained
    codec of the same architecture (measured for v1: mel distance 1.9 against 5.6, STOI
    0.82 against 0.47), more codebooks bring it closer (the rates of one model), and v2
    voices what was voiced."""
    from toolkit.data.audio import resample
    from toolkit.tasks.codec.metrics import mel_distance, stoi
    from toolkit.tasks.codec.pitch import pitch_kept
    from toolkit.tasks.codec.model import CodecConfig, CodecModel, remove_weight_norm
    from toolkit.tasks.codec.runtime import ExportedCodec
    from toolkit.voicebank.espeak import Espeak
    espeak = Espeak()
    espeak.seed(0)
    wave = espeak.synth("Please call Stella and ask her to bring these things with her "
                        "from the store.", "en-us")
    wave = resample(wave, espeak.rate, RATE).astype(np.float32)
    codec = ExportedCodec.pretrained(CODEC)
    codes = codec.encode(wave)
    full = codec.decode(codes, len(wave))
    low = codec.decode(codes[:4], len(wave))
    config = pretrained.metadata(CODEC)["model"]
    torch.manual_seed(0)
    untrained = remove_weight_norm(CodecModel(CodecConfig(**config)).eval())
    with torch.no_grad():
        raw = untrained.decode(untrained.encode(torch.from_numpy(wave)[None, None]))
    raw = raw[0, 0, :len(wave)].numpy()
    d_full, d_low = mel_distance(wave, full, RATE), mel_distance(wave, low, RATE)
    d_raw = mel_distance(wave, raw, RATE)
    assert d_full < d_low < 0.5 * d_raw, (d_full, d_low, d_raw)
    full_stoi, low_stoi, voiced = LEARNED[CODEC]
    assert stoi(wave, full, RATE) > full_stoi and stoi(wave, low, RATE) > low_stoi
    assert stoi(wave, raw, RATE) < 0.6
    assert pitch_kept(wave, full) >= voiced and pitch_kept(wave, raw) < 0.1


def test_an_unknown_codec_name_is_refused(tmp_path, capsys):
    # Damaged weights: test_pretrained.py::test_damaged_weights_are_refused, for every model.
    from toolkit.bin import codec as codec_bin
    from toolkit.tasks.codec.runtime import ExportedCodec
    with pytest.raises(MissingInputError, match="no pretrained model 'nope'"):
        ExportedCodec.pretrained("nope")
    capsys.readouterr()
    assert codec_bin.main(["encode", "--pretrained", "nope", str(tmp_path / "a.wav"),
                           str(tmp_path / "a.codes")]) != 0
    assert "no pretrained model 'nope'" in capsys.readouterr().err


# --------------------------------------------------------------------------- the backend

@pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export")
def test_safetensors_backend_matches_the_graphs_and_packages(tmp_path):
    """A tiny causal codec: the safetensors backend (all a packaged codec has) gives the
    ONNX graphs' codes and audio, streams like whole decoding, and works after packaging."""
    from toolkit.pretrained.package import package
    from toolkit.tasks.codec.export import export_codec
    from toolkit.tasks.codec.model import CodecConfig, CodecModel, remove_weight_norm
    from toolkit.tasks.codec.runtime import ExportedCodec
    torch.manual_seed(0)
    model = remove_weight_norm(CodecModel(CodecConfig(
        channels=4, strides=[2, 4, 5, 4], dilations=[1, 3], kernel_size=5, causal=True,
        n_codebooks=3, codebook_size=16, codebook_dim=4)).eval())
    rng = np.random.default_rng(1)
    cases = [(rng.uniform(-0.3, 0.3, (1, 1, n * 160)).astype(np.float32),) for n in (7, 31)]
    export = str(tmp_path / "export")
    export_codec(model, export, cases, tolerance=1e-4)
    wave = _speech(1.3)
    graphs, eager = ExportedCodec(export, "onnx"), ExportedCodec(export, "safetensors")
    assert eager.fingerprint == graphs.fingerprint and eager.causal
    codes = eager.encode(wave)
    assert np.array_equal(codes, graphs.encode(wave))
    whole = eager.decode(codes, len(wave))
    assert np.abs(whole - graphs.decode(codes, len(wave))).max() < 1e-4
    streamed = np.concatenate(list(eager.decode_chunks(
        codes[:, i:i + 3] for i in range(0, codes.shape[1], 3))))[:len(wave)]
    assert np.abs(streamed - whole).max() < 1e-4
    chunked_codes = np.concatenate(list(eager.encode_chunks(
        wave[i:i + 500] for i in range(0, len(wave), 500))), axis=1)
    assert np.array_equal(chunked_codes, codes)
    template = tmp_path / "card.md"
    template.write_text("# {{name}}\nsha256 (model.safetensors): `{{sha256}}`\n")
    root = str(tmp_path / "shipped")
    os.makedirs(root)
    out = package(export, "tiny-codec", str(template), {}, root=root)
    assert sorted(os.listdir(out)) == ["README.md", "config.json", "model.safetensors"]
    shipped = ExportedCodec(out, "safetensors")
    assert np.array_equal(shipped.encode(wave), codes)
    with pytest.raises(MissingInputError, match="pretrained codec"):
        ExportedCodec(str(tmp_path), "safetensors")
