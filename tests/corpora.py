"""Miniature copies of real corpora, in each corpus's own directory and metadata layout,
for testing the recipes' data preparation and full runs without downloading anything.

Audio is synthesized with numpy (16 kHz, 16-bit WAV): every class has its own
signature (tone pairs, chirp direction, noise colour), varied per speaker and clip, so
that a tiny model has something learnable. Deterministic for a given seed.

  build_speech_commands(root)   Google Speech Commands v0.02
  build_hey_snips(root)         Snips "Hey Snips" (hey_snips_research_6k_en_train_eval_clean_ter)
  build_mobvoi_hotwords(root)   Mobvoi hotwords, OpenSLR 87 ("hi xiaowen", "nihao wenwen")
"""
import hashlib
import json
import os
from typing import Dict, List, Optional, Sequence

import numpy as np
import soundfile as sf

RATE = 16000

SPEECH_COMMANDS_WORDS = [
    "backward", "bed", "bird", "cat", "dog", "down", "eight", "five", "follow", "forward",
    "four", "go", "happy", "house", "learn", "left", "marvin", "nine", "no", "off", "on",
    "one", "right", "seven", "sheila", "six", "stop", "three", "tree", "two", "up",
    "visual", "wow", "yes", "zero"]
COMMANDS = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"]
BACKGROUND_NOISES = ["doing_the_dishes", "exercise_bike", "white_noise"]


def _hex_id(*parts, n: int = 8) -> str:
    return hashlib.sha1("/".join(map(str, parts)).encode()).hexdigest()[:n]


def _write(path: str, wave: np.ndarray) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    sf.write(path, np.clip(wave, -1.0, 1.0).astype(np.float32), RATE, subtype="PCM_16")


def class_signal(index: int, seconds: float, rng: np.random.Generator,
                 pitch: float = 1.0, level: float = 0.3) -> np.ndarray:
    """A ~0.5 s 'word' for class `index`: two tones then a chirp whose direction and span
    depend on the class, in light noise; `pitch` shifts it per speaker."""
    n = int(seconds * RATE)
    wave = 0.01 * rng.standard_normal(n)
    f1 = (300 + 150 * (index % 12)) * pitch
    f2 = (500 + 230 * (index % 7)) * pitch
    seg = int(0.15 * RATE)
    t = np.arange(seg) / RATE
    up = index % 2 == 0
    lo, hi = (400 + 60 * (index % 5)) * pitch, (1800 + 90 * (index % 9)) * pitch
    f_start, f_end = (lo, hi) if up else (hi, lo)
    chirp_phase = 2 * np.pi * (f_start * t + (f_end - f_start) * t * t / (2 * t[-1]))
    word = np.concatenate([np.sin(2 * np.pi * f1 * t), np.sin(2 * np.pi * f2 * t),
                           np.sin(chirp_phase)]) * np.hanning(3 * seg)
    start = int(rng.integers(0, max(1, n - len(word))))
    end = min(n, start + len(word))
    wave[start:end] += level * rng.uniform(0.7, 1.0) * word[: end - start]
    return wave


def noise_signal(seconds: float, rng: np.random.Generator, color: str = "white",
                 level: float = 0.1) -> np.ndarray:
    n = int(seconds * RATE)
    white = rng.standard_normal(n)
    if color == "white":
        x = white
    elif color == "brown":
        x = np.cumsum(white)
        x -= np.convolve(x, np.ones(400) / 400, mode="same")
    else:                                   # "hum": a mains-like hum with harmonics
        t = np.arange(n) / RATE
        x = sum(np.sin(2 * np.pi * 60 * k * t) / k for k in range(1, 6)) + 0.3 * white
    return level * x / (np.std(x) + 1e-9)


# --------------------------------------------------------------------------- Speech Commands

def build_speech_commands(root: str, words: Sequence[str] = SPEECH_COMMANDS_WORDS,
                          train_speakers: int = 4, dev_speakers: int = 1,
                          test_speakers: int = 1, noise_seconds: float = 12.0,
                          seed: int = 0) -> Dict[str, List[str]]:
    """`<root>/<word>/<speaker>_nohash_<n>.wav` (one clip per speaker and word, plus a
    second clip `_nohash_1` for the first training speaker), `validation_list.txt`,
    `testing_list.txt` (relative paths, split by speaker as in the real corpus),
    `_background_noise_/*.wav` and the corpus README/LICENSE. Returns split -> paths."""
    rng = np.random.default_rng(seed)
    n_spk = train_speakers + dev_speakers + test_speakers
    speakers = [_hex_id("speaker", seed, i) for i in range(n_spk)]
    split_of = {s: ("train" if i < train_speakers else
                    "dev" if i < train_speakers + dev_speakers else "test")
                for i, s in enumerate(speakers)}
    pitch = {s: 0.85 + 0.3 * i / max(1, n_spk - 1) for i, s in enumerate(speakers)}
    splits: Dict[str, List[str]] = {"train": [], "dev": [], "test": []}
    for w_index, word in enumerate(words):
        class_index = SPEECH_COMMANDS_WORDS.index(word) if word in SPEECH_COMMANDS_WORDS \
            else len(SPEECH_COMMANDS_WORDS) + w_index
        for s_index, spk in enumerate(speakers):
            for n in range(2 if s_index == 0 else 1):
                rel = f"{word}/{spk}_nohash_{n}.wav"
                # Most clips are 1 s; a few are shorter, as in the real corpus.
                seconds = 1.0 if (w_index + s_index + n) % 5 else 0.8
                _write(os.path.join(root, rel), class_signal(class_index, seconds, rng, pitch[spk]))
                splits[split_of[spk]].append(rel)
    noise_dir = os.path.join(root, "_background_noise_")
    for i, name in enumerate(BACKGROUND_NOISES):
        color = ("hum", "brown", "white")[i % 3]
        _write(os.path.join(noise_dir, name + ".wav"), noise_signal(noise_seconds, rng, color))
    with open(os.path.join(noise_dir, "README.md"), "w") as f:
        f.write("Background noise recordings, cut into 1 s silence clips by recipes.\n")
    for name, split in (("validation_list.txt", "dev"), ("testing_list.txt", "test")):
        with open(os.path.join(root, name), "w") as f:
            f.write("".join(rel + "\n" for rel in sorted(splits[split])))
    for name in ("README.md", "LICENSE"):
        with open(os.path.join(root, name), "w") as f:
            f.write("miniature Speech Commands v0.02 for tests\n")
    return splits


def speech_commands_archive(corpus_root: str, archive: str) -> str:
    """A .tar.gz of a miniature corpus laid out like speech_commands_v0.02.tar.gz
    (members at the top level: ./yes/..., ./validation_list.txt)."""
    import tarfile
    os.makedirs(os.path.dirname(os.path.abspath(archive)), exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for name in sorted(os.listdir(corpus_root)):
            tar.add(os.path.join(corpus_root, name), arcname=f"./{name}")
    return archive


# --------------------------------------------------------------------------- Hey Snips

def build_hey_snips(root: str, sizes: Optional[Dict[str, tuple]] = None, seed: int = 0,
                    zero_duration_entry: bool = True) -> Dict[str, List[dict]]:
    """`<root>/audio_files/<id>.wav` and `<root>/{train,dev,test}.json`, each a JSON list
    of {"duration", "worker_id", "audio_file_path", "id", "is_hotword"}; `sizes` maps
    split -> (hotword clips, other clips). Workers (speakers) do not cross splits.
    With `zero_duration_entry`, train.json also lists one entry of duration 0 (as the
    real metadata does), whose file holds no samples."""
    sizes = sizes or {"train": (12, 20), "dev": (4, 6), "test": (6, 10)}
    rng = np.random.default_rng(seed)
    meta: Dict[str, List[dict]] = {}
    for split, (n_pos, n_neg) in sizes.items():
        # Worker ids are integers in the real metadata; they differ between splits.
        workers = [1000 * (1 + ("train", "dev", "test").index(split)) + i for i in range(3)]
        entries = []
        for i in range(n_pos + n_neg):
            hot = i < n_pos
            utt = "-".join(_hex_id("snips", split, seed, i, k, n=m)
                           for k, m in enumerate((8, 4, 4, 4, 12)))
            worker = workers[i % len(workers)]
            seconds = float(np.round(rng.uniform(1.2, 2.5), 2))
            if hot:
                wave = class_signal(0, seconds, rng, pitch=0.9 + 0.1 * (i % 3))
            else:
                wave = noise_signal(seconds, rng, ("white", "brown", "hum")[i % 3], 0.03)
                wave += class_signal(3 + i % 5, seconds, rng, level=0.2)
            rel = f"audio_files/{utt}.wav"
            _write(os.path.join(root, rel), wave)
            entries.append({"duration": seconds, "worker_id": worker, "audio_file_path": rel,
                            "id": utt, "is_hotword": int(hot)})
        if zero_duration_entry and split == "train":
            utt = _hex_id("snips-empty", seed, n=8) + "-0000-0000-0000-000000000000"
            rel = f"audio_files/{utt}.wav"
            _write(os.path.join(root, rel), np.zeros(0))
            entries.append({"duration": 0.0, "worker_id": workers[0], "audio_file_path": rel,
                            "id": utt, "is_hotword": 0})
        rng.shuffle(entries)
        with open(os.path.join(root, f"{split}.json"), "w") as f:
            json.dump(entries, f, indent=1)
        meta[split] = entries
    return meta


# --------------------------------------------------------------------------- Mobvoi hotwords

def build_mobvoi_hotwords(root: str, sizes: Optional[Dict[str, tuple]] = None,
                          seed: int = 0) -> Dict[str, List[dict]]:
    """`<root>/mobvoi_hotword_dataset/<utt_id>.wav` and
    `<root>/mobvoi_hotword_dataset_resources/{p,n}_{train,dev,test}.json`: JSON lists of
    {"utt_id", "speaker_id", "keyword_id"} with keyword_id 0 ("hi xiaowen") or 1
    ("nihao wenwen") in p_*.json and -1 in n_*.json. `sizes` maps split -> (clips per
    keyword, negative clips). Returns split -> all entries."""
    sizes = sizes or {"train": (8, 16), "dev": (3, 5), "test": (4, 8)}
    rng = np.random.default_rng(seed)
    wav_dir = os.path.join(root, "mobvoi_hotword_dataset")
    res_dir = os.path.join(root, "mobvoi_hotword_dataset_resources")
    os.makedirs(res_dir, exist_ok=True)
    out: Dict[str, List[dict]] = {}
    for split, (n_kw, n_neg) in sizes.items():
        speakers = [_hex_id("mobvoi-spk", split, seed, i, n=32) for i in range(3)]
        pos, neg = [], []
        for kw in (0, 1):
            for i in range(n_kw):
                utt = _hex_id("mobvoi", split, seed, kw, i, n=32)
                seconds = float(rng.uniform(1.2, 2.2))
                _write(os.path.join(wav_dir, utt + ".wav"),
                       class_signal(kw, seconds, rng, pitch=0.9 + 0.1 * (i % 3)))
                pos.append({"utt_id": utt, "speaker_id": speakers[i % 3], "keyword_id": kw})
        for i in range(n_neg):
            utt = _hex_id("mobvoi-neg", split, seed, i, n=32)
            seconds = float(rng.uniform(1.5, 3.0))
            wave = noise_signal(seconds, rng, ("white", "brown", "hum")[i % 3], 0.03)
            wave += class_signal(4 + i % 6, seconds, rng, level=0.2)
            _write(os.path.join(wav_dir, utt + ".wav"), wave)
            # Negative speakers are mostly not the keyword speakers, as in the corpus, and
            # some negatives have no speaker id at all (null), as many in the corpus do.
            speaker = None if i % 4 == 3 else _hex_id("mobvoi-neg-spk", split, i % 4, n=32)
            neg.append({"utt_id": utt, "speaker_id": speaker, "keyword_id": -1})
        for prefix, entries in (("p", pos), ("n", neg)):
            with open(os.path.join(res_dir, f"{prefix}_{split}.json"), "w") as f:
                json.dump(entries, f, indent=1)
        out[split] = pos + neg
    return out
