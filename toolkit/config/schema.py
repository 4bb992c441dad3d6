"""The configuration schema: the generic sections every task shares (`dataset`, `optim`,
`training`; `task` is the task's own dataclass), the validated `Config` object, and how
a task declares the sections it owns. Every field's comment is its line in
docs/config_reference.md. Checking raw YAML against these classes: toolkit.config.validate."""
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from toolkit.config.ramps import Ramp
from toolkit.registry import Registry


@dataclass
class FeatureConfig:
    type: str = "fbank"           # fbank | phone_frontend (this toolkit's pretrained phone front end) | speech_embedding (openWakeWord's ONNX front end, opt-in)
    num_mel_bins: int = 40        # fbank bins; 40 for wake words, 80 for speakers
    frame_length_ms: float = 25.0  # Kaldi's default window
    frame_shift_ms: float = 10.0  # 100 frames per second
    # Gaussian noise added to the samples (int16 scale) before framing; drawn from the
    # utterance's own random stream (seed, epoch, key), so resume stays exact.
    dither: float = 0.0
    mel_model: str = ""           # speech_embedding: melspectrogram.onnx; empty: the installed openwakeword's
    embedding_model: str = ""     # speech_embedding: embedding_model.onnx; empty: the installed openwakeword's
    frontend_model: str = ""      # phone_frontend: pretrained:NAME or a phone_ctc export's model.safetensors; empty: pretrained:phone-voicebank-v2
    frontend_output: str = "posteriors"  # phone_frontend: posteriors (log phone posteriors) | hidden (the encoder's last layer)


@dataclass
class SpecAugConfig:
    enabled: bool = False         # time and frequency masks on training features
    num_time_masks: int = 2       # masks per utterance along time
    max_time_width: int = 20      # frames per time mask at most
    num_freq_masks: int = 2       # masks per utterance along frequency
    max_freq_width: int = 8       # bins per frequency mask at most


@dataclass
class NoiseConfig:
    noise_list: str = ""          # data list (JSON lines with `wav`) of noise recordings
    prob: Ramp = field(default_factory=lambda: Ramp.constant(0.0))  # share of utterances noised
    snr_db: List[float] = field(default_factory=lambda: [5.0, 20.0])  # [low, high] SNR drawn per utterance
    # Optional per-type SNR ranges for MUSAN-style lists whose entries carry a `kind`
    # (noise, music, babble/speech), e.g. {noise: [0, 15], music: [5, 15], babble: [13, 20]}.
    snr_db_by_kind: Dict[str, List[float]] = field(default_factory=dict)


@dataclass
class ReverbConfig:
    rir_list: str = ""            # data list of room impulse responses
    prob: Ramp = field(default_factory=lambda: Ramp.constant(0.0))  # share of utterances reverberated


@dataclass
class VoicePerturbConfig:
    """Per-utterance spectral changes a new voice makes, on the fbank features (training
    only): formants below `split_hz` scaled by a factor from `low_range`, those above by
    one from `high_range`, and a spectral tilt from `tilt_db`."""
    prob: float = 0.0             # share of training utterances perturbed; 0: off
    low_range: List[float] = field(default_factory=lambda: [1.0, 1.0])  # warp of formants below split_hz
    high_range: List[float] = field(default_factory=lambda: [1.0, 1.0])  # warp above split_hz
    split_hz: float = 1000.0      # boundary between the two warp bands (F1 vs F2-F3)
    tilt_db: List[float] = field(default_factory=lambda: [0.0, 0.0])  # tilt, highest bin vs lowest


@dataclass
class WhisperConfig:
    """Whispered training speech (toolkit.data.augment.whisper, on the waveform, training
    only): the voice source turned to noise under each frame's formants, `breath` of it
    mixed with the voice. The bank's synthesizers do not whisper; some users do."""
    prob: float = 0.0             # share of training utterances whispered; 0: off
    breath: List[float] = field(default_factory=lambda: [0.6, 1.0])  # the noise's share


@dataclass
class SamplerConfig:
    # bucket: shuffled, length-sorted inside windows; class_balanced: each batch draws
    # `classes_per_batch` labels (e.g. speakers), then `utts_per_class` utterances of each.
    type: str = "bucket"
    classes_per_batch: int = 0    # class_balanced: labels per batch (0: batch_size / utts_per_class)
    utts_per_class: int = 2       # class_balanced: utterances drawn per label


@dataclass
class HFDatasetConfig:
    """One Hugging Face dataset split read as training or dev input (`datasets` reads it;
    the audio column is decoded here with soundfile, never through `datasets`' decoders)."""
    # hub name (org/name) or local directory (parquet/Arrow files, save_to_disk output, audio files)
    path: str = ""
    name: str = ""                # the dataset's configuration (subset) name; empty: its default
    split: str = "train"          # split to read, e.g. train.clean.100
    audio_column: str = "audio"   # Audio feature or {bytes, path} struct column
    id_column: str = ""           # column of utterance ids; empty: row numbers
    # column of durations in seconds, read instead of decoding every audio header once
    duration_column: str = ""
    label_column: str = ""        # integer class column, for tasks that need labels
    revision: str = ""            # hub commit, tag or branch (pin it: the data then cannot change)
    # hub access token of this dataset (redacted from every saved copy); empty: HF_TOKEN
    token: str = ""


@dataclass
class HFDataConfig:
    # Hugging Face datasets mixed into one training input (instead of dataset.train_data)
    train: List[HFDatasetConfig] = field(default_factory=list)
    # datasets mixed into the validation input (instead of dataset.dev_data)
    dev: List[HFDatasetConfig] = field(default_factory=list)


@dataclass
class DatasetConfig:
    data_type: str = "auto"       # raw: JSON-lines data list; shard: tar shard list; auto: look
    train_data: str = ""          # training data list or shard list
    dev_data: str = ""            # validation list; empty: no validation
    hf: HFDataConfig = field(default_factory=HFDataConfig)   # Hugging Face datasets as input
    # Bearer token for http(s) shard URLs; never written to any file. Falls back to the
    # TOOLKIT_DATA_TOKEN environment variable.
    auth_token: str = ""
    sample_rate: int = 16000      # audio is resampled to this rate on the fly
    channel: int = -1             # -1 mixes all channels down; >= 0 selects one
    feature: FeatureConfig = field(default_factory=FeatureConfig)
    speed_perturb: List[float] = field(default_factory=list)   # e.g. [0.9, 1.0, 1.1], one drawn per utterance
    volume_range: List[float] = field(default_factory=list)    # e.g. [0.5, 1.5] gain
    # Vocal tract length perturbation, e.g. [0.9, 1.1]: formants scaled by a factor drawn
    # per utterance, on the fbank features (so it also works on precomputed ones).
    vtlp_range: List[float] = field(default_factory=list)
    voice_perturb: VoicePerturbConfig = field(default_factory=VoicePerturbConfig)
    whisper: WhisperConfig = field(default_factory=WhisperConfig)
    # Log phone posteriors (feature.type phone_frontend, frontend_output posteriors) divided
    # by a temperature drawn per utterance from [low, high] >= 1 and renormalised, e.g.
    # [1.0, 1.5]: flatter posteriors, as the front end gives on voices unlike its own.
    posterior_temperature: List[float] = field(default_factory=list)
    noise: NoiseConfig = field(default_factory=NoiseConfig)
    reverb: ReverbConfig = field(default_factory=ReverbConfig)
    spec_aug: SpecAugConfig = field(default_factory=SpecAugConfig)
    min_duration: float = 0.05    # seconds; shorter utterances are left out (and named in the log)
    max_duration: float = 30.0    # seconds; longer ones too (memory follows the longest)
    shuffle: bool = True          # shuffle training batches each epoch
    sort_window: int = 2000       # utterances sorted by length inside each window (bucketing)
    batch_size: int = 256         # utterances per batch at most
    max_frames_in_batch: int = 0  # > 0: dynamic batches holding at most this many padded frames
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    num_workers: int = 2          # loader processes per node; divided across the local ranks
    prefetch_factor: int = 4      # batches each worker prepares ahead
    max_bad_fraction: float = 0.01  # share of unusable utterances that stops training


@dataclass
class SchedulerConfig:
    type: str = "warmup_cosine"   # constant | warmup_linear | warmup_cosine | exponential | reduce_on_plateau
    warmup_steps: int = 0         # linear warm-up from 0; 0 starts at the peak
    total_steps: int = 0          # 0: derived from training.max_steps / max_epoch and the data
    final_lr_ratio: float = 0.01  # LR at the end relative to the peak
    gamma: float = 0.0            # exponential: decay per step (0: reach final_lr_ratio at the end)
    factor: float = 0.5           # reduce_on_plateau: LR multiplier per reduction
    patience: int = 1             # reduce_on_plateau: validations without improvement tolerated


@dataclass
class OptimConfig:
    type: str = "adam"            # adam | adamw | sgd
    lr: float = 1e-3              # peak learning rate
    weight_decay: float = 0.0     # L2 (adam, sgd) or decoupled (adamw) decay
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])  # adam/adamw moments
    momentum: float = 0.9         # sgd (Nesterov when > 0)
    eps: float = 1e-8             # adam/adamw denominator term
    amsgrad: bool = False         # adam/adamw: AMSGrad variant
    grad_clip: float = 0.0        # global-norm clip for this optimizer; 0: training.grad_clip
    # Fraction of max_steps before which this optimizer does nothing (a phase switch:
    # e.g. discriminators start after the reconstruction warm-up).
    start_fraction: float = 0.0
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)


@dataclass
class WandbConfig:
    """Weights & Biases logging beside TensorBoard (rank 0; the config it records and the
    values it logs carry no secret)."""
    mode: str = "disabled"        # disabled | online | offline (no network: `wandb sync` later)
    project: str = ""             # W&B project; empty: wandb's default
    entity: str = ""              # team or user; empty: the logged-in user's default
    name: str = ""                # run name; empty: the exp dir's name
    group: str = ""               # run group (e.g. a sweep or recipe)
    tags: List[str] = field(default_factory=list)  # run tags
    notes: str = ""               # run description
    dir: str = ""                 # where wandb writes its files; empty: the exp dir


@dataclass
class TrainingConfig:
    seed: int = 777               # seeds weights, batch plans and augmentation
    # epochs to train; 0: not given. Give max_epoch, max_steps or both (then the first
    # reached ends the run, and the log says which)
    max_epoch: int = 0
    # optimizer steps to train, over as many epochs as that takes; 0: not given
    max_steps: int = 0
    grad_clip: float = 50.0       # default global-norm clip of every optimizer
    max_nonfinite_steps: int = 100  # consecutive skipped (non-finite) updates that stop training
    accum_grad: int = 1           # micro-batches per optimizer step
    log_interval: int = 20        # optimizer steps between log lines
    save_interval_steps: int = 1000  # optimizer steps between mid-epoch checkpoints
    val_interval_steps: int = 0   # 0: validate at epoch end only
    keep_last: int = 3            # newest checkpoints kept
    keep_best: int = 5            # best checkpoints (by the task's dev metric) kept
    use_amp: bool = False         # mixed precision autocast
    amp_dtype: str = "float16"    # float16 (with a GradScaler) | bfloat16
    # Bitwise-reproducible kernels; on CUDA also cuBLAS's workspace setting, and a
    # nondeterministic op is an error instead of a warning.
    deterministic: bool = True
    init_checkpoint: str = ""     # weights to start from: checkpoint, .safetensors export, pretrained:NAME
    # Accept missing/unexpected/mismatched tensors when initialising; mismatched ones keep
    # their fresh initialisation (e.g. a classifier for another inventory size).
    init_allow_missing: bool = False
    tensorboard: bool = True      # write <exp>/tensorboard event files
    rank_failure_timeout_s: float = 60.0  # collective timeout: a dead rank stops the others
    # CPU under glibc's malloc (no preloaded allocator, toolkit/memory.py): return freed
    # heap pages to the OS every N steps (0: never). Varying batch shapes fragment glibc's
    # arenas; trimming bounds RSS, but each trim costs page faults on the next steps.
    malloc_trim_interval: int = 20
    # CPU fp32: the memory-lean training pass of convolution -> BatchNorm -> ReLU -> dropout
    # units (toolkit/nn/lean.py), bitwise the plain modules' results; false keeps every
    # intermediate for backward instead (about 3.5x the activation memory, docs/performance.md).
    lean_units: bool = True
    trace_keys: bool = False      # write log/keys.rank<r>.txt: the keys of every trained batch
    # Weights & Biases; the run id is kept in the exp dir, so a resumed run continues it
    wandb: WandbConfig = field(default_factory=WandbConfig)


class OptimizerConfigs(dict):
    """Optimizer name -> OptimConfig. With a single optimizer its keys read directly too
    (cfg.optim.lr), as the YAML of such a task writes them."""

    def __getattr__(self, name: str):
        if len(self) == 1:
            return getattr(next(iter(self.values())), name)
        raise AttributeError(f"optim has optimizers {', '.join(self)}: use optim[name].{name}")

    def __setattr__(self, name: str, value) -> None:
        if len(self) == 1:
            setattr(next(iter(self.values())), name, value)
        else:
            raise AttributeError(f"optim has optimizers {', '.join(self)}")


GENERIC_SECTIONS = ("task", "dataset", "optim", "training")


class Config:
    """Validated sections, as attributes (cfg.dataset.batch_size). `optim` maps optimizer
    names to OptimConfig; `cfg.sections` lists the names in file order."""

    def __init__(self, sections: Dict[str, Any]):
        object.__setattr__(self, "_sections", dict(sections))

    def __getattr__(self, name: str):
        try:
            return self._sections[name]
        except KeyError:
            raise AttributeError(f"config has no section '{name}'") from None

    def __setattr__(self, name: str, value) -> None:
        # Values derived from the data are overrides applied before validation
        # (toolkit.task.Task.derived_values): a validated config keeps its sections.
        raise AttributeError(f"a validated config's sections are not replaced (tried '{name}')")

    @property
    def sections(self) -> List[str]:
        return list(self._sections)

    def has(self, name: str) -> bool:
        return name in self._sections


@dataclass
class TaskConfigBase:
    type: str = ""                # the task: kws | speaker | codec


@dataclass
class Section:
    """A task-owned top-level section: a fixed dataclass, or a registry whose `type`
    key selects the class (with `default_type` when the key is absent)."""
    schema: Any = None
    registry: Optional[Registry] = None
    default_type: Optional[str] = None
    required: bool = True


def to_dict(cfg: Config) -> Dict[str, Any]:
    """The plain mapping of a validated config (what config.yaml holds, before redaction).
    A single optimizer named `model` is written flat, as such a task's YAML writes it."""
    out: Dict[str, Any] = {}
    for name in cfg.sections:
        value = getattr(cfg, name)
        if name == "optim":
            value = {k: dataclasses.asdict(v) for k, v in value.items()}
            if len(value) == 1 and next(iter(value)) == "model":
                value = next(iter(value.values()))
        elif dataclasses.is_dataclass(value):
            value = dataclasses.asdict(value)
        out[name] = value
    return out


def dataset_config_from_metadata(meta: dict, **paths) -> DatasetConfig:
    """A DatasetConfig whose features are those an exported model's `feature` metadata
    describes (the feature type's own `config_fields` read them)."""
    from toolkit.data.features import extractor_class_for_metadata
    fields = extractor_class_for_metadata(meta).config_fields(meta, **paths)
    return DatasetConfig(sample_rate=int(meta["sample_rate"]), feature=FeatureConfig(**fields))
