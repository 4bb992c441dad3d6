"""Channel conditions of speech as plain numpy functions, and the seeded chain of them that
a condition copy of a data dir puts each utterance through (toolkit.voicebank.conditions).

Every transform takes a float waveform at its own rate and returns float32 of the same
length, time-aligned with the input (the phones of a transcript keep their times):

  reverberate   a room by the image method (toolkit.data.rir): small, medium or large, the
                microphone at a drawn distance; convolved and aligned on the direct path
                (toolkit.data.augment.add_reverb), so the path's delay is removed.
  (noise)       toolkit.voicebank.signal: background_noise and mix_at_snr.
  telephone     the telephone band: resampled to 8 kHz, band-passed 300-3400 Hz (a
                zero-phase windowed-sinc FIR), mu-law companded to 8 bits (G.711's law,
                mu = 255, without its segment approximation), band-passed again (the
                receiving end), resampled back; mulaw_bits=0 gives the band alone.
  mulaw         mu-law companding to `bits` at the signal's own rate.
  mic_colouring a random smooth EQ, the colouring of a cheap microphone or a laptop's
                case: 2-4 bands (low shelf, peaking, high shelf; the RBJ audio-EQ
                cookbook's magnitude responses) of 3-10 dB either way, applied as one
                zero-phase linear-phase FIR (511 taps, Hann window), so the EQ moves no
                phone in time.
  clip          hard clipping at the level that `fraction` of the samples exceed.
  whisper       whispered speech from voiced speech: the voice source replaced by noise
                under each frame's spectral envelope (formants kept, harmonics gone);
                `breath` is the noise's share (toolkit.data.augment.whisper). No
                synthesizer of the bank whispers.
  codec2        Codec2 (MODE 3200/2400/1600/1200/700C) and Opus at KBPS, through
  opus          toolkit.data.speech_codecs (the pinned `codec` extra: pycodec2==4.1.1,
                av==18.1.0); Codec2's algorithmic delay (CODEC2_DELAY_MS, measured on
                espeak-ng speech) is taken out; Opus's decoder drops its own pre-skip.

A chain (`sample_chain`) is drawn per utterance from ConditionSettings: whispering (off
by default), a room, noise, then one transmission channel (telephone, Codec2, Opus) or
microphone colouring alone, clipping; `apply_chain` runs it (whisper, room, noise, back to
the input's active level, mic, clip, transmission, back to the input's active level) and
`Chain.label` names it, e.g. `room:medium/2.1m+noise:babble/8.3dB+codec2:1600`.
"""
import math
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Sequence, Tuple

import numpy as np

from toolkit.data.audio import resample
from toolkit.data.augment import whisper
from toolkit.data.rir import ROOM_SIZES, Room, image_method_rir, random_room
from toolkit.data.speech_codecs import (CODEC2_MODES, OPUS_KBPS_RANGE, codec2_codec,
                                        fit_length, mulaw_decode, mulaw_encode, opus_codec)
from toolkit.errors import ConfigError
from toolkit.voicebank.signal import NOISE_TYPES, active_power, background_noise, mix_at_snr

TELEPHONE_RATE = 8000
TELEPHONE_BAND_HZ = (300.0, 3400.0)
BAND_TAPS = 255                 # the telephone band-pass at 8 kHz (31.9 ms)
EQ_TAPS = 511                   # the microphone EQ's FIR
# Codec2's algorithmic delay in ms per mode, removed: toolkit.tasks.codec.delay's estimate
# over 12 espeak-ng utterances (1400 and 1300: 3), 16 kHz in and out; the utterances
# scatter about +-3 ms around it (+-6 ms for 700C), well inside a 10 ms feature frame.
CODEC2_DELAY_MS = {"3200": 18.0, "2400": 18.0, "1600": 18.0, "1400": 18.0, "1300": 21.0,
                   "1200": 18.0, "700C": 31.0}
TRANSMISSIONS = ("telephone", "codec2", "opus")
CHANNELS = TRANSMISSIONS + ("mic",)
EQ_KINDS = ("lowshelf", "peaking", "highshelf")


# --------------------------------------------------------------------------- filters

def fir_same(x: np.ndarray, taps: np.ndarray) -> np.ndarray:
    """`x` through the odd-length FIR `taps`, centred (a symmetric filter: zero phase), the
    same length as `x` (FFT convolution)."""
    x = np.asarray(x, dtype=np.float64)
    if len(taps) % 2 != 1:
        raise ValueError(f"expected an odd number of taps, got {len(taps)}")
    if len(x) == 0:
        return x.astype(np.float32)
    n = len(x) + len(taps) - 1
    size = 1 << (n - 1).bit_length()
    y = np.fft.irfft(np.fft.rfft(x, size) * np.fft.rfft(taps, size), size)
    half = len(taps) // 2
    return y[half:half + len(x)].astype(np.float32)


def bandpass_taps(rate: int, low_hz: float, high_hz: float, n_taps: int = BAND_TAPS
                  ) -> np.ndarray:
    """A linear-phase band-pass (windowed sinc, Blackman window: about -74 dB stop band)."""
    if not 0 < low_hz < high_hz < rate / 2:
        raise ValueError(f"band {low_hz:g}-{high_hz:g} Hz outside (0, {rate / 2:g})")
    t = np.arange(n_taps) - (n_taps - 1) / 2
    ideal = (2 * high_hz / rate) * np.sinc(2 * high_hz / rate * t) - \
        (2 * low_hz / rate) * np.sinc(2 * low_hz / rate * t)
    return ideal * np.blackman(n_taps)


def biquad_magnitude(kind: str, f0: float, gain_db: float, q: float, freqs: np.ndarray,
                     rate: int) -> np.ndarray:
    """|H| at `freqs` (Hz) of one RBJ cookbook biquad: lowshelf / highshelf (shelf slope
    from `q`) or peaking, `gain_db` at the shelf or the peak."""
    a = 10 ** (gain_db / 40)
    w0 = 2 * math.pi * f0 / rate
    alpha = math.sin(w0) / (2 * q)
    cw = math.cos(w0)
    if kind == "peaking":
        b = (1 + alpha * a, -2 * cw, 1 - alpha * a)
        den = (1 + alpha / a, -2 * cw, 1 - alpha / a)
    elif kind in ("lowshelf", "highshelf"):
        s = 1 if kind == "lowshelf" else -1
        root = 2 * math.sqrt(a) * alpha
        b = (a * ((a + 1) - s * (a - 1) * cw + root), s * 2 * a * ((a - 1) - s * (a + 1) * cw),
             a * ((a + 1) - s * (a - 1) * cw - root))
        den = ((a + 1) + s * (a - 1) * cw + root, -s * 2 * ((a - 1) + s * (a + 1) * cw),
               (a + 1) + s * (a - 1) * cw - root)
    else:
        raise ValueError(f"EQ band kind {kind!r}: expected one of {', '.join(EQ_KINDS)}")
    z = np.exp(-1j * 2 * math.pi * np.asarray(freqs, np.float64) / rate)
    return np.abs((b[0] + b[1] * z + b[2] * z * z) / (den[0] + den[1] * z + den[2] * z * z))


def eq_taps(bands: Sequence[dict], rate: int, n_taps: int = EQ_TAPS) -> np.ndarray:
    """The zero-phase FIR whose magnitude is the product of `bands`' biquads (each a dict of
    kind, f0, gain_db, q): frequency sampling on a 4096-point grid, Hann-windowed."""
    n_fft = 4096
    freqs = np.fft.rfftfreq(n_fft, 1.0 / rate)
    mag = np.ones_like(freqs)
    for band in bands:
        mag *= biquad_magnitude(band["kind"], band["f0"], band["gain_db"], band["q"], freqs, rate)
    impulse = np.roll(np.fft.irfft(mag, n_fft), n_taps // 2)[:n_taps]
    return impulse * np.hanning(n_taps + 2)[1:-1]


# --------------------------------------------------------------------------- transforms

def mulaw(x: np.ndarray, bits: int = 8) -> np.ndarray:
    """Mu-law companding to `bits` (mu = 2^bits - 1; 8 bits: G.711's mu = 255) and back."""
    return mulaw_decode(mulaw_encode(x, bits), bits)


def telephone(x: np.ndarray, rate: int, mulaw_bits: int = 8) -> np.ndarray:
    """A telephone line: 8 kHz, 300-3400 Hz at both ends, `mulaw_bits` mu-law between (0:
    the band alone), back at `rate`."""
    x = np.asarray(x, dtype=np.float32)
    taps = bandpass_taps(TELEPHONE_RATE, *TELEPHONE_BAND_HZ)
    low = fir_same(resample(x, rate, TELEPHONE_RATE), taps)
    if mulaw_bits:
        low = fir_same(mulaw(low, mulaw_bits), taps)
    return fit_length(resample(low, TELEPHONE_RATE, rate), len(x)).astype(np.float32)


def telephone_band(x: np.ndarray, rate: int) -> np.ndarray:
    """The telephone band (8 kHz, 300-3400 Hz) without the mu-law quantiser."""
    return telephone(x, rate, mulaw_bits=0)


def mic_colouring(x: np.ndarray, rate: int, bands: Sequence[dict]) -> np.ndarray:
    """`x` through the EQ of `bands` (see eq_taps), same length, zero phase."""
    return fir_same(x, eq_taps(bands, rate))


def clip(x: np.ndarray, fraction: float) -> np.ndarray:
    """Hard clipping at the magnitude that `fraction` of the samples reach or exceed."""
    x = np.asarray(x, dtype=np.float32)
    if not 0 < fraction < 1:
        raise ValueError(f"clipped fraction {fraction} outside (0, 1)")
    level = float(np.quantile(np.abs(x), 1.0 - fraction))
    return np.clip(x, -level, level) if level > 0 else x.copy()


def _advance(y: np.ndarray, samples: int) -> np.ndarray:
    """`y` earlier by `samples` (zero-padded at the end), the same length."""
    if samples <= 0:
        return y
    return np.concatenate([y[samples:], np.zeros(min(samples, len(y)), y.dtype)])


def codec2(x: np.ndarray, rate: int, mode: str) -> np.ndarray:
    """Codec2 in `mode` (pycodec2==4.1.1), its algorithmic delay removed."""
    y, _ = codec2_codec(x, rate, mode, what=f"the channel codec2:{mode}")
    return _advance(y, int(round(CODEC2_DELAY_MS[mode] * rate / 1000)))


def opus(x: np.ndarray, rate: int, kbps: float) -> np.ndarray:
    """Opus at `kbps` (PyAV's libopus, av==18.1.0): CBR, VoIP, 20 ms frames."""
    return opus_codec(x, rate, kbps, what=f"the channel opus:{kbps:g}")[0]


def room_at_distance(rng: np.random.Generator, kind: str, distance_m: Tuple[float, float]
                     ) -> Room:
    """A room of `kind` (toolkit.data.rir.random_room: size, RT60, the talker's place) with
    the microphone at a distance drawn from `distance_m` (at most what the room holds,
    0.3 m from the walls, 0.5-1.6 m high)."""
    room = random_room(rng, kind)
    size, src = np.asarray(room.size), np.asarray(room.source)
    margin = 0.3
    reach = float(np.linalg.norm(size - 2 * margin))
    low, high = distance_m[0], min(distance_m[1], reach)
    for _ in range(100):
        d = float(rng.uniform(min(low, high), high))
        z = float(rng.uniform(0.5, min(1.6, size[2] - margin)))
        horizontal = d * d - (z - src[2]) ** 2
        if horizontal <= 0:
            continue
        angle = float(rng.uniform(0, 2 * math.pi))
        r = math.sqrt(horizontal)
        mic = (src[0] + r * math.cos(angle), src[1] + r * math.sin(angle), z)
        if margin <= mic[0] <= size[0] - margin and margin <= mic[1] <= size[1] - margin:
            return Room(room.size, room.rt60, room.source, tuple(float(v) for v in mic))
    return room                  # nothing fits (a tiny room): random_room's own microphone


def reverberate(x: np.ndarray, rate: int, room: Room) -> np.ndarray:
    """`x` in `room`, aligned on the direct path and at the dry signal's level."""
    from toolkit.data.augment import add_reverb
    rir = image_method_rir(room, rate, length_s=min(1.2, 1.2 * room.rt60 + 0.05))
    return add_reverb(np.asarray(x, dtype=np.float32), rir)


# --------------------------------------------------------------------------- the chain

@dataclass(frozen=True)
class ConditionSettings:
    """How often each condition is drawn and from what ranges (per utterance, independently:
    about 5 % of the utterances draw none and stay clean)."""
    room_prob: float = 0.5                  # a room
    room_sizes: Tuple[str, ...] = ("small", "medium", "large")   # toolkit.data.rir.ROOM_SIZES
    distance_m: Tuple[float, float] = (0.5, 4.0)     # talker to mic (what the room holds)
    noise_prob: float = 0.6                 # background noise
    noise_kinds: Tuple[str, ...] = NOISE_TYPES       # babble: other utterances of the dir
    snr_db: Tuple[float, float] = (0.0, 25.0)
    channel_prob: float = 0.7               # one of `channels`, equally likely
    channels: Tuple[str, ...] = CHANNELS    # telephone (+ mu-law), codec2, opus, mic
    mic_also_prob: float = 0.3              # mic colouring before a telephone/codec channel
    codec2_modes: Tuple[str, ...] = ("3200", "2400", "1600", "1200", "700C")
    opus_kbps: Tuple[int, int] = (6, 24)    # a whole number of kbit/s, uniform
    mic_bands: Tuple[int, int] = (2, 4)     # EQ bands
    mic_gain_db: Tuple[float, float] = (3.0, 10.0)   # each band's gain, either sign
    clip_prob: float = 0.1
    clip_fraction: Tuple[float, float] = (0.01, 0.10)    # of the samples clipped
    whisper_prob: float = 0.0               # whispered (the source voice turned to noise)
    breath: Tuple[float, float] = (0.6, 1.0)    # the noise's share of a whispered voice

    def check(self) -> "ConditionSettings":
        """Itself, or ConfigError naming the setting at fault."""
        for name in ("room_prob", "noise_prob", "channel_prob", "mic_also_prob", "clip_prob",
                     "whisper_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"conditions: {name} {getattr(self, name)} outside [0, 1]")
        for name in ("distance_m", "snr_db", "opus_kbps", "mic_bands", "mic_gain_db",
                     "clip_fraction", "breath"):
            low, high = getattr(self, name)
            if low > high:
                raise ConfigError(f"conditions: {name} {low},{high}: low above high")
        choices = {"room_sizes": (sorted(ROOM_SIZES), self.room_prob),
                   "noise_kinds": (NOISE_TYPES, self.noise_prob),
                   "channels": (CHANNELS, self.channel_prob),
                   "codec2_modes": (list(CODEC2_MODES), self.channel_prob)}
        for name, (known, prob) in choices.items():
            values = getattr(self, name)
            if [v for v in values if v not in known] or (prob > 0 and not values):
                raise ConfigError(f"conditions: {name} {','.join(values) or '(none)'}: "
                                  f"expected some of {', '.join(known)}")
        if self.distance_m[0] <= 0:
            raise ConfigError(f"conditions: distance_m {self.distance_m}: must be > 0")
        if not OPUS_KBPS_RANGE[0] <= self.opus_kbps[0] <= self.opus_kbps[1] <= OPUS_KBPS_RANGE[1]:
            raise ConfigError(f"conditions: opus_kbps {self.opus_kbps}: Opus takes "
                              f"{OPUS_KBPS_RANGE[0]:g}-{OPUS_KBPS_RANGE[1]:g}")
        if self.mic_bands[0] < 1:
            raise ConfigError(f"conditions: mic_bands {self.mic_bands}: at least 1")
        if not 0 < self.clip_fraction[0] <= self.clip_fraction[1] < 1:
            raise ConfigError(f"conditions: clip_fraction {self.clip_fraction}: in (0, 1)")
        if not 0 < self.breath[0] <= self.breath[1] <= 1:
            raise ConfigError(f"conditions: breath {self.breath}: in (0, 1]")
        return self


@dataclass
class Step:
    """One condition of a chain: `kind` (room, noise, mic, clip, telephone, codec2, opus),
    its drawn parameters and its label."""
    kind: str
    label: str
    params: Dict = field(default_factory=dict)


@dataclass
class Chain:
    steps: List[Step]

    @property
    def label(self) -> str:
        """The steps' labels joined by `+` in the order they apply; `clean` for none."""
        return "+".join(s.label for s in self.steps) or "clean"

    def step(self, kind: str):
        return next((s for s in self.steps if s.kind == kind), None)


def _pick(rng: np.random.Generator, items: Sequence):
    return items[int(rng.integers(len(items)))]


def _eq_bands(rng: np.random.Generator, settings: ConditionSettings, rate: int) -> List[dict]:
    bands = []
    for _ in range(int(rng.integers(settings.mic_bands[0], settings.mic_bands[1] + 1))):
        kind = _pick(rng, ("lowshelf", "peaking", "peaking", "highshelf"))
        gain = float(rng.uniform(*settings.mic_gain_db)) * (1 if rng.random() < 0.5 else -1)
        if kind == "lowshelf":
            f0, q = float(rng.uniform(80, 400)), 0.707
        elif kind == "highshelf":
            f0, q = float(rng.uniform(2000, min(6000, 0.4 * rate))), 0.707
        else:
            f0 = float(np.exp(rng.uniform(math.log(200), math.log(min(6000, 0.4 * rate)))))
            q = float(rng.uniform(0.7, 3.0))
        bands.append({"kind": kind, "f0": round(f0, 1), "gain_db": round(gain, 2),
                      "q": round(q, 3)})
    return bands


def sample_chain(rng: np.random.Generator, settings: ConditionSettings, rate: int,
                 babble: bool = True) -> Chain:
    """One utterance's chain, every choice drawn from `rng` (the audio's own random draws,
    noise samples and babble, come from another generator, so the chain does not depend on
    the audio). `babble`: False where the dir has no other utterance to talk over."""
    steps = []
    # Each condition draws its coin and its parameters whether or not it is taken, so that
    # one setting changes no other condition's draws.
    coin, size = rng.random(), _pick(rng, settings.room_sizes or ("medium",))
    room = room_at_distance(rng, size, settings.distance_m)
    if coin < settings.room_prob:
        steps.append(Step("room", f"room:{size}/{room.distance():.1f}m", {"room": room}))
    kinds = [k for k in settings.noise_kinds if babble or k != "babble"] or ["pink"]
    coin, kind, snr = rng.random(), _pick(rng, kinds), float(rng.uniform(*settings.snr_db))
    if coin < settings.noise_prob:
        steps.append(Step("noise", f"noise:{kind}/{snr:.1f}dB", {"kind": kind, "snr_db": snr}))
    coin, channel = rng.random(), _pick(rng, settings.channels or CHANNELS)
    also, bands = rng.random(), _eq_bands(rng, settings, rate)
    mode = _pick(rng, settings.codec2_modes or ("2400",))
    kbps = int(rng.integers(settings.opus_kbps[0], settings.opus_kbps[1] + 1))
    clip_coin, fraction = rng.random(), float(rng.uniform(*settings.clip_fraction))
    # Drawn after the others (so chains without it are as before), applied first: a
    # whisper is the talker's, the room and the channel come after.
    whisper_coin, breath = rng.random(), float(rng.uniform(*settings.breath))
    if whisper_coin < settings.whisper_prob:
        steps.insert(0, Step("whisper", f"whisper:{breath:.2f}", {"breath": breath}))
    taken = coin < settings.channel_prob
    if taken and (channel == "mic" or also < settings.mic_also_prob):
        steps.append(Step("mic", f"mic:eq{len(bands)}", {"bands": bands}))
    if clip_coin < settings.clip_prob:
        steps.append(Step("clip", f"clip:{100 * fraction:.1f}%", {"fraction": fraction}))
    if taken and channel == "telephone":
        steps.append(Step("telephone", "telephone:g711", {}))
    elif taken and channel == "codec2":
        steps.append(Step("codec2", f"codec2:{mode}", {"mode": mode}))
    elif taken and channel == "opus":
        steps.append(Step("opus", f"opus:{kbps}kbps", {"kbps": kbps}))
    return Chain(steps)


def _at_level(x: np.ndarray, power: float) -> np.ndarray:
    current = active_power(x)
    return (x * math.sqrt(power / current)).astype(np.float32) if current > 0 and power > 0 \
        else np.asarray(x, np.float32)


def apply_chain(wave: np.ndarray, rate: int, chain: Chain, rng: np.random.Generator,
                babble_pool: Sequence[np.ndarray] = ()) -> np.ndarray:
    """`wave` through `chain`: float32, the same length, at the input's active level (the
    caller protects the peak: toolkit.voicebank.signal.peak_gain). `rng` draws the noise
    samples; `babble_pool`: the talkers of babble noise."""
    x = np.asarray(wave, dtype=np.float32)
    level = active_power(x)
    for step in chain.steps:
        p = step.params
        if step.kind == "whisper":
            x = whisper(x, rate, rng, p["breath"])
        elif step.kind == "room":
            x = reverberate(x, rate, p["room"])
        elif step.kind == "noise":
            noise = background_noise(len(x), p["kind"], rng, rate, babble_pool)
            x, _ = mix_at_snr(x, noise, p["snr_db"])
            x = _at_level(x, level)
        elif step.kind == "mic":
            x = mic_colouring(x, rate, p["bands"])
        elif step.kind == "clip":
            x = clip(x, p["fraction"])
        elif step.kind == "telephone":
            x = telephone(x, rate)
        elif step.kind == "codec2":
            x = codec2(x, rate, p["mode"])
        elif step.kind == "opus":
            x = opus(x, rate, p["kbps"])
        else:
            raise ValueError(f"unknown condition {step.kind!r}")
    return _at_level(x, level)


def settings_dict(settings: ConditionSettings) -> dict:
    """The settings as JSON-ready values (tuples as lists), for stamps. Whispering, off, is
    left out: copies made before it existed keep their stamps (their chains are the same)."""
    out = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(settings).items()}
    if settings.whisper_prob == 0:
        del out["whisper_prob"], out["breath"]
    return out
