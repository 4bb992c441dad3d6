"""Phone recognition as a task of the generic trainer (`task.type: phone_ctc`): a streaming
keyword-spotting encoder trained with CTC on espeak-ng phones alone. It is the acoustic
front end the rest of the family builds on: a wake-word head trained on its frozen outputs
(feature type `phone_frontend`, toolkit.tasks.kws.frontend) and keyword search with no
training at all (toolkit.tasks.kws.search). Its inventory is the unit list of
toolkit.bin.make_lexicon (`<blank>` first); its data lists carry `tokens`
(make_datalist --lexicon --units). Validation reports the phone error rate (greedy CTC
decoding against the reference units), which also chooses checkpoints."""
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from torch import nn

from toolkit.config import ConfigError, Section, TaskConfigBase
from toolkit.data.cmvn import read_cmvn
from toolkit.data.features import build_extractor
from toolkit.data.pipeline import evaluation_pipeline
from toolkit.nn.ctc import ctc_loss, edit_distance, greedy_decode
from toolkit.task import TASKS, DataRequirements, Metrics, Task, TaskInput
from toolkit.tasks.kws.data import KwsExampleBuilder
from toolkit.tasks.kws.models import MODELS, build_model
from toolkit.tasks.kws.task import model_values
from toolkit.tasks.kws.tokens import BLANK

# What the exported graph outputs: log posteriors over the units, frame by frame.
ACTIVATION = "log_softmax"


def front_end_metadata(model: nn.Module, feature: dict, units: List[str]) -> dict:
    """The export metadata of a phone front end (config.json beside its safetensors)."""
    from toolkit.tasks.kws.export import build_metadata
    meta = build_metadata(model, feature, units, None)
    meta.update({"task": "phone_ctc", "units": list(units), "activation": ACTIVATION,
                 "output": "log posteriors (batch, frames, units), units[0] the CTC blank",
                 "threshold": None})
    return meta


@TASKS.register("phone_ctc")
class PhoneCtcTask(Task):
    name = "phone_ctc"

    @dataclass
    class Config(TaskConfigBase):
        # SpecAugment masks (dataset.spec_aug) apply to every utterance: a masked phone
        # still has its label, which teaches the encoder to use context.
        pass

    sections = {"model": Section(registry=MODELS)}
    optimizers = ("model",)
    inputs = (TaskInput("cmvn", "global CMVN statistics (JSON or Kaldi stats, "
                        "toolkit.bin.compute_cmvn), applied inside the model",
                        "model.cmvn_file"),)
    metrics = Metrics(train=("loss",), eval=("loss", "per"), select="per")

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.model.ctc_outputs:
            raise ConfigError("model.ctc_outputs: a phone_ctc model's main output is its CTC "
                              "output (model.num_outputs, from the unit list); leave it 0")

    @classmethod
    def derived_values(cls, draft, inventory, inputs) -> Dict[str, object]:
        if inventory is None or inventory[0] != BLANK:
            raise ConfigError(f"--inventory {inputs.get('inventory')}: a phone_ctc inventory is "
                              f"a unit list with {BLANK} first (toolkit.bin.make_lexicon --units)")
        return model_values(draft, inventory, inputs, "the unit list")

    # ---------------------------------------------------------------- modules
    def build_modules(self) -> Dict[str, nn.Module]:
        m = self.cfg.model
        model = build_model(m, read_cmvn(m.cmvn_file) if m.cmvn_file else None)
        if not getattr(model, "streaming", True):
            raise ConfigError(f"model.type {m.type} classifies whole utterances; a phone front "
                              "end needs a streaming model (ds_tcn, tcn, mdtc, gru)")
        return {"model": model}

    # ---------------------------------------------------------------- data
    def data_requirements(self, split: str = "train") -> DataRequirements:
        return DataRequirements(require_label=False)

    def example_builder(self, pipeline):
        # Labels play no part: every utterance is masked alike when SpecAugment is on.
        return KwsExampleBuilder(pipeline, True, self.cfg.model.num_outputs)

    # ---------------------------------------------------------------- steps
    def _log_probs(self, batch, ctx):
        feats = batch.feats.to(ctx.device, non_blocking=True)
        with ctx.autocast():
            logits, _ = ctx.module("model")(feats)
        return torch.log_softmax(logits.float(), dim=-1)      # the loss in fp32

    def _loss(self, log_probs, batch, device):
        lengths = batch.lengths.to(device)
        tokens, token_lengths = batch.tokens.to(device), batch.token_lengths.to(device)
        # zero_infinity: an utterance shorter in frames than its phones has no alignment;
        # it adds nothing instead of an infinite loss.
        per_utt = ctc_loss(log_probs.transpose(0, 1), tokens, lengths, token_lengths,
                           zero_infinity=True)
        return (per_utt / token_lengths.clamp(min=1)).mean()

    def train_step(self, batch, ctx) -> Dict[str, float]:
        loss = self._loss(self._log_probs(batch, ctx), batch, ctx.device)
        ctx.backward(loss, "model")
        ctx.step("model")
        return {"loss": float(loss.detach())}

    def eval_begin(self):
        return {"loss": 0.0, "count": 0.0, "errors": 0, "reference": 0}

    def eval_batch(self, batch, ctx, state) -> None:
        log_probs = self._log_probs(batch, ctx)
        state["loss"] += float(self._loss(log_probs, batch, ctx.device)) * len(batch)
        state["count"] += len(batch)
        errors, reference = phone_errors(log_probs.cpu(), batch.lengths, batch.tokens,
                                         batch.token_lengths)
        state["errors"] += errors
        state["reference"] += reference

    def eval_end(self, states) -> Dict[str, float]:
        count = sum(s["count"] for s in states)
        if not count:
            return {"count": 0.0}
        reference = sum(s["reference"] for s in states)
        return {"loss": sum(s["loss"] for s in states) / count,
                "per": sum(s["errors"] for s in states) / max(1, reference), "count": count}

    # ---------------------------------------------------------------- export
    def export(self, checkpoint: str, out_dir: str, test_data: str, num_check: int = 20,
               tolerance: float = 1e-4, threshold: Optional[float] = None) -> Dict[str, float]:
        from toolkit.export import parity_inputs
        from toolkit.tasks.kws.export import (check_parity, export_model_files,
                                              model_from_checkpoint)
        model = model_from_checkpoint(checkpoint)
        d = self.cfg.dataset
        metadata = front_end_metadata(model, build_extractor(d.feature, d.sample_rate).metadata(),
                                      self.inventory)
        paths = export_model_files(model, out_dir, metadata)
        pipeline = evaluation_pipeline(d)
        features = parity_inputs(test_data, lambda e: pipeline.features(e, 0), num_check)
        return check_parity(model, paths, features, tolerance, activation=ACTIVATION)

    @classmethod
    def export_weights(cls, weights: str, out_dir: str, test_data: Optional[str] = None,
                       num_check: int = 20, tolerance: float = 1e-4) -> Dict[str, float]:
        """A shipped front end's streaming graph (toolkit.bin.export_model --pretrained)."""
        from toolkit.tasks.kws.frontend import export_frontend_weights
        return export_frontend_weights(weights, out_dir, test_data, num_check, tolerance)


def phone_errors(log_probs, lengths, tokens, token_lengths):
    """(edit distance summed over the batch, reference units) of greedy CTC decoding."""
    errors = reference = 0
    for b in range(log_probs.size(0)):
        hyp = greedy_decode(log_probs[b], int(lengths[b]))
        ref = tokens[b, :int(token_lengths[b])].tolist()
        errors += edit_distance(hyp, ref)
        reference += len(ref)
    return errors, reference
