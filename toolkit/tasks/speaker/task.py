"""Speaker embeddings as a task of the generic trainer: an embedding network (x-vector,
ResNet, ECAPA-TDNN) trained through a separate margin-softmax head over the speaker
inventory; validation by EER on trials among dev utterances (unseen speakers welcome);
export of the embedding network alone."""
import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import numpy as np
import torch.nn.functional as F
from torch import nn

from toolkit.config import ConfigError, Section, TaskConfigBase
from toolkit.errors import DataError
from toolkit.task import TASKS, DataRequirements, Metrics, Task
from toolkit.tasks.speaker import scoring
from toolkit.tasks.speaker.data import ChunkBuilder, TrialError, make_trials, trial_problem
from toolkit.tasks.speaker.heads import SPEAKER_HEADS, build_speaker_head
from toolkit.tasks.speaker.models import SPEAKER_MODELS, build_speaker_model, min_input_frames

logger = logging.getLogger(__name__)


@TASKS.register("speaker")
class SpeakerTask(Task):
    name = "speaker"

    @dataclass
    class Config(TaskConfigBase):
        chunk_frames: int = 200       # training chunk per utterance (2 s); shorter ones are looped
        # Dev utterances are embedded whole up to this many frames (centre crop); 0: all.
        eval_max_frames: int = 600
        # Dev trials: every same-speaker pair up to this many, and as many others.
        dev_max_targets: int = 20000

    sections = {"model": Section(registry=SPEAKER_MODELS),
                "head": Section(registry=SPEAKER_HEADS, default_type="aam_softmax")}
    optimizers = ("model",)
    # EER in %; the margin is the head's, ramped over training.
    metrics = Metrics(train=("loss", "acc", "margin"), eval=("eer", "min_dcf_0.01"), select="eer")
    export_module = "model"

    # ---------------------------------------------------------------- config
    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.task.chunk_frames < 2:
            raise ConfigError("task.chunk_frames must be >= 2")
        needed = min_input_frames(cfg.model) if cfg.model.type in SPEAKER_MODELS else 1
        for key in ("chunk_frames", "eval_max_frames"):
            value = getattr(cfg.task, key)
            if value and value < needed:
                raise ConfigError(f"task.{key}={value}: model {cfg.model.type} needs at least "
                                  f"{needed} frames")

    @classmethod
    def derived_values(cls, draft, inventory, inputs) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        bins = draft.dataset.feature.num_mel_bins
        if draft.model.input_dim != bins:
            if draft.model.input_dim != type(draft.model)().input_dim:
                raise ConfigError(f"model.input_dim={draft.model.input_dim} but "
                                  f"dataset.feature.num_mel_bins={bins}")
            out["model.input_dim"] = bins
        if draft.head.num_classes <= 0:
            out["head.num_classes"] = len(inventory)
        elif draft.head.num_classes != len(inventory):
            raise ConfigError(f"head.num_classes={draft.head.num_classes} but the speaker "
                              f"inventory {inputs.get('inventory')} has {len(inventory)} "
                              "entries")
        return out

    # ---------------------------------------------------------------- modules
    def build_modules(self) -> Dict[str, nn.Module]:
        model = build_speaker_model(self.cfg.model)
        return {"model": model, "head": build_speaker_head(self.cfg.head, self.cfg.model.embed_dim)}

    def optimizer_modules(self):
        return {"model": ["model", "head"]}

    def init_modules(self, task_state: Optional[dict] = None) -> List[str]:
        """The embedding network always; the head only for the same speaker inventory
        (e.g. large-margin fine-tuning). Another speaker set gets a fresh head."""
        theirs = (task_state or {}).get("inventory")
        if theirs is not None and list(theirs) == list(self.inventory or []):
            return ["model", "head"]
        logger.info("init: the head is re-initialised for this inventory (%d speakers%s)",
                    len(self.inventory or []),
                    f"; the checkpoint's had {len(theirs)}" if theirs is not None else "")
        return ["model"]

    def state_dict(self) -> dict:
        return {"inventory": list(self.inventory or [])}

    def describe(self, modules) -> str:
        embed = sum(p.numel() for p in modules["model"].parameters())
        head = sum(p.numel() for p in modules["head"].parameters())
        return (f"task speaker: {self.cfg.model.type} {embed:,} parameters (embedding "
                f"{self.cfg.model.embed_dim}), {self.cfg.head.type} head {head:,} over "
                f"{self.cfg.head.num_classes} speakers")

    # ---------------------------------------------------------------- data
    def data_requirements(self, split: str = "train") -> DataRequirements:
        if split == "train":
            return DataRequirements(require_label=True, num_classes=self.cfg.head.num_classes,
                                    allow_negative_label=False)
        return DataRequirements(require_label=False)     # dev speakers may be unseen

    def example_builder(self, pipeline):
        return ChunkBuilder(pipeline, self.cfg.task.chunk_frames, self.cfg.task.eval_max_frames,
                            min_input_frames(self.cfg.model))

    def check_data(self, split: str, source) -> None:
        """A dev list must give both kinds of trial, and each dev utterance its speaker:
        refused before training rather than at the first validation."""
        if split != "dev":
            return
        fields = source.field_values("spk")
        if fields is None:
            return                # shards: entries are read with their audio, checked there
        problem = trial_problem([k for k, _ in fields],
                                [v if isinstance(v, str) else "" for _, v in fields])
        if problem:
            raise DataError(f"{source.path}: {problem}")

    def example_frames(self, durations: np.ndarray) -> np.ndarray:
        return np.full(len(durations), self.cfg.task.chunk_frames, dtype=np.int64)

    # ---------------------------------------------------------------- steps
    def train_step(self, batch, ctx) -> Dict[str, float]:
        feats = batch.feats.to(ctx.device, non_blocking=True)
        labels = batch.labels.to(ctx.device)
        margin = ctx.value(self.cfg.head.margin)
        with ctx.autocast():
            embeddings = ctx.module("model")(feats)
        logits = ctx.module("head")(embeddings, labels, margin)      # fp32 inside the head
        loss = F.cross_entropy(logits.float(), labels)
        ctx.backward(loss, "model")
        ctx.step("model")
        acc = (logits.detach().argmax(dim=1) == labels).float().mean()
        return {"loss": float(loss.detach()), "acc": float(acc), "margin": margin}

    def eval_begin(self) -> Any:
        return {"keys": [], "speakers": [], "embeddings": []}

    def eval_batch(self, batch, ctx, state) -> None:
        model = ctx.module("model")
        for i in range(len(batch)):     # whole utterances, one at a time (their lengths differ)
            feats = batch.feats[i:i + 1, :int(batch.lengths[i])].to(ctx.device)
            with ctx.autocast():
                emb = model(feats).float()
            state["embeddings"].append(emb[0].cpu().numpy())
        state["keys"] += list(batch.keys)
        state["speakers"] += list(batch.speakers)

    def eval_end(self, states: List[Any]) -> Dict[str, float]:
        keys = [k for s in states for k in s["keys"]]
        speakers = [k for s in states for k in s["speakers"]]
        vectors = {k: v for s in states for k, v in zip(s["keys"], s["embeddings"])}
        try:
            enroll, test, labels = make_trials(keys, speakers, 0, self.cfg.task.dev_max_targets)
        except TrialError as err:
            dev = self.cfg.dataset.dev_data or "dataset.hf.dev"
            raise DataError(f"{dev}: the usable dev utterances cannot "
                            f"make trials for the dev EER: {err}") from None
        trials = scoring.Trials(enroll, test, labels)
        scores = scoring.score_trials(trials, vectors, length_norm=True)
        summary = scoring.summarize(scores, labels, (0.01,))
        return {"eer": summary["eer_percent"], "min_dcf_0.01": summary["min_dcf_0.01"],
                "count": float(len(keys))}

    # ---------------------------------------------------------------- export
    def export(self, checkpoint: str, out_dir: str, test_data: str, num_check: int = 20,
               tolerance: float = 1e-4, threshold: Optional[float] = None) -> Dict[str, float]:
        from toolkit.tasks.speaker.embed import export_embedder
        return export_embedder(self, checkpoint, out_dir, test_data, num_check, tolerance,
                               threshold)

    @classmethod
    def export_weights(cls, weights: str, out_dir: str, test_data: Optional[str] = None,
                       num_check: int = 20, tolerance: float = 1e-4) -> Dict[str, float]:
        from toolkit.tasks.speaker.embed import export_embedder_weights
        return export_embedder_weights(weights, out_dir, test_data, num_check, tolerance)
