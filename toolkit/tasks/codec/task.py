"""Neural speech codecs as a task of the generic trainer: a generator (encoder, residual VQ,
decoder; toolkit.tasks.codec.model) trained against waveform discriminators with two
optimizers, validated by mel distance on fixed dev segments, exported as separate encoder
and decoder graphs plus a safetensors inference checkpoint (toolkit.tasks.codec.export;
running them: toolkit.tasks.codec.runtime; objective evaluation: toolkit.tasks.codec.evaluate).

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

Two rates (`model.encoder_sample_rate` below `model.sample_rate` = `dataset.sample_rate`):
the loader decodes and augments at the target rate, and each example also carries its
encoder-rate version (`encoder_audio`, resampled from the same excerpt, so both start at the
same instant and a whole number of code frames is a whole number of samples at both rates).
The generator reads the encoder version and writes the target rate; losses, discriminators
and dev metrics all work at the target rate.

Frozen teachers (toolkit.tasks.codec.teachers): semantic distillation of the encoder output
(or first VQ stage) through a training-only head, and a perceptual loss on a frozen model's
features of decoded vs reference audio. With the adversarial phase they make the three
phases of the seed's default: reconstruction + distillation + VQ, then + adversarial,
discriminator and feature matching, then + perceptual, all set by the loss ramps and
`optim.discriminator.start_fraction` (conf/codec_phases.yaml of egs/tts_codec/s0).
"""
import copy
import math
import os
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from toolkit.config import ConfigError, Section
from toolkit.data.audio import resample
from toolkit.data.pipeline import evaluation_pipeline
from toolkit.errors import MissingInputError
from toolkit.task import TASKS, Batch, DataRequirements, Metrics, Task
from toolkit.tasks.codec.config import (ADVERSARIAL_KEYS, ADVERSARIAL_START, WEIGHT_KEYS,
                                        CodecDiscriminatorConfig, CodecLossConfig,
                                        CodecTaskConfig, check_codec_config, ever_on)
from toolkit.tasks.codec.data import SegmentBuilder
from toolkit.tasks.codec.discriminators import (MultiPeriodDiscriminator,
                                                MultiResolutionSTFTDiscriminator)
from toolkit.tasks.codec.export import export_codec, pad_to_hop
from toolkit.tasks.codec.losses import (CompressedComplexSTFTLoss, MultiResolutionMelLoss,
                                        MultiResolutionSTFTLoss,
                                        discriminator_loss, feature_matching_loss,
                                        generator_adversarial_loss)
from toolkit.tasks.codec.model import CodecConfig, CodecModel, count_parameters, remove_weight_norm
from toolkit.tasks.codec.teachers import (BUILTIN_PREFIX, DistillationHead, FrozenTeacher,
                                          TeachersConfig, distillation_loss, perceptual_loss)


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


# --------------------------------------------------------------------------- the task

@TASKS.register("codec")
class CodecTask(Task):
    name = "codec"
    Config = CodecTaskConfig          # the config sections: toolkit.tasks.codec.config
    sections = {"model": Section(schema=CodecConfig),
                "discriminator": Section(schema=CodecDiscriminatorConfig),
                "loss": Section(schema=CodecLossConfig),
                "teachers": Section(schema=TeachersConfig)}
    optimizers = ("generator", "discriminator")
    needs_inventory = False
    export_module = "generator"
    # metrics: set in __init__ (the teachers in use add theirs)
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
        check_codec_config(cfg)

    def __init__(self, cfg, inventory=None):
        super().__init__(cfg, inventory)
        m = cfg.model
        self.hop = m.hop
        self.encoder_rate = m.resolved_encoder_sample_rate
        frames = max(1, int(math.ceil(cfg.task.segment_seconds * self.encoder_rate / self.hop)))
        self.segment = frames * m.decoder_hop             # target-rate samples
        self.encoder_segment = frames * self.hop          # encoder-rate samples
        self.segment_frames = frames
        self.distill_on = ever_on(cfg.loss.distillation)
        self.perceptual_on = ever_on(cfg.loss.perceptual)
        teachers = (("distill",) if self.distill_on else ()) + \
            (("perceptual",) if self.perceptual_on else ())
        self.metrics = Metrics(
            train=("total", "mel", "commit", "codebook", "adv_g", "fm", "d_loss") +
            (("complex",) if ever_on(cfg.loss.complex_stft) else ()) + teachers,
            eval=("mel_distance", "stft_distance", "si_sdr"), select="mel_distance")
        self._teachers: Dict[Tuple[str, str], FrozenTeacher] = {}
        self.eval_samples = max(1, int(round(cfg.task.eval_seconds * m.sample_rate)))
        self.eval_n_q = cfg.task.eval_n_q or m.n_codebooks
        self.mel_loss = MultiResolutionMelLoss(m.sample_rate, cfg.loss.mel_window_lengths,
                                               cfg.loss.mel_n_mels)
        # Validation uses the metric's own (DAC default) resolutions, as evaluate_codec
        # does, so dev numbers compare across configs.
        self.complex_loss = CompressedComplexSTFTLoss()
        self.eval_mel = MultiResolutionMelLoss(m.sample_rate)
        self.eval_stft = MultiResolutionSTFTLoss()

    # ---------------------------------------------------------------- modules
    def build_modules(self) -> Dict[str, nn.Module]:
        generator = CodecModel(copy.deepcopy(self.cfg.model))
        for part in self.cfg.task.frozen:
            # No optimizer sees them (the trainer takes parameters that need a gradient).
            getattr(generator, part).requires_grad_(False)
        modules = {"generator": generator,
                   "discriminator": CodecDiscriminator(self.cfg.discriminator)}
        if self.distill_on:
            # Built last, so the other modules draw the same initial weights as without it.
            dim = self.teacher("distillation", torch.device("cpu")).feature_dim()
            modules["distill_head"] = DistillationHead(self.cfg.model.resolved_latent_dim, dim)
        return modules

    def optimizer_modules(self):
        generator = ["generator", "distill_head"] if self.distill_on else ["generator"]
        return {"generator": generator, "discriminator": ["discriminator"]}

    def init_modules(self, task_state=None) -> List[str]:
        # Fine-tuning starts the discriminators (and the distillation head, which belongs to
        # its teacher) over: a fresh critic for the new data.
        return ["generator"]

    def teacher(self, name: str, device: torch.device) -> FrozenTeacher:
        """teachers.<name>, loaded frozen on `device` on first use; held by the task, never
        by a module that an optimizer, checkpoint or export sees."""
        key = (name, str(device))
        if key not in self._teachers:
            self._teachers[key] = FrozenTeacher(getattr(self.cfg.teachers, name), name, device,
                                                differentiable=name == "perceptual")
        return self._teachers[key]

    def fingerprinted_files(self) -> Dict[str, str]:
        """The teachers in use: each shapes the losses, so a resume against a replaced
        teacher file would silently train towards other targets."""
        used = (("distillation", self.distill_on), ("perceptual", self.perceptual_on))
        return {f"teachers.{name}.model": getattr(self.cfg.teachers, name).model
                for name, on in used
                if on and not getattr(self.cfg.teachers, name).model.startswith(BUILTIN_PREFIX)}

    def adapt_init_state(self, name, module, state):
        """An export holds plain weights (weight norm folded in); a generator built with
        weight norm expects (g, v): v = w and g = ||w|| per output channel rebuild the same
        weight (to rounding). The parts of task.reinit keep their fresh weights."""
        if name != "generator":
            return state
        own = module.state_dict()
        state = dict(state)
        for part in self.cfg.task.reinit:
            # The part's fresh tensors stand in for the file's: they load as they are.
            prefix = part + "."
            state = {k: v for k, v in state.items() if not k.startswith(prefix)}
            state.update({k: v for k, v in own.items() if k.startswith(prefix)})
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
        c = g.config
        rates = (f", {g.encoder_sample_rate} Hz in, {c.sample_rate} Hz out"
                 if g.encoder_sample_rate != c.sample_rate else "")
        decoder = f", {c.decoder} decoder" if c.decoder != "conv" else ""
        text = (f"task codec: generator {count_parameters(g):,} parameters (hop {g.hop}, "
                f"{g.frames_per_second:g} frames/s, {c.n_codebooks} x "
                f"{c.codebook_size} codes = {g.bitrate() / 1000:g} kbit/s"
                f"{', causal' if c.causal else ''}{rates}{decoder}), discriminator "
                f"{count_parameters(d):,} ({' + '.join(parts)}); segment "
                f"{self.segment} samples")
        if "distill_head" in modules:
            t = self.cfg.teachers.distillation
            text += (f"; distillation head {count_parameters(modules['distill_head']):,} "
                     f"({t.source} -> {t.model}, {t.loss})")
        if self.perceptual_on:
            text += f"; perceptual teacher {self.cfg.teachers.perceptual.model}"
        return text

    # ---------------------------------------------------------------- data
    def data_requirements(self, split="train"):
        return DataRequirements(require_label=False)

    def example_builder(self, pipeline):
        return SegmentBuilder(pipeline, self.segment, self.eval_samples,
                              self.cfg.task.short_utterances, self.encoder_rate)

    def example_frames(self, durations: np.ndarray) -> np.ndarray:
        return np.full(len(durations), self.segment_frames, dtype=np.int64)

    def batch_of(self, waves: np.ndarray, keys: List[str]) -> Batch:
        """A training batch of (B, segment) target-rate waveforms, as the loader builds it
        (with their encoder-rate versions when the rates differ)."""
        n = waves.shape[0]
        tensors = {"audio": torch.from_numpy(np.ascontiguousarray(waves, dtype=np.float32)),
                   "lengths": torch.full((n,), waves.shape[1], dtype=torch.int64)}
        if self.encoder_rate != self.cfg.model.sample_rate:
            encoder = np.stack([resample(w, self.cfg.model.sample_rate, self.encoder_rate)
                                [:self.encoder_segment] for w in waves]).astype(np.float32)
            tensors["encoder_audio"] = torch.from_numpy(encoder)
            tensors["encoder_lengths"] = torch.full((n,), encoder.shape[1], dtype=torch.int64)
        return Batch(list(keys), tensors)

    # ---------------------------------------------------------------- steps
    def _weights(self, ctx) -> Dict[str, float]:
        w = {k: ctx.value(getattr(self.cfg.loss, k)) for k in WEIGHT_KEYS}
        if ctx.active("discriminator"):
            # The adversarial weights belong to the discriminators' phase: once it has
            # begun they stay on, also when a resume with a larger total moves the
            # fraction they switch on at (the phase keeps its recorded start).
            for k in ADVERSARIAL_KEYS:
                ramp = getattr(self.cfg.loss, k)
                begin = ramp.active_from()
                if math.isinf(begin):
                    continue
                if ramp.unit == "steps":
                    w[k] = ramp.value(max(ctx.step_index, begin), ctx.total_steps)
                else:       # evaluated at the fraction itself (a total of 1): no rounding
                    w[k] = ramp.value(max(ctx.step_index / max(1, ctx.total_steps), begin), 1)
        return w

    def train_step(self, batch, ctx) -> Dict[str, float]:
        real = batch.audio.to(ctx.device, non_blocking=True).unsqueeze(1)      # (B, 1, T)
        source = batch.get("encoder_audio")                                  # encoder's rate
        source = real if source is None else \
            source.to(ctx.device, non_blocking=True).unsqueeze(1)
        n = real.shape[0]
        w = self._weights(ctx)
        adversarial = ctx.active("discriminator") and (
            w["adversarial"] > 0 or w["feature_matching"] > 0)
        distill = self.distill_on and w["distillation"] > 0
        first_stage = distill and self.cfg.teachers.distillation.source == "first_stage"
        stats: Dict[str, float] = {}
        with ctx.autocast():
            # quantizer dropout: n_q drawn per item
            out = ctx.module("generator")(source, **({"first_stage": True} if first_stage
                                                     else {}))
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
        if w["complex_stft"] > 0:
            complex_loss = self.complex_loss(fake, real)
            total = total + w["complex_stft"] * complex_loss
            stats["complex"] = float(complex_loss.detach())
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
        if distill:
            d_loss_value = self._distillation(out["first_stage" if first_stage else "latent"],
                                              real, source, ctx)
            total = total + w["distillation"] * d_loss_value
            stats["distill"] = float(d_loss_value.detach())
        if self.perceptual_on and w["perceptual"] > 0:
            teacher = self.teacher("perceptual", ctx.device)
            rate = self.cfg.model.sample_rate
            with torch.no_grad():
                real_features = teacher.features(real, rate)
            p_loss = perceptual_loss(teacher.features(fake, rate), real_features)
            total = total + w["perceptual"] * p_loss
            stats["perceptual"] = float(p_loss.detach())
        ctx.backward(total, "generator")
        ctx.step("generator")
        stats.update(total=float(total.detach()), mel=float(mel.detach()),
                     commit=float(commit.detach()), codebook=float(codebook.detach()))
        return stats

    def _distillation(self, latent: torch.Tensor, real: torch.Tensor, source: torch.Tensor,
                      ctx) -> torch.Tensor:
        """The head's projection of `latent` against the teacher's features of the input
        audio: read from the encoder-rate audio when the teacher has that rate, else from the
        target-rate audio (the richer one) resampled."""
        teacher = self.teacher("distillation", ctx.device)
        if teacher.sample_rate == self.encoder_rate:
            audio, rate = source, self.encoder_rate
        else:
            audio, rate = real, self.cfg.model.sample_rate
        target = teacher.features(audio, rate)
        with ctx.autocast():
            prediction = ctx.module("distill_head")(latent)
        with ctx.fp32():
            return distillation_loss(prediction, target, self.cfg.teachers.distillation.loss)

    def _mel(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mel loss as an fp32 island (the STFTs are float32 inside as well)."""
        self.mel_loss.to(prediction.device)
        with torch.autocast(device_type=prediction.device.type, enabled=False):
            return self.mel_loss(prediction.float(), target.float())

    def eval_step(self, batch, ctx) -> Dict[str, float]:
        from toolkit.tasks.codec.metrics import si_sdr
        generator = ctx.module("generator")
        self.eval_mel.to(ctx.device)
        sums = {k: 0.0 for k in self.metrics.eval}
        encoder_audio = batch.get("encoder_audio")
        for i in range(len(batch)):        # each utterance at its own length: no padding
            ref = batch.audio[i:i + 1, :int(batch.lengths[i])].to(ctx.device).unsqueeze(1)
            source = ref if encoder_audio is None else encoder_audio[
                i:i + 1, :int(batch.encoder_lengths[i])].to(ctx.device).unsqueeze(1)
            with ctx.autocast():
                decoded = generator(source, n_q=self.eval_n_q)["audio"]
            with torch.autocast(device_type=ctx.device.type, enabled=False):
                decoded = decoded.float()
                sums["mel_distance"] += float(self.eval_mel(decoded, ref))
                sc, mag = self.eval_stft(decoded, ref)
                sums["stft_distance"] += float(sc + mag)
            sums["si_sdr"] += si_sdr(ref[0, 0].cpu().numpy(), decoded[0, 0].cpu().numpy())
        return {k: v / max(1, len(batch)) for k, v in sums.items()}

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
        pipeline = evaluation_pipeline(self.cfg.dataset)
        limit = int(max(self.cfg.task.eval_seconds, 10.0) * model.config.sample_rate)
        rate = model.config.sample_rate

        def make(entry):
            wave = resample(pipeline.load(entry)[:limit], rate, model.encoder_sample_rate)
            return (pad_to_hop(wave, model.hop)[None, None],)
        cases = parity_inputs(test_data, make, num_check)
        return export_codec(model, out_dir, cases, tolerance)

    @classmethod
    def export_weights(cls, weights: str, out_dir: str, test_data: Optional[str] = None,
                       num_check: int = 20, tolerance: float = 1e-4) -> Dict[str, float]:
        """The ONNX and TorchScript graphs of a shipped codec's safetensors (toolkit.
        pretrained), checked on the test list's audio, or on seeded noise of 1-4 s."""
        from toolkit.data.augment import load_mono
        from toolkit.export import parity_inputs
        from toolkit.tasks.codec.export import load_safetensors_model
        model = load_safetensors_model(weights)
        rate, enc_rate = model.config.sample_rate, model.encoder_sample_rate
        if test_data:
            def make(entry):
                wave = resample(load_mono(entry["wav"], rate)[:10 * rate], rate, enc_rate)
                return (pad_to_hop(wave, model.hop)[None, None],)
            cases = parity_inputs(test_data, make, num_check)
        else:
            rng = np.random.default_rng(0)
            cases = [(pad_to_hop(rng.uniform(-0.3, 0.3, int(s * enc_rate)).astype(np.float32),
                                 model.hop)[None, None],)
                     for s in np.linspace(1.0, 4.0, max(1, min(num_check, 4)))]
        return export_codec(model, out_dir, cases, tolerance)
