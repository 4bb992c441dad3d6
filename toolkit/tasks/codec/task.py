"""Neural speech codecs as a task of the generic trainer: a generator (encoder, residual VQ,
decoder; toolkit.tasks.codec.model) trained against waveform discriminators with two
optimizers, validated by mel distance on fixed dev segments, exported as separate encoder
and decoder graphs plus a safetensors inference checkpoint.

Training step (DAC/HiFi-GAN order): the generator runs once; while the adversarial phase
is on, the discriminators take their step on real audio and the detached output; then the
generator's loss (mel, VQ commitment and codebook terms, and in the adversarial phase the
LSGAN and feature-matching terms through the just-updated, frozen discriminators) drives
the generator's step. The adversarial phase starts with `optim.discriminator.start_fraction`
(default 0.1 of max_steps, from `optim_defaults`); the adversarial and feature-matching
weights switch on at the same point (checked by `check_config`), and until then the
discriminators neither run nor step, so their LR schedule counts only their own steps.

Batching: every training example is one segment of `task.segment_seconds`, so
`dataset.max_frames_in_batch` counts code frames of that segment (segment samples / hop),
the same number for every utterance: it gives batch_size = max_frames_in_batch /
segment_frames. Dev batches hold as many utterances, each at most `eval_seconds` long.
"""
import copy
import dataclasses
import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from toolkit.config import ConfigError, Ramp, Section, TaskConfigBase
from toolkit.data.audio import BadEntry
from toolkit.data.pipeline import FeaturePipeline
from toolkit.errors import DataError, MissingInputError, UserError
from toolkit.task import TASKS, Batch, DataRequirements, ExampleBuilder, Task, pad_sequences
from toolkit.tasks.codec.discriminators import (MultiPeriodDiscriminator,
                                                MultiPeriodDiscriminatorConfig,
                                                MultiResolutionSTFTDiscriminator,
                                                MultiResolutionSTFTDiscriminatorConfig)
from toolkit.tasks.codec.losses import (MultiResolutionMelLoss, MultiResolutionSTFTLoss,
                                        discriminator_loss, feature_matching_loss,
                                        generator_adversarial_loss)
from toolkit.tasks.codec.model import (CodecConfig, CodecConv1d, CodecConvTranspose1d,
                                       CodecModel, count_parameters, history_length,
                                       remove_weight_norm)

logger = logging.getLogger(__name__)

CODES_FORMAT = "toolkit-codec-codes"
CODES_VERSION = 1
EXPORT_FORMAT_VERSION = 1
GRAPH_FILES = {"onnx": ("encoder.onnx", "decoder.onnx"), "torch": ("encoder.zip", "decoder.zip")}
SAFETENSORS_NAME = "model.safetensors"


# --------------------------------------------------------------------------- config sections

def _step_on(weight: float, at: float) -> Ramp:
    return Ramp(initial=0.0, final=weight, start=at, end=at, shape="step")


# Where the adversarial phase starts by default (fraction of max_steps), for the loss
# weights and the discriminator optimizer alike: 10 % of reconstruction-only training
# first, so the discriminators meet audio that already resembles speech.
ADVERSARIAL_START = 0.1


@dataclass
class CodecDiscriminatorConfig:
    use_mpd: bool = True          # multi-period discriminator (HiFi-GAN): periodic structure, pitch
    # MPD sizes (periods, widths); the default is HiFi-GAN's full size
    mpd: MultiPeriodDiscriminatorConfig = field(default_factory=MultiPeriodDiscriminatorConfig)
    use_mrsd: bool = True         # complex multi-resolution STFT discriminator (EnCodec): phase too
    # MS-STFT discriminator sizes (FFT sizes, filters); EnCodec's, halved for 16 kHz
    mrsd: MultiResolutionSTFTDiscriminatorConfig = field(
        default_factory=MultiResolutionSTFTDiscriminatorConfig)


@dataclass
class CodecLossConfig:
    # multi-resolution log-mel L1 weight (DAC: 15), on from the first step
    mel: Ramp = field(default_factory=lambda: Ramp.constant(15.0))
    # LSGAN generator term (DAC: 1); a step at 10 % of max_steps, with the discriminators
    adversarial: Ramp = field(default_factory=lambda: _step_on(1.0, ADVERSARIAL_START))
    # discriminator feature matching (DAC: 2); switched on with the adversarial term
    feature_matching: Ramp = field(default_factory=lambda: _step_on(2.0, ADVERSARIAL_START))
    # VQ commitment (encoder towards its codes; DAC: 0.25), from the start
    commitment: Ramp = field(default_factory=lambda: Ramp.constant(0.25))
    # VQ codebook term (codes towards the encoder; DAC: 1); zero in effect with EMA codebooks
    codebook: Ramp = field(default_factory=lambda: Ramp.constant(1.0))
    # mel-loss STFT windows in samples (DAC's, hop = window / 4): short ones time transients
    mel_window_lengths: List[int] = field(
        default_factory=lambda: [32, 64, 128, 256, 512, 1024, 2048])
    # mel bands per window (DAC's); each clipped so that no band falls between FFT bins
    mel_n_mels: List[int] = field(default_factory=lambda: [5, 10, 20, 40, 80, 160, 320])


WEIGHT_KEYS = ("mel", "adversarial", "feature_matching", "commitment", "codebook")
ADVERSARIAL_KEYS = ("adversarial", "feature_matching")


def _wrap_sub_error(err: ConfigError, own: str, key: str) -> ConfigError:
    """The discriminator classes name their own prefixes (mpd., mstftd.); name ours."""
    text = str(err)
    if text.startswith(own + "."):
        text = text[len(own) + 1:]
    return ConfigError(f"discriminator.{key}.{text}")


# --------------------------------------------------------------------------- modules

class CodecDiscriminator(nn.Module):
    """The enabled discriminators as one module, so that one optimizer steps them and one
    DDP wrapper syncs them: (logits, feature maps) of every sub-discriminator, MPD's
    first."""

    def __init__(self, cfg: CodecDiscriminatorConfig):
        super().__init__()
        self.mpd = MultiPeriodDiscriminator(cfg.mpd) if cfg.use_mpd else None
        self.mrsd = MultiResolutionSTFTDiscriminator(cfg.mrsd) if cfg.use_mrsd else None

    def forward(self, audio: torch.Tensor):
        logits: List[torch.Tensor] = []
        features: List[List[torch.Tensor]] = []
        for disc in (self.mpd, self.mrsd):
            if disc is not None:
                part_logits, part_features = disc(audio)
                logits += part_logits
                features += part_features
        return logits, features


def _halves(tensors, n: int):
    """Batch-concatenated [real; fake] outputs -> (real part, fake part), nested lists kept."""
    if isinstance(tensors, torch.Tensor):
        return tensors[:n], tensors[n:]
    pairs = [_halves(t, n) for t in tensors]
    return [p[0] for p in pairs], [p[1] for p in pairs]


# --------------------------------------------------------------------------- data

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
    could shorten it. Evaluation: the first `eval_samples` samples, no randomness."""

    def __init__(self, pipeline: FeaturePipeline, segment: int, eval_samples: int,
                 policy: str):
        self.pipeline = pipeline
        self.segment = segment
        self.eval_samples = eval_samples
        self.policy = policy
        fastest = max(pipeline.cfg.speed_perturb) if pipeline.cfg.speed_perturb else 1.0
        self.excerpt = int(math.ceil(segment * max(1.0, fastest)))

    def __call__(self, entry: dict, epoch: int, audio=None) -> np.ndarray:
        if audio is None and "wav" not in entry:
            raise BadEntry("missing_field", "codec training reads audio (`wav`), not "
                           "precomputed features")
        p = self.pipeline
        wave = p.load(entry, audio)
        if not p.train:
            return np.ascontiguousarray(wave[:self.eval_samples], dtype=np.float32)
        rng = p.rng(epoch, entry["key"])
        wave = fit_length(wave, self.excerpt, self.policy)
        start = int(rng.integers(0, len(wave) - self.excerpt + 1))
        piece = p.augment_waveform(wave[start:start + self.excerpt], rng, epoch)
        piece = fit_length(piece, self.segment, self.policy)[:self.segment]
        # Gain and added noise can leave the PCM range that the (tanh) output covers.
        return np.clip(piece, -1.0, 1.0).astype(np.float32)

    def collate(self, examples, keys, audio_seconds, bad) -> Batch:
        if examples:
            audio, lengths = pad_sequences(examples)
        else:
            audio, lengths = np.zeros((0, self.segment), np.float32), np.zeros(0, np.int64)
        return Batch(list(keys), {"audio": torch.from_numpy(audio),
                                  "lengths": torch.as_tensor(lengths, dtype=torch.int64)},
                     audio_seconds, bad)


# --------------------------------------------------------------------------- the task

@TASKS.register("codec")
class CodecTask(Task):
    name = "codec"

    @dataclass
    class Config(TaskConfigBase):
        # training excerpt per utterance in seconds (rounded up to whole code frames); DAC
        # uses 0.38 s, EnCodec 1 s: long enough for the 2048-point mel window
        segment_seconds: float = 1.0
        # utterances shorter than the segment: pad (zeros after them, as silence is part of
        # speech) or loop (repeated; the joins become clicks the codec has to code)
        short_utterances: str = "pad"
        # dev segment: the first eval_seconds of each dev utterance (all of a shorter one),
        # fixed so that successive validations measure the same audio
        eval_seconds: float = 3.0
        # codebooks used by validation; 0: all (training draws 1..n by quantizer dropout)
        eval_n_q: int = 0

    sections = {"model": Section(schema=CodecConfig),
                "discriminator": Section(schema=CodecDiscriminatorConfig),
                "loss": Section(schema=CodecLossConfig)}
    optimizers = ("generator", "discriminator")
    needs_inventory = False
    selection_metric = "mel_distance"
    export_module = "generator"
    # DAC's optimizer settings (AdamW, betas 0.8/0.99, per-step exponential LR decay,
    # generator clip 1e3, discriminator clip 10); the discriminator starts with the
    # adversarial loss weights.
    optim_defaults = {
        "generator": {"type": "adamw", "lr": 1e-4, "betas": [0.8, 0.99], "grad_clip": 1000.0,
                      "scheduler": {"type": "exponential", "gamma": 0.999996}},
        "discriminator": {"type": "adamw", "lr": 1e-4, "betas": [0.8, 0.99],
                          "grad_clip": 10.0, "start_fraction": ADVERSARIAL_START,
                          "scheduler": {"type": "exponential", "gamma": 0.999996}},
    }

    # ---------------------------------------------------------------- config
    @classmethod
    def check_config(cls, cfg) -> None:
        cfg.model.validate()
        d = cfg.discriminator
        for key, own, sub in (("mpd", "mpd", d.mpd), ("mrsd", "mstftd", d.mrsd)):
            try:
                sub.validate()
            except ConfigError as err:
                raise _wrap_sub_error(err, own, key) from None
        if not (d.use_mpd or d.use_mrsd):
            raise ConfigError("discriminator.use_mpd and discriminator.use_mrsd are both false: "
                              "the discriminator optimizer needs at least one of them")
        t = cfg.task
        if t.segment_seconds <= 0 or t.eval_seconds <= 0:
            raise ConfigError("task.segment_seconds and task.eval_seconds must be positive")
        if t.short_utterances not in ("pad", "loop"):
            raise ConfigError(f"task.short_utterances: expected pad or loop, got "
                              f"{t.short_utterances!r}")
        if not 0 <= t.eval_n_q <= cfg.model.n_codebooks:
            raise ConfigError(f"task.eval_n_q={t.eval_n_q}: must lie in [0, model.n_codebooks="
                              f"{cfg.model.n_codebooks}] (0: all)")
        if cfg.dataset.sample_rate != cfg.model.sample_rate:
            raise ConfigError(f"dataset.sample_rate={cfg.dataset.sample_rate} but "
                              f"model.sample_rate={cfg.model.sample_rate}: the loader resamples "
                              "to dataset.sample_rate, so set both to the codec's rate")
        ds = cfg.dataset
        for key, on in (("spec_aug.enabled", ds.spec_aug.enabled), ("vtlp_range", ds.vtlp_range),
                        ("voice_perturb.prob", ds.voice_perturb.prob > 0),
                        ("feature.dither", ds.feature.dither > 0)):
            if on:
                raise ConfigError(f"dataset.{key} acts on fbank features; the codec trains on "
                                  "waveforms (use speed_perturb, volume_range, noise, reverb)")
        loss = cfg.loss
        for key in WEIGHT_KEYS:
            ramp = getattr(loss, key)
            if ramp.initial < 0 or ramp.final < 0:
                raise ConfigError(f"loss.{key}: weights must be >= 0")
        if len(loss.mel_window_lengths) != len(loss.mel_n_mels) or not loss.mel_n_mels:
            raise ConfigError("loss.mel_window_lengths and loss.mel_n_mels need the same, "
                              "non-zero number of entries")
        if any(w < 4 for w in loss.mel_window_lengths) or any(m < 1 for m in loss.mel_n_mels):
            raise ConfigError("loss.mel_window_lengths must be >= 4 and loss.mel_n_mels >= 1")
        cls._check_phase(cfg)

    @staticmethod
    def _check_phase(cfg) -> None:
        """The discriminator optimizer and the adversarial weights share one start: a
        generator trained against a discriminator that has not started learns from noise,
        and a discriminator trained with no adversarial term spends steps on nothing."""
        starts = []
        for key in ADVERSARIAL_KEYS:
            ramp = getattr(cfg.loss, key)
            begin = ramp.active_from()
            if math.isinf(begin):
                continue
            if ramp.unit == "steps":
                if not cfg.training.max_steps:
                    raise ConfigError(f"loss.{key} ramps in steps: set training.max_steps (or "
                                      "use unit: fraction) so that its start can be matched "
                                      "with optim.discriminator.start_fraction")
                begin = begin / cfg.training.max_steps
            starts.append((begin, key))
        if not starts:
            return                     # no adversarial term: the discriminators never run
        begin, key = min(starts)
        d_start = cfg.optim["discriminator"].start_fraction
        if abs(d_start - begin) > 1e-9:
            when = "after" if d_start > begin else "before"
            raise ConfigError(
                f"optim.discriminator.start_fraction={d_start:g} starts the discriminator "
                f"{when} loss.{key} switches on (at {begin:g} of max_steps): set both to the "
                "same fraction (the adversarial phase)")

    def __init__(self, cfg, inventory=None):
        super().__init__(cfg, inventory)
        m = cfg.model
        self.hop = m.hop
        frames = max(1, int(math.ceil(cfg.task.segment_seconds * m.sample_rate / self.hop)))
        self.segment = frames * self.hop
        self.segment_frames = frames
        self.eval_samples = max(1, int(round(cfg.task.eval_seconds * m.sample_rate)))
        self.eval_n_q = cfg.task.eval_n_q or m.n_codebooks
        self.mel_loss = MultiResolutionMelLoss(m.sample_rate, cfg.loss.mel_window_lengths,
                                               cfg.loss.mel_n_mels)
        # Validation uses the metric's own (DAC default) resolutions, as evaluate_codec
        # does, so dev numbers compare across configs.
        self.eval_mel = MultiResolutionMelLoss(m.sample_rate)
        self.eval_stft = MultiResolutionSTFTLoss()

    # ---------------------------------------------------------------- modules
    def build_modules(self) -> Dict[str, nn.Module]:
        return {"generator": CodecModel(copy.deepcopy(self.cfg.model)),
                "discriminator": CodecDiscriminator(self.cfg.discriminator)}

    def optimizer_modules(self):
        return {"generator": ["generator"], "discriminator": ["discriminator"]}

    def init_modules(self, task_state=None) -> List[str]:
        # Fine-tuning starts the discriminators over: a fresh critic for the new data.
        return ["generator"]

    def adapt_init_state(self, name, module, state):
        """An export holds plain weights (weight norm folded in); a generator built with
        weight norm expects (g, v): v = w and g = ||w|| per output channel rebuild the same
        weight (to rounding)."""
        if name != "generator":
            return state
        own = module.state_dict()
        state = dict(state)
        suffix_g, suffix_v = ".parametrizations.weight.original0", ".parametrizations.weight.original1"
        for key in own:
            if not key.endswith(suffix_g):
                continue
            prefix = key[:-len(suffix_g)]
            plain = prefix + ".weight"
            if key in state or plain not in state:
                continue
            w = state.pop(plain)
            norm = torch.linalg.vector_norm(w.reshape(w.shape[0], -1).float(), dim=1)
            state[key] = norm.to(w.dtype).reshape(own[key].shape)
            state[prefix + suffix_v] = w
        return state

    def describe(self, modules) -> str:
        g = modules["generator"]
        d = modules["discriminator"]
        parts = [n for n, sub in (("mpd", d.mpd), ("mrsd", d.mrsd)) if sub is not None]
        return (f"task codec: generator {count_parameters(g):,} parameters (hop {g.hop}, "
                f"{g.frames_per_second:g} frames/s, {g.config.n_codebooks} x "
                f"{g.config.codebook_size} codes = {g.bitrate() / 1000:g} kbit/s"
                f"{', causal' if g.config.causal else ''}), discriminator "
                f"{count_parameters(d):,} ({' + '.join(parts)}); segment "
                f"{self.segment} samples")

    # ---------------------------------------------------------------- data
    def data_requirements(self, split="train"):
        return DataRequirements(require_label=False)

    def example_builder(self, train, seed, noise=None, rirs=None, steps_per_epoch=0,
                        total_steps=0):
        pipeline = FeaturePipeline(self.cfg.dataset, seed, train, noise, rirs, steps_per_epoch,
                                   total_steps)
        return SegmentBuilder(pipeline, self.segment, self.eval_samples,
                              self.cfg.task.short_utterances)

    def example_frames(self, durations: np.ndarray) -> np.ndarray:
        return np.full(len(durations), self.segment_frames, dtype=np.int64)

    def dummy_batch(self) -> Batch:
        # A quiet tone, not zeros: feature matching divides by the real activations' scale.
        t = np.arange(self.segment) / self.cfg.model.sample_rate
        wave = (0.1 * np.sin(2 * np.pi * 220.0 * t)).astype(np.float32)
        return Batch(["<empty>"], {"audio": torch.from_numpy(wave[None]),
                                   "lengths": torch.tensor([self.segment])})

    # ---------------------------------------------------------------- steps
    def _weights(self, ctx) -> Dict[str, float]:
        return {k: ctx.value(getattr(self.cfg.loss, k)) for k in WEIGHT_KEYS}

    def train_step(self, batch, ctx) -> Dict[str, float]:
        real = batch.audio.to(ctx.device, non_blocking=True).unsqueeze(1)      # (B, 1, T)
        n = real.shape[0]
        w = self._weights(ctx)
        adversarial = ctx.active("discriminator") and (
            w["adversarial"] > 0 or w["feature_matching"] > 0)
        stats: Dict[str, float] = {}
        with ctx.autocast():
            out = ctx.module("generator")(real)          # quantizer dropout: n_q drawn per item
        fake = out["audio"]

        if adversarial:
            # One discriminator forward for real and fake together (one DDP forward per
            # backward); the fake half is detached: this loss trains the discriminators only.
            with ctx.autocast():
                logits, _ = ctx.module("discriminator")(torch.cat([real, fake.detach()]))
            real_logits, fake_logits = _halves(logits, n)
            d_loss = discriminator_loss(real_logits, fake_logits)
            ctx.backward(d_loss, "discriminator")
            ctx.step("discriminator")
            stats["d_loss"] = float(d_loss.detach())

        mel = self._mel(fake, real)
        commit, codebook = out["commit_loss"], out["codebook_loss"]          # float32 (RVQ)
        total = w["mel"] * mel + w["commitment"] * commit + w["codebook"] * codebook
        if adversarial:
            # The updated discriminators, bare (no DDP sync: their parameters collect no
            # gradient here), judge the output; real features are the matching targets.
            with ctx.frozen("discriminator"), ctx.autocast():
                logits, features = ctx.raw("discriminator")(torch.cat([real, fake]))
            _, fake_logits = _halves(logits, n)
            real_features, fake_features = _halves(features, n)
            adv = generator_adversarial_loss(fake_logits)
            fm = feature_matching_loss(real_features, fake_features)
            total = total + w["adversarial"] * adv + w["feature_matching"] * fm
            stats.update(adv_g=float(adv.detach()), fm=float(fm.detach()))
        ctx.backward(total, "generator")
        ctx.step("generator")
        stats.update(total=float(total.detach()), mel=float(mel.detach()),
                     commit=float(commit.detach()), codebook=float(codebook.detach()))
        return stats

    def _mel(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mel loss as an fp32 island (the STFTs are float32 inside as well)."""
        self.mel_loss.to(prediction.device)
        with torch.autocast(device_type=prediction.device.type, enabled=False):
            return self.mel_loss(prediction.float(), target.float())

    def eval_step(self, batch, ctx) -> Dict[str, float]:
        from toolkit.tasks.codec.metrics import si_sdr
        generator = ctx.module("generator")
        self.eval_mel.to(ctx.device)
        sums = {k: 0.0 for k in self.eval_metric_names()}
        for i in range(len(batch)):        # each utterance at its own length: no padding
            ref = batch.audio[i:i + 1, :int(batch.lengths[i])].to(ctx.device).unsqueeze(1)
            with ctx.autocast():
                decoded = generator(ref, n_q=self.eval_n_q)["audio"]
            with torch.autocast(device_type=ctx.device.type, enabled=False):
                decoded = decoded.float()
                sums["mel_distance"] += float(self.eval_mel(decoded, ref))
                sc, mag = self.eval_stft(decoded, ref)
                sums["stft_distance"] += float(sc + mag)
            sums["si_sdr"] += si_sdr(ref[0, 0].cpu().numpy(), decoded[0, 0].cpu().numpy())
        return {k: v / max(1, len(batch)) for k, v in sums.items()}

    def train_metric_names(self) -> Tuple[str, ...]:
        return ("total", "mel", "commit", "codebook", "adv_g", "fm", "d_loss")

    def eval_metric_names(self) -> Tuple[str, ...]:
        return ("mel_distance", "stft_distance", "si_sdr")

    # ---------------------------------------------------------------- export
    def export(self, checkpoint: str, out_dir: str, test_data: str, num_check: int = 20,
               tolerance: float = 1e-4, threshold: Optional[float] = None) -> Dict[str, float]:
        """model.safetensors + config.json (generator weights, weight norm folded in),
        encoder.onnx / decoder.onnx and encoder.zip / decoder.zip (TorchScript), dynamic
        batch and time axes; the codes of every format must equal PyTorch's on real test
        utterances and the decoded audio lie within `tolerance`."""
        from toolkit.export import parity_inputs
        from toolkit.trainer.checkpoint import module_states_from_file
        if not os.path.exists(checkpoint):
            raise MissingInputError(f"checkpoint {checkpoint} not found")
        states = module_states_from_file(checkpoint)
        if "generator" not in states:
            raise ConfigError(f"{checkpoint} has no generator weights (it has "
                              f"{', '.join(sorted(states))})")
        model = CodecModel(copy.deepcopy(self.cfg.model))
        model.load_state_dict(states["generator"])
        model = remove_weight_norm(model.eval())
        pipeline = FeaturePipeline(self.cfg.dataset, seed=0, train=False)
        limit = int(max(self.cfg.task.eval_seconds, 10.0) * model.config.sample_rate)

        def make(entry):
            return (_pad_to_hop(pipeline.load(entry)[:limit], model.hop)[None, None],)
        cases = parity_inputs(test_data, make, num_check)
        return export_codec(model, out_dir, cases, tolerance)


# --------------------------------------------------------------------------- export graphs

class _PaddedConv(nn.Module):
    """CodecConv1d with its padding as two ints (TorchScript's F.pad takes a list)."""

    def __init__(self, layer: CodecConv1d):
        super().__init__()
        self.conv = layer.conv
        self.left, self.right = int(layer.padding[0]), int(layer.padding[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, [self.left, self.right]))


class _TrimmedConvTranspose(nn.Module):
    """CodecConvTranspose1d trimming by constant offsets from both ends, so a traced
    graph keeps a dynamic length (slicing to `shape - right` would bake the length in)."""

    def __init__(self, layer: CodecConvTranspose1d):
        super().__init__()
        self.conv = layer.conv
        self.left, self.right = int(layer.trim[0]), int(layer.trim[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if self.right > 0:
            return y[:, :, self.left:-self.right]
        return y[:, :, self.left:]


def _exportable(module: nn.Module) -> nn.Module:
    """A copy of an encoder/decoder stack with graph-friendly conv wrappers (same weights)."""
    module = copy.deepcopy(module)

    def walk(parent: nn.Module) -> None:
        for name, child in parent.named_children():
            if isinstance(child, CodecConv1d):
                setattr(parent, name, _PaddedConv(child))
            elif isinstance(child, CodecConvTranspose1d):
                setattr(parent, name, _TrimmedConvTranspose(child))
            else:
                walk(child)
    walk(module)
    return module


class _StageGraph(nn.Module):
    """One VQ stage at inference: the same operations as VectorQuantizer (cosine nearest
    entry, straight-through sum), so the graph picks the same codes as PyTorch."""

    def __init__(self, stage):
        super().__init__()
        self.in_proj = copy.deepcopy(stage.in_proj)
        self.out_proj = copy.deepcopy(stage.out_proj)
        codebook = stage.codebook.detach().clone().float()
        self.register_buffer("codebook", codebook)
        self.register_buffer("keys", F.normalize(codebook, dim=1).t().contiguous())

    def forward(self, residual: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        z_e = self.in_proj(residual)                                   # (B, d, frames)
        sims = torch.matmul(F.normalize(z_e.transpose(1, 2), dim=2), self.keys)
        codes = sims.argmax(dim=2)                                     # (B, frames)
        q = F.embedding(codes, self.codebook).transpose(1, 2)
        q = z_e + (q - z_e)
        return codes, self.out_proj(q)


class EncoderGraph(nn.Module):
    """wav (B, 1, T), T a multiple of the hop -> codes (B, n_codebooks, T / hop) int64."""

    def __init__(self, model: CodecModel):
        super().__init__()
        self.encoder = _exportable(model.encoder)
        self.stages = nn.ModuleList(_StageGraph(s) for s in model.quantizer.stages)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        residual = self.encoder(wav)
        codes: List[torch.Tensor] = []
        for stage in self.stages:
            stage_codes, q = stage(residual)
            residual = residual - q
            codes.append(stage_codes)
        return torch.stack(codes, dim=1)


class _StageDecode(nn.Module):
    def __init__(self, stage: _StageGraph):
        super().__init__()
        self.out_proj = stage.out_proj
        self.register_buffer("codebook", stage.codebook)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.out_proj(F.embedding(codes, self.codebook).transpose(1, 2))


class DecoderGraph(nn.Module):
    """codes (B, n_codebooks, frames) int64 -> wav (B, 1, frames * hop) float32."""

    def __init__(self, model: CodecModel):
        super().__init__()
        stages = [_StageDecode(_StageGraph(s)) for s in model.quantizer.stages]
        self.first = stages[0]
        self.rest = nn.ModuleList(stages[1:])
        self.decoder = _exportable(model.decoder)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        z_q = self.first(codes[:, 0])
        for i, stage in enumerate(self.rest):
            z_q = z_q + stage(codes[:, i + 1])
        return self.decoder(z_q)


def weights_fingerprint(model: nn.Module) -> str:
    """Short hash of the inference weights: a codes file names the model it needs."""
    h = hashlib.sha256()
    for key, value in sorted(model.state_dict().items()):
        t = value.detach().cpu().contiguous()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


def encoder_context_samples(model: CodecModel) -> int:
    """Left context (a multiple of the hop) that makes chunked encoding of a causal model
    exact: its receptive field, rounded up to whole frames, plus one frame."""
    hop = model.hop
    return int(math.ceil(history_length(model.encoder) / hop)) * hop + hop


def decoder_context_frames(model: CodecModel) -> int:
    return int(math.ceil(history_length(model.decoder))) + 1


def codec_metadata(model: CodecModel) -> dict:
    cfg = model.config
    causal = bool(cfg.causal)
    return {
        "format_version": EXPORT_FORMAT_VERSION, "task": "codec",
        "sample_rate": int(cfg.sample_rate), "hop": int(model.hop),
        "frame_rate": float(model.frames_per_second), "n_codebooks": int(cfg.n_codebooks),
        "codebook_size": int(cfg.codebook_size), "bitrate": float(model.bitrate()),
        "causal": causal, "fingerprint": weights_fingerprint(model),
        "encoder_context_samples": encoder_context_samples(model) if causal else None,
        "decoder_context_frames": decoder_context_frames(model) if causal else None,
        "weight_norm": "removed (folded into the weights)",
        "encoder": "wav (batch, 1, samples), samples a multiple of hop, mono in [-1, 1] at "
                   "sample_rate -> codes (batch, n_codebooks, samples / hop) int64",
        "decoder": "codes (batch, n_codebooks, frames) int64 -> wav (batch, 1, frames * hop)",
    }


def _pad_to_hop(wave: np.ndarray, hop: int) -> np.ndarray:
    wave = np.asarray(wave, dtype=np.float32)
    extra = (-len(wave)) % hop
    return np.pad(wave, (0, extra)) if extra else wave


def export_codec(model: CodecModel, out_dir: str, cases: List[Tuple[np.ndarray]],
                 tolerance: float) -> Dict[str, float]:
    """Writes every format of `model` (eval mode, weight norm removed) to `out_dir` and
    checks them: codes equal to `model.encode`'s, audio within `tolerance` of
    `model.decode`'s. Returns the worst differences by format."""
    from toolkit import export as writers
    from toolkit.export import compare, onnx_runner, torch_runner
    os.makedirs(out_dir, exist_ok=True)
    metadata = codec_metadata(model)
    config = dataclasses.asdict(model.config)
    writers.export_safetensors(model, os.path.join(out_dir, SAFETENSORS_NAME), metadata, config)
    encoder, decoder = EncoderGraph(model).eval(), DecoderGraph(model).eval()
    paths = {}
    for backend, (enc_name, dec_name) in GRAPH_FILES.items():
        paths[backend] = (os.path.join(out_dir, enc_name), os.path.join(out_dir, dec_name))
    frames = 8
    wav = torch.zeros(1, 1, frames * model.hop)
    codes = torch.zeros(1, model.config.n_codebooks, frames, dtype=torch.long)
    writers.export_onnx(encoder, (wav,), paths["onnx"][0], ["wav"], ["codes"],
                        {"wav": {0: "batch", 2: "samples"}, "codes": {0: "batch", 2: "frames"}},
                        metadata)
    writers.export_onnx(decoder, (codes,), paths["onnx"][1], ["codes"], ["wav"],
                        {"codes": {0: "batch", 2: "frames"}, "wav": {0: "batch", 2: "samples"}},
                        metadata)
    writers.export_torchscript(encoder, paths["torch"][0], metadata)
    writers.export_torchscript(decoder, paths["torch"][1], metadata)

    reloaded = load_safetensors_model(os.path.join(out_dir, SAFETENSORS_NAME))

    def run_encode(m):
        return lambda wav_: (m.encode(torch.from_numpy(wav_)).numpy(),)

    def run_decode(m):
        return lambda codes_: (m.decode(torch.from_numpy(codes_)).numpy(),)
    worst = {}
    got = compare(run_encode(model), {
        "onnx": onnx_runner(paths["onnx"][0]),
        "torchscript": torch_runner(torch.jit.load(paths["torch"][0]).eval()),
        "safetensors": run_encode(reloaded)}, cases, 0.0, "exported codec encoder (codes)")
    worst.update({f"encoder_{k}": v for k, v in got.items()})
    code_cases = [run_encode(model)(*case) for case in cases]
    got = compare(run_decode(model), {
        "onnx": onnx_runner(paths["onnx"][1]),
        "torchscript": torch_runner(torch.jit.load(paths["torch"][1]).eval()),
        "safetensors": run_decode(reloaded)}, code_cases, tolerance, "exported codec decoder")
    worst.update({f"decoder_{k}": v for k, v in got.items()})
    logger.info("codec export %s: %s, %g kbit/s, fingerprint %s", out_dir,
                ", ".join(sorted(os.listdir(out_dir))), metadata["bitrate"] / 1000,
                metadata["fingerprint"])
    return worst


def load_safetensors_model(path: str) -> CodecModel:
    """The generator of an export (model.safetensors + config.json), eval mode."""
    from safetensors.torch import load_file
    from toolkit.export import read_metadata
    meta = read_metadata(path)
    raw = dict(meta.get("model") or {})
    names = {f.name for f in dataclasses.fields(CodecConfig)}
    model = CodecModel(CodecConfig(**{k: v for k, v in raw.items() if k in names}))
    model = remove_weight_norm(model.eval())
    model.load_state_dict(load_file(path))
    return model


# --------------------------------------------------------------------------- runtime

class ExportedCodec:
    """Encodes and decodes with the graphs of an export dir (onnx: onnxruntime; torch:
    the TorchScript files), whole signals or chunk by chunk (causal models)."""

    def __init__(self, export_dir: str, backend: str = "onnx", threads: int = 1):
        if backend not in GRAPH_FILES:
            raise ConfigError(f"backend: expected onnx or torch, got {backend!r}")
        enc, dec = (os.path.join(export_dir, name) for name in GRAPH_FILES[backend])
        for path in (enc, dec):
            if not os.path.exists(path):
                raise MissingInputError(f"{path} not found: is {export_dir} a codec export "
                                        "(toolkit.bin.export_model)?")
        from toolkit.export import onnx_runner, read_metadata, torch_runner
        self.metadata = read_metadata(enc)
        if self.metadata.get("task") != "codec":
            raise DataError(f"{enc} is a {self.metadata.get('task')} model, not a codec")
        if backend == "onnx":
            self._encode, self._decode = onnx_runner(enc, threads), onnx_runner(dec, threads)
        else:
            torch.set_num_threads(threads)
            self._encode = torch_runner(torch.jit.load(enc).eval())
            self._decode = torch_runner(torch.jit.load(dec).eval())
        m = self.metadata
        self.sample_rate, self.hop = int(m["sample_rate"]), int(m["hop"])
        self.n_codebooks, self.codebook_size = int(m["n_codebooks"]), int(m["codebook_size"])
        self.causal, self.fingerprint = bool(m["causal"]), str(m["fingerprint"])
        self.bitrate = float(m["bitrate"])

    def encode(self, wave: np.ndarray) -> np.ndarray:
        """Mono samples at the model's rate -> codes (n_codebooks, ceil(T / hop))."""
        wave = _pad_to_hop(wave, self.hop)
        if not len(wave):
            return np.zeros((self.n_codebooks, 0), np.int64)
        return self._encode(wave[None, None])[0][0]

    def decode(self, codes: np.ndarray, length: Optional[int] = None) -> np.ndarray:
        codes = np.ascontiguousarray(codes, dtype=np.int64)
        if codes.shape[1] == 0:
            return np.zeros(0, np.float32)
        audio = self._decode(codes[None])[0][0, 0]
        return audio if length is None else audio[:length]

    def _need_causal(self) -> None:
        if not self.causal:
            raise ConfigError("chunked processing needs a causal model (model.causal: true); "
                              "this export is not causal: process whole files")

    def encode_chunks(self, blocks: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
        """Blocks of samples in, codes of the frames completed so far out (the last, partial
        frame zero padded at the end), equal to encoding the whole signal at once: each
        window re-reads `encoder_context_samples` before its new frames."""
        self._need_causal()
        hop, context = self.hop, int(self.metadata["encoder_context_samples"])
        buffer = np.zeros(0, np.float32)
        buffer_start = total = done = 0
        for block in blocks:
            buffer = np.concatenate([buffer, np.asarray(block, np.float32)])
            total += len(block)
            complete = total // hop
            if complete == done:
                continue
            start = max(0, done * hop - context)
            window = buffer[start - buffer_start:complete * hop - buffer_start]
            yield self._encode(window[None, None])[0][0][:, done - start // hop:]
            done = complete
            keep = max(0, complete * hop - context)
            buffer, buffer_start = buffer[keep - buffer_start:], keep
        if total % hop:
            start = max(0, done * hop - context)
            window = _pad_to_hop(buffer[start - buffer_start:], hop)
            yield self._encode(window[None, None])[0][0][:, done - start // hop:]

    def decode_chunks(self, blocks: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
        """Code blocks (n_codebooks, frames) in, frames * hop samples each out, equal (to
        rounding) to decoding all codes at once: `decoder_context_frames` are re-read."""
        self._need_causal()
        context = int(self.metadata["decoder_context_frames"])
        kept = np.zeros((self.n_codebooks, 0), np.int64)
        for block in blocks:
            block = np.asarray(block, np.int64)
            new = block.shape[1]
            if not new:
                continue
            window = np.concatenate([kept, block], axis=1)
            yield self._decode(np.ascontiguousarray(window[None]))[0][0, 0, -new * self.hop:]
            kept = window[:, max(0, window.shape[1] - context):]


# --------------------------------------------------------------------------- codes files

def write_codes(path: str, codes: np.ndarray, codec: ExportedCodec, length: int) -> None:
    """An .npz: codes (n_q, frames) int16 (int32 for codebooks above 2^15 entries), the
    sample rate, hop and length of the audio, and the fingerprint of the model that
    decodes them. Written under a temporary name, then renamed."""
    dtype = np.int16 if codec.codebook_size <= 2 ** 15 else np.int32
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        np.savez(f, format=np.array(CODES_FORMAT), version=np.array(CODES_VERSION),
                 codes=np.asarray(codes).astype(dtype), sample_rate=np.array(codec.sample_rate),
                 hop=np.array(codec.hop), length=np.array(int(length), dtype=np.int64),
                 codebook_size=np.array(codec.codebook_size),
                 fingerprint=np.array(codec.fingerprint))
    os.replace(tmp, path)


def read_codes(path: str, codec: Optional[ExportedCodec] = None) -> Dict[str, Any]:
    """A codes file's fields; with `codec`, checks that this model can decode them."""
    try:
        with np.load(path, allow_pickle=False) as data:
            fields = {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise MissingInputError(f"{path} not found") from None
    except (OSError, ValueError) as err:
        raise DataError(f"{path} is not a codes file ({err})") from None
    if str(fields.get("format", "")) != CODES_FORMAT:
        raise DataError(f"{path} is not a codes file written by toolkit.bin.codec encode")
    if int(fields["version"]) > CODES_VERSION:
        raise DataError(f"{path}: codes format version {int(fields['version'])} is newer than "
                        f"this toolkit's ({CODES_VERSION})")
    out = {"codes": fields["codes"].astype(np.int64), "sample_rate": int(fields["sample_rate"]),
           "hop": int(fields["hop"]), "length": int(fields["length"]),
           "codebook_size": int(fields["codebook_size"]),
           "fingerprint": str(fields["fingerprint"])}
    if codec is not None:
        if out["fingerprint"] != codec.fingerprint:
            raise UserError(f"{path} was encoded by the codec model with fingerprint "
                            f"{out['fingerprint']}, but --model is {codec.fingerprint}: decode "
                            "with the model that encoded it")
        codes = out["codes"]
        if codes.ndim != 2 or codes.shape[0] != codec.n_codebooks:
            raise DataError(f"{path}: codes of shape {codes.shape}, the model needs "
                            f"({codec.n_codebooks}, frames)")
        if codes.size and (codes.min() < 0 or codes.max() >= codec.codebook_size):
            raise DataError(f"{path}: codes outside [0, {codec.codebook_size})")
    return out


# --------------------------------------------------------------------------- files

def _read_blocks(path: str, block: int, counter: List[int]) -> Iterator[np.ndarray]:
    """Mono float32 blocks of a sound file (channels averaged), `counter[0]` the samples
    read so far: only one block is in memory at a time."""
    import soundfile as sf
    with sf.SoundFile(path) as f:
        while True:
            data = f.read(block, dtype="float32", always_2d=True)
            if not len(data):
                return
            counter[0] += len(data)
            yield data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]


def _load_whole(path: str, rate: int) -> np.ndarray:
    from toolkit.data.augment import load_mono
    try:
        return load_mono(path, rate)
    except BadEntry as err:
        raise DataError(f"{path}: {err}") from None


def _chunk_samples(codec: ExportedCodec, chunk_seconds: float) -> int:
    if chunk_seconds <= 0:
        raise ConfigError(f"--chunk-seconds must be positive, got {chunk_seconds}")
    frames = max(1, int(round(chunk_seconds * codec.sample_rate / codec.hop)))
    return frames * codec.hop


def encode_file(codec: ExportedCodec, wav_path: str, codes_path: str,
                chunk_seconds: float = 1.0) -> Dict[str, Any]:
    """WAV -> codes file. A causal model at the file's own rate reads and encodes block by
    block (constant memory); otherwise the file is read (and resampled) whole."""
    import soundfile as sf
    if not os.path.exists(wav_path):
        raise MissingInputError(f"{wav_path} not found")
    try:
        rate = sf.info(wav_path).samplerate
    except RuntimeError as err:
        raise DataError(f"{wav_path}: cannot read audio ({err})") from None
    chunk = _chunk_samples(codec, chunk_seconds)
    if codec.causal and rate == codec.sample_rate:
        counter = [0]
        parts = list(codec.encode_chunks(_read_blocks(wav_path, chunk, counter)))
        length = counter[0]
    else:
        wave = _load_whole(wav_path, codec.sample_rate)
        length = len(wave)
        parts = (list(codec.encode_chunks(wave[i:i + chunk] for i in range(0, length, chunk)))
                 if codec.causal else [codec.encode(wave)])
    codes = (np.concatenate(parts, axis=1) if parts
             else np.zeros((codec.n_codebooks, 0), np.int64))
    write_codes(codes_path, codes, codec, length)
    return {"samples": length, "frames": int(codes.shape[1]), "seconds": length / codec.sample_rate,
            "resampled_from": rate if rate != codec.sample_rate else None}


def decode_file(codec: ExportedCodec, codes_path: str, wav_path: str,
                chunk_seconds: float = 1.0) -> Dict[str, Any]:
    """Codes file -> 16-bit WAV at the model's rate with the encoded length; a causal model
    decodes and writes block by block."""
    import soundfile as sf
    data = read_codes(codes_path, codec)
    codes, length = data["codes"], data["length"]
    frames = _chunk_samples(codec, chunk_seconds) // codec.hop
    tmp = wav_path + ".tmp"
    written = 0
    try:
        with sf.SoundFile(tmp, "w", samplerate=codec.sample_rate, channels=1,
                          subtype="PCM_16", format="WAV") as out:
            if codec.causal:
                pieces = codec.decode_chunks(codes[:, i:i + frames]
                                             for i in range(0, codes.shape[1], frames))
            else:
                pieces = iter([codec.decode(codes)])
            for audio in pieces:
                audio = audio[:max(0, length - written)]
                out.write(np.clip(audio, -1.0, 1.0))
                written += len(audio)
        os.replace(tmp, wav_path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return {"samples": written, "frames": int(codes.shape[1]),
            "seconds": written / codec.sample_rate}


# --------------------------------------------------------------------------- evaluation

def parse_baseline(text: str):
    """`mulaw:TARGET_RATE:BITS` or `melgl:N_MELS:FRAME_RATE:BITS` -> (name, codec function
    (wave, sample_rate) -> (decoded, bitrate))."""
    from toolkit.tasks.codec.baselines import melgl_codec, mulaw_codec
    parts = text.split(":")
    try:
        numbers = [int(p) for p in parts[1:]]
    except ValueError:
        numbers = []
    if parts[0] == "mulaw" and len(numbers) == 2:
        target, bits = numbers
        return f"mu-law {target / 1000:g} kHz {bits} bit", \
            lambda x, sr: mulaw_codec(x, sr, target, bits)
    if parts[0] == "melgl" and len(numbers) == 3:
        n_mels, frame_rate, bits = numbers
        return f"mel+Griffin-Lim {n_mels} mels {frame_rate} fps {bits} bit", \
            lambda x, sr: melgl_codec(x, sr, n_mels, frame_rate, bits)
    raise ConfigError(f"baseline {text!r}: expected mulaw:TARGET_RATE:BITS or "
                      "melgl:N_MELS:FRAME_RATE:BITS")


METRIC_COLUMNS = (("mel_distance", "mel distance (lower better)", "{:.3f}"),
                  ("stft_distance", "STFT distance (lower better)", "{:.3f}"),
                  ("si_sdr", "SI-SDR dB (higher better)", "{:.2f}"),
                  ("stoi", "STOI (higher better)", "{:.3f}"))


def evaluate_list(codec: ExportedCodec, test_data: str, baselines: List[Tuple[str, Any]],
                  max_utts: int = 0, plot_key: str = "") -> Dict[str, Any]:
    """Metrics (toolkit.tasks.codec.metrics.evaluate_pair) of the codec and each baseline,
    averaged over the usable utterances of `test_data`; the waveforms of one utterance
    (`plot_key`, else the first) are kept for the spectrogram figure."""
    from toolkit.config import DatasetConfig
    from toolkit.data.datalist import BadCounter, DataList
    from toolkit.tasks.codec.metrics import evaluate_pair
    test = DataList.load(test_data, require_label=False)
    pipeline = FeaturePipeline(DatasetConfig(sample_rate=codec.sample_rate), 0, False)
    names = ["codec"] + [name for name, _ in baselines]
    sums: Dict[str, Dict[str, float]] = {n: {} for n in names}
    rates = {"codec": codec.bitrate}
    bad, used, plot = BadCounter(), 0, None
    for i in range(len(test)):
        if max_utts and used >= max_utts:
            break
        entry = test.entry(i)
        try:
            wave = pipeline.load(entry)
        except BadEntry as err:
            bad.add(err.reason, entry["key"], err.detail)
            continue
        decoded = {"codec": codec.decode(codec.encode(wave), len(wave))}
        for name, fn in baselines:
            decoded[name], rates[name] = fn(wave, codec.sample_rate)
        for name in names:
            for k, v in evaluate_pair(wave, decoded[name], codec.sample_rate).items():
                sums[name][k] = sums[name].get(k, 0.0) + v
        used += 1
        if plot is None or entry["key"] == plot_key:
            plot = {"key": entry["key"], "original": wave, **decoded}
    if not used:
        raise DataError(f"{test_data}: no usable utterance ({bad.summary()})")
    systems = []
    for name in names:
        row = {"system": name, "bitrate": rates[name]}
        for key, _, _ in METRIC_COLUMNS:
            row[key] = sums[name][key] / used if key in sums[name] else None
        systems.append(row)
    return {"utterances": used, "skipped": bad.total(), "systems": systems, "plot": plot,
            "fingerprint": codec.fingerprint, "sample_rate": codec.sample_rate}


def markdown_table(result: Dict[str, Any]) -> str:
    header = "| system | kbit/s | " + " | ".join(c[1] for c in METRIC_COLUMNS) + " |"
    lines = [header, "|" + "---|" * (2 + len(METRIC_COLUMNS))]
    for row in result["systems"]:
        cells = [row["system"], f"{row['bitrate'] / 1000:g}"]
        cells += ["n/a" if row[k] is None else fmt.format(row[k]) for k, _, fmt in METRIC_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_spectrograms(plot: Dict[str, Any], rates: Dict[str, float], sample_rate: int,
                      path: str) -> None:
    """Log-mel spectrograms (80 bands, 1024-point window, hop 256) one above the other."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from toolkit.nn.spectral import log_mel_spectrogram
    names = ["original"] + [k for k in plot if k not in ("key", "original")]
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 2.2 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        wave = torch.from_numpy(np.ascontiguousarray(plot[name], dtype=np.float32))[None]
        spec = log_mel_spectrogram(wave, sample_rate, 1024, 256, n_mels=80)[0].numpy()
        ax.imshow(spec, origin="lower", aspect="auto", vmin=-5.0, vmax=float(spec.max()),
                  extent=(0, len(plot[name]) / sample_rate, 0, spec.shape[0]))
        title = name if name == "original" else f"{name} ({rates[name] / 1000:g} kbit/s)"
        ax.set_title(f"{plot['key']}: {title}", fontsize=9)
        ax.set_ylabel("mel band")
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(result: Dict[str, Any], out_dir: str) -> Dict[str, str]:
    """results.md, results.json and spectrograms.png in `out_dir`; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"markdown": os.path.join(out_dir, "results.md"),
             "json": os.path.join(out_dir, "results.json"),
             "png": os.path.join(out_dir, "spectrograms.png")}
    summary = {k: v for k, v in result.items() if k != "plot"}
    note = ("STOI: n/a (pip install pystoi)\n" if any(r["stoi"] is None for r in result["systems"])
            else "")
    with open(paths["markdown"], "w", encoding="utf-8") as f:
        f.write(f"Codec evaluation over {result['utterances']} utterances "
                f"({result['skipped']} skipped), model {result['fingerprint']}; baselines use "
                "no entropy coding.\n\n" + markdown_table(result) + note)
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    rates = {r["system"]: r["bitrate"] for r in result["systems"]}
    plot_spectrograms(result["plot"], rates, result["sample_rate"], paths["png"])
    return paths
