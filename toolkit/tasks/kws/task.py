"""Keyword spotting as a task of the generic trainer: wake words (max-pooling detectors,
optionally with a CTC head) and command words (utterance classifiers)."""
from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import torch
from torch import nn

from toolkit.config import ConfigError, Section, TaskConfigBase
from toolkit.data.cmvn import read_cmvn
from toolkit.data.features import FEATURES, build_extractor
from toolkit.data.pipeline import evaluation_pipeline
from toolkit.task import TASKS, DataRequirements, Metrics, Task, TaskInput
from toolkit.tasks.kws.data import KwsExampleBuilder
from toolkit.tasks.kws.losses import LOSSES, WeightedSumLoss, build_loss, uses_ctc_head
from toolkit.tasks.kws.models import MODELS, build_model
from toolkit.tasks.kws.tokens import read_units


def feature_dim(dataset_cfg) -> int:
    f = dataset_cfg.feature
    if f.type == "fbank":
        return int(f.num_mel_bins)
    dim = getattr(FEATURES.get(f.type), "dim", None)
    if dim is None:     # set by the configured model (phone_frontend's output)
        dim = build_extractor(f, dataset_cfg.sample_rate).dim
    return int(dim)


class WithCTCHead(nn.Module):
    """Keyword logits and CTC logits from one encoder pass. DDP wraps this view when the
    loss has a CTC component: DDP synchronises only parameters used through the forward
    it wraps, and the model's own forward skips the CTC head."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, feats: torch.Tensor):
        hidden, _ = self.model.encode(feats, None)
        return self.model.classifier(hidden), self.model.ctc_head(hidden)


def model_values(draft, inventory, inputs, listed: str = "the inventory") -> Dict[str, object]:
    """The model values every keyword-family task derives: the CMVN file, the input dim
    from the features, the output count from `inventory` (`listed` names it in errors)."""
    m = draft.model
    out: Dict[str, object] = {}
    if inputs.get("cmvn"):
        out["model.cmvn_file"] = inputs["cmvn"]
    if m.input_dim <= 0:
        out["model.input_dim"] = feature_dim(draft.dataset)
    if m.num_outputs <= 0:
        out["model.num_outputs"] = len(inventory)
    elif m.num_outputs != len(inventory):
        raise ConfigError(f"model.num_outputs={m.num_outputs} but {listed} "
                          f"{inputs.get('inventory')} has {len(inventory)} entries")
    return out


@TASKS.register("kws")
class KwsTask(Task):
    name = "kws"

    @dataclass
    class Config(TaskConfigBase):
        # SpecAugment on keyword utterances too; false masks fillers (label -1) only, since
        # a mask over the final /s/ of "hey snips" leaves a positive that sounds like
        # "hey snip" (label noise against the confusables a wake word must reject).
        spec_aug_positives: bool = True

    sections = {"model": Section(registry=MODELS),
                "loss": Section(registry=LOSSES, default_type="max_pooling")}
    optimizers = ("model",)
    inputs = (TaskInput("cmvn", "global CMVN statistics (JSON or Kaldi stats, "
                        "toolkit.bin.compute_cmvn), applied inside the model",
                        "model.cmvn_file"),
              TaskInput("units", "CTC unit list (<blank> first; toolkit.bin.make_lexicon) for "
                        "a loss with a ctc component; its size is the CTC head's",
                        "model.ctc_outputs"))

    # ---------------------------------------------------------------- config
    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.loss.type == "ctc":
            raise ConfigError("loss.type ctc alone trains no keyword output: use weighted_sum "
                              "with a keyword loss and a ctc component")

    @classmethod
    def derived_values(cls, draft, inventory, inputs) -> Dict[str, object]:
        m = draft.model
        out = model_values(draft, inventory, inputs)
        if not uses_ctc_head(build_loss(draft.loss)):
            return out          # a unit list given for another config changes nothing
        units_path = inputs.get("units")
        ctc_outputs = m.ctc_outputs
        if units_path:
            try:
                units = read_units(units_path)
            except (OSError, ValueError) as err:
                raise ConfigError(f"--units: {err}") from None
            if ctc_outputs <= 0:
                ctc_outputs = out["model.ctc_outputs"] = len(units)
            if ctc_outputs != len(units):
                raise ConfigError(f"model.ctc_outputs={ctc_outputs} but the unit list "
                                  f"{units_path} has {len(units)} entries")
        if ctc_outputs <= 0:
            raise ConfigError("the loss has a ctc component but model.ctc_outputs is 0: "
                              "pass --units (toolkit.bin.make_lexicon) or set it")
        return out

    def __init__(self, cfg, inventory=None):
        super().__init__(cfg, inventory)
        self.loss_fn = build_loss(cfg.loss)
        self.use_ctc = uses_ctc_head(self.loss_fn)
        self.part_names = list(getattr(self.loss_fn, "names", []))
        self.metrics = Metrics(train=("loss", "acc", *self.part_names), eval=("loss", "acc"),
                               select="loss")
        if isinstance(self.loss_fn, WeightedSumLoss) and self.loss_fn.switches_parts():
            # A component switched on later (e.g. the CTC head) gets no gradient before then.
            self.modules_with_unused_parameters = ("model",)

    # ---------------------------------------------------------------- modules
    def build_modules(self) -> Dict[str, nn.Module]:
        m = self.cfg.model
        cmvn = read_cmvn(m.cmvn_file) if m.cmvn_file else None
        return {"model": build_model(m, cmvn)}

    def training_view(self, name: str, module: nn.Module) -> nn.Module:
        return WithCTCHead(module) if self.use_ctc else module

    # ---------------------------------------------------------------- data
    def data_requirements(self, split: str = "train") -> DataRequirements:
        return DataRequirements(require_label=True, num_classes=self.cfg.model.num_outputs,
                                allow_negative_label=True)

    def example_builder(self, pipeline):
        return KwsExampleBuilder(pipeline, self.cfg.task.spec_aug_positives,
                                 self.cfg.model.ctc_outputs if self.use_ctc else None)

    def example_frames(self, durations: np.ndarray) -> np.ndarray:
        d = self.cfg.dataset
        if d.feature.type == "fbank":
            return super().example_frames(durations)
        samples = np.round(np.asarray(durations, dtype=np.float64) * d.sample_rate)
        return build_extractor(d.feature, d.sample_rate).frames_for_samples(samples.astype(np.int64))

    # ---------------------------------------------------------------- steps
    def _loss(self, out, batch, device, step: int, total: int):
        lengths = batch.lengths.to(device)
        labels = batch.labels.to(device)
        end = batch.get("keyword_end")
        end = None if end is None else end.to(device)
        extra = {"step": step, "total_steps": total} \
            if isinstance(self.loss_fn, WeightedSumLoss) else {}
        if not self.use_ctc:
            return self.loss_fn(out[0], lengths, labels, keyword_end=end, **extra)
        logits, ctc_logits = out
        return self.loss_fn(logits, lengths, labels, ctc_logits, batch.tokens.to(device),
                            batch.token_lengths.to(device), keyword_end=end, **extra)

    def _forward(self, batch, ctx):
        feats = batch.feats.to(ctx.device, non_blocking=True)
        with ctx.autocast():
            out = ctx.module("model")(feats)
        return self._loss(out, batch, ctx.device, ctx.step_index, ctx.total_steps)  # fp32 loss

    def train_step(self, batch, ctx) -> Dict[str, float]:
        loss, metrics = self._forward(batch, ctx)
        ctx.backward(loss, "model")
        ctx.step("model")
        stats = {"loss": float(loss.detach()), "acc": float(metrics["acc"])}
        for name in self.part_names:
            if name in metrics:
                stats[name] = float(metrics[name])
        return stats

    def eval_step(self, batch, ctx) -> Dict[str, float]:
        loss, metrics = self._forward(batch, ctx)
        return {"loss": float(loss), "acc": float(metrics["acc"])}

    # ---------------------------------------------------------------- export
    def export(self, checkpoint: str, out_dir: str, test_data: str, num_check: int = 20,
               tolerance: float = 1e-4, threshold: Optional[float] = None) -> Dict[str, float]:
        from toolkit.export import parity_inputs
        from toolkit.tasks.kws.export import (build_metadata, check_frontend_parity,
                                              check_parity, export_model_files,
                                              model_from_checkpoint)
        model = model_from_checkpoint(checkpoint)
        d = self.cfg.dataset
        extractor = build_extractor(d.feature, d.sample_rate)
        metadata = build_metadata(model, extractor.metadata(), self.inventory, threshold)
        paths = export_model_files(model, out_dir, metadata)
        pipeline = evaluation_pipeline(d)
        features = parity_inputs(test_data, lambda e: pipeline.features(e, 0), num_check)
        worst = check_parity(model, paths, features, tolerance)
        if d.feature.type != "fbank":
            # The deployed front end, rebuilt from the metadata and fed in odd-sized
            # chunks, against the training features of the same audio.
            waves = parity_inputs(test_data, pipeline.load, min(num_check, 3))
            worst["frontend_stream"] = check_frontend_parity(metadata["feature"], extractor,
                                                             waves, tolerance)
        return worst
