"""Where rank 0's training scalars go: TensorBoard event files (`training.tensorboard`) and a
Weights & Biases run (`training.wandb`), behind the one `add_scalar(tag, value, step)` /
`close()` interface the trainer writes to.

W&B, as it is used here:
- the run id is kept in `<exp>/wandb_run.json`, so a resumed training continues the same
  run (`resume="allow"`); steps are logged as the `trainer/step` metric, the x-axis of
  every chart, so that the steps a resumed run repeats after a kill stay on their steps;
- `mode: offline` writes the run under `<dir>/wandb/offline-run-*` for `wandb sync`
  later; `mode: online` without network or login falls back to offline with a warning;
- it records the config with every secret as the fixed `<redacted>` (no hash) and the
  scalars, nothing else: no console capture, no code, git or command-line metadata (a
  command line may carry a token override); name, group, tags and notes are scrubbed too;
- starting a run draws no number from the Python, NumPy or torch generators that the
  training's exact resume depends on.
"""
import contextlib
import json
import logging
import os
import secrets
import string
from typing import Dict, List, Optional

from toolkit.config import Config, ConfigError, scrub_text, to_dict
from toolkit.config.secrets import redact_shared
from toolkit.fileio import atomic_write_text

logger = logging.getLogger(__name__)
WANDB_RUN_FILE = "wandb_run.json"
STEP_METRIC = "trainer/step"


@contextlib.contextmanager
def untouched_random_state():
    """Whatever runs inside leaves the global random generators where they were."""
    from toolkit.trainer.checkpoint import rng_state, set_rng_state
    saved = rng_state()
    try:
        yield
    finally:
        set_rng_state(saved)


class WandbSink:
    """Scalars of one step are sent together, when the next step's first one arrives."""

    def __init__(self, run):
        self.run = run
        self.step: Optional[int] = None
        self.pending: Dict[str, float] = {}

    def add_scalar(self, tag: str, value, step: int) -> None:
        if step != self.step:
            self.flush()
            self.step = step
        self.pending[tag] = float(value)

    def flush(self) -> None:
        if self.pending:
            self.run.log(dict(self.pending, **{STEP_METRIC: self.step}))
            self.pending = {}

    def close(self) -> None:
        self.flush()
        with untouched_random_state():
            self.run.finish()


class MetricWriter:
    """Fans each scalar out to every configured sink."""

    def __init__(self, sinks: List):
        self.sinks = sinks

    def add_scalar(self, tag: str, value, step: int) -> None:
        for sink in self.sinks:
            sink.add_scalar(tag, value, step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def _run_id(exp_dir: str) -> str:
    path = os.path.join(exp_dir, WANDB_RUN_FILE)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f)["id"]
    # W&B's own id form (8 lowercase letters and digits), from the OS's entropy.
    run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    atomic_write_text(path, json.dumps({"id": run_id}) + "\n")
    return run_id


def open_wandb(cfg: Config, exp_dir: str) -> WandbSink:
    w = cfg.training.wandb
    try:
        import wandb
    except ImportError:
        raise ConfigError("training.wandb.mode=%s needs the `wandb` package (tools/install.sh "
                          "installs it with the toolkit's extras)" % w.mode) from None
    directory = os.path.abspath(w.dir or exp_dir)
    os.makedirs(directory, exist_ok=True)
    settings = wandb.Settings(console="off", disable_code=True, save_code=False,
                              disable_git=True, x_disable_meta=True, disable_job_creation=True)
    with untouched_random_state():
        run_id = _run_id(exp_dir)
        kwargs = dict(project=w.project or None, entity=w.entity or None,
                      name=scrub_text(w.name or os.path.basename(os.path.abspath(exp_dir))),
                      group=scrub_text(w.group) or None,
                      tags=[scrub_text(t) for t in w.tags] or None,
                      notes=scrub_text(w.notes) or None, dir=directory, id=run_id,
                      resume="allow", config=redact_shared(to_dict(cfg)), settings=settings)
        try:
            run = wandb.init(mode=w.mode, **kwargs)
        except Exception as err:        # no network, no login, server refused: many types
            if w.mode != "online":
                raise
            logger.warning("W&B online run could not start (%s); logging offline instead: "
                           "`wandb sync %s/wandb/offline-run-*` uploads it later",
                           scrub_text(" ".join(str(err).split())[:300]), directory)
            run = wandb.init(mode="offline", **kwargs)
        run.define_metric(STEP_METRIC)
        run.define_metric("*", step_metric=STEP_METRIC)
    logger.info("W&B run %s (%s) in %s", run_id, run.settings.mode, directory)
    return WandbSink(run)


def open_metric_writer(cfg: Config, exp_dir: str, step: int) -> Optional[MetricWriter]:
    """Rank 0's writer; None when neither TensorBoard nor W&B is on."""
    sinks = []
    if cfg.training.tensorboard:
        from tensorboardX import SummaryWriter
        sinks.append(SummaryWriter(os.path.join(exp_dir, "tensorboard"),
                                   purge_step=step if step else None))
    if cfg.training.wandb.mode != "disabled":
        sinks.append(open_wandb(cfg, exp_dir))
    return MetricWriter(sinks) if sinks else None
