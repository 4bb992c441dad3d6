"""The task contract: everything a model family plugs into the one generic trainer, in one
file. Read this first to write a task; docs/architecture.md walks one task end to end.

A task owns what is family-specific: its config sections, the values it derives from its
data, its named modules, which optimizer steps which modules, what an utterance becomes
and how examples are batched, the training step (forward, losses, which optimizer each
loss drives, in which order), validation metrics, and what export writes. The trainer
owns everything generic (the loop, exact resume, the exp-dir lock, checkpoints, DDP of
each module, AMP, clipping, non-finite skipping, accumulation, logging, TensorBoard,
validation scheduling, bad-input accounting, the feature pipeline with its augmentation)
and knows no family.

The life of a task, and which hook each step calls:

1. Registration: `@TASKS.register("name")` on a Task subclass. `toolkit.tasks` registers
   the toolkit's families by module name (the module, and torch, load only when a config
   names the task); TOOLKIT_PLUGINS names modules of your own. Generic code never imports
   a task package.
2. Configuration (toolkit.config.resolve_config): the YAML with its `defaults`, the CLI
   overrides, then `validate` builds the `task` section from `Config`, the generic
   sections, each of `sections`, and the optimizers (`optimizers`, over
   `optim_defaults`), and calls `check_config`. The values the task derives from its
   data (`derived_values`: class counts, feature dim, the declared `inputs` such as
   --cmvn) are overrides applied to the raw config before the one validation of the
   config training uses; nothing changes a validated Config afterwards.
3. Training (toolkit.trainer): `Task(cfg, inventory)`, `build_modules`,
   `optimizer_modules`, `training_view`, `modules_with_unused_parameters`; an init
   checkpoint loads `init_modules` through `adapt_init_state`; `describe` is logged. The
   trainer builds the `FeaturePipeline` of the train and dev data (decode, waveform
   augmentation, features, feature augmentation) and hands each to `example_builder`;
   batches are planned with `example_frames` and checked against `data_requirements`;
   each step calls `train_step` with a StepContext (a rank without data in a step runs a
   stand-in batch of real data at weight 0, so that the gradient all-reduce finds it),
   validation calls `eval_begin` / `eval_batch` (default: `eval_step`) / `eval_end`;
   `metrics` names what they return; `state_dict` rides in checkpoints.
4. Export (toolkit.bin.export_model): `export` writes the deployable files and checks
   them against PyTorch.
"""
from __future__ import annotations

import abc
import inspect
from dataclasses import dataclass, field
from typing import (TYPE_CHECKING, Any, ContextManager, Dict, List, Optional, Protocol, Sequence,
                    Tuple)

import numpy as np

from toolkit.config.resolve import TASKS
from toolkit.config.ramps import Ramp
from toolkit.config.schema import Config, Section, TaskConfigBase
from toolkit.data.datalist import BadCounter

if TYPE_CHECKING:       # annotations only: this module stays free of torch at import
    import torch
    from torch import nn

    from toolkit.data.pipeline import FeaturePipeline

# TASKS (the registry `@TASKS.register("name")` adds a task to) lives with the config
# resolution that looks tasks up by `task.type` (toolkit.config.resolve); a task module
# imports it from here with the rest of the contract.
__all__ = ["TASKS", "Task", "TaskInput", "Metrics", "Batch", "ExampleBuilder", "StepContext",
           "DataRequirements", "Section", "TaskConfigBase", "pad_sequences"]


@dataclass(frozen=True)
class TaskInput:
    """A file a task takes on the training command line, `--NAME PATH` (toolkit.bin.train
    shows the flag because the task declares it), and the config key its value decides
    (through the task's `derived_values`)."""
    name: str       # the flag without dashes, and the key in derived_values' `inputs`
    help: str       # its line in --help
    fills: str      # the config key it determines, e.g. "model.cmvn_file"


# --------------------------------------------------------------------------- data

@dataclass
class Batch:
    """A collated batch: utterance keys, named tensors, and accounting. `batch.feats` reads
    `batch.tensors["feats"]`."""
    keys: List[str]
    tensors: Dict[str, "torch.Tensor"] = field(default_factory=dict)
    audio_seconds: float = 0.0
    bad: BadCounter = field(default_factory=BadCounter)

    def __len__(self) -> int:
        return len(self.keys)

    def __getattr__(self, name: str):
        tensors = self.__dict__.get("tensors")
        if tensors is not None and name in tensors:
            return tensors[name]
        raise AttributeError(name)

    def get(self, name: str, default=None):
        return self.tensors.get(name, default)


def pad_sequences(arrays: Sequence[np.ndarray], dtype=np.float32) -> Tuple[np.ndarray, np.ndarray]:
    """(T_i, ...) arrays -> zero-padded (B, T_max, ...) array and (B,) lengths."""
    lengths = np.array([len(a) for a in arrays], dtype=np.int64)
    longest = int(lengths.max()) if len(lengths) else 0
    tail = arrays[0].shape[1:] if len(arrays) else ()
    out = np.zeros((len(arrays), longest) + tuple(tail), dtype=dtype)
    for i, a in enumerate(arrays):
        out[i, :len(a)] = a
    return out, lengths


class ExampleBuilder(abc.ABC):
    """Runs in loader workers: one data-list entry -> one example, and examples -> Batch.

    `__call__` gets the entry (a dict with at least key, duration, label, and wav or feat)
    and the epoch; for tar shards `audio` holds the decoded (mono wave, rate). Randomness
    must come from (seed, epoch, key) only, so that resume is exact: the pipeline's
    `rng(epoch, key)`. An unusable entry raises toolkit.data.audio.BadEntry (counted and
    skipped)."""

    @abc.abstractmethod
    def __call__(self, entry: dict, epoch: int, audio: Optional[Tuple[np.ndarray, int]] = None):
        """One example of `entry` (anything `collate` takes)."""

    @abc.abstractmethod
    def collate(self, examples: List[Any], keys: List[str], audio_seconds: float,
                bad: BadCounter) -> Batch:
        """The batch of `examples` (possibly none: every entry of the batch was bad)."""


@dataclass
class DataRequirements:
    """What the data lists must carry for this task; checked when a list is loaded."""
    require_label: bool = True        # entries need an integer `label`
    num_classes: Optional[int] = None  # labels must lie below this
    allow_negative_label: bool = True  # label -1 allowed (fillers)


class StepContext(Protocol):
    """What the trainer hands a task's train_step / eval_step for one micro-batch
    (toolkit.trainer.context implements it)."""

    step_index: int         # optimizer steps taken before this one
    total_steps: int        # the steps this run trains
    epoch: int
    device: "torch.device"
    training: bool          # False inside validation

    @property
    def progress(self) -> float:
        """step_index / total_steps."""

    def module(self, name: str) -> "nn.Module":
        """The module to run forward through: DDP-wrapped when distributed, gradient sync
        deferred on non-boundary accumulation steps (the task's `training_view` of it)."""

    def raw(self, name: str) -> "nn.Module":
        """The bare module, for a pass whose gradients must not be synced (e.g. a
        discriminator evaluated inside the generator step with frozen parameters)."""

    def autocast(self) -> ContextManager[Any]:
        """The configured mixed-precision context (a no-op without AMP)."""

    def fp32(self) -> ContextManager[Any]:
        """An fp32 island inside autocast."""

    def backward(self, loss: "torch.Tensor", optimizer: str) -> None:
        """Scales `loss` (the GradScaler of `optimizer`, the step's weight) and
        backpropagates."""

    def step(self, optimizer: str) -> None:
        """At an accumulation boundary: clips, skips a non-finite update, steps and zeroes
        `optimizer` and advances its LR schedule; otherwise nothing."""

    def active(self, optimizer: str) -> bool:
        """Whether the phase of `optimizer` has begun (its start_fraction)."""

    def frozen(self, *modules: str) -> ContextManager[Any]:
        """Inside it the parameters of `modules` collect no gradient."""

    def value(self, ramp: Ramp) -> float:
        """A Ramp config value at the current progress."""


@dataclass(frozen=True)
class Metrics:
    """The one declaration of a task's metric names, read by the trainer (logging,
    reduction over ranks, checkpoint selection) and the default validation."""
    train: Tuple[str, ...]      # every metric train_step may return, in log order
    eval: Tuple[str, ...]       # every dev metric validation reports, in log order
    select: str                 # the one of `eval` that chooses checkpoints; lower is better

    def __post_init__(self):
        if self.select not in self.eval:
            raise ValueError(f"selection metric {self.select!r} is not among the eval metrics "
                             f"{self.eval}")


# --------------------------------------------------------------------------- the contract

class Task(abc.ABC):
    """Base of every task. Subclasses set the class attributes and implement the abstract
    methods (and eval_step, or eval_begin/eval_batch/eval_end); the defaults describe a
    single-module, single-optimizer task. Every method here is called by the trainer, a
    binary or the config resolution."""

    name: str = ""
    # Dataclass of the `task:` section (subclass TaskConfigBase; comment every field:
    # the comment is its line in docs/config_reference.md).
    Config = TaskConfigBase
    # Task-owned top-level config sections (name -> Section: a dataclass, or a registry
    # whose `type` key picks the class, e.g. the model).
    sections: Dict[str, Section] = {}
    # Optimizer names, in the order the step uses them; each has its own LR schedule,
    # clip value, GradScaler and phase start.
    optimizers: Tuple[str, ...] = ("model",)
    # Per-optimizer raw defaults that replace the generic OptimConfig defaults (the YAML
    # still overrides them key by key), e.g. {"discriminator": {"start_fraction": 0.1}}
    # for a phase that belongs to the family, not to every config file.
    optim_defaults: Dict[str, Dict[str, Any]] = {}
    # Files the task takes on the training command line (toolkit.bin.train --NAME PATH).
    inputs: Tuple[TaskInput, ...] = ()
    # The class inventory (keywords, speakers) is required (--inventory) and recorded in
    # the exp dir.
    needs_inventory: bool = True
    # The metric names: what train_step returns, what validation reports, which of those
    # chooses checkpoints. A task whose names depend on its config sets `self.metrics` in
    # __init__.
    metrics: Metrics = Metrics(train=("loss",), eval=("loss",), select="loss")
    # Modules some of whose parameters may get no gradient in a step (a loss component
    # switched on later); the trainer's gradient sync then looks for them. Likewise set in
    # __init__ when the config decides.
    modules_with_unused_parameters: Tuple[str, ...] = ()
    # Module a safetensors export holds, and the modules an init checkpoint loads into.
    export_module: str = "model"

    def __init__(self, cfg: Config, inventory: Optional[List[str]] = None):
        self.cfg = cfg
        self.inventory = inventory

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not inspect.isabstract(cls) and cls.eval_step is Task.eval_step and \
                cls.eval_batch is Task.eval_batch:
            raise TypeError(f"task {cls.__name__} implements neither eval_step nor eval_batch: "
                            "validation needs one of them")

    # ---------------------------------------------------------------- config hooks
    @classmethod
    def check_config(cls, cfg: Config) -> None:
        """Cross-section checks of a built config (run by `validate`, so every binary
        that reads a config meets them); raise ConfigError naming the key."""

    @classmethod
    def derived_values(cls, draft: Config, inventory: Optional[List[str]],
                       inputs: Dict[str, str]) -> Dict[str, Any]:
        """Values the data decides, as `key.path -> value` overrides (e.g. the inventory
        size into the classifier's output count, the feature dim into the model's input,
        a declared input's path or what its file holds). `draft` is the config validated
        without them (read it, never change it); `inputs` holds the declared inputs given
        on the command line (name -> path) and `inventory`, the --inventory path. Raise
        ConfigError naming the key and flag on a contradiction (model.num_outputs=5 but
        the inventory has 3 entries)."""
        return {}

    # ---------------------------------------------------------------- modules
    @abc.abstractmethod
    def build_modules(self) -> Dict[str, "nn.Module"]:
        """The named modules (fresh initialisation); the trainer moves, wraps and
        checkpoints each."""

    def optimizer_modules(self) -> Dict[str, List[str]]:
        """Optimizer name -> the modules whose parameters it steps."""
        return {self.optimizers[0]: ["model"]}

    def training_view(self, name: str, module: "nn.Module") -> "nn.Module":
        """The module whose forward the step calls through ctx.module(name) (and DDP
        wraps): the module itself, or a view of it whose forward also computes an
        auxiliary output. Parameters are the module's; checkpoints hold the module."""
        return module

    def init_modules(self, task_state: Optional[dict] = None) -> List[str]:
        """Modules an init checkpoint loads into (the rest keep their fresh init);
        `task_state` is the checkpoint's task state (None for a one-module export)."""
        return [self.export_module]

    def adapt_init_state(self, name: str, module: "nn.Module",
                         state: Dict[str, "torch.Tensor"]) -> Dict[str, "torch.Tensor"]:
        """`state`, the init checkpoint's or export's weights for module `name`, in the
        layout of the freshly built `module` (e.g. an export whose weight norm was folded
        into plain weights, re-parametrized); the strict key check runs afterwards."""
        return state

    def describe(self, modules: Dict[str, "nn.Module"]) -> str:
        """The line the training log starts with: what is being trained, how big."""
        counts = ", ".join(f"{n} {sum(p.numel() for p in m.parameters()):,}"
                           for n, m in modules.items())
        return f"task {self.name}: parameters {counts}"

    def fingerprinted_files(self) -> Dict[str, str]:
        """Files besides the data that training reads and a resume must find unchanged
        (frozen teacher models), as config key -> path: their sha256 joins the exp dir's
        data fingerprint, so a resume with one of them replaced is refused."""
        return {}

    # ---------------------------------------------------------------- data
    def data_requirements(self, split: str = "train") -> DataRequirements:
        """What the `split` (train or dev) list must carry; a dev list may hold other
        classes (e.g. unseen speakers)."""
        return DataRequirements()

    def check_data(self, split: str, source) -> None:
        """Checks a loaded list before training starts (`split`: train or dev; `source`: a
        toolkit.data.sources.DataSource): raise DataError naming the list for what would
        only fail later (e.g. a dev list that cannot give what validation computes)."""

    @abc.abstractmethod
    def example_builder(self, pipeline: "FeaturePipeline") -> ExampleBuilder:
        """The builder of the train or dev examples around the trainer's `pipeline`
        (pipeline.train tells which; it holds the dataset section, the seed, the noise and
        RIR lists and the step counts ramped augmentation follows). The task adds what
        its examples need: labels, a random chunk, keyword end frames, a waveform
        segment."""

    def example_frames(self, durations: np.ndarray) -> np.ndarray:
        """Padded length of each utterance's example, in the unit `max_frames_in_batch`
        counts (fbank frames by default): batch planning needs it before any audio is
        read."""
        from toolkit.data.plan import estimated_frames
        return estimated_frames(durations, self.cfg.dataset)

    # ---------------------------------------------------------------- steps
    @abc.abstractmethod
    def train_step(self, batch: Batch, ctx: StepContext) -> Dict[str, float]:
        """Forward, losses, ctx.backward/ctx.step per optimizer in order. Returns the
        batch's metrics (means over its utterances, named in `metrics.train`) for
        logging."""

    def eval_step(self, batch: Batch, ctx: StepContext) -> Dict[str, float]:
        """Dev metrics of one batch (means over its utterances, `metrics.eval`); weighted
        by batch size and reduced over ranks by the default eval_begin/eval_batch/eval_end.
        Required unless the task overrides eval_batch (metrics that do not decompose over
        batches)."""
        raise NotImplementedError(f"task {self.name} has no eval_step")

    # Validation as begin -> batch ... -> end over the gathered per-rank states, so that a
    # task can compute metrics that do not decompose over batches (EER over trials).
    def eval_begin(self) -> Any:
        """A fresh per-rank validation state."""
        return {"sums": {}, "count": 0.0}

    def eval_batch(self, batch: Batch, ctx: StepContext, state: Any) -> None:
        """Adds one dev batch to this rank's state."""
        metrics = self.eval_step(batch, ctx)
        for k in self.metrics.eval:
            state["sums"][k] = state["sums"].get(k, 0.0) + float(metrics[k]) * len(batch)
        state["count"] += len(batch)

    def eval_end(self, states: List[Any]) -> Dict[str, float]:
        """`states`: every rank's eval state, in rank order. Returns `metrics.eval` and
        `count`, the utterances evaluated."""
        count = sum(s["count"] for s in states)
        if not count:
            return {"count": 0.0}
        out = {k: sum(s["sums"].get(k, 0.0) for s in states) / count
               for k in self.metrics.eval}
        out["count"] = count
        return out

    def state_dict(self) -> dict:
        """Task state outside modules and optimizers (kept in checkpoints)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restores state_dict() on resume."""

    # ---------------------------------------------------------------- export
    def export(self, checkpoint: str, out_dir: str, test_data: str, num_check: int = 20,
               tolerance: float = 1e-4, threshold: Optional[float] = None) -> Dict[str, float]:
        """Writes the deployable files of `checkpoint` into `out_dir` (toolkit.bin.
        export_model) and checks each against PyTorch on up to `num_check` utterances of
        the `test_data` list; returns the worst difference per format (above `tolerance`
        is an error). `threshold`: a detection threshold to record, where one applies.
        A pipeline for the test audio: toolkit.data.pipeline.evaluation_pipeline."""
        raise NotImplementedError(f"task {self.name} has no export")

    @classmethod
    def export_weights(cls, weights: str, out_dir: str, test_data: Optional[str] = None,
                       num_check: int = 20, tolerance: float = 1e-4) -> Dict[str, float]:
        """The deployable files of an export's safetensors + config.json (a shipped
        pretrained model: toolkit.pretrained), checked like `export`; without `test_data`
        the check runs on seeded random inputs of several lengths."""
        raise NotImplementedError(f"task {cls.name} cannot export from safetensors alone")
