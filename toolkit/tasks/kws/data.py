"""What an utterance becomes for keyword spotting: features (with the dataset
section's augmentation), its label (keyword index, -1 for filler), the frame where its
keyword ends, and CTC unit targets when the loss has a CTC component. (Labels and
keyword times are read by toolkit.tasks.kws.labels, at make_datalist time.)"""
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from toolkit.data.audio import BadEntry
from toolkit.data.datalist import BadCounter
from toolkit.task import Batch, ExampleBuilder, pad_sequences


def keyword_end_frame(entry: dict, num_frames: int,
                      frame_end_s: Optional[np.ndarray] = None) -> int:
    """Frame where the entry's keyword ends (`kw_end` seconds), -1 when the entry has none.
    With `frame_end_s` (where each frame's input ends, in the entry's seconds; feature
    types that know it) the first frame whose input holds the whole keyword. Otherwise
    (fbank) a fraction of the duration, so it follows any speed perturbation."""
    end, duration = entry.get("kw_end"), entry.get("duration")
    if not isinstance(end, (int, float)) or not isinstance(duration, (int, float)) \
            or duration <= 0 or num_frames <= 0:
        return -1
    if frame_end_s is not None:
        # A nanosecond of slack: kw_times' millisecond values meet the 80 ms grid exactly.
        first = int(np.searchsorted(np.asarray(frame_end_s[:num_frames]), end - 1e-9))
        return min(first, num_frames - 1)
    return min(int(end / duration * num_frames), num_frames - 1)


def token_problem(tokens, num_units: int) -> Optional[Tuple[str, str]]:
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                               for t in tokens):
        return "missing_tokens", "needs a `tokens` list of unit ids (make_datalist --lexicon)"
    outside = [t for t in tokens if not 0 < t < num_units]
    if outside:
        return "token_not_in_units", f"ids {outside[:5]} outside [1, {num_units})"
    return None


class KwsExampleBuilder(ExampleBuilder):
    """Entry -> (features, label, keyword end frame, CTC tokens or None)."""

    def __init__(self, pipeline, spec_aug_positives: bool, num_units: Optional[int]):
        self.pipeline = pipeline
        self.spec_aug_positives = spec_aug_positives
        self.num_units = num_units
        self.dim = pipeline.num_bins

    def __call__(self, entry: dict, epoch: int, audio=None):
        label = entry.get("label")
        label = label if isinstance(label, int) else -1
        tokens = None
        if self.num_units is not None:
            problem = token_problem(entry.get("tokens"), self.num_units)
            if problem is not None:
                raise BadEntry(*problem)
            tokens = entry["tokens"]
        # A mask over the final /s/ of "hey snips" leaves a positive that sounds like a
        # confusable: `spec_aug_positives: false` masks fillers only.
        feats = self.pipeline.features(entry, epoch, audio,
                                       spec_aug=self.spec_aug_positives or label < 0)
        end = -1
        if label >= 0:
            timing = getattr(self.pipeline, "frame_end_times", None)
            end = keyword_end_frame(entry, len(feats),
                                    timing(len(feats)) if timing is not None else None)
        return feats, label, end, tokens

    def collate(self, examples, keys: List[str], audio_seconds: float, bad: BadCounter) -> Batch:
        return collate(keys, [e[0] for e in examples], [e[1] for e in examples], audio_seconds,
                       bad, self.dim, [e[3] for e in examples] if self.num_units is not None
                       else None, [e[2] for e in examples])


def collate(keys, feats_list, labels, audio_seconds, bad, dim: int,
            tokens: Optional[Sequence[Sequence[int]]] = None,
            keyword_end: Optional[Sequence[int]] = None) -> Batch:
    if feats_list:
        padded, lengths = pad_sequences(feats_list)
    else:
        padded, lengths = np.zeros((0, 0, dim), np.float32), np.zeros(0, np.int64)
    tensors = {"feats": torch.from_numpy(padded), "lengths": torch.from_numpy(lengths),
               "labels": torch.tensor(labels, dtype=torch.int64)}
    if keyword_end is not None:
        tensors["keyword_end"] = torch.tensor(list(keyword_end), dtype=torch.int64)
    if tokens is not None:
        token_lengths = np.array([len(t) for t in tokens], dtype=np.int64)
        ids = np.zeros((len(tokens), max(1, int(token_lengths.max(initial=0)))), dtype=np.int64)
        for i, t in enumerate(tokens):
            ids[i, :len(t)] = t
        tensors["tokens"] = torch.from_numpy(ids)
        tensors["token_lengths"] = torch.from_numpy(token_lengths)
    return Batch(list(keys), tensors, audio_seconds, bad)
