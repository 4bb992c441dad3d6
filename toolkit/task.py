"""The task contract: what a model family plugs into the one generic trainer.

A task owns everything family-specific: its config sections, its named modules, which
optimizer steps which modules, what an utterance becomes and how examples are batched,
the training step (forward, losses, which optimizer each loss drives, in which order),
validation metrics, and what export writes. The trainer owns everything generic (the
loop, exact resume, the exp-dir lock, checkpoints, DDP of each module, AMP, clipping,
non-finite skipping, accumulation, logging, TensorBoard, validation scheduling,
bad-input accounting) and knows no family.

Registration: `@TASKS.register("name")` on a Task subclass; importing `toolkit.tasks`
registers every family. Generic code never imports a task package.
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from toolkit.config import TASKS, Config, Section, TaskConfigBase  # noqa: F401  (re-exported)
from toolkit.data.datalist import BadCounter

__all__ = ["TASKS", "Task", "Batch", "ExampleBuilder", "StepContext", "DataRequirements",
           "Section", "TaskConfigBase", "pad_sequences"]


@dataclass
class Batch:
    """A collated batch: utterance keys, named tensors, and accounting. `batch.feats` reads
    `batch.tensors["feats"]`."""
    keys: List[str]
    tensors: Dict[str, torch.Tensor] = field(default_factory=dict)
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


class ExampleBuilder:
    """Runs in loader workers: one data-list entry -> one example, and examples -> Batch.

    `__call__` gets the entry (a dict with at least key, duration, label, and wav or feat)
    and the epoch; for tar shards `audio` holds the decoded (mono wave, rate). Randomness
    must come from (seed, epoch, key) only, so that resume is exact. An unusable entry
    raises toolkit.data.audio.BadEntry (counted and skipped)."""

    def __call__(self, entry: dict, epoch: int, audio: Optional[Tuple[np.ndarray, int]] = None):
        raise NotImplementedError

    def collate(self, examples: List[Any], keys: List[str], audio_seconds: float,
                bad: BadCounter) -> Batch:
        raise NotImplementedError


@dataclass
class DataRequirements:
    """What the data lists must carry for this task; checked when a list is loaded."""
    require_label: bool = True        # entries need an integer `label`
    num_classes: Optional[int] = None  # labels must lie below this
    allow_negative_label: bool = True  # label -1 allowed (fillers)


class StepContext:
    """What the trainer hands a task's train_step / eval_step (implemented by the trainer).

    - `module(name)`: the module to run forward through (DDP-wrapped when distributed,
      gradient sync deferred on non-boundary accumulation steps);
    - `raw(name)`: the bare module (for a pass whose gradients must not be synced, e.g.
      a discriminator evaluated inside the generator step with frozen parameters);
    - `autocast()`: the configured mixed-precision context; `fp32()`: an fp32 island;
    - `backward(loss, optimizer)`: scales (GradScaler of that optimizer) and backpropagates;
    - `step(optimizer)`: at an accumulation boundary clips, skips a non-finite update,
      steps and zeroes that optimizer and advances its LR schedule; otherwise nothing;
    - `active(optimizer)`: whether the optimizer's phase has begun (start_fraction);
    - `frozen(*modules)`: parameters of those modules do not collect gradients inside;
    - `value(ramp)`: a Ramp config value at the current progress;
    - `step_index`, `total_steps`, `progress` (fraction), `epoch`, `device`, `training`."""

    step_index: int
    total_steps: int
    epoch: int
    device: torch.device
    training: bool

    @property
    def progress(self) -> float:
        return self.step_index / max(1, self.total_steps)


class Task:
    """Base of every task. Subclasses set the class attributes and implement the methods;
    the defaults describe a single-module, single-optimizer task."""

    name: str = ""
    Config = TaskConfigBase
    # Task-owned top-level config sections (name -> Section).
    sections: Dict[str, Section] = {}
    # Optimizer names, in the order the step uses them; each has its own LR schedule,
    # clip value, GradScaler and phase start.
    optimizers: Tuple[str, ...] = ("model",)
    # The class inventory (keywords, speakers) is required and recorded in the exp dir.
    needs_inventory: bool = True
    # Dev metric (from eval_step) choosing the best checkpoints; lower is better.
    selection_metric: str = "loss"
    # Module a safetensors export holds, and the modules an init checkpoint loads into.
    export_module: str = "model"
    # Per-optimizer raw defaults that replace the generic OptimConfig defaults (the YAML
    # still overrides them key by key), e.g. {"discriminator": {"start_fraction": 0.1}}
    # for a phase that belongs to the family, not to every config file.
    optim_defaults: Dict[str, Dict[str, Any]] = {}

    def __init__(self, cfg: Config, inventory: Optional[List[str]] = None):
        self.cfg = cfg
        self.inventory = inventory

    # ---------------------------------------------------------------- config
    @classmethod
    def check_config(cls, cfg: Config) -> None:
        """Cross-section checks after validation; raise ConfigError naming the key."""

    @classmethod
    def resolve(cls, cfg: Config, inventory: Optional[List[str]], extras: Dict[str, Any]) -> None:
        """Fills sizes derived from the data (inventory size, feature dim, CLI extras such
        as --units or --cmvn) into `cfg`, raising ConfigError on a contradiction."""

    # ---------------------------------------------------------------- modules
    def build_modules(self) -> Dict[str, nn.Module]:
        raise NotImplementedError

    def optimizer_modules(self) -> Dict[str, List[str]]:
        """Optimizer name -> the modules whose parameters it steps."""
        return {self.optimizers[0]: ["model"]}

    def training_view(self, name: str, module: nn.Module) -> nn.Module:
        """The module whose forward the step calls through ctx.module(name) (and DDP
        wraps): the module itself, or a view of it whose forward also computes an
        auxiliary output. Parameters are the module's; checkpoints hold the module."""
        return module

    def find_unused_parameters(self, module: str) -> bool:
        """True when some parameters of `module` may get no gradient in a step (a head
        switched on later): DDP then has to look for them."""
        return False

    def init_modules(self, task_state: Optional[dict] = None) -> List[str]:
        """Modules an init checkpoint loads into (the rest keep their fresh init);
        `task_state` is the checkpoint's task state (None for a one-module export)."""
        return [self.export_module]

    def adapt_init_state(self, name: str, module: nn.Module,
                         state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """`state`, the init checkpoint's or export's weights for module `name`, in the
        layout of the freshly built `module` (e.g. an export whose weight norm was folded
        into plain weights, re-parametrized); the strict key check runs afterwards."""
        return state

    def describe(self, modules: Dict[str, nn.Module]) -> str:
        counts = ", ".join(f"{n} {sum(p.numel() for p in m.parameters()):,}"
                           for n, m in modules.items())
        return f"task {self.name}: parameters {counts}"

    # ---------------------------------------------------------------- data
    def data_requirements(self, split: str = "train") -> DataRequirements:
        """`split`: train or dev (a dev list may hold other classes, e.g. unseen speakers)."""
        return DataRequirements()

    def check_data(self, split: str, source) -> None:
        """Checks a loaded list before training starts (`split`: train or dev; `source`: a
        toolkit.data.sources.DataSource): raise DataError naming the list for what would
        only fail later (e.g. a dev list that cannot give what validation computes)."""

    def example_builder(self, train: bool, seed: int, noise=None, rirs=None,
                        steps_per_epoch: int = 0, total_steps: int = 0) -> ExampleBuilder:
        """`noise`/`rirs`: loaded DataLists when augmentation is on; the step counts let
        ramped augmentation probabilities follow training progress per epoch."""
        raise NotImplementedError

    def example_frames(self, durations: np.ndarray) -> np.ndarray:
        """Padded length of each utterance's example, in the unit `max_frames_in_batch`
        counts (fbank frames by default)."""
        from toolkit.data.plan import estimated_frames
        return estimated_frames(durations, self.cfg.dataset)

    def dummy_batch(self) -> Batch:
        """A minimal batch for a rank without data in a step: it still runs forward and
        backward (at weight 0) so the others' gradient all-reduce finds it."""
        raise NotImplementedError

    # ---------------------------------------------------------------- steps
    def train_step(self, batch: Batch, ctx: StepContext) -> Dict[str, float]:
        """Forward, losses, ctx.backward/ctx.step per optimizer in order. Returns the
        batch's metrics (means over its utterances) for logging."""
        raise NotImplementedError

    def eval_step(self, batch: Batch, ctx: StepContext) -> Dict[str, float]:
        """Dev metrics of one batch (means over its utterances); weighted by batch size
        and reduced over ranks by the default eval_begin/eval_batch/eval_end."""
        raise NotImplementedError

    # Validation as begin -> batch ... -> end over the gathered per-rank states, so that a
    # task can compute metrics that do not decompose over batches (EER over trials).
    def eval_begin(self) -> Any:
        return {"sums": {}, "count": 0.0}

    def eval_batch(self, batch: Batch, ctx: StepContext, state: Any) -> None:
        metrics = self.eval_step(batch, ctx)
        for k in self.eval_metric_names():
            state["sums"][k] = state["sums"].get(k, 0.0) + float(metrics[k]) * len(batch)
        state["count"] += len(batch)

    def eval_end(self, states: List[Any]) -> Dict[str, float]:
        """`states`: every rank's eval state, in rank order. Returns the metrics (must
        include `selection_metric`) and `count`, the utterances evaluated."""
        count = sum(s["count"] for s in states)
        if not count:
            return {"count": 0.0}
        out = {k: sum(s["sums"].get(k, 0.0) for s in states) / count
               for k in self.eval_metric_names()}
        out["count"] = count
        return out

    def train_metric_names(self) -> Tuple[str, ...]:
        """Every metric train_step may return, in log order (ranks reduce them together)."""
        return ("loss",)

    def eval_metric_names(self) -> Tuple[str, ...]:
        """Every metric eval_step returns; includes `selection_metric`."""
        return ("loss",)

    def state_dict(self) -> dict:
        """Task state outside modules and optimizers (kept in checkpoints)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
