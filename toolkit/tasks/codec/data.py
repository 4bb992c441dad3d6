"""The codec's examples: a training segment per utterance (random offset, padded or
looped, the dataset's waveform augmentation) or the first seconds of a dev utterance, with
its encoder-rate version when the encoder reads another rate; and their batches."""
import math

import numpy as np
import torch

from toolkit.data.audio import BadEntry, resample
from toolkit.data.pipeline import FeaturePipeline
from toolkit.task import Batch, ExampleBuilder, pad_sequences


def fit_length(wave: np.ndarray, length: int, policy: str) -> np.ndarray:
    """`wave` brought to at least `length` samples: zeros after it (pad) or repeated (loop)."""
    if len(wave) >= length:
        return wave
    if policy == "loop" and len(wave):
        return np.concatenate([wave] * int(math.ceil(length / len(wave))))
    return np.pad(wave, (0, length - len(wave)))


class SegmentBuilder(ExampleBuilder):
    """Training: a `segment` samples excerpt at a random offset (from the utterance's own
    stream: seed, epoch, key), short utterances padded or looped, then the dataset's
    waveform augmentation; cut from a slightly longer excerpt when speed perturbation
    could shorten it. Evaluation: the first `eval_samples` samples, no randomness.

    With `encoder_rate` (the encoder reads another rate than the dataset's): each example is
    (target-rate audio, encoder-rate audio), the second resampled from the same excerpt
    (with `RESAMPLING_MARGIN` more target samples after it, so that the filter sees real
    signal at the segment's end). Both start at the excerpt's first sample; the segment
    (whole code frames) and dev utterances (cut to whole `step`s, the target samples of the
    rates' common period) map to whole samples at both rates."""

    # Target-rate samples resampled beyond the segment: more than the resampling filter's
    # half width (52 samples for 24 -> 16 kHz, 95 for 44.1 -> 16 kHz).
    RESAMPLING_MARGIN = 256

    def __init__(self, pipeline: FeaturePipeline, segment: int, eval_samples: int,
                 policy: str, encoder_rate: int = 0):
        self.pipeline = pipeline
        self.segment = segment
        self.eval_samples = eval_samples
        self.policy = policy
        rate = pipeline.cfg.sample_rate
        self.encoder_rate = encoder_rate if encoder_rate and encoder_rate != rate else 0
        self.step = rate // math.gcd(rate, self.encoder_rate) if self.encoder_rate else 1
        self.encoder_segment = segment * self.encoder_rate // rate if self.encoder_rate else 0
        fastest = max(pipeline.cfg.speed_perturb) if pipeline.cfg.speed_perturb else 1.0
        self.excerpt = int(math.ceil(segment * max(1.0, fastest)))
        if self.encoder_rate:
            self.excerpt += self.RESAMPLING_MARGIN

    def encoder_view(self, wave: np.ndarray, length: int) -> np.ndarray:
        """`length` samples of `wave` (target rate) resampled to the encoder's rate."""
        out = resample(wave, self.pipeline.cfg.sample_rate, self.encoder_rate)[:length]
        return np.clip(fit_length(out, length, "pad"), -1.0, 1.0).astype(np.float32)

    def __call__(self, entry: dict, epoch: int, audio=None) -> np.ndarray:
        if audio is None and "wav" not in entry:
            raise BadEntry("missing_field", "codec training reads audio (`wav`), not "
                           "precomputed features")
        p = self.pipeline
        wave = p.load(entry, audio)
        if not p.train:
            wave = np.ascontiguousarray(wave[:self.eval_samples], dtype=np.float32)
            if not self.encoder_rate:
                return wave
            wave = wave[:len(wave) // self.step * self.step]
            if not len(wave):
                raise BadEntry("too_short", f"shorter than {self.step} samples, the common "
                               "period of the encoder's and the target rate")
            return wave, self.encoder_view(wave, len(wave) * self.encoder_rate //
                                           p.cfg.sample_rate)
        rng = p.rng(epoch, entry["key"])
        wave = fit_length(wave, self.excerpt, self.policy)
        start = int(rng.integers(0, len(wave) - self.excerpt + 1))
        piece = p.augment_waveform(wave[start:start + self.excerpt], rng, epoch)
        piece = fit_length(piece, self.segment, self.policy)
        # Gain and added noise can leave the PCM range that the (tanh) output covers.
        target = np.clip(piece[:self.segment], -1.0, 1.0).astype(np.float32)
        if not self.encoder_rate:
            return target
        return target, self.encoder_view(np.clip(piece, -1.0, 1.0), self.encoder_segment)

    def collate(self, examples, keys, audio_seconds, bad) -> Batch:
        dual = bool(self.encoder_rate)
        targets = [e[0] for e in examples] if dual else examples
        if examples:
            audio, lengths = pad_sequences(targets)
        else:
            audio, lengths = np.zeros((0, self.segment), np.float32), np.zeros(0, np.int64)
        tensors = {"audio": torch.from_numpy(audio),
                   "lengths": torch.as_tensor(lengths, dtype=torch.int64)}
        if dual:
            if examples:
                encoder_audio, encoder_lengths = pad_sequences([e[1] for e in examples])
            else:
                encoder_audio = np.zeros((0, self.encoder_segment), np.float32)
                encoder_lengths = np.zeros(0, np.int64)
            tensors["encoder_audio"] = torch.from_numpy(encoder_audio)
            tensors["encoder_lengths"] = torch.as_tensor(encoder_lengths, dtype=torch.int64)
        return Batch(list(keys), tensors, audio_seconds, bad)
