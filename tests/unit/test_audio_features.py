"""Audio decoding (paths, pipes, ark offsets, segments, broken files), resampling and fbank."""
import math

import kaldi_native_fbank as knf
import kaldiio
import numpy as np
import pytest
import soundfile as sf

from toolkit.data.audio import BadEntry, check_and_mix, read_audio, resample
from toolkit.data.augment import load_mono
from toolkit.data.features import compute_fbank, fbank_options, num_frames

RATE = 16000


def sine(freq, rate, seconds, amp=0.5, phase=0.0):
    t = np.arange(int(round(rate * seconds))) / rate
    return (amp * np.sin(2 * np.pi * freq * t + phase)).astype(np.float32)


def write_wav(path, data, rate=RATE, subtype="PCM_16"):
    sf.write(str(path), data, rate, subtype=subtype)
    return str(path)


def reason(fn, *args, **kwargs):
    with pytest.raises(BadEntry) as err:
        fn(*args, **kwargs)
    return err.value.reason


@pytest.fixture
def pcm(tmp_path):
    rng = np.random.default_rng(0)
    ints = (rng.standard_normal(RATE) * 3000).clip(-32768, 32767).astype(np.int16)
    path = write_wav(tmp_path / "a.wav", ints)
    return path, ints


# ----------------------------------------------------------------------------- decoding

def test_read_real_wav(pcm):
    path, ints = pcm
    audio, rate = read_audio(path)
    assert rate == RATE
    assert audio.shape == (len(ints), 1) and audio.dtype == np.float32
    np.testing.assert_array_equal(audio[:, 0], ints.astype(np.float32) / 32768.0)


def test_truncated_wav(tmp_path, pcm):
    path, _ = pcm
    data = open(path, "rb").read()
    cut = tmp_path / "cut.wav"
    cut.write_bytes(data[:-1000])
    assert reason(read_audio, str(cut)) == "truncated_audio"
    # The intact file is fine.
    read_audio(path)


def test_missing_file(tmp_path):
    assert reason(read_audio, str(tmp_path / "nope.wav")) == "missing_file"


def test_garbage_bytes(tmp_path):
    bad = tmp_path / "garbage.wav"
    bad.write_bytes(np.random.default_rng(1).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    assert reason(read_audio, str(bad)) == "unreadable_audio"


def test_nan_samples(tmp_path):
    x = sine(300, RATE, 0.2)
    x[100] = np.nan
    path = write_wav(tmp_path / "nan.wav", x, subtype="FLOAT")
    audio, _ = read_audio(path)          # decodes; the content check is separate
    assert np.isnan(audio).any()
    assert reason(check_and_mix, audio, path) == "nonfinite_samples"
    assert reason(load_mono, path, RATE) == "nonfinite_samples"


def test_silent_audio(tmp_path):
    path = write_wav(tmp_path / "zero.wav", np.zeros(4000, dtype=np.int16))
    assert reason(load_mono, path, RATE) == "silent_audio"


def test_stereo_mixdown_and_channel_selection(tmp_path):
    left = sine(300, RATE, 0.1, amp=0.5)
    right = sine(700, RATE, 0.1, amp=0.25)
    path = write_wav(tmp_path / "st.wav", np.stack([left, right], axis=1), subtype="FLOAT")
    audio, _ = read_audio(path)
    assert audio.shape == (len(left), 2)
    np.testing.assert_allclose(check_and_mix(audio, path), (left + right) / 2, atol=1e-7)
    np.testing.assert_array_equal(check_and_mix(audio, path, channel=0), left)
    np.testing.assert_array_equal(check_and_mix(audio, path, channel=1), right)
    assert reason(check_and_mix, audio, path, channel=2) == "bad_channel_count"
    assert reason(check_and_mix, audio, path, expected_channels=1) == "bad_channel_count"
    np.testing.assert_array_equal(load_mono(path, RATE, channel=1), right)


def test_pipe_source(pcm):
    path, ints = pcm
    audio, rate = read_audio(f"cat {path} |")
    assert rate == RATE
    np.testing.assert_array_equal(audio[:, 0], ints.astype(np.float32) / 32768.0)
    seg, _ = read_audio(f"cat {path} |", start=0.25, end=0.5)
    np.testing.assert_array_equal(seg[:, 0], ints[4000:8000].astype(np.float32) / 32768.0)
    assert reason(read_audio, f"cat {path}.missing |") == "pipe_failed"
    assert reason(read_audio, "head -c 10 /dev/zero |") == "unreadable_audio"


def test_ark_offset_source(tmp_path):
    rng = np.random.default_rng(2)
    a = (rng.standard_normal(8000) * 2000).astype(np.int16)
    b = (rng.standard_normal(4000) * 2000).astype(np.int16)
    ark, scp = str(tmp_path / "wav.ark"), str(tmp_path / "wav.scp")
    kaldiio.save_ark(ark, {"utt_a": (RATE, a), "utt_b": (8000, b)}, scp=scp)
    table = dict(line.split(maxsplit=1) for line in open(scp).read().splitlines())
    assert table["utt_b"].startswith(ark + ":")
    audio, rate = read_audio(table["utt_b"])
    assert rate == 8000
    np.testing.assert_array_equal(audio[:, 0], b.astype(np.float32) / 32768.0)
    audio, rate = read_audio(table["utt_a"], start=0.1, end=0.2)
    assert rate == RATE
    np.testing.assert_array_equal(audio[:, 0], a[1600:3200].astype(np.float32) / 32768.0)
    # A bad offset in an existing ark is unreadable, not a crash.
    assert reason(read_audio, ark + ":1") == "unreadable_audio"


def test_segments_on_file(pcm):
    path, ints = pcm
    audio, _ = read_audio(path, start=0.1, end=0.3)
    np.testing.assert_array_equal(audio[:, 0], ints[1600:4800].astype(np.float32) / 32768.0)
    audio, _ = read_audio(path, start=0.5)
    np.testing.assert_array_equal(audio[:, 0], ints[8000:].astype(np.float32) / 32768.0)


def test_load_mono_resamples_to_target_rate(tmp_path):
    x = sine(440, 8000, 0.5)
    path = write_wav(tmp_path / "n.wav", x, rate=8000, subtype="FLOAT")
    wave = load_mono(path, RATE)
    assert len(wave) == 2 * len(x)


# ----------------------------------------------------------------------------- resampling

@pytest.mark.parametrize("orig, new", [(22050, 16000), (16000, 8000), (8000, 16000)])
def test_resample_keeps_frequency_and_amplitude(orig, new):
    freq, n = 440.0, int(orig * 0.5)
    x = sine(freq, orig, n / orig, amp=1.0, phase=0.3)
    y = resample(x, orig, new)
    g = math.gcd(orig, new)
    assert len(y) == math.ceil(n * (new // g) / (orig // g))
    assert y.dtype == np.float32
    # FFT peak of the (windowed) output sits at 440 Hz.
    spec = np.abs(np.fft.rfft(y * np.hanning(len(y))))
    freqs = np.fft.rfftfreq(len(y), 1.0 / new)
    assert abs(freqs[np.argmax(spec)] - freq) <= new / len(y)
    # Away from the edges the output is the same sine sampled at the new rate:
    # same amplitude, same frequency and no time shift.
    t = np.arange(len(y)) / new
    ideal = np.sin(2 * np.pi * freq * t + 0.3)
    mid = slice(len(y) // 10, len(y) - len(y) // 10)
    assert np.max(np.abs(y[mid])) == pytest.approx(1.0, abs=1e-3)
    assert np.max(np.abs(y[mid] - ideal[mid])) < 1e-3


def test_resample_identity_and_empty():
    x = sine(440, RATE, 0.01)
    assert resample(x, RATE, RATE) is x
    assert len(resample(np.zeros(0, dtype=np.float32), RATE, 8000)) == 0


def test_resample_removes_content_above_new_nyquist():
    # 6 kHz cannot exist at 8 kHz: it must be filtered out, not aliased to 2 kHz.
    x = sine(6000, RATE, 0.5, amp=1.0)
    y = resample(x, RATE, 8000)
    mid = y[len(y) // 10: -len(y) // 10]
    assert np.sqrt(np.mean(mid ** 2)) < 0.01


# ----------------------------------------------------------------------------- features

@pytest.mark.parametrize("n", [399, 400, 401, 559, 560, 16000, 12345])
def test_fbank_frame_count(n):
    opts = fbank_options()
    wave = np.random.default_rng(n).uniform(-0.5, 0.5, n).astype(np.float32)
    feats = compute_fbank(wave, opts)
    expected = 0 if n < 400 else 1 + (n - 400) // 160
    assert feats.shape == (expected, 40)
    assert feats.dtype == np.float32
    assert num_frames(n, opts) == expected
    assert num_frames(n, RATE) == expected


def test_fbank_streaming_equals_offline():
    opts = fbank_options(num_mel_bins=40)
    rng = np.random.default_rng(3)
    wave = (sine(500, RATE, 1.0) + rng.uniform(-0.1, 0.1, RATE)).astype(np.float32)
    offline = compute_fbank(wave, opts)
    online = knf.OnlineFbank(opts)
    pos = 0
    while pos < len(wave):
        step = int(rng.integers(1, 700))
        online.accept_waveform(float(RATE), (wave[pos:pos + step] * 32768.0).astype(np.float32))
        pos += step
    online.input_finished()
    assert online.num_frames_ready == len(offline)
    streamed = np.stack([online.get_frame(i) for i in range(online.num_frames_ready)])
    np.testing.assert_allclose(streamed, offline, atol=1e-5, rtol=0)


def test_fbank_is_log_energy_of_int16_scaled_input():
    # Doubling the signal quadruples every mel energy: +log(4) in every bin. This holds
    # only if the features are log energies of a linear function of the input.
    opts = fbank_options()
    wave = np.random.default_rng(4).uniform(-0.2, 0.2, 8000).astype(np.float32)
    a = compute_fbank(wave, opts)
    b = compute_fbank(2 * wave, opts)
    np.testing.assert_allclose(b - a, np.log(4.0), atol=1e-3)
    # Kaldi works on int16-scaled samples: scaling by 32768 adds 2*log(32768) ~ 20.8 to
    # every log energy compared with [-1, 1] input (which would average ~1 here).
    assert a.mean() > 10.0


def test_compute_feats_speed_copies(tmp_path):
    """3-way speed perturbation of a training list: each utterance plus copies at 0.9 and
    1.1 whose features match speeding the audio up, with Kaldi's sp<factor>- keys."""
    import json
    import subprocess
    import sys

    import kaldiio

    from kws_data import make_datalist
    from toolkit.data import augment
    from toolkit.data.features import compute_fbank, options_from_config
    from toolkit.config import DatasetConfig

    src = make_datalist(str(tmp_path), "train", 2, 2, 5)
    out = tmp_path / "fbank"
    cmd = [sys.executable, "-m", "toolkit.bin.compute_feats", src, str(out), "--nj", "2",
           "--speed-copies", "0.9,1.1"]
    subprocess.run(cmd, check=True, capture_output=True)
    entries = {e["key"]: e for e in map(json.loads, open(out / "data.list"))}
    originals = [json.loads(line) for line in open(src)]
    assert len(entries) == 3 * len(originals)
    opts = options_from_config(DatasetConfig().feature, 16000)
    for orig in originals:
        for factor in (0.9, 1.1):
            copy = entries[f"sp{factor:g}-{orig['key']}"]
            assert copy["label"] == orig["label"] and copy["speed"] == factor
            assert copy["duration"] == pytest.approx(orig["duration"] / factor, abs=1e-3)
            if "kw_end" in orig:     # the keyword is heard earlier in a faster copy
                assert copy["kw_end"] == pytest.approx(orig["kw_end"] / factor, abs=1e-3)
                assert copy["kw_start"] == pytest.approx(orig["kw_start"] / factor, abs=1e-3)
            wave = augment.load_mono(orig["wav"], 16000, DatasetConfig().channel, 0.0, -1.0)
            expected = compute_fbank(augment.speed_perturb(wave, 16000, factor), opts)
            got = kaldiio.load_mat(copy["feat"])
            assert got.shape == expected.shape
            assert np.abs(got - expected).max() < 1e-4
        assert kaldiio.load_mat(entries[orig["key"]]["feat"]).shape[0] > 0
    bad = subprocess.run(cmd[:-1] + ["1.0,1.1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "other than 1" in bad.stderr


@pytest.mark.parametrize("factor", [0.9, 1.12])
def test_vtlp_moves_a_tone_like_a_talker_with_scaled_formants(factor):
    """Warping the fbank of a 1500 Hz tone by `factor` gives (nearly) the fbank of a tone
    at 1500*factor Hz: same peak bin, and a log-mel profile around it far closer to that
    tone's than the unwarped one is."""
    from toolkit.data.augment import mel_bin_centers_hz, warp_frequency
    opts = fbank_options(40, 25.0, 10.0, 0.0, RATE)
    t = np.arange(RATE // 2) / RATE
    fbank = lambda hz: compute_fbank(0.3 * np.sin(2 * np.pi * hz * t), opts)
    centers = mel_bin_centers_hz(40, opts.mel_opts.low_freq, RATE / 2)
    warped = warp_frequency(fbank(1500.0), factor, centers)
    target = fbank(1500.0 * factor)
    assert warped.shape == target.shape and warped.dtype == np.float32
    assert np.all(warped.argmax(axis=1) == target.argmax(axis=1))
    peak = int(target[10].argmax())
    near = slice(peak - 3, peak + 4)
    err = lambda x: float(np.sqrt(np.mean((x[10, near] - target[10, near]) ** 2)))
    assert err(warped) < 0.4 * err(fbank(1500.0))
    assert fbank(1500.0)[10].argmax() != peak        # unwarped, the tone sits elsewhere
    np.testing.assert_array_equal(warp_frequency(target, 1.0, centers), target)


def test_two_band_warp_moves_low_and_high_formants_by_their_own_factors():
    """F1 region x0.8, above 1 kHz slope 1.2 (continuous at the knee): a 500 Hz tone lands
    where a 400 Hz tone is, a 3000 Hz one where 0.8*1000 + 1.2*2000 = 3200 Hz is."""
    from toolkit.data.augment import mel_bin_centers_hz, warp_frequency
    opts = fbank_options(40, 25.0, 10.0, 0.0, RATE)
    t = np.arange(RATE // 2) / RATE
    fbank = lambda hz: compute_fbank(0.3 * np.sin(2 * np.pi * hz * t), opts)
    centers = mel_bin_centers_hz(40, opts.mel_opts.low_freq, RATE / 2)
    for source, target in ((500.0, 400.0), (3000.0, 3200.0)):
        warped = warp_frequency(fbank(source), 0.8, centers, 1.2, 1000.0)
        want = fbank(target)
        assert np.all(warped.argmax(axis=1) == want.argmax(axis=1)), (source, target)
        assert fbank(source)[10].argmax() != want[10].argmax()
    # Equal factors are the one-factor warp, whatever the split.
    x = fbank(1500.0)
    np.testing.assert_array_equal(warp_frequency(x, 0.9, centers, 0.9, 700.0),
                                  warp_frequency(x, 0.9, centers))


def test_tilt_adds_a_linear_slope_in_db():
    from toolkit.data.augment import tilt_spectrum
    x = np.random.default_rng(0).normal(size=(7, 40)).astype(np.float32)
    y = tilt_spectrum(x, 6.0) - x
    # Natural-log energies: +6 dB from the lowest to the highest bin is ln(10) * 0.6.
    assert y[:, -1] - y[:, 0] == pytest.approx(np.full(7, np.log(10) * 0.6), rel=1e-5)
    np.testing.assert_allclose(np.diff(y, axis=1), np.log(10) * 0.6 / 39, rtol=1e-4)
    assert abs(float(y.mean())) < 1e-6                  # centred: overall level unchanged
    assert tilt_spectrum(x, 0.0) is x
