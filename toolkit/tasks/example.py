"""The worked example of a task (`task.type: example`), small enough to read in one go and
to copy as the start of a family: a generator that reconstructs fbank frames, and a critic
that learns to tell its output from real frames, with their own optimizers. The critic's
optimizer starts at a fraction of training (`optim.critic.start_fraction`, a phase), and
the adversarial term that trains the generator through it is a Ramp of training progress.
Every hook of toolkit.task.Task it implements is one the trainer calls; the others keep
their single-module defaults. docs/architecture.md walks it hook by hook; the trainer
tests train it for every multi-optimizer path (the codec family's, in miniature).

A config (with `--train-data` / `--dev-data` lists of utterances, no inventory):

    task: {type: example}
    dataset: {feature: {num_mel_bins: 20}, batch_size: 6}
    model: {hidden: 16}
    optim:
      generator: {lr: 0.003}
      critic: {lr: 0.001, start_fraction: 0.3}
    training: {max_epoch: 3}
"""
from dataclasses import dataclass, field
from typing import Dict

import numpy as np
import torch
from torch import nn

from toolkit.config import Ramp, Section, TaskConfigBase
from toolkit.data.pipeline import FeaturePipeline
from toolkit.task import (TASKS, Batch, DataRequirements, ExampleBuilder, Metrics, StepContext,
                          Task, pad_sequences)


# --------------------------------------------------------------------------- config

@dataclass
class ExampleModelConfig:
    """The `model:` section (a task-owned section; each comment is its line in
    docs/config_reference.md)."""
    hidden: int = 16              # generator hidden units
    crop_frames: int = 12         # frames of each utterance per example
    dropout: float = 0.1          # generator dropout (each rank draws its own masks)


# --------------------------------------------------------------------------- data

class CropBuilder(ExampleBuilder):
    """An utterance -> `frames` consecutive fbank frames at a random offset. It runs in
    the loader workers; its randomness comes from the pipeline's per-utterance stream
    (seed, epoch, key), so that a resumed run draws the same crops."""

    def __init__(self, pipeline: FeaturePipeline, frames: int):
        self.pipeline = pipeline
        self.frames = frames

    def __call__(self, entry, epoch, audio=None):
        rng = self.pipeline.rng(epoch, entry["key"])
        feats = self.pipeline.features(entry, epoch, audio, rng=rng)
        start = int(rng.integers(0, max(1, len(feats) - self.frames + 1)))
        return feats[start:start + self.frames]

    def collate(self, examples, keys, audio_seconds, bad) -> Batch:
        if examples:
            feats, _ = pad_sequences(examples)
        else:           # every utterance of the batch was bad: an empty batch, same layout
            feats = np.zeros((0, self.frames, self.pipeline.num_bins), np.float32)
        return Batch(list(keys), {"feats": torch.from_numpy(feats)}, audio_seconds, bad)


# --------------------------------------------------------------------------- modules

class Generator(nn.Module):
    def __init__(self, dim: int, cfg: ExampleModelConfig):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, cfg.hidden), nn.ReLU(), nn.Dropout(cfg.dropout),
                                 nn.Linear(cfg.hidden, dim))

    def forward(self, x):
        return self.net(x)


class Critic(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.net = nn.Linear(dim, 1)

    def forward(self, x):
        return self.net(x).mean(dim=(1, 2))


# --------------------------------------------------------------------------- the task

@TASKS.register("example")
class ExampleTask(Task):
    name = "example"

    @dataclass
    class Config(TaskConfigBase):
        # weight of the generator's adversarial term; ramped in after the critic starts
        adversarial_weight: Ramp = field(default_factory=lambda: Ramp(
            initial=0.0, final=0.5, start=0.3, end=0.6))

    sections = {"model": Section(schema=ExampleModelConfig)}
    # In the order train_step steps them; each gets its LR schedule, clip and phase.
    optimizers = ("generator", "critic")
    needs_inventory = False           # no classes: the data lists need no labels
    metrics = Metrics(train=("loss", "recon", "critic_loss"), eval=("loss",), select="loss")
    export_module = "generator"

    def build_modules(self) -> Dict[str, nn.Module]:
        dim = self.cfg.dataset.feature.num_mel_bins
        return {"generator": Generator(dim, self.cfg.model), "critic": Critic(dim)}

    def optimizer_modules(self):
        return {"generator": ["generator"], "critic": ["critic"]}

    def init_modules(self, task_state=None):
        return ["generator"]          # fine-tuning starts with a fresh critic

    def data_requirements(self, split="train"):
        return DataRequirements(require_label=False)

    def example_builder(self, pipeline):
        return CropBuilder(pipeline, self.cfg.model.crop_frames)

    def train_step(self, batch: Batch, ctx: StepContext) -> Dict[str, float]:
        real = batch.feats.to(ctx.device)
        stats = {}
        with ctx.autocast():
            fake = ctx.module("generator")(real)
        if ctx.active("critic"):
            # The critic's step first, on the detached output: one forward of real and fake
            # together (one forward per distributed module and backward).
            with ctx.autocast():
                scores = ctx.module("critic")(torch.cat([real, fake.detach()])).float()
            d_real, d_fake = scores[:len(real)], scores[len(real):]
            loss_c = ((d_real - 1) ** 2).mean() + (d_fake ** 2).mean()
            ctx.backward(loss_c, "critic")
            ctx.step("critic")
            stats["critic_loss"] = float(loss_c.detach())
        recon = ((fake.float() - real) ** 2).mean()
        loss_g = recon
        weight = ctx.value(self.cfg.task.adversarial_weight)
        if weight > 0:
            # Then the generator through the just-updated critic: frozen, and bare (its
            # parameters collect no gradient, so nothing of it is synchronised).
            with ctx.frozen("critic"), ctx.autocast():
                adv = ((ctx.raw("critic")(fake).float() - 1) ** 2).mean()
            loss_g = loss_g + weight * adv
        ctx.backward(loss_g, "generator")
        ctx.step("generator")
        stats.update(loss=float(loss_g.detach()), recon=float(recon.detach()))
        return stats

    def eval_step(self, batch: Batch, ctx: StepContext) -> Dict[str, float]:
        real = batch.feats.to(ctx.device)
        with ctx.autocast():
            fake = ctx.module("generator")(real)
        return {"loss": float(((fake.float() - real) ** 2).mean())}
