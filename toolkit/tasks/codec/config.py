"""The codec task's config sections: `task` (segments, validation), `discriminator`, `loss`
(the weights as Ramps of training progress, the mel-loss resolutions), and the checks
across them (the adversarial phase: discriminator optimizer and adversarial weights start
together). The `model` section is toolkit.tasks.codec.model.CodecConfig, `teachers`
toolkit.tasks.codec.teachers.TeachersConfig."""
import math
from dataclasses import dataclass, field
from typing import List

from toolkit.config import ConfigError, Ramp, TaskConfigBase
from toolkit.tasks.codec.discriminators import (MultiPeriodDiscriminatorConfig,
                                                MultiResolutionSTFTDiscriminatorConfig)
from toolkit.tasks.codec.teachers import check_distillation_config, check_teacher_config


@dataclass
class CodecTaskConfig(TaskConfigBase):
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
    # generator parts kept as training.init_checkpoint has them (encoder, quantizer): a
    # new decoder learns to render a trained codec's codes, which stay the same
    frozen: List[str] = field(default_factory=list)
    # generator parts that start fresh although training.init_checkpoint holds them (decoder:
    # a decoder design measured from scratch on a trained codec's codes)
    reinit: List[str] = field(default_factory=list)


# Generator parts task.frozen can keep fixed (the decoder always trains).
FREEZABLE = ("encoder", "quantizer")
# Generator parts task.reinit can start fresh.
REINITIALISABLE = ("encoder", "quantizer", "decoder")


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
    # phase-aware L1 on power-law compressed complex STFTs (losses.CompressedComplexSTFTLoss);
    # 0: off
    complex_stft: Ramp = field(default_factory=lambda: Ramp.constant(0.0))
    # VQ commitment (encoder towards its codes; DAC: 0.25), from the start
    commitment: Ramp = field(default_factory=lambda: Ramp.constant(0.25))
    # VQ codebook term (codes towards the encoder; DAC: 1); zero in effect with EMA codebooks
    codebook: Ramp = field(default_factory=lambda: Ramp.constant(1.0))
    # semantic distillation towards teachers.distillation's features (SpeechTokenizer: 1
    # with cosine); 0: off, no head is built
    distillation: Ramp = field(default_factory=lambda: Ramp.constant(0.0))
    # perceptual loss on teachers.perceptual's features of decoded vs reference audio; 0: off
    perceptual: Ramp = field(default_factory=lambda: Ramp.constant(0.0))
    # mel-loss STFT windows in samples (DAC's, hop = window / 4): short ones time transients
    mel_window_lengths: List[int] = field(
        default_factory=lambda: [32, 64, 128, 256, 512, 1024, 2048])
    # mel bands per window (DAC's); each clipped so that no band falls between FFT bins
    mel_n_mels: List[int] = field(default_factory=lambda: [5, 10, 20, 40, 80, 160, 320])


WEIGHT_KEYS = ("mel", "complex_stft", "adversarial", "feature_matching", "commitment",
               "codebook", "distillation", "perceptual")
ADVERSARIAL_KEYS = ("adversarial", "feature_matching")


def ever_on(ramp: Ramp) -> bool:
    """Whether a weight is ever above zero (the term, and what it needs, is built)."""
    return ramp.initial > 0 or ramp.final > 0


def _wrap_sub_error(err: ConfigError, own: str, key: str) -> ConfigError:
    """The discriminator classes name their own prefixes (mpd., mstftd.); name ours."""
    text = str(err)
    if text.startswith(own + "."):
        text = text[len(own) + 1:]
    return ConfigError(f"discriminator.{key}.{text}")


def check_codec_config(cfg) -> None:
    """The codec's cross-section checks (its Task.check_config); ConfigError names the key."""
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
    for key, known in (("frozen", FREEZABLE), ("reinit", REINITIALISABLE)):
        wrong = sorted(set(getattr(t, key)) - set(known))
        if wrong:
            raise ConfigError(f"task.{key}: unknown parts {wrong}; known: {', '.join(known)}")
    both = sorted(set(t.frozen) & set(t.reinit))
    if both:
        raise ConfigError(f"task.frozen and task.reinit both name {both}: a part kept as "
                          "initialised cannot also start fresh")
    if t.frozen and not cfg.training.init_checkpoint:
        raise ConfigError(f"task.frozen={t.frozen} keeps parts as initialised, but "
                          "training.init_checkpoint is empty: they would stay random")
    if cfg.dataset.sample_rate != cfg.model.sample_rate:
        raise ConfigError(f"dataset.sample_rate={cfg.dataset.sample_rate} but "
                          f"model.sample_rate={cfg.model.sample_rate}: the loader resamples "
                          "to dataset.sample_rate, the rate the codec reconstructs, so set "
                          "both to it (model.encoder_sample_rate sets the encoder's rate)")
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
    teachers = cfg.teachers
    check_teacher_config(teachers.distillation, "distillation", ever_on(loss.distillation),
                         needs_gradient=False)
    check_distillation_config(teachers.distillation)
    check_teacher_config(teachers.perceptual, "perceptual", ever_on(loss.perceptual),
                         needs_gradient=True)
    check_adversarial_phase(cfg)

def check_adversarial_phase(cfg) -> None:
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
