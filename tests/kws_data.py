"""Small real-audio keyword-spotting data sets for tests (WAV files, Kaldi dirs, lists).

Positives carry a distinctive rising chirp (the "keyword") inside noise; negatives carry
noise and steady tones. Deterministic for a given seed."""
import json
import os
from typing import List, Optional

import numpy as np
import soundfile as sf

RATE = 16000


def make_wave(rng: np.random.Generator, positive: bool, seconds: float) -> np.ndarray:
    return keyword_wave(rng, positive, seconds)[0]


def keyword_wave(rng: np.random.Generator, positive: bool, seconds: float):
    """(wave, (start, end) seconds of the chirp, or None for a negative)."""
    n = int(seconds * RATE)
    wave = 0.02 * rng.standard_normal(n)
    t = np.arange(int(0.4 * RATE)) / RATE
    if positive:
        chirp = 0.4 * np.sin(2 * np.pi * (300 + 1500 * t) * t)
        start = int(rng.integers(int(0.1 * RATE), max(int(0.1 * RATE) + 1, n - len(t))))
        wave[start:start + len(t)] += chirp[: n - start]
        span = (start / RATE, min(n, start + len(t)) / RATE)
    else:
        span = None
        freq = rng.uniform(200, 2000)
        start = int(rng.integers(0, max(1, n - len(t))))
        wave[start:start + len(t)] += 0.3 * np.sin(2 * np.pi * freq * t)[: n - start]
    return wave.astype(np.float32), span


def make_kaldi_dir(root: str, name: str, num_pos: int, num_neg: int, seed: int,
                   keyword: str = "hey chirp") -> str:
    """Writes <root>/<name>/{wav.scp,text,kw_times} plus WAVs; returns the data dir."""
    rng = np.random.default_rng(seed)
    data_dir = os.path.join(root, name)
    wav_dir = os.path.join(root, "wavs", name)
    os.makedirs(data_dir, exist_ok=True)
    os.makedirs(wav_dir, exist_ok=True)
    scp, text, times = [], [], []
    for i in range(num_pos + num_neg):
        positive = i < num_pos
        key = f"{'pos' if positive else 'neg'}-{name}-{i:05d}"
        path = os.path.join(wav_dir, key + ".wav")
        wave, span = keyword_wave(rng, positive, float(rng.uniform(0.8, 2.0)))
        sf.write(path, wave, RATE, subtype="PCM_16")
        if span is not None:
            times.append(f"{key} {span[0]:.3f} {span[1]:.3f}\n")
        scp.append(f"{key} {path}\n")
        text.append(f"{key} {keyword if positive else 'something else'}\n")
    with open(os.path.join(data_dir, "wav.scp"), "w") as f:
        f.writelines(sorted(scp))
    with open(os.path.join(data_dir, "text"), "w") as f:
        f.writelines(sorted(text))
    with open(os.path.join(data_dir, "kw_times"), "w") as f:
        f.writelines(sorted(times))
    return data_dir


def write_keywords(root: str, keywords: List[str]) -> str:
    path = os.path.join(root, "keywords.txt")
    with open(path, "w") as f:
        f.write("".join(k + "\n" for k in keywords))
    return path


def make_datalist(root: str, name: str, num_pos: int, num_neg: int, seed: int,
                  extra: Optional[List[dict]] = None) -> str:
    """A data list of real WAVs (label 0 for positives, -1 otherwise)."""
    from toolkit.tasks.kws.labels import read_kw_times
    data_dir = make_kaldi_dir(root, name, num_pos, num_neg, seed)
    times = read_kw_times(os.path.join(data_dir, "kw_times"))
    out = os.path.join(root, f"{name}.list")
    with open(os.path.join(data_dir, "wav.scp")) as f, open(out, "w") as w:
        for line in f:
            key, path = line.split()
            info = sf.info(path)
            entry = {"key": key, "wav": path, "duration": info.frames / info.samplerate,
                     "label": 0 if key.startswith("pos") else -1}
            if key in times:
                entry["kw_start"], entry["kw_end"] = times[key]
            w.write(json.dumps(entry) + "\n")
        for entry in extra or []:
            w.write(json.dumps(entry) + "\n")
    return out
