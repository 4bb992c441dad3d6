"""The data pipeline shared by every recipe: batch plan -> per-utterance processing ->
padding, served by a torch DataLoader.

Determinism contract (exact resume depends on it):
- the batch plan of an epoch depends only on (seed, epoch, data list, config);
- batch i of the plan goes to rank i % world_size, so each utterance is seen exactly once
  per epoch across ranks, and every rank gets the same number of steps (a rank short of
  a batch gets an empty one and takes a zero-weight step, so collectives never hang);
- augmentation randomness per utterance comes from (seed, epoch, key);
- resuming at step k of an epoch starts the sampler at k: the skipped batches are never
  decoded or featurized.
"""
import logging
import math
import multiprocessing
import os
import threading
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from toolkit.data import augment
from toolkit.data.audio import BadEntry
from toolkit.data.datalist import BadCounter, DataList
from toolkit.data.features import compute_fbank, options_from_config
from toolkit.registry import Registry

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- batch plan

def estimated_frames(durations: np.ndarray, dataset_cfg) -> np.ndarray:
    f = dataset_cfg.feature
    rate = dataset_cfg.sample_rate
    win = int(rate * f.frame_length_ms / 1000)
    hop = int(rate * f.frame_shift_ms / 1000)
    samples = np.round(durations.astype(np.float64) * rate)
    return np.maximum(0, 1 + (samples - win) // hop).astype(np.int64)


def plan_batches(datalist: DataList, dataset_cfg, seed: int, epoch: int,
                 train: bool) -> List[np.ndarray]:
    """Global list of batches (arrays of entry indices) for one epoch."""
    d = dataset_cfg
    dur = datalist.durations
    keep = np.nonzero((dur >= d.min_duration) & (dur <= d.max_duration))[0]
    rng = np.random.default_rng([seed & 0xFFFFFFFF, epoch, 0x5EED])
    order = rng.permutation(keep) if (train and d.shuffle) else keep
    frames = estimated_frames(dur, d)
    # Bucketing: sort by length inside windows, so padding stays small but the order
    # still varies between epochs.
    window = max(1, d.sort_window)
    parts = []
    for start in range(0, len(order), window):
        chunk = order[start:start + window]
        parts.append(chunk[np.argsort(frames[chunk], kind="stable")])
    order = np.concatenate(parts) if parts else order
    batches: List[np.ndarray] = []
    if d.max_frames_in_batch > 0:
        start, longest = 0, 0
        for i, idx in enumerate(order):
            longest_if_added = max(longest, int(frames[idx]))
            count = i - start + 1
            too_many = d.batch_size > 0 and count > d.batch_size
            if i > start and (longest_if_added * count > d.max_frames_in_batch or too_many):
                batches.append(order[start:i])
                start, longest_if_added = i, int(frames[idx])
            longest = longest_if_added
        if start < len(order):
            batches.append(order[start:])
    else:
        batches = [order[i:i + d.batch_size] for i in range(0, len(order), d.batch_size)]
    if train and d.shuffle and batches:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def rank_batches(batches: List[np.ndarray], rank: int, world_size: int) -> List[np.ndarray]:
    """Round-robin share of one rank, padded with empty batches to the common length."""
    steps = math.ceil(len(batches) / world_size) if batches else 0
    mine = batches[rank::world_size]
    empty = np.zeros(0, dtype=np.int64)
    return mine + [empty] * (steps - len(mine))


# --------------------------------------------------------------------------- processing

class UtteranceProcessor:
    """Entry -> feature matrix (frames, bins), with the configured augmentation chain."""

    def __init__(self, dataset_cfg, seed: int, train: bool,
                 noise: Optional[DataList] = None, rirs: Optional[DataList] = None,
                 from_features: bool = False):
        self.cfg = dataset_cfg
        self.seed = seed
        self.train = train
        self.noise = noise
        self.rirs = rirs
        self.from_features = from_features
        self.opts = options_from_config(dataset_cfg.feature, dataset_cfg.sample_rate)
        self.min_frames = 1
        mel = self.opts.mel_opts
        nyquist = dataset_cfg.sample_rate / 2
        self.mel_centers = augment.mel_bin_centers_hz(
            mel.num_bins, mel.low_freq, mel.high_freq if mel.high_freq > 0 else nyquist + mel.high_freq)

    def load(self, entry: dict) -> np.ndarray:
        """Decoded mono audio at the configured rate (segment applied)."""
        d = self.cfg
        return augment.load_mono(entry["wav"], d.sample_rate, d.channel,
                                 float(entry.get("start", 0.0)), float(entry.get("end", -1.0)))

    def augment_waveform(self, wave: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Speed, volume, reverberation, noise — in that fixed order (training only)."""
        d = self.cfg
        if not self.train:
            return wave
        if d.speed_perturb:
            factor = float(d.speed_perturb[int(rng.integers(0, len(d.speed_perturb)))])
            wave = augment.speed_perturb(wave, d.sample_rate, factor)
        if d.volume_range:
            wave = augment.apply_volume(wave, rng, *d.volume_range)
        if self.rirs is not None and rng.random() < d.reverb.prob:
            rir = augment.pick_and_load(self.rirs, rng, d.sample_rate)
            if rir is not None:
                wave = augment.add_reverb(wave, rir)
        if self.noise is not None and rng.random() < d.noise.prob:
            noise = augment.pick_and_load(self.noise, rng, d.sample_rate)
            if noise is not None:
                wave = augment.add_noise(wave, noise, float(rng.uniform(*d.noise.snr_db)), rng)
        return wave

    def _finish(self, feats: np.ndarray, rng: np.random.Generator, label: int) -> np.ndarray:
        feats = self._check_length(feats)
        if self.train and self.cfg.vtlp_range:
            factor = float(rng.uniform(*self.cfg.vtlp_range))
            feats = augment.warp_frequency(feats, factor, self.mel_centers)
        vp = self.cfg.voice_perturb
        # No draw at all when off: the random stream of older configs stays the same.
        if self.train and vp.prob > 0 and rng.random() < vp.prob:
            low, high = float(rng.uniform(*vp.low_range)), float(rng.uniform(*vp.high_range))
            feats = augment.warp_frequency(feats, low, self.mel_centers, high, vp.split_hz)
            feats = augment.tilt_spectrum(feats, float(rng.uniform(*vp.tilt_db)))
        sa = self.cfg.spec_aug
        if self.train and sa.enabled and (sa.keyword_utterances or label < 0):
            feats = augment.spec_augment(feats, rng, sa.num_time_masks, sa.max_time_width,
                                         sa.num_freq_masks, sa.max_freq_width)
        return feats

    def features_at_speed(self, entry: dict, factor: float) -> np.ndarray:
        """Features of `entry` played `factor` times faster, nothing else applied
        (speed-perturbed copies of training data, computed once)."""
        wave = augment.speed_perturb(self.load(entry), self.cfg.sample_rate, factor)
        return self._check_length(compute_fbank(wave, self.opts))

    def _check_length(self, feats: np.ndarray) -> np.ndarray:
        if len(feats) < self.min_frames:
            raise BadEntry("too_short_after_processing", f"{len(feats)} frames")
        return feats

    def features_from_waveform(self, wave: np.ndarray, key: str, epoch: int,
                               label: int = -1) -> np.ndarray:
        """Same as __call__ for audio already decoded (tar shards): mono at the
        configured rate."""
        rng = augment.utterance_rng(self.seed, epoch, key)
        return self._finish(compute_fbank(self.augment_waveform(wave, rng), self.opts), rng,
                            label)

    def __call__(self, entry: dict, epoch: int) -> np.ndarray:
        rng = augment.utterance_rng(self.seed, epoch, entry["key"])
        if "feat" in entry:       # precomputed features win over audio, per entry
            import kaldiio
            try:
                feats = np.asarray(kaldiio.load_mat(entry["feat"]), dtype=np.float32)
            except Exception as err:
                raise BadEntry("unreadable_features", f"{entry['feat']}: {err}") from None
            if not np.all(np.isfinite(feats)):
                raise BadEntry("nonfinite_samples", entry["feat"])
        else:
            feats = compute_fbank(self.augment_waveform(self.load(entry), rng), self.opts)
        label = entry.get("label")
        return self._finish(feats, rng, label if isinstance(label, int) else -1)


@dataclass
class Batch:
    keys: List[str]
    feats: torch.Tensor        # (B, T, D) float32, zero padded
    lengths: torch.Tensor      # (B,) int64
    labels: torch.Tensor       # (B,) int64
    audio_seconds: float
    bad: BadCounter
    # CTC targets when the loss needs them: (B, L) unit ids zero padded, (B,) lengths.
    tokens: Optional[torch.Tensor] = None
    token_lengths: Optional[torch.Tensor] = None
    # (B,) int64: frame at which each utterance's keyword ends, -1 where unknown.
    keyword_end: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return len(self.keys)


def keyword_end_frame(entry: dict, num_frames: int) -> int:
    """Frame where the entry's keyword ends (`kw_end` seconds), -1 when the entry has none.
    Taken as a fraction of the duration, so it follows any speed perturbation."""
    end, duration = entry.get("kw_end"), entry.get("duration")
    if not isinstance(end, (int, float)) or not isinstance(duration, (int, float)) \
            or duration <= 0 or num_frames <= 0:
        return -1
    return min(int(end / duration * num_frames), num_frames - 1)


def collate(keys, feats_list, labels, audio_seconds, bad, dim: int,
            tokens: Optional[Sequence[Sequence[int]]] = None,
            keyword_end: Optional[Sequence[int]] = None) -> Batch:
    lengths = np.array([len(f) for f in feats_list], dtype=np.int64)
    longest = int(lengths.max()) if len(lengths) else 0
    padded = np.zeros((len(feats_list), longest, dim), dtype=np.float32)
    for i, f in enumerate(feats_list):
        padded[i, :len(f)] = f
    batch = Batch(keys, torch.from_numpy(padded), torch.from_numpy(lengths),
                  torch.tensor(labels, dtype=torch.int64), audio_seconds, bad)
    if keyword_end is not None:
        batch.keyword_end = torch.tensor(list(keyword_end), dtype=torch.int64)
    if tokens is not None:
        token_lengths = np.array([len(t) for t in tokens], dtype=np.int64)
        ids = np.zeros((len(tokens), max(1, int(token_lengths.max(initial=0)))), dtype=np.int64)
        for i, t in enumerate(tokens):
            ids[i, :len(t)] = t
        batch.tokens = torch.from_numpy(ids)
        batch.token_lengths = torch.from_numpy(token_lengths)
    return batch


class BatchDataset(Dataset):
    """Item i = the i-th batch of this rank's plan, fully processed and padded."""

    def __init__(self, datalist: DataList, batches: Sequence[np.ndarray],
                 processor: UtteranceProcessor, epoch: int, with_tokens: bool = False):
        self.datalist = datalist
        self.batches = batches
        self.processor = processor
        self.epoch = epoch
        self.dim = processor.opts.mel_opts.num_bins
        self.with_tokens = with_tokens

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> Batch:
        keys, feats, labels, tokens, ends = [], [], [], [], []
        bad = BadCounter()
        seconds = 0.0
        for idx in self.batches[i]:
            entry = self.datalist.entry(int(idx))
            try:
                f = self.processor(entry, self.epoch)
            except BadEntry as err:
                bad.add(err.reason, entry["key"], err.detail)
                continue
            keys.append(entry["key"])
            feats.append(f)
            labels.append(int(self.datalist.labels[int(idx)]))
            ends.append(keyword_end_frame(entry, len(f)) if labels[-1] >= 0 else -1)
            if self.with_tokens:
                tokens.append(entry["tokens"])    # checked when the list was loaded
            seconds += float(self.datalist.durations[int(idx)])
        return collate(keys, feats, labels, seconds, bad, self.dim,
                       tokens if self.with_tokens else None, ends)


def _identity(x):
    return x


class ForkSafeLoader:
    """A DataLoader whose forked workers are checked to have started, and whose iteration
    ends only once the helper threads it started are gone.

    Workers are forked (copy-on-write data lists), but CPython 3.11 forks unsafely while
    another thread holds the interpreter's thread-list lock: a thread exiting, or a C++
    thread (gloo's run loops) briefly entering Python. The child then waits forever inside
    fork and the rank hangs (seen about once per thousand forks with two gloo ranks).
    Two defences:
    - the previous loader's queue-feeder threads exit just as the next loader forks
      (train epoch -> dev -> next epoch), so iteration waits until they are gone;
    - each worker reports in from `worker_init_fn`; a worker that has not reported within
      `startup_timeout_s` is stuck in fork, so the workers are replaced (the batches they
      would have served are asked for again: nothing is skipped or repeated)."""

    def __init__(self, loader: DataLoader, ready=None, startup_timeout_s: float = 10.0,
                 attempts: int = 3, thread_exit_timeout_s: float = 30.0):
        self.loader = loader
        self.ready = ready
        self.startup_timeout = startup_timeout_s
        self.attempts = attempts
        self.thread_timeout = thread_exit_timeout_s

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        iterator = self._start()
        try:
            yield from iterator
        finally:
            self._finish(iterator)
            del iterator

    def _start(self):
        workers = self.loader.num_workers
        patience = self.startup_timeout
        for attempt in range(1, self.attempts + 1):
            if self.ready is not None:
                self.ready.value = 0
            iterator = iter(self.loader)
            if self.ready is None or workers == 0:
                return iterator
            deadline = time.monotonic() + patience
            while self.ready.value < workers and time.monotonic() < deadline:
                time.sleep(0.002)
            if self.ready.value >= workers:
                return iterator
            logger.warning("%d of %d data-loader workers did not start within %.0f s (stuck in "
                           "fork); replacing them (attempt %d of %d)",
                           workers - self.ready.value, workers, patience, attempt, self.attempts)
            self._finish(iterator, stuck=True)
            del iterator
            patience *= 2
        raise RuntimeError(f"data-loader workers failed to start {self.attempts} times in a row; "
                           "set dataset.num_workers=0 to load in the training process")

    def _finish(self, iterator, stuck: bool = False) -> None:
        feeders = _queue_feeder_threads(iterator)
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()      # idempotent; already done when the iterator was exhausted
        if stuck:
            # A worker stuck in fork ignores the shutdown request and may have inherited a
            # SIGTERM handler it can never run; it is off the loader's watch list now.
            for worker in getattr(iterator, "_workers", []):
                if worker.is_alive():
                    worker.kill()
                    worker.join(self.thread_timeout)
        wait_for_threads_gone(feeders, self.thread_timeout)


class _ReportStarted:
    """worker_init_fn: counts workers that made it through fork."""

    def __init__(self, counter):
        self.counter = counter

    def __call__(self, worker_id: int) -> None:
        with self.counter.get_lock():
            self.counter.value += 1


def _queue_feeder_threads(iterator) -> List[threading.Thread]:
    """The threads that feed a multi-process DataLoader iterator's queues (none for an
    in-process loader). Other threads, such as TensorBoard's writer, live on and are left
    alone."""
    queues = list(getattr(iterator, "_index_queues", None) or [])
    queues.append(getattr(iterator, "_worker_result_queue", None))
    threads = [getattr(q, "_thread", None) for q in queues]
    return [t for t in threads if isinstance(t, threading.Thread)]


def wait_for_threads_gone(threads, timeout_s: float) -> None:
    """Join `threads`, then wait until the OS has removed them too: join returns before a
    Python thread has finished unregistering itself."""
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
        task = f"/proc/self/task/{t.native_id}"
        while t.native_id is not None and os.path.exists(task) and time.monotonic() < deadline:
            time.sleep(0.001)
        if t.is_alive() or (t.native_id is not None and os.path.exists(task)):
            logger.warning("data-loader thread %s still running after %.0f s; forking the next "
                           "loader anyway", t.name, timeout_s)


def build_loader(dataset: Dataset, num_workers: int, prefetch_factor: int, seed: int,
                 sampler: Optional[Sequence[int]] = None) -> ForkSafeLoader:
    """The one DataLoader recipe for map-style (with `sampler`) and iterable datasets. Its
    own generator keeps DataLoader from drawing on the global torch RNG, which the training
    step's RNG state must not depend on."""
    kwargs = {}
    ready = None
    if num_workers > 0:
        context = multiprocessing.get_context("fork")
        ready = context.Value("i", 0)
        kwargs = dict(prefetch_factor=prefetch_factor, persistent_workers=False,
                      multiprocessing_context=context, worker_init_fn=_ReportStarted(ready))
    if sampler is not None:
        kwargs["sampler"] = sampler
    loader = DataLoader(dataset, batch_size=None, num_workers=num_workers,
                        collate_fn=_identity, pin_memory=False,
                        generator=torch.Generator().manual_seed(seed), **kwargs)
    return ForkSafeLoader(loader, ready)


def make_loader(dataset: BatchDataset, start: int, num_workers: int, prefetch_factor: int,
                seed: int) -> ForkSafeLoader:
    """Loader over batches [start:]."""
    return build_loader(dataset, num_workers, prefetch_factor, seed,
                        sampler=range(start, len(dataset)))


# --------------------------------------------------------------------------- sources

SOURCES: Registry = Registry("data type")


class DataSource:
    """One input form of the pipeline (raw data list, tar shards): what the trainer
    needs to plan an epoch and serve one rank's batches from any position."""

    def __len__(self) -> int:
        raise NotImplementedError

    def total_hours(self) -> float:
        raise NotImplementedError

    def has_features(self) -> bool:
        return False

    def plan(self, dataset_cfg, seed: int, epoch: int, train: bool) -> List[np.ndarray]:
        raise NotImplementedError

    def loader(self, batches, processor: "UtteranceProcessor", epoch: int, start: int,
               num_workers: int, prefetch_factor: int, seed: int):
        raise NotImplementedError


@SOURCES.register("raw")
class RawSource(DataSource):
    """A JSON-lines data list (wav or feat entries)."""

    def __init__(self, path: str, num_classes: Optional[int] = None,
                 num_units: Optional[int] = None):
        self.data = DataList.load(path, num_classes=num_classes, num_units=num_units)
        self.bad = self.data.bad
        self.with_tokens = num_units is not None

    def __len__(self) -> int:
        return len(self.data)

    def total_hours(self) -> float:
        return self.data.total_hours()

    def has_features(self) -> bool:
        return self.data.has_features()

    def plan(self, dataset_cfg, seed, epoch, train):
        return plan_batches(self.data, dataset_cfg, seed, epoch, train)

    def loader(self, batches, processor, epoch, start, num_workers, prefetch_factor, seed):
        return make_loader(BatchDataset(self.data, batches, processor, epoch, self.with_tokens),
                           start, num_workers, prefetch_factor, seed)


def detect_data_type(path: str) -> str:
    """A data list holds JSON objects; a shard list holds tar paths or URLs."""
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                return "raw" if line.lstrip().startswith(b"{") else "shard"
    return "raw"


def open_source(data_type: str, path: str, num_classes: Optional[int] = None,
                num_units: Optional[int] = None) -> DataSource:
    """`num_units`: the CTC unit count when the loss needs targets (entries need tokens)."""
    if data_type == "auto":
        data_type = detect_data_type(path)
    if data_type == "shard":
        from toolkit.data import shards  # noqa: F401  (registers the shard source)
    return SOURCES.get(data_type)(path, num_classes, num_units)


def workers_per_rank(configured: int, local_world_size: int) -> int:
    """The configured worker count is per node; share it among the local ranks."""
    if configured <= 0:
        return 0
    return max(1, configured // max(1, local_world_size))
