"""Small real-audio speaker data sets for tests: each "speaker" is a voice-like source
(harmonics of a speaker-specific pitch through speaker-specific formant resonances, with
jitter and noise), so embeddings have something to separate. WAV files, Kaldi dirs with
utt2spk, data lists with `spk` and labels. Deterministic for a seed."""
import json
import os
from typing import Dict, List, Sequence, Tuple

import numpy as np
import soundfile as sf

RATE = 16000


def speaker_params(index: int) -> Tuple[float, List[float]]:
    rng = np.random.default_rng([index, 99])
    return float(rng.uniform(90, 260)), sorted(rng.uniform(300, 3500, size=3).tolist())


def voice_wave(rng: np.random.Generator, pitch: float, formants: Sequence[float],
               seconds: float) -> np.ndarray:
    n = int(seconds * RATE)
    t = np.arange(n) / RATE
    f0 = pitch * (1 + 0.05 * np.sin(2 * np.pi * rng.uniform(2, 5) * t))
    phase = 2 * np.pi * np.cumsum(f0) / RATE
    source = sum(np.sin(k * phase) / k for k in range(1, 20))
    spectrum = np.fft.rfft(source)
    freqs = np.fft.rfftfreq(n, 1 / RATE)
    envelope = sum(np.exp(-0.5 * ((freqs - f) / 120.0) ** 2) for f in formants) + 0.05
    wave = np.fft.irfft(spectrum * envelope, n)
    wave = 0.3 * wave / (np.abs(wave).max() + 1e-9) + 0.01 * rng.standard_normal(n)
    return wave.astype(np.float32)


def make_speaker_dir(root: str, name: str, speakers: Sequence[int], utts: int,
                     seed: int) -> str:
    rng = np.random.default_rng(seed)
    data_dir = os.path.join(root, name)
    wav_dir = os.path.join(root, "wavs", name)
    os.makedirs(data_dir, exist_ok=True)
    os.makedirs(wav_dir, exist_ok=True)
    scp, u2s = {}, {}
    for s in speakers:
        pitch, formants = speaker_params(s)
        for u in range(utts):
            key = f"spk{s:03d}-{name}-{u:03d}"
            path = os.path.join(wav_dir, key + ".wav")
            sf.write(path, voice_wave(rng, pitch, formants, float(rng.uniform(1.0, 2.5))),
                     RATE, subtype="PCM_16")
            scp[key], u2s[key] = path, f"spk{s:03d}"
    for file, table in (("wav.scp", scp), ("utt2spk", u2s)):
        with open(os.path.join(data_dir, file), "w") as f:
            f.writelines(f"{k} {table[k]}\n" for k in sorted(table))
    return data_dir


def speaker_list(root: str, name: str, speakers: Sequence[int], utts: int, seed: int,
                 inventory: Dict[str, int]) -> str:
    """A data list (label from `inventory`, -1 for speakers outside it)."""
    data_dir = make_speaker_dir(root, name, speakers, utts, seed)
    out = os.path.join(root, f"{name}.list")
    with open(os.path.join(data_dir, "wav.scp")) as f, open(out, "w") as w:
        for line in f:
            key, path = line.split()
            spk = key.split("-")[0]
            info = sf.info(path)
            w.write(json.dumps({"key": key, "wav": path, "spk": spk,
                                "duration": info.frames / info.samplerate,
                                "label": inventory.get(spk, -1)}) + "\n")
    return out


class SpeakerCorpus:
    """Train list (speakers 0..n-1), dev list of unseen speakers, inventory, config."""

    def __init__(self, root: str, num_speakers: int = 6, utts: int = 6, dev_speakers: int = 4,
                 config: dict = None):
        self.root = root
        os.makedirs(root, exist_ok=True)
        names = [f"spk{s:03d}" for s in range(num_speakers)]
        self.inventory = os.path.join(root, "speakers.txt")
        with open(self.inventory, "w") as f:
            f.writelines(n + "\n" for n in names)
        index = {n: i for i, n in enumerate(names)}
        self.train = speaker_list(root, "train", range(num_speakers), utts, 1, index)
        self.dev = speaker_list(root, "dev", range(100, 100 + dev_speakers), 4, 2, index)
        self.config = os.path.join(root, "speaker.yaml")
        import yaml
        with open(self.config, "w") as f:
            yaml.safe_dump(config or TINY_SPEAKER_CONFIG, f)

    def train_args(self, exp: str, *overrides: str, config: str = None,
                   inventory: str = None) -> List[str]:
        return ["-m", "toolkit.bin.train", "--config", config or self.config, "--exp-dir", exp,
                "--train-data", self.train, "--dev-data", self.dev,
                "--inventory", inventory or self.inventory, *overrides]


TINY_SPEAKER_CONFIG = {
    "task": {"type": "speaker", "chunk_frames": 50, "eval_max_frames": 200},
    "dataset": {"feature": {"num_mel_bins": 24, "dither": 1.0}, "batch_size": 8,
                "volume_range": [0.8, 1.2], "num_workers": 2, "sort_window": 50},
    "model": {"type": "resnet", "num_blocks": [1, 1], "stage_strides": [1, 2],
              "base_channels": 4, "embed_dim": 16},
    "head": {"type": "aam_softmax", "scale": 16.0,
             "margin": {"initial": 0.0, "final": 0.2, "start": 0.2, "end": 0.6}},
    "optim": {"type": "adam", "lr": 0.01, "scheduler": {"type": "warmup_cosine",
                                                        "warmup_steps": 2}},
    "training": {"seed": 3, "max_epoch": 3, "log_interval": 2, "save_interval_steps": 2,
                 "keep_last": 2, "keep_best": 2},
}
