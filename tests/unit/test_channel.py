"""The channel conditions of condition copies (toolkit.voicebank.channel) on real speech
(espeak-ng, the tts extra) and noise, through the real codecs (the codec extra): the
telephone band by the energy it leaves above 3.6 kHz, mu-law's round-trip error, the
clipped fraction, the EQ's spectrum and timing, Codec2 and Opus kept in time and near
their input, the chain sampler's settings and labels."""
import math
import tempfile

import numpy as np
import pytest

from toolkit.errors import ConfigError
from toolkit.voicebank import channel as ch
from toolkit.voicebank.signal import colored_noise

SR = 16000


@pytest.fixture(scope="module")
def speech():
    """One espeak-ng sentence at 16 kHz, peak 0.3."""
    from toolkit.data.audio import resample
    from toolkit.voicebank import Voice
    from toolkit.voicebank.engines import EspeakEngine
    spoken = EspeakEngine(tempfile.mkdtemp()).synth(
        "Please call Stella and ask her to bring these things with her from the store.",
        Voice("en-us", "espeak", "en-us"))
    wave = resample(spoken.audio, spoken.sample_rate, SR)
    return (0.3 * wave / np.abs(wave).max()).astype(np.float32)


def white(seconds=3.0, seed=0):
    return 0.1 * colored_noise(int(seconds * SR), "white", np.random.default_rng(seed))


def band_share_db(x, low_hz, high_hz, rate=SR):
    """Energy between the two frequencies over all the energy, dB."""
    power = np.abs(np.fft.rfft(x)) ** 2
    freqs = np.fft.rfftfreq(len(x), 1.0 / rate)
    return 10 * np.log10(power[(freqs >= low_hz) & (freqs < high_hz)].sum() / power.sum())


def envelopes(x, hop=160, win=400):
    """(frames, 8) log energies of 8 bands 150-3600 Hz, 10 ms hop, each band zero-mean."""
    n = 1 + (len(x) - win) // hop
    frames = np.stack([x[i * hop:i * hop + win] for i in range(n)]) * np.hanning(win)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    freqs = np.fft.rfftfreq(win, 1.0 / SR)
    edges = np.geomspace(150, 3600, 9)
    bands = np.stack([power[:, (freqs >= a) & (freqs < b)].sum(1)
                      for a, b in zip(edges[:-1], edges[1:])], 1)
    e = np.log10(bands + 1e-10)
    return e - e.mean(0)


def envelope_match(x, y, max_lag=5):
    """(correlation of the band envelopes at lag 0, the lag in 10 ms frames within
    +-max_lag where they correlate best)."""
    a, b = envelopes(x), envelopes(y)
    scores = []
    for lag in range(-max_lag, max_lag + 1):
        aa, bb = (a[:len(a) - lag], b[lag:]) if lag >= 0 else (a[-lag:], b[:len(b) + lag])
        scores.append(float((aa * bb).sum() / np.sqrt((aa * aa).sum() * (bb * bb).sum())))
    return scores[max_lag], int(np.argmax(scores)) - max_lag


def snr_db(x, y):
    return 10 * np.log10(np.sum(x.astype(np.float64) ** 2) / np.sum((x - y) ** 2.0))


def test_the_telephone_band_leaves_nothing_above_3600_hz_or_below_250():
    x = white()
    assert band_share_db(x, 3600, 8000) > -3           # white noise: half the band
    for y in (ch.telephone(x, SR), ch.telephone_band(x, SR)):
        assert len(y) == len(x) and y.dtype == np.float32
        assert band_share_db(y, 3600, 8000) < -45
        assert band_share_db(y, 0, 250) < -35
        assert band_share_db(y, 250, 3600) > -0.3       # the pass band carries it all
    # The band alone passes 500-3000 Hz unchanged in level (within 0.5 dB).
    band = ch.telephone_band(x, SR)
    kept = np.abs(np.fft.rfft(band)) ** 2 / (np.abs(np.fft.rfft(x)) ** 2 + 1e-20)
    freqs = np.fft.rfftfreq(len(x), 1.0 / SR)
    assert abs(10 * np.log10(kept[(freqs > 500) & (freqs < 3000)].mean())) < 0.5
    # Another rate works the same way.
    x22 = 0.1 * colored_noise(22050 * 2, "white", np.random.default_rng(1), 22050)
    y22 = ch.telephone(x22, 22050)
    assert len(y22) == len(x22) and band_share_db(y22, 3600, 11025, 22050) < -45


def test_the_telephone_keeps_speech_in_time(speech):
    y = ch.telephone(speech, SR)
    corr, lag = envelope_match(speech, y)
    assert lag == 0 and corr > 0.8
    assert snr_db(speech, y) > 5                      # waveform kept, band-limited


def test_mulaw_round_trip_error_is_within_half_a_step():
    x = np.linspace(-1, 1, 20001)
    err = np.abs(ch.mulaw(x, 8) - x)
    # Half a step of the companded grid, mapped back: (1 + 255|x|) ln(256) / 255^2 (2 %
    # more: the slope grows within the step).
    assert np.all(err <= 1.02 * (1 + 255 * np.abs(x)) * math.log(256) / 255 ** 2 + 1e-6)
    assert err.max() > 0.005                          # it does quantize (8 bits)
    # 8 bits: about 38 dB SNR on noise at a speech level; 4 bits much less.
    noise = white()
    assert 35 < snr_db(noise, ch.mulaw(noise, 8)) < 42
    assert snr_db(noise, ch.mulaw(noise, 4)) < 20


@pytest.mark.parametrize("fraction", [0.01, 0.05, 0.10])
def test_clipping_clips_the_asked_fraction(speech, fraction):
    for x in (white(), speech):
        y = ch.clip(x, fraction)
        level = np.abs(y).max()
        clipped = np.mean(np.abs(y) >= level)
        assert abs(clipped - fraction) < 0.002, (clipped, fraction)
        kept = np.abs(x) < level
        assert np.array_equal(y[kept], x[kept]) and len(y) == len(x)
    with pytest.raises(ValueError):
        ch.clip(white(), 0.0)


def test_mic_colouring_changes_the_spectrum_as_drawn_but_not_length_or_timing():
    rng = np.random.default_rng(5)
    settings = ch.ConditionSettings()
    x = white(seconds=4.0)
    for _ in range(3):
        bands = ch._eq_bands(rng, settings, SR)
        assert 2 <= len(bands) <= 4
        assert all(3.0 <= abs(b["gain_db"]) <= 10.0 for b in bands)
        y = ch.mic_colouring(x, SR, bands)
        assert len(y) == len(x)
        # Measured gain (Welch-averaged) against the biquads' product, 100-7000 Hz.
        seg = 1024
        frames = lambda s: np.stack([s[i:i + seg] for i in range(0, len(s) - seg, seg // 2)])
        px = (np.abs(np.fft.rfft(frames(x) * np.hanning(seg), axis=1)) ** 2).mean(0)
        py = (np.abs(np.fft.rfft(frames(y) * np.hanning(seg), axis=1)) ** 2).mean(0)
        freqs = np.fft.rfftfreq(seg, 1.0 / SR)
        target = np.ones_like(freqs)
        for b in bands:
            target *= ch.biquad_magnitude(b["kind"], b["f0"], b["gain_db"], b["q"], freqs, SR)
        sel = (freqs > 100) & (freqs < 7000)
        measured = 10 * np.log10(py[sel] / px[sel])
        wanted = 20 * np.log10(target[sel])
        assert np.median(np.abs(measured - wanted)) < 0.5
        assert wanted.max() - wanted.min() > 3        # it is a colouring, not a gain
    click = np.zeros(8000, np.float32)
    click[4000] = 1.0
    assert int(np.argmax(np.abs(ch.mic_colouring(click, SR, bands)))) == 4000  # zero phase


@pytest.mark.parametrize("mode", ["3200", "2400", "1600", "1200", "700C"])
def test_codec2_keeps_length_time_and_envelope(speech, mode):
    y = ch.codec2(speech, SR, mode)
    assert len(y) == len(speech) and y.dtype == np.float32
    corr, lag = envelope_match(speech, y)
    # A vocoder: the waveform differs (random phases), the band envelopes follow the
    # input in time; noise, silence or a 30 ms shift fall below these bounds.
    assert abs(lag) <= 1, lag
    assert corr > (0.6 if mode == "700C" else 0.75), corr
    assert np.sqrt(np.mean(y ** 2)) > 0.3 * np.sqrt(np.mean(speech ** 2))
    noise = np.random.default_rng(0).standard_normal(len(speech)).astype(np.float32) * 0.05
    assert envelope_match(speech, noise)[0] < 0.2
    assert envelope_match(speech, np.concatenate([np.zeros(480, np.float32),
                                                  speech[:-480]]))[1] >= 2


@pytest.mark.parametrize("kbps", [6, 12, 24])
def test_opus_keeps_length_and_waveform(speech, kbps):
    y = ch.opus(speech, SR, kbps)
    assert len(y) == len(speech) and y.dtype == np.float32
    corr, lag = envelope_match(speech, y)
    assert lag == 0 and corr > 0.85
    # A waveform codec here: SNR grows with the rate (a delayed or broken output is < 0).
    assert snr_db(speech, y) > {6: 0.5, 12: 4.0, 24: 5.5}[kbps]
    assert snr_db(speech, np.concatenate([np.zeros(48, np.float32), speech[:-48]])) < 0


def test_a_room_keeps_the_direct_path_in_place():
    rng = np.random.default_rng(2)
    click = np.zeros(SR, np.float32)
    click[8000] = 1.0
    for kind in ("small", "medium", "large"):
        room = ch.room_at_distance(rng, kind, (0.5, 4.0))
        assert 0.3 <= room.distance() <= 4.0 + 1e-9
        y = ch.reverberate(click, SR, room)
        assert len(y) == len(click) and int(np.argmax(np.abs(y))) == 8000
        assert np.sum(y[8010:] ** 2) > 0.05 * np.sum(y ** 2)    # a tail follows


def test_distances_are_drawn_across_the_range():
    rng = np.random.default_rng(0)
    d = [ch.room_at_distance(rng, "large", (0.5, 4.0)).distance() for _ in range(200)]
    assert min(d) < 1.0 and max(d) > 3.0 and all(0.45 < v < 4.01 for v in d)


def test_the_sampler_follows_its_settings_and_labels_the_chain():
    settings = ch.ConditionSettings()
    chains = [ch.sample_chain(np.random.default_rng([7, i]), settings, SR) for i in range(2000)]
    share = lambda kind: np.mean([c.step(kind) is not None for c in chains])
    assert abs(share("room") - 0.5) < 0.04 and abs(share("noise") - 0.6) < 0.04
    assert abs(share("clip") - 0.1) < 0.03
    transmitted = np.mean([any(c.step(k) for k in ch.TRANSMISSIONS) for c in chains])
    assert abs(transmitted - 0.7 * 3 / 4) < 0.04
    labels = [c.label for c in chains]
    assert "clean" in labels
    example = next(c for c in chains if c.step("room") and c.step("noise") and c.step("codec2"))
    import re
    assert re.fullmatch(r"room:(small|medium|large)/\d+\.\dm\+noise:(white|pink|brown|babble)/"
                        r"\d+\.\ddB\+(mic:eq\d\+)?(clip:\d+\.\d%\+)?codec2:(3200|2400|1600|"
                        r"1200|700C)", example.label), example.label
    order = ["whisper", "room", "noise", "mic", "clip", "telephone", "codec2", "opus"]
    for c in chains:
        kinds = [s.kind for s in c.steps]
        assert kinds == sorted(kinds, key=order.index)
        assert sum(k in ch.TRANSMISSIONS for k in kinds) <= 1
    # The same generator state gives the same chain; babble is left out when not offered.
    assert ch.sample_chain(np.random.default_rng(3), settings, SR).label == \
        ch.sample_chain(np.random.default_rng(3), settings, SR).label
    lone = [ch.sample_chain(np.random.default_rng([8, i]), settings, SR, babble=False)
            for i in range(300)]
    assert not any("babble" in c.label for c in lone)
    # Turning one condition off changes no other's draws.
    no_clip = ch.ConditionSettings(clip_prob=0.0)
    for i in range(50):
        a = ch.sample_chain(np.random.default_rng([9, i]), settings, SR).label
        b = ch.sample_chain(np.random.default_rng([9, i]), no_clip, SR).label
        assert b == "+".join(p for p in a.split("+") if not p.startswith("clip:")) or \
            (b == "clean" and all(p.startswith("clip:") for p in a.split("+")))


def test_the_chain_keeps_length_and_level(speech):
    settings = ch.ConditionSettings(room_prob=1, noise_prob=1, channel_prob=1,
                                    mic_also_prob=1, clip_prob=1, channels=("codec2",),
                                    noise_kinds=("babble",))
    chain = ch.sample_chain(np.random.default_rng(0), settings, SR)
    assert [s.kind for s in chain.steps] == ["room", "noise", "mic", "clip", "codec2"]
    from toolkit.voicebank.signal import active_power
    y = ch.apply_chain(speech, SR, chain, np.random.default_rng(1), [speech[::-1].copy()])
    assert len(y) == len(speech)
    assert abs(10 * np.log10(active_power(y) / active_power(speech))) < 0.1


def voicing(x, rate=SR):
    """Cepstral peak prominence at 2.5-12.5 ms quefrency (pitch 80-400 Hz), the mean over
    the louder half of 64 ms frames: the harmonics of a voice (0.21 for espeak-ng here),
    none in noise (0.07)."""
    win, window, frames = 1024, np.hanning(1024), []
    for i in range(0, len(x) - win, win // 2):
        f = x[i:i + win] * window
        c = np.fft.irfft(np.log(np.abs(np.fft.rfft(f)) + 1e-9))
        seg = c[int(0.0025 * rate):int(0.0125 * rate)]
        frames.append((np.sum(f ** 2), seg.max() - np.median(seg)))
    frames.sort(reverse=True)
    return float(np.mean([p for _, p in frames[:len(frames) // 2]]))


def test_whisper_keeps_the_formants_and_drops_the_voicing(speech):
    from toolkit.data.augment import whisper
    y = whisper(speech, SR, np.random.default_rng(0), 1.0)
    assert y.dtype == np.float32 and len(y) == len(speech)
    assert abs(np.sqrt(np.mean(y ** 2)) / np.sqrt(np.mean(speech ** 2)) - 1) < 0.01
    assert voicing(speech) > 0.15 and voicing(y) < 0.09         # 0.21 and 0.07 here
    # the spectral envelope stays: each band's share of the energy within 3 dB
    for low, high in ((100, 1000), (1000, 3000), (3000, 6000)):
        assert abs(band_share_db(y, low, high) - band_share_db(speech, low, high)) < 3.0
    # the phones stay where they were: energy envelopes follow the original's
    assert np.corrcoef(envelopes(y).ravel(), envelopes(speech).ravel())[0, 1] > 0.8
    np.testing.assert_array_equal(y, whisper(speech, SR, np.random.default_rng(0), 1.0))
    half = whisper(speech, SR, np.random.default_rng(0), 0.5)
    assert voicing(y) < voicing(half) < voicing(speech)
    assert len(whisper(np.zeros(0, np.float32), SR, np.random.default_rng(0))) == 0


def test_whispering_in_a_chain_comes_first_and_moves_no_other_draw(speech):
    settings = ch.ConditionSettings()
    whispered = ch.ConditionSettings(whisper_prob=1.0, breath=(0.8, 0.8))
    for i in range(50):
        a = ch.sample_chain(np.random.default_rng([9, i]), settings, SR)
        b = ch.sample_chain(np.random.default_rng([9, i]), whispered, SR)
        assert b.steps[0].kind == "whisper" and b.label.startswith("whisper:0.80")
        assert [s.label for s in b.steps[1:]] == [s.label for s in a.steps]
    half = [ch.sample_chain(np.random.default_rng([10, i]), ch.ConditionSettings(
        whisper_prob=0.3), SR) for i in range(1000)]
    assert abs(np.mean([c.step("whisper") is not None for c in half]) - 0.3) < 0.05
    chain = ch.Chain([ch.Step("whisper", "whisper:1.00", {"breath": 1.0})])
    y = ch.apply_chain(speech, SR, chain, np.random.default_rng(1))
    assert len(y) == len(speech) and voicing(y) < 0.09
    # stamps of copies made before whispering existed stay the same while it is off
    assert "whisper_prob" not in ch.settings_dict(settings)
    assert ch.settings_dict(whispered)["breath"] == [0.8, 0.8]


@pytest.mark.parametrize("bad, match", [
    ({"room_prob": 1.5}, "room_prob"), ({"snr_db": (20.0, 5.0)}, "snr_db"),
    ({"channels": ("radio",)}, "channels radio"), ({"codec2_modes": ("450",)}, "codec2_modes"),
    ({"opus_kbps": (2, 24)}, "opus_kbps"), ({"noise_kinds": ()}, "noise_kinds"),
    ({"clip_fraction": (0.0, 0.1)}, "clip_fraction"), ({"whisper_prob": -0.1}, "whisper_prob"),
    ({"breath": (0.0, 1.0)}, "breath"), ({"breath": (0.9, 0.5)}, "breath")])
def test_bad_settings_name_the_setting(bad, match):
    with pytest.raises(ConfigError, match=match):
        ch.ConditionSettings(**bad).check()
    ch.ConditionSettings(noise_prob=0.0, noise_kinds=()).check()   # not drawn: may be empty
