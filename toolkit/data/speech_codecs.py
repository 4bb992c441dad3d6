"""Speech codecs as plain functions on float waveforms: mu-law companding, Codec2 and Opus.

Used alike by the codec evaluation's reference baselines (toolkit.tasks.codec.baselines)
and by the channel simulation of condition copies (toolkit.voicebank.channel): generic
code, so that both reach them without a task package.

  codec2_codec: Codec2 (pycodec2 4.1.1, bundling libcodec2 1.2) at 8 kHz, resampled there
    and back with the toolkit's resampler; bitrate from the mode's frame size.
  opus_codec: Opus through PyAV's libopus (hard CBR, VoIP application, 20 ms frames);
    bitrate measured from the encoded packet bytes.
Both packages are the pinned `codec` extra of setup.py (CODEC2_REQUIREMENT,
OPUS_REQUIREMENT); a missing one is a MissingPackageError that names the pin and the fix.

Each codec takes a 1-D float waveform in [-1, 1] and returns (decoded float32 of the same
length, bitrate in bit/s). The decoded signal keeps the codec's own delay.
"""
import ctypes
import math
import os
import pickle
import sys
from typing import Callable, Tuple

import numpy as np

from toolkit.data.audio import resample
from toolkit.errors import import_optional


def check_wave(x) -> np.ndarray:
    """`x` as a float32 1-D array; ValueError when it is not a non-empty 1-D waveform."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 1 or len(x) == 0:
        raise ValueError(f"expected a non-empty 1-D waveform, got shape {x.shape}")
    return x


def fit_length(y: np.ndarray, n: int) -> np.ndarray:
    """`y` cut or zero-padded to `n` samples."""
    if len(y) >= n:
        return y[:n]
    return np.pad(y, (0, n - len(y)))


# --------------------------------------------------------------------------- mu-law

def mulaw_encode(x: np.ndarray, bits: int) -> np.ndarray:
    """[-1, 1] -> integer levels 0 .. 2^bits - 1 after mu-law companding (mu = 2^bits - 1)."""
    mu = 2 ** bits - 1
    x = np.clip(np.asarray(x, dtype=np.float64), -1.0, 1.0)
    companded = np.sign(x) * np.log1p(mu * np.abs(x)) / math.log1p(mu)
    return np.rint((companded + 1.0) / 2.0 * mu).astype(np.int64)


def mulaw_decode(levels: np.ndarray, bits: int) -> np.ndarray:
    """The inverse of mulaw_encode: levels -> float32 in [-1, 1]."""
    mu = 2 ** bits - 1
    companded = 2.0 * np.asarray(levels, dtype=np.float64) / mu - 1.0
    return (np.sign(companded) * np.expm1(np.abs(companded) * math.log1p(mu)) / mu).astype(
        np.float32)


# --------------------------------------------------------------------------- Codec2

CODEC2_RATE = 8000
CODEC2_REQUIREMENT = "pycodec2==4.1.1"
# The modes pycodec2 4.1.1 builds (its name -> the library's mode number); Codec2's 450 and
# 700 (without C) are not among them.
CODEC2_MODES = {"3200": 3200, "2400": 2400, "1600": 1600, "1400": 1400, "1300": 1300,
                "1200": 1200, "700C": 700}


# 16-bit PCM <-> float in [-1, 1) by one scale both ways, 32768 as the toolkit's WAV reader
# (toolkit.data.audio) and soundfile use: a clip on the 16-bit grid goes to the libraries
# and back unchanged (32767 one way and 32768 the other scaled every decoded signal by
# 32767/32768).
PCM16_SCALE = 32768.0


def to_pcm16(x: np.ndarray) -> np.ndarray:
    """Float samples -> int16, rounded, full scale clipped to 32767."""
    return np.clip(np.rint(np.asarray(x, dtype=np.float64) * PCM16_SCALE), -32768,
                   32767).astype(np.int16)


def from_pcm16(pcm: np.ndarray) -> np.ndarray:
    """int16 samples -> float32, the inverse of to_pcm16 on the 16-bit grid."""
    return np.asarray(pcm, dtype=np.float32) / np.float32(PCM16_SCALE)


def in_fresh_process(fn: Callable, *args):
    """fn(*args) in a forked child, its result pickled back through a pipe. A child starts
    from the parent's library state; the parent never calls the library itself."""
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:                    # child: never returns into the caller's code
        try:
            os.close(read_fd)
            try:
                payload = pickle.dumps(("ok", fn(*args)))
            except BaseException as err:    # report everything, Ctrl-C included
                payload = pickle.dumps(("err", f"{type(err).__name__}: {err}"))
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(payload)
        finally:
            os._exit(0)
    os.close(write_fd)
    try:
        with os.fdopen(read_fd, "rb") as pipe:
            data = pipe.read()
    finally:
        _, status = os.waitpid(pid, 0)
    if not data:
        raise RuntimeError(f"{getattr(fn, '__name__', fn)} died in its child process "
                           f"(wait status {status})")
    kind, value = pickle.loads(data)
    if kind != "ok":
        raise RuntimeError(value)
    return value


def _codec2_frames(pcm: np.ndarray, mode_number: int) -> Tuple[np.ndarray, int, int]:
    """int16 PCM at 8 kHz through a Codec2 encoder and decoder -> (decoded int16, bits per
    frame, samples per frame); the last frame zero-padded."""
    import pycodec2
    ctypes.CDLL(None).srand(1)      # libc's generator, in case the library draws from it
    # Separate encoder and decoder states, as between a sender and a receiver.
    encoder = pycodec2.Codec2(mode_number)
    decoder = pycodec2.Codec2(mode_number)
    frame = encoder.samples_per_frame()
    pcm = np.pad(pcm, (0, -len(pcm) % frame))
    out = np.empty(len(pcm), np.int16)
    for start in range(0, len(pcm), frame):
        # pycodec2's encode/decode handle one frame per call (codec2_encode's contract).
        out[start:start + frame] = decoder.decode(encoder.encode(pcm[start:start + frame]))
    return out, encoder.bits_per_frame(), frame


def codec2_codec(x, sr: int, mode: str, what: str = "") -> Tuple[np.ndarray, float]:
    """Codec2 in `mode` (a key of CODEC2_MODES) at 8 kHz: resample, encode frame by frame
    (the last one zero-padded), decode, resample back. Bitrate: the mode's bits per frame
    over its frame duration (2400: 48 bits per 20 ms).

    libcodec2 draws the phases of unvoiced speech from a process-wide generator that
    nothing resets, so in one process each utterance's output would depend on every call
    before it (and on the order of the systems); each call runs in a freshly forked child
    instead, which makes the output a function of the input alone. `what` names the caller
    in the error when pycodec2 is missing."""
    x = check_wave(x)
    if mode not in CODEC2_MODES:
        raise ValueError(f"Codec2 mode {mode!r}: expected one of {', '.join(CODEC2_MODES)}")
    import_optional("pycodec2", CODEC2_REQUIREMENT, what or f"baseline codec2:{mode}")
    pcm = to_pcm16(resample(x, sr, CODEC2_RATE))
    out, bits, frame = in_fresh_process(_codec2_frames, pcm, CODEC2_MODES[mode])
    back = resample(from_pcm16(out), CODEC2_RATE, sr)
    return fit_length(back, len(x)).astype(np.float32), bits * CODEC2_RATE / frame


# --------------------------------------------------------------------------- Opus

OPUS_REQUIREMENT = "av==18.1.0"
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)     # libopus' input and output rates
OPUS_KBPS_RANGE = (6.0, 510.0)


def opus_codec(x, sr: int, kbps: float, what: str = "") -> Tuple[np.ndarray, float]:
    """Opus at `kbps` kbit/s through libopus (PyAV's wheel bundles it): hard CBR (no VBR),
    the VoIP application (libopus' speech tuning), 20 ms frames, mono; input at `sr` when
    libopus takes that rate, else resampled to 48 kHz. The decoder gets the stream header
    (OpusHead) and so drops the encoder's pre-skip, as an Ogg Opus player does; its output
    rate (libopus decodes at 48 kHz here) is resampled back to `sr`. Bitrate: the bytes of
    all encoded packets (Opus payload, no container) over the input's duration. `what`
    names the caller in the error when PyAV is missing."""
    x = check_wave(x)
    if not OPUS_KBPS_RANGE[0] <= kbps <= OPUS_KBPS_RANGE[1]:
        raise ValueError(f"Opus bitrate {kbps:g} kbit/s outside {OPUS_KBPS_RANGE[0]:g}-"
                         f"{OPUS_KBPS_RANGE[1]:g}")
    av = import_optional("av", OPUS_REQUIREMENT, what or f"baseline opus:{kbps:g}")
    rate = sr if sr in OPUS_RATES else 48000
    pcm = resample(x, sr, rate).astype(np.float32)
    encoder = av.CodecContext.create("libopus", "w")
    encoder.sample_rate, encoder.layout, encoder.format = rate, "mono", "flt"
    encoder.bit_rate = int(round(kbps * 1000))
    encoder.options = {"application": "voip", "vbr": "off", "frame_duration": "20"}
    encoder.open()
    frame = encoder.frame_size
    pcm = np.pad(pcm, (0, -len(pcm) % frame))
    packets = []
    for start in range(0, len(pcm), frame):
        chunk = av.AudioFrame.from_ndarray(pcm[None, start:start + frame], format="flt",
                                           layout="mono")
        chunk.sample_rate, chunk.pts = rate, start
        packets.extend(encoder.encode(chunk))
    packets.extend(encoder.encode(None))
    payload_bytes = sum(p.size for p in packets)
    decoder = av.CodecContext.create("libopus", "r")
    decoder.layout = "mono"
    decoder.extradata = encoder.extradata
    chunks, out_rate = [], None
    for packet in packets:
        for decoded in decoder.decode(packet):
            samples = decoded.to_ndarray().reshape(-1)
            if samples.dtype == np.int16:
                samples = from_pcm16(samples)
            elif samples.dtype.kind != "f":
                raise RuntimeError(f"libopus decoded {samples.dtype} samples; expected float "
                                   "or int16")
            chunks.append(samples.astype(np.float32))
            out_rate = decoded.sample_rate
    if not chunks:
        raise RuntimeError(f"libopus decoded nothing from {len(packets)} packets")
    back = fit_length(resample(np.concatenate(chunks), out_rate, sr), len(x))
    return back.astype(np.float32), payload_bytes * 8.0 / (len(x) / sr)
