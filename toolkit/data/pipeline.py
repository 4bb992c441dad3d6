"""Per-utterance processing shared by every task: decode -> waveform augmentation ->
features (the `dataset.feature.type` extractor; fbank by default) -> feature augmentation. A task's ExampleBuilder calls these pieces and adds what
its examples need (labels, a random chunk, keyword end frames, a waveform segment).

All randomness of an utterance comes from (seed, epoch, key): the result never depends
on worker count, timing, or where a resumed run starts."""
from typing import Optional, Tuple

import numpy as np

from toolkit.data import augment
from toolkit.data.audio import BadEntry, resample
from toolkit.data.datalist import DataList
from toolkit.data.features import build_extractor

DITHER_STREAM = "\0dither"   # dither draws from its own stream: other draws stay put


class FeaturePipeline:
    """Entry -> feature matrix (frames, bins) or augmented waveform, with the dataset
    section's augmentation chain (training only)."""

    def __init__(self, dataset_cfg, seed: int, train: bool,
                 noise: Optional[DataList] = None, rirs: Optional[DataList] = None,
                 steps_per_epoch: int = 0, total_steps: int = 0):
        self.cfg = dataset_cfg
        self.seed = seed
        self.train = train
        self.noise = noise
        self.rirs = rirs
        # Ramped augmentation probabilities are read at each epoch's first step.
        self.steps_per_epoch = steps_per_epoch
        self.total_steps = total_steps
        self.extractor = build_extractor(dataset_cfg.feature, dataset_cfg.sample_rate)
        # fbank's kaldi-native-fbank options (None for other feature types).
        self.opts = getattr(self.extractor, "opts", None)
        self.dither = float(dataset_cfg.feature.dither)
        self.min_frames = 1
        # Duration of the audio the last features came from over that of the audio as
        # loaded (speed perturbation changes it): frame times map back through it.
        self.time_scale = 1.0
        self.mel_centers = None
        if self.opts is not None:
            # kaldi-native-fbank's own dither draws from a process-global generator that no
            # checkpoint can restore; the pipeline dithers from the utterance stream instead.
            self.opts.frame_opts.dither = 0.0
            mel = self.opts.mel_opts
            nyquist = dataset_cfg.sample_rate / 2
            self.mel_centers = augment.mel_bin_centers_hz(
                mel.num_bins, mel.low_freq,
                mel.high_freq if mel.high_freq > 0 else nyquist + mel.high_freq)

    @property
    def num_bins(self) -> int:
        """The feature dimension (mel bins for fbank)."""
        return int(self.extractor.dim)

    def frame_end_times(self, num_frames: int) -> Optional[np.ndarray]:
        """Where the input of each of the last utterance's frames ends, in seconds of the
        audio as loaded; None when the feature type has no such timing (fbank)."""
        ends = self.extractor.frame_end_times(num_frames)
        return None if ends is None else ends / self.time_scale

    def rng(self, epoch: int, key: str) -> np.random.Generator:
        return augment.utterance_rng(self.seed, epoch, key)

    def _prob(self, ramp, epoch: int) -> float:
        if isinstance(ramp, (int, float)):
            return float(ramp)
        return ramp.value(epoch * self.steps_per_epoch, self.total_steps)

    # ------------------------------------------------------------------ waveform
    def load(self, entry: dict, audio: Optional[Tuple[np.ndarray, int]] = None) -> np.ndarray:
        """Decoded mono audio at the configured rate (segment applied). `audio` is an
        already decoded (wave, rate), as tar shards deliver it."""
        d = self.cfg
        if audio is not None:
            wave, rate = audio
            if rate != d.sample_rate:
                wave = resample(wave, rate, d.sample_rate)
            return wave
        return augment.load_mono(entry["wav"], d.sample_rate, d.channel,
                                 float(entry.get("start", 0.0)), float(entry.get("end", -1.0)))

    def augment_waveform(self, wave: np.ndarray, rng: np.random.Generator,
                         epoch: int = 0) -> np.ndarray:
        """Speed, volume, whispering, reverberation, noise — in that fixed order (training
        only)."""
        d = self.cfg
        if not self.train:
            return wave
        if d.speed_perturb:
            factor = float(d.speed_perturb[int(rng.integers(0, len(d.speed_perturb)))])
            wave = augment.speed_perturb(wave, d.sample_rate, factor)
        if d.volume_range:
            wave = augment.apply_volume(wave, rng, *d.volume_range)
        # No draw at all when off: the random stream of configs without it stays the same.
        if d.whisper.prob > 0 and rng.random() < d.whisper.prob:
            wave = augment.whisper(wave, d.sample_rate, rng, float(rng.uniform(*d.whisper.breath)))
        if self.rirs is not None and rng.random() < self._prob(d.reverb.prob, epoch):
            rir = augment.pick_and_load(self.rirs, rng, d.sample_rate)
            if rir is not None:
                wave = augment.add_reverb(wave, rir)
        if self.noise is not None and rng.random() < self._prob(d.noise.prob, epoch):
            picked = augment.pick_entry_and_load(self.noise, rng, d.sample_rate)
            if picked is not None:
                noise, kind = picked
                low, high = d.noise.snr_db_by_kind.get(kind, d.noise.snr_db) if kind \
                    else d.noise.snr_db
                wave = augment.add_noise(wave, noise, float(rng.uniform(low, high)), rng)
        return wave

    # ------------------------------------------------------------------ features
    def extract(self, wave: np.ndarray, epoch: int, key: str) -> np.ndarray:
        if self.dither > 0:
            drng = augment.utterance_rng(self.seed, epoch, key + DITHER_STREAM)
            wave = (wave + (self.dither / 32768.0)
                    * drng.standard_normal(len(wave))).astype(np.float32)
        return self.extractor.compute(wave)

    fbank = extract     # the name callers knew when fbank was the only type

    def read_features(self, entry: dict) -> np.ndarray:
        import kaldiio
        try:
            feats = np.asarray(kaldiio.load_mat(entry["feat"]), dtype=np.float32)
        except Exception as err:
            raise BadEntry("unreadable_features", f"{entry['feat']}: {err}") from None
        if not np.all(np.isfinite(feats)):
            raise BadEntry("nonfinite_samples", entry["feat"])
        return feats

    def augment_features(self, feats: np.ndarray, rng: np.random.Generator,
                         spec_aug: bool = True) -> np.ndarray:
        feats = self.check_length(feats)
        if self.train and self.cfg.vtlp_range:
            factor = float(rng.uniform(*self.cfg.vtlp_range))
            feats = augment.warp_frequency(feats, factor, self.mel_centers)
        vp = self.cfg.voice_perturb
        # No draw at all when off: the random stream of configs without it stays the same.
        if self.train and vp.prob > 0 and rng.random() < vp.prob:
            low, high = float(rng.uniform(*vp.low_range)), float(rng.uniform(*vp.high_range))
            feats = augment.warp_frequency(feats, low, self.mel_centers, high, vp.split_hz)
            feats = augment.tilt_spectrum(feats, float(rng.uniform(*vp.tilt_db)))
        if self.train and self.cfg.posterior_temperature:
            temperature = float(rng.uniform(*self.cfg.posterior_temperature))
            feats = augment.flatten_log_posteriors(feats, temperature)
        sa = self.cfg.spec_aug
        if self.train and sa.enabled and spec_aug:
            feats = augment.spec_augment(feats, rng, sa.num_time_masks, sa.max_time_width,
                                         sa.num_freq_masks, sa.max_freq_width)
        return feats

    def features(self, entry: dict, epoch: int, audio: Optional[Tuple[np.ndarray, int]] = None,
                 spec_aug: bool = True, rng: Optional[np.random.Generator] = None) -> np.ndarray:
        """The whole chain. Precomputed features (`feat`) win over audio, per entry."""
        rng = rng if rng is not None else self.rng(epoch, entry["key"])
        if "feat" in entry and audio is None:
            self.extractor.check_stored(entry)     # another front end's features: refused
            feats = self.read_features(entry)
            self.time_scale = 1.0
        else:
            loaded = self.load(entry, audio)
            wave = self.augment_waveform(loaded, rng, epoch)
            self.time_scale = len(wave) / len(loaded) if len(loaded) else 1.0
            feats = self.extract(wave, epoch, entry["key"])
        return self.augment_features(feats, rng, spec_aug)

    __call__ = features

    def features_at_speed(self, entry: dict, factor: float) -> np.ndarray:
        """Features of `entry` played `factor` times faster, nothing else applied
        (speed-perturbed copies of training data, computed once)."""
        wave = augment.speed_perturb(self.load(entry), self.cfg.sample_rate, factor)
        self.time_scale = 1.0     # the copy's entry carries its own (scaled) times
        return self.check_length(self.extract(wave, 0, entry["key"]))

    def check_length(self, feats: np.ndarray) -> np.ndarray:
        if len(feats) < self.min_frames:
            raise BadEntry("too_short_after_processing", f"{len(feats)} frames")
        return feats



def evaluation_pipeline(dataset_cfg) -> FeaturePipeline:
    """The pipeline of a dataset section without augmentation or a training seed: what
    export parity checks, evaluation and feature extraction outside training run (the
    trainer builds the training and dev pipelines itself)."""
    return FeaturePipeline(dataset_cfg, seed=0, train=False)
