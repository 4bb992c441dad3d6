"""Room impulse responses by the image method (Allen & Berkley, 1979), numpy only.

A shoebox room's walls mirror the source: every image at distance d that reached the
microphone after k wall hits adds an impulse of amplitude beta^k / (4 pi d) at delay d / c.
The walls' reflection coefficient beta follows the reverberation time through Sabine's
formula, so a room is described the way it is heard: size, RT60, where source and
microphone stand. Impulses land between samples through a short windowed sinc, and a
high-pass at 40 Hz removes the DC the summed positive impulses would otherwise leave.

    rng = np.random.default_rng(0)
    room = random_room(rng)                 # size, RT60, positions drawn from ROOM_SIZES
    rir = image_method_rir(room, 16000)     # float32, direct path at its delay
"""
import math
from dataclasses import asdict, dataclass
from typing import Dict, Sequence, Tuple

import numpy as np

SPEED_OF_SOUND = 343.0          # m/s at 20 C
SINC_HALF_WIDTH = 8             # taps each side of a fractional-delay impulse
EARLY_S = 0.05                  # s: reflections placed between samples up to this delay
# Room sizes a voice assistant meets (length, width ranges in m; height range), with the
# RT60 ranges that go with them: small rooms are dead, halls ring.
ROOM_SIZES: Dict[str, Tuple[Tuple[float, float], Tuple[float, float], Tuple[float, float],
                            Tuple[float, float]]] = {
    "small": ((2.5, 4.0), (2.0, 3.5), (2.3, 2.7), (0.15, 0.45)),
    "medium": ((4.0, 8.0), (3.5, 6.0), (2.5, 3.2), (0.3, 0.7)),
    "large": ((8.0, 18.0), (6.0, 12.0), (3.0, 5.0), (0.5, 1.1)),
}


@dataclass
class Room:
    size: Tuple[float, float, float]      # m
    rt60: float                           # s, the time for the sound to fall by 60 dB
    source: Tuple[float, float, float]    # m, inside the room
    mic: Tuple[float, float, float]

    def distance(self) -> float:
        return float(np.linalg.norm(np.subtract(self.source, self.mic)))

    def describe(self) -> Dict:
        d = asdict(self)
        d["distance"] = round(self.distance(), 3)
        return d


def reflection_coefficient(size: Sequence[float], rt60: float) -> float:
    """The walls' pressure reflection coefficient that gives `rt60` by Sabine's formula
    (RT60 = 0.161 V / (S alpha)); alpha capped below 1 for very dead small rooms."""
    lx, ly, lz = size
    volume, surface = lx * ly * lz, 2.0 * (lx * ly + lx * lz + ly * lz)
    alpha = min(0.99, 0.161 * volume / (surface * rt60))
    return math.sqrt(1.0 - alpha)


def random_room(rng: np.random.Generator, kind: str = "") -> Room:
    """A room of `kind` (one of ROOM_SIZES; empty: any, equally likely) with source and
    microphone at least 0.3 m from the walls and from each other, at talking heights."""
    kind = kind or str(rng.choice(sorted(ROOM_SIZES)))
    if kind not in ROOM_SIZES:
        raise ValueError(f"room kind {kind!r}: expected one of {', '.join(sorted(ROOM_SIZES))}")
    (lx0, lx1), (ly0, ly1), (lz0, lz1), (t0, t1) = ROOM_SIZES[kind]
    size = (float(rng.uniform(lx0, lx1)), float(rng.uniform(ly0, ly1)), float(rng.uniform(lz0, lz1)))
    margin = 0.3

    def point(z_low, z_high):
        return (float(rng.uniform(margin, size[0] - margin)),
                float(rng.uniform(margin, size[1] - margin)),
                float(rng.uniform(z_low, min(z_high, size[2] - margin))))

    source = point(1.0, 1.9)
    mic = point(0.5, 1.6)
    while np.linalg.norm(np.subtract(source, mic)) < margin:
        mic = point(0.5, 1.6)
    return Room(size, float(rng.uniform(t0, t1)), source, mic)


def image_method_rir(room: Room, rate: int, length_s: float = 0.0) -> np.ndarray:
    """The room's impulse response at `rate` Hz, `length_s` long (default: the RT60, at
    least 0.1 s), float32, peak-normalised."""
    length_s = length_s or max(0.1, room.rt60)
    n = int(round(length_s * rate))
    size = np.asarray(room.size, np.float64)
    src, mic = np.asarray(room.source, np.float64), np.asarray(room.mic, np.float64)
    beta = reflection_coefficient(room.size, room.rt60)
    reach = SPEED_OF_SOUND * length_s                # images farther than this arrive too late
    orders = np.ceil(reach / (2.0 * size)).astype(int) + 1
    # Per axis: image coordinates and wall hits for every (mirror u, period m), then all
    # combinations; an image's wall hits are |m - u| + |m| along each axis.
    coords, hits = [], []
    for axis in range(3):
        m = np.arange(-orders[axis], orders[axis] + 1)
        u = np.array([0, 1])
        mm, uu = np.meshgrid(m, u, indexing="ij")
        coords.append(((1 - 2 * uu) * src[axis] + 2 * mm * size[axis] - mic[axis]).ravel())
        hits.append((np.abs(mm - uu) + np.abs(mm)).ravel())
    dx, dy, dz = np.meshgrid(*coords, indexing="ij", sparse=True)
    kx, ky, kz = np.meshgrid(*hits, indexing="ij", sparse=True)
    dist = np.sqrt(dx ** 2 + dy ** 2 + dz ** 2)
    k = kx + ky + kz
    keep = dist < reach
    dist, k = dist[keep], k[keep]
    dist = np.maximum(dist, 1e-3)
    amp = beta ** k / (4.0 * np.pi * dist)
    delay = dist / SPEED_OF_SOUND * rate
    # Early reflections land between samples through a Hann-windowed sinc of
    # 2 * SINC_HALF_WIDTH + 1 taps; the dense late tail (after EARLY_S) at the nearest
    # sample, where no ear or feature resolves a fraction of a sample.
    early = delay < EARLY_S * rate
    late_index = np.round(delay[~early]).astype(int)
    late_ok = late_index < n
    out = np.bincount(late_index[late_ok], weights=amp[~early][late_ok], minlength=n)[:n]
    delay, amp = delay[early], amp[early]
    base = np.floor(delay).astype(int)
    frac = delay - base
    taps = np.arange(-SINC_HALF_WIDTH, SINC_HALF_WIDTH + 1)
    t = taps[None, :] - frac[:, None]
    kernel = np.sinc(t) * (0.5 + 0.5 * np.cos(np.pi * t / (SINC_HALF_WIDTH + 1)))
    index = base[:, None] + taps[None, :]
    valid = (index >= 0) & (index < n)
    out += np.bincount(index[valid], weights=(amp[:, None] * kernel)[valid], minlength=n)[:n]
    out = _highpass(out, rate, 40.0)
    peak = np.max(np.abs(out))
    return (out / peak if peak > 0 else out).astype(np.float32)


def _highpass(x: np.ndarray, rate: int, cutoff_hz: float) -> np.ndarray:
    """A first-order high-pass (one pole): the image method's DC offset goes, speech stays."""
    r = math.exp(-2.0 * math.pi * cutoff_hz / rate)
    out = np.empty_like(x)
    prev_x = prev_y = 0.0
    for i, v in enumerate(x):
        prev_y = v - prev_x + r * prev_y
        prev_x = v
        out[i] = prev_y
    return out
