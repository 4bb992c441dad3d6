"""A second task for the trainer tests, loaded through TOOLKIT_PLUGINS: two modules
with their own optimizers stepped alternately (a critic on the detached output, then
the generator through the frozen critic), a critic that switches on at a fraction of
max_steps, and an adversarial weight ramped over progress. It is small enough to train
in seconds on real fbank features, and exercises every multi-optimizer path of the
trainer that the codec family uses."""
from dataclasses import dataclass, field
from typing import Dict, Tuple

import numpy as np
import torch
from torch import nn

from toolkit.config import Ramp, Section, TaskConfigBase
from toolkit.data.pipeline import FeaturePipeline
from toolkit.task import TASKS, Batch, DataRequirements, ExampleBuilder, Task, pad_sequences


@dataclass
class NetConfig:
    hidden: int = 16              # generator hidden units
    crop_frames: int = 12         # frames of each utterance per example
    dropout: float = 0.1          # generator dropout: exercises each rank's torch RNG


class CropBuilder(ExampleBuilder):
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
        else:
            feats = np.zeros((0, self.frames, self.pipeline.num_bins), np.float32)
        return Batch(list(keys), {"feats": torch.from_numpy(feats)}, audio_seconds, bad)


class Generator(nn.Module):
    def __init__(self, dim: int, cfg: NetConfig):
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


@TASKS.register("two_optimizer")
class TwoOptimizerTask(Task):
    name = "two_optimizer"

    @dataclass
    class Config(TaskConfigBase):
        adversarial_weight: Ramp = field(default_factory=lambda: Ramp(
            initial=0.0, final=0.5, start=0.3, end=0.6))   # ramped in after the critic starts

    sections = {"model": Section(schema=NetConfig)}
    optimizers = ("generator", "critic")
    needs_inventory = False
    export_module = "generator"

    def build_modules(self) -> Dict[str, nn.Module]:
        dim = self.cfg.dataset.feature.num_mel_bins
        return {"generator": Generator(dim, self.cfg.model), "critic": Critic(dim)}

    def optimizer_modules(self):
        return {"generator": ["generator"], "critic": ["critic"]}

    def init_modules(self, task_state=None):
        return ["generator"]

    def data_requirements(self, split="train"):
        return DataRequirements(require_label=False)

    def example_builder(self, pipeline):
        return CropBuilder(pipeline, self.cfg.model.crop_frames)

    def dummy_batch(self):
        dim = self.cfg.dataset.feature.num_mel_bins
        return Batch(["<empty>"], {"feats": torch.zeros(1, self.cfg.model.crop_frames, dim)})

    def train_step(self, batch, ctx) -> Dict[str, float]:
        real = batch.feats.to(ctx.device)
        stats = {}
        with ctx.autocast():
            fake = ctx.module("generator")(real)
        if ctx.active("critic"):
            # One forward per DDP module and backward: real and fake in one batch.
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
            with ctx.frozen("critic"), ctx.autocast():
                adv = ((ctx.raw("critic")(fake).float() - 1) ** 2).mean()
            loss_g = loss_g + weight * adv
        ctx.backward(loss_g, "generator")
        ctx.step("generator")
        stats.update(loss=float(loss_g.detach()), recon=float(recon.detach()))
        return stats

    def eval_step(self, batch, ctx) -> Dict[str, float]:
        real = batch.feats.to(ctx.device)
        with ctx.autocast():
            fake = ctx.module("generator")(real)
        return {"loss": float(((fake.float() - real) ** 2).mean())}

    def train_metric_names(self) -> Tuple[str, ...]:
        return ("loss", "recon", "critic_loss")
