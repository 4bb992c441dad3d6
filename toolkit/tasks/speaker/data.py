"""What an utterance becomes for speaker embeddings: a random fixed-length chunk of fbank
frames for training (drawn per seed, epoch and utterance, so resume stays exact), the
whole utterance (centred crop) for validation; plus trial lists made from a dev list."""
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from toolkit.data.datalist import BadCounter
from toolkit.task import Batch, ExampleBuilder, pad_sequences


def tile_to(x: np.ndarray, length: int) -> np.ndarray:
    """`x` repeated along its first axis until it is at least `length` long (short
    utterances are looped, as speaker recipes do, rather than zero-padded)."""
    if len(x) >= length or len(x) == 0:
        return x
    return np.concatenate([x] * int(np.ceil(length / len(x))))


class ChunkBuilder(ExampleBuilder):
    """Training: a `chunk_frames` chunk at a random offset. From audio only the chunk's
    samples are decoded into fbank (and augmented), from precomputed features the chunk
    is cut from them. Evaluation: the utterance itself, centre-cropped to `max_frames`."""

    def __init__(self, pipeline, chunk_frames: int, max_frames: int):
        self.pipeline = pipeline
        self.chunk_frames = chunk_frames
        self.max_frames = max_frames
        opts = pipeline.opts.frame_opts
        rate = pipeline.cfg.sample_rate
        self.win = int(rate * opts.frame_length_ms / 1000)
        self.hop = int(rate * opts.frame_shift_ms / 1000)
        self.dim = pipeline.num_bins

    def _chunk_features(self, entry: dict, epoch: int, audio, rng) -> np.ndarray:
        p = self.pipeline
        n = self.chunk_frames
        if "feat" in entry and audio is None:
            feats = tile_to(p.read_features(entry), n)
            start = int(rng.integers(0, len(feats) - n + 1))
            return p.augment_features(feats[start:start + n], rng)
        wave = tile_to(p.load(entry, audio), self.win + (n - 1) * self.hop)
        need = self.win + (n - 1) * self.hop
        start = int(rng.integers(0, len(wave) - need + 1))
        wave = p.augment_waveform(wave[start:start + need], rng, epoch)
        # Speed perturbation changes the length: loop or cut back to the chunk.
        feats = tile_to(p.fbank(wave, epoch, entry["key"]), n)[:n]
        return p.augment_features(feats, rng)

    def __call__(self, entry: dict, epoch: int, audio=None):
        label = entry.get("label")
        label = label if isinstance(label, int) else -1
        if self.pipeline.train:
            feats = self._chunk_features(entry, epoch, audio, self.pipeline.rng(epoch, entry["key"]))
        else:
            feats = self.pipeline.features(entry, epoch, audio)
            if self.max_frames and len(feats) > self.max_frames:
                start = (len(feats) - self.max_frames) // 2
                feats = feats[start:start + self.max_frames]
        return feats, label, str(entry.get("spk", ""))

    def collate(self, examples, keys: List[str], audio_seconds: float, bad: BadCounter) -> Batch:
        if examples:
            feats, lengths = pad_sequences([e[0] for e in examples])
        else:
            feats, lengths = np.zeros((0, self.chunk_frames, self.dim), np.float32), np.zeros(0)
        tensors = {"feats": torch.from_numpy(feats),
                   "lengths": torch.as_tensor(lengths, dtype=torch.int64),
                   "labels": torch.tensor([e[1] for e in examples], dtype=torch.int64)}
        batch = Batch(list(keys), tensors, audio_seconds, bad)
        batch.speakers = [e[2] for e in examples]
        return batch


def make_trials(keys: Sequence[str], speakers: Sequence[str], seed: int = 0,
                max_targets: int = 20000, nontarget_ratio: float = 1.0
                ) -> Tuple[List[str], List[str], np.ndarray]:
    """Trials over utterances with known speakers: every same-speaker pair (a random
    sample above `max_targets`) and as many different-speaker pairs times
    `nontarget_ratio`, deterministic for the seed. Returns (enroll, test, labels)."""
    rng = np.random.default_rng([seed & 0xFFFFFFFF, 0x7121A1])
    order = np.argsort(np.asarray(keys, dtype=object), kind="stable")
    keys = [keys[i] for i in order]
    speakers = [speakers[i] for i in order]
    by_spk = {}
    for i, s in enumerate(speakers):
        by_spk.setdefault(s, []).append(i)
    targets = [(a, b) for idx in by_spk.values() for x, a in enumerate(idx) for b in idx[x + 1:]]
    if len(targets) > max_targets:
        pick = rng.choice(len(targets), max_targets, replace=False)
        targets = [targets[i] for i in sorted(pick)]
    n = len(keys)
    want = int(round(len(targets) * nontarget_ratio))
    nontargets = set()
    if len(by_spk) > 1:
        while len(nontargets) < want:
            a, b = (int(v) for v in rng.integers(0, n, size=2))
            if speakers[a] != speakers[b]:
                nontargets.add((min(a, b), max(a, b)))
    pairs = [(a, b, 1) for a, b in targets] + [(a, b, 0) for a, b in sorted(nontargets)]
    return ([keys[a] for a, _, _ in pairs], [keys[b] for _, b, _ in pairs],
            np.array([lab for _, _, lab in pairs], dtype=np.int64))
