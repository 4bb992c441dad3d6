"""toolkit.bin.codec on the shipped codec (toolkit/pretrained/codec-voicebank-v1) with input
a user can get wrong: `--model pretrained:NAME`; codes files cut short, damaged or not ours
refused in one line naming the file; codes of fewer codebooks (a lower bitrate, `encode
--n-q`) decoded like the first rows of all; and the same input checks at every rate (NaN and
a WAV cut short refused, silence encoded). The binary runs in process (its @cli wrapper
included): a round trip is a second, not a fresh interpreter's import of torch."""
import os
import zipfile

import numpy as np
import pytest
import soundfile as sf

from speaker_data import RATE, speaker_params, voice_wave
from toolkit.bin import codec as codec_bin
from toolkit.pretrained import PREFIX

CODEC = "codec-voicebank-v1"
SECONDS = 0.6


def _speech(seconds=SECONDS, rate=RATE):
    pitch, formants = speaker_params(2)
    wave = voice_wave(np.random.default_rng(0), pitch, formants, seconds).astype(np.float32)
    if rate != RATE:
        from toolkit.data.audio import resample
        wave = resample(wave, RATE, rate)
    return wave


def _run(capsys, *args):
    """(exit status, stderr) of the binary in process."""
    capsys.readouterr()
    rc = codec_bin.main(list(args))
    return rc, capsys.readouterr().err


def _one_error_line(err, *words):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in errors[0], (word, errors[0])
    return errors[0]


@pytest.fixture(scope="module")
def codec():
    from toolkit.tasks.codec.runtime import ExportedCodec
    return ExportedCodec.pretrained(CODEC)


@pytest.fixture(scope="module")
def encoded(tmp_path_factory):
    """A short speech WAV and its codes file, encoded once by `--pretrained NAME`."""
    folder = tmp_path_factory.mktemp("codec_cli")
    wav, codes = str(folder / "in.wav"), str(folder / "in.codes")
    sf.write(wav, _speech(), RATE, subtype="FLOAT")
    assert codec_bin.main(["encode", "--pretrained", CODEC, wav, codes]) == 0
    return wav, codes


# --------------------------------------------------------------------------- pretrained:NAME

def test_model_takes_pretrained_name(encoded, tmp_path, capsys):
    """`--model pretrained:NAME` is the same codec as `--pretrained NAME`, both ways."""
    from toolkit.tasks.codec.runtime import read_codes
    wav, reference = encoded
    codes, decoded = str(tmp_path / "a.codes"), str(tmp_path / "a.wav")
    rc, err = _run(capsys, "encode", "--model", PREFIX + CODEC, wav, codes)
    assert rc == 0, err
    assert np.array_equal(read_codes(codes)["codes"], read_codes(reference)["codes"])
    rc, err = _run(capsys, "decode", "--model", PREFIX + CODEC, codes, decoded)
    assert rc == 0, err
    assert len(sf.read(decoded)[0]) == len(sf.read(wav)[0])
    rc, err = _run(capsys, "encode", "--model", PREFIX + "nope", wav, codes)
    assert rc == 2
    _one_error_line(err, "no pretrained model 'nope'")


# --------------------------------------------------------------------------- damaged codes

def _cut_short(source, path):
    data = open(source, "rb").read()
    open(path, "wb").write(data[:len(data) // 2])


def _without_version(source, path):
    fields = dict(np.load(source))
    del fields["version"]
    np.savez(open(path, "wb"), **fields)


def _garbage(source, path):
    open(path, "wb").write(b"these are not codes\n" * 20)


def _empty(source, path):
    open(path, "wb").close()


def _pickled(source, path):
    np.save(open(path, "wb"), np.array([{"codes": 1}], dtype=object), allow_pickle=True)


def _float_codes(source, path):
    fields = dict(np.load(source))
    fields["codes"] = fields["codes"].astype(np.float32)
    np.savez(open(path, "wb"), **fields)


def _bad_crc(source, path):
    # Bytes of the codes member flipped: the archive's CRC catches it on reading.
    data = bytearray(open(source, "rb").read())
    with zipfile.ZipFile(source) as z:
        offset = z.getinfo("codes.npy").header_offset
    for i in range(offset + 200, offset + 240):
        data[i] ^= 0xFF
    open(path, "wb").write(bytes(data))


DAMAGES = [(_cut_short, ("cut short",)), (_without_version, ("'version'",)),
           (_garbage, ("not a codes file",)), (_empty, ("not a codes file",)),
           (_pickled, ("not a codes file",)), (_float_codes, ("'codes'", "integers")),
           (_bad_crc, ("damaged", "'codes'"))]


@pytest.mark.parametrize("damage,words", DAMAGES, ids=[d.__name__[1:] for d, _ in DAMAGES])
def test_damaged_codes_file_is_refused_in_one_line(encoded, tmp_path, capsys, damage, words):
    _, codes = encoded
    bad, out = str(tmp_path / "bad.codes"), str(tmp_path / "out.wav")
    damage(codes, bad)
    rc, err = _run(capsys, "decode", "--pretrained", CODEC, bad, out)
    assert rc == 2
    line = _one_error_line(err, bad, *words)
    assert "pickle" not in line and "allow_pickle" not in line      # numpy's words, not ours
    assert not os.path.exists(out) and not os.path.exists(out + ".tmp")


# --------------------------------------------------------------------------- fewer codebooks

def test_fewer_codebooks_decode_as_the_lower_bitrate(codec, encoded, tmp_path, capsys):
    """Codes of the first 4 of 12 codebooks (2 of 6 kbit/s), cut from all twelve by hand or
    from `encode --n-q 4`, decode (streamed in chunks) to the audio of those codebooks."""
    from toolkit.tasks.codec.runtime import read_codes
    wav, full_path = encoded
    full = read_codes(full_path, codec)
    by_hand, low = str(tmp_path / "hand.codes"), str(tmp_path / "low.codes")
    fields = dict(np.load(full_path))
    fields["codes"] = fields["codes"][:4]
    np.savez(open(by_hand, "wb"), **fields)
    expected = np.clip(codec.decode(full["codes"][:4], full["length"]), -1, 1)
    everything = np.clip(codec.decode(full["codes"], full["length"]), -1, 1)

    def decodes_to_four_codebooks(path):
        out = path + ".wav"
        rc, err = _run(capsys, "decode", "--pretrained", CODEC, "--chunk-seconds", "0.2",
                       path, out)
        assert rc == 0, err
        audio, rate = sf.read(out, dtype="float32")
        assert rate == RATE and len(audio) == full["length"]
        assert np.abs(audio - expected).max() < 2e-4                    # 16-bit rounding
        assert np.abs(audio - everything).max() > 1e-2                  # not all twelve

    decodes_to_four_codebooks(by_hand)
    rc, err = _run(capsys, "encode", "--pretrained", CODEC, "--n-q", "4", wav, low)
    assert rc == 0, err
    # The residual quantizer works codebook by codebook: the first rows of all twelve.
    assert np.array_equal(read_codes(low, codec)["codes"], full["codes"][:4])
    decodes_to_four_codebooks(low)
    rc, err = _run(capsys, "encode", "--pretrained", CODEC, "--n-q", "13", wav, low)
    assert rc == 2
    _one_error_line(err, "--n-q 13", "12 codebooks")


# --------------------------------------------------------------------------- encode checks

@pytest.mark.parametrize("rate", [16000, 8000])
def test_encode_checks_are_the_same_at_every_rate(codec, tmp_path, capsys, rate):
    """At the encoder's rate (streamed) and at another (resampled whole): NaN and a WAV cut
    short are refused naming the file; silence is encoded and decodes to near silence."""
    codes, out = str(tmp_path / "x.codes"), str(tmp_path / "x.wav")
    n = int(SECONDS * rate)
    silent = str(tmp_path / f"silent{rate}.wav")
    sf.write(silent, np.zeros(n, np.float32), rate, subtype="PCM_16")
    rc, err = _run(capsys, "encode", "--pretrained", CODEC, silent, codes)
    assert rc == 0, err
    rc, err = _run(capsys, "decode", "--pretrained", CODEC, codes, out)
    assert rc == 0, err
    audio, _ = sf.read(out, dtype="float32")
    assert len(audio) == codec.output_length(n, rate) and np.abs(audio).max() < 0.05

    wave = _speech(rate=rate)
    wave[len(wave) // 2] = np.nan
    nan_wav = str(tmp_path / f"nan{rate}.wav")
    sf.write(nan_wav, wave, rate, subtype="FLOAT")
    os.remove(codes)
    rc, err = _run(capsys, "encode", "--pretrained", CODEC, nan_wav, codes)
    assert rc == 2
    _one_error_line(err, nan_wav, "NaN")
    assert not os.path.exists(codes)

    whole = str(tmp_path / f"speech{rate}.wav")
    sf.write(whole, _speech(rate=rate), rate, subtype="PCM_16")
    cut = str(tmp_path / f"cut{rate}.wav")
    data = open(whole, "rb").read()
    open(cut, "wb").write(data[:len(data) * 2 // 3])
    rc, err = _run(capsys, "encode", "--pretrained", CODEC, cut, codes)
    assert rc == 2
    _one_error_line(err, cut, "cut short")
    assert not os.path.exists(codes)
