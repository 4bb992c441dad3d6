"""What an utterance becomes for speaker embeddings: a random fixed-length chunk of fbank
frames for training (drawn per seed, epoch and utterance, so resume stays exact), the
whole utterance (centred crop) for validation; plus trial lists made from a dev list."""
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from toolkit.data.audio import BadEntry
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

    def __init__(self, pipeline, chunk_frames: int, max_frames: int, min_frames: int = 1):
        self.pipeline = pipeline
        self.chunk_frames = chunk_frames
        self.max_frames = max_frames
        # The model's fewest input frames: shorter utterances are counted skips, in
        # training (before looping) and in validation alike.
        pipeline.min_frames = max(1, int(min_frames))
        opts = pipeline.opts.frame_opts
        rate = pipeline.cfg.sample_rate
        self.win = int(rate * opts.frame_length_ms / 1000)
        self.hop = int(rate * opts.frame_shift_ms / 1000)
        self.dim = pipeline.num_bins

    def _chunk_features(self, entry: dict, epoch: int, audio, rng) -> np.ndarray:
        p = self.pipeline
        n = self.chunk_frames
        if "feat" in entry and audio is None:
            feats = tile_to(p.check_length(p.read_features(entry)), n)
            start = int(rng.integers(0, len(feats) - n + 1))
            return p.augment_features(feats[start:start + n], rng)
        wave = p.load(entry, audio)
        frames = 1 + (len(wave) - self.win) // self.hop if len(wave) >= self.win else 0
        if frames < p.min_frames:
            raise BadEntry("too_short_after_processing",
                           f"{frames} frames, the model needs {p.min_frames}")
        need = self.win + (n - 1) * self.hop
        wave = tile_to(wave, need)
        start = int(rng.integers(0, len(wave) - need + 1))
        wave = p.augment_waveform(wave[start:start + need], rng, epoch)
        # Speed perturbation changes the length: loop or cut back to the chunk.
        feats = tile_to(p.fbank(wave, epoch, entry["key"]), n)[:n]
        return p.augment_features(feats, rng)

    def __call__(self, entry: dict, epoch: int, audio=None):
        label = entry.get("label")
        label = label if isinstance(label, int) else -1
        if not self.pipeline.train and not entry.get("spk"):
            # Its trials need the speaker (a shard's entry is only read here).
            raise BadEntry("missing_field", "no speaker (`spk`) for the dev trials")
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


class TrialError(ValueError):
    """Utterances that cannot give both kinds of trial (target and non-target)."""


# Random draws of the rejection sampler per non-target pair wanted before it gives way to
# exact sampling (a dev list dominated by one speaker has few cross-speaker pairs).
_DRAWS_PER_PAIR = 4


def _pair_of(index: np.ndarray, sizes: np.ndarray, offsets: np.ndarray
             ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Target pair numbers -> (group, x, y): the pairs of group g (c = sizes[g] members)
    are numbered from offsets[g] in the order (0,1), (0,2), ..., (1,2), ... (x < y)."""
    group = np.searchsorted(offsets, index, side="right") - 1
    c = sizes[group].astype(np.int64)
    k = index - offsets[group]

    def before(x):                     # pairs in the rows above row x
        return x * (2 * c - x - 1) // 2
    # The row from the quadratic formula, then exact in integers.
    b = 2.0 * c - 1.0
    x = np.floor((b - np.sqrt(np.maximum(b * b - 8.0 * k, 0.0))) / 2.0).astype(np.int64)
    x = np.clip(x, 0, np.maximum(c - 2, 0))
    while True:
        low = before(x) > k
        high = before(x + 1) <= k
        if not (low.any() or high.any()):
            break
        x = x - low + high
    return group, x, x + 1 + (k - before(x))


def trial_problem(keys: Sequence[str], speakers: Sequence[str]) -> Optional[str]:
    """Why these utterances cannot make trials (make_trials' TrialError), or None."""
    unnamed = [k for k, s in zip(keys, speakers) if not s]
    if unnamed:
        return (f"{len(unnamed)} utterances have no speaker (`spk`), e.g. "
                f"{', '.join(unnamed[:3])}")
    counts = np.unique(np.asarray(speakers, dtype=object), return_counts=True)[1] \
        if len(speakers) else np.zeros(0, np.int64)
    if not (counts >= 2).any() or len(counts) < 2:
        return (f"{len(speakers)} utterances of {len(counts)} speakers give no "
                + ("same-speaker (target) pair: every speaker has one utterance"
                   if not (counts >= 2).any() else
                   "different-speaker (non-target) pair: one speaker")
                + "; a dev list needs speakers with two or more utterances, and two or more "
                "speakers")
    return None


def make_trials(keys: Sequence[str], speakers: Sequence[str], seed: int = 0,
                max_targets: int = 20000, nontarget_ratio: float = 1.0
                ) -> Tuple[List[str], List[str], np.ndarray]:
    """Trials over utterances with known speakers: every same-speaker pair (a random
    sample above `max_targets`) and as many different-speaker pairs times
    `nontarget_ratio` (all of them when there are fewer), deterministic for the seed.
    Memory and time stay bounded by the trials asked for, whatever the list. Returns
    (enroll, test, labels); TrialError when an utterance has no speaker or the utterances
    give no target pair (every speaker once) or no non-target pair (one speaker)."""
    problem = trial_problem(keys, speakers)
    if problem:
        raise TrialError(problem)
    rng = np.random.default_rng([seed & 0xFFFFFFFF, 0x7121A1])
    order = np.argsort(np.asarray(keys, dtype=object), kind="stable")
    keys = [keys[i] for i in order]
    speakers = [speakers[i] for i in order]
    by_spk = {}
    for i, s in enumerate(speakers):
        by_spk.setdefault(s, []).append(i)
    groups = list(by_spk.values())
    sizes = np.array([len(g) for g in groups], dtype=np.int64)
    pairs_per = sizes * (sizes - 1) // 2
    offsets = np.concatenate([[0], np.cumsum(pairs_per)])
    total_targets = int(offsets[-1])
    n = len(keys)
    total_nontargets = n * (n - 1) // 2 - total_targets
    # Pair numbers in the enumeration order (speaker groups, then x < y): a sample is
    # drawn from the numbers, never from a list of every pair.
    if total_targets > max_targets:
        picked = np.sort(rng.choice(total_targets, max_targets, replace=False))
    else:
        picked = np.arange(total_targets)
    group, x, y = _pair_of(picked.astype(np.int64), sizes, offsets)
    members = [np.asarray(g, dtype=np.int64) for g in groups]
    targets = [(int(members[g][a]), int(members[g][b])) for g, a, b in zip(group, x, y)]
    want = min(int(round(len(targets) * nontarget_ratio)), total_nontargets)
    nontargets = set()
    draws = 0
    while len(nontargets) < want and draws < _DRAWS_PER_PAIR * want + 1000:
        a, b = (int(v) for v in rng.integers(0, n, size=2))
        draws += 1
        if speakers[a] != speakers[b]:
            nontargets.add((min(a, b), max(a, b)))
    if len(nontargets) < want:
        nontargets |= _more_nontargets(speakers, nontargets, want, rng)
    pairs = [(a, b, 1) for a, b in targets] + [(a, b, 0) for a, b in sorted(nontargets)]
    return ([keys[a] for a, _, _ in pairs], [keys[b] for _, b, _ in pairs],
            np.array([lab for _, _, lab in pairs], dtype=np.int64))


def _more_nontargets(speakers: Sequence[str], have: set, want: int,
                     rng: np.random.Generator) -> set:
    """Different-speaker pairs until there are `want` (at most all of them) besides
    `have`, when random pairs mostly meet one speaker: every such pair when there are few,
    else pairs drawn with the second utterance from the other speakers only."""
    n = len(speakers)
    spk_ids = np.unique(np.asarray(speakers, dtype=object), return_inverse=True)[1]
    order = np.argsort(spk_ids, kind="stable")
    bounds = np.searchsorted(spk_ids[order], np.arange(spk_ids.max() + 2))
    sizes = np.diff(bounds)
    cross = (n * n - int((sizes * sizes).sum())) // 2
    out = set()
    if cross <= 4 * want + 100000:
        firsts, seconds = [], []
        for s in range(len(sizes)):
            mine, later = order[bounds[s]:bounds[s + 1]], order[bounds[s + 1]:]
            firsts.append(np.repeat(mine, len(later)))
            seconds.append(np.tile(later, len(mine)))
        a, b = np.concatenate(firsts), np.concatenate(seconds)
        lo, hi = np.minimum(a, b), np.maximum(a, b)
        fresh = [(int(p), int(q)) for p, q in zip(lo, hi) if (int(p), int(q)) not in have]
        fresh.sort()
        need = want - len(have)
        if need >= len(fresh):
            return set(fresh)
        return {fresh[i] for i in rng.choice(len(fresh), need, replace=False)}
    # Many cross pairs: the second utterance drawn among the other speakers' (a pair is
    # new with probability >= 3/4 here), in bounded rounds.
    for _ in range(100):
        need = want - len(have) - len(out)
        if need <= 0:
            break
        a = rng.integers(0, n, size=2 * need)
        own = spk_ids[a]
        r = rng.integers(0, n - sizes[own])
        b = order[np.where(r < bounds[own], r, r + sizes[own])]
        for p, q in zip(np.minimum(a, b), np.maximum(a, b)):
            pair = (int(p), int(q))
            if pair not in have:
                out.add(pair)
                if len(have) + len(out) >= want:
                    break
    return out
