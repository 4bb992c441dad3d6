"""Where rank 0's training scalars go: TensorBoard event files (`training.tensorboard`) and a
Weights & Biases run (`training.wandb`), behind the one `add_scalar(tag, value, step)` /
`flush()` / `close()` interface the trainer writes to. The trainer flushes before writing
each checkpoint, so a run killed at any point after a checkpoint has lost none of the
scalars up to it, and its resume (which redoes the steps after it) repeats none in
TensorBoard's view nor, killed right after the checkpoint, in W&B.

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
import time
from typing import Dict, List, Optional

from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto.event_pb2 import Event, SessionLog
from tensorboardX.summary import scalar

from toolkit.config import Config, ConfigError, scrub_text, to_dict
from toolkit.config.secrets import redact_shared
from toolkit.fileio import atomic_write_text

logger = logging.getLogger(__name__)
WANDB_RUN_FILE = "wandb_run.json"
STEP_METRIC = "trainer/step"
# W&B's core keeps the run file's last 32 KiB block in memory, writes it every this many
# seconds (its default: 15), and drops it when the training process dies; a flush waits
# for the next write, so the interval bounds what a checkpoint waits.
RUN_FILE_WRITE_INTERVAL_S = 0.2
RUN_FILE_WAIT_S = 10.0


@contextlib.contextmanager
def untouched_random_state():
    """Whatever runs inside leaves the global random generators where they were."""
    from toolkit.trainer.checkpoint import rng_state, set_rng_state
    saved = rng_state()
    try:
        yield
    finally:
        set_rng_state(saved)


class TensorBoardSink:
    """Scalars as TensorBoard event files, written by the calling thread (tensorboardX's
    SummaryWriter queues them for a thread that writes every two minutes: a killed run lost
    up to those minutes). The file starts with a restart marker at the first step this run
    logs, so TensorBoard hides what an earlier, killed attempt logged from that step on."""

    def __init__(self, logdir: str, first_step: int):
        os.makedirs(logdir, exist_ok=True)
        # The pid in the name: two attempts started within one second get two files.
        self.events = EventsWriter(os.path.join(logdir, "events"), f".{os.getpid()}")
        self._write(step=first_step, session_log=SessionLog(status=SessionLog.START))

    def _write(self, **fields) -> None:
        self.events.write_event(Event(wall_time=time.time(), **fields))

    def add_scalar(self, tag: str, value, step: int) -> None:
        self._write(step=step, summary=scalar(tag, float(value)))

    def flush(self) -> None:
        self.events.flush()

    def close(self) -> None:
        self.events.close()


class RunFileTail:
    """The newest `trainer/step` W&B's core has written to a run's `.wandb` file, read on
    from where the last call stopped. The file is LevelDB's log format: a 7-byte file header,
    then 32 KiB blocks of fragments, each with a 7-byte header (checksum, length, type: 1 a
    whole record, 2 its first, 3 a middle, 4 its last fragment; a block's tail shorter than a
    header is padding); each record is a protobuf `Record` of wandb's."""
    BLOCK = 32768
    HEADER = 7

    def __init__(self, path: str):
        self.path = path
        self.offset = self.HEADER           # of the first record not read yet
        self.step: Optional[int] = None

    def newest_step(self) -> Optional[int]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return self.step
        pos = done = 0
        fragments: List[bytes] = []
        while True:
            left = self.BLOCK - (self.offset + pos) % self.BLOCK
            if left < self.HEADER or (pos + self.HEADER <= len(data) and data[pos + 6] == 0):
                pos += left                     # padding to the block's end
                done = done if fragments else pos
                continue
            if pos + self.HEADER > len(data):
                break
            length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
            end = pos + self.HEADER + length
            if end > len(data):
                break                           # not all written yet
            fragments.append(data[pos + self.HEADER:end])
            pos = end
            if kind in (1, 4):
                self._read_record(b"".join(fragments))
                fragments, done = [], pos
        self.offset += done
        return self.step

    def _read_record(self, raw: bytes) -> None:
        from wandb.proto import wandb_internal_pb2
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            for item in record.history.item:    # newer cores send keys as nested_key
                if (item.key or "/".join(item.nested_key)) == STEP_METRIC:
                    self.step = int(json.loads(item.value_json))


class WandbSink:
    """Scalars of one step are sent together, when the next step's first one arrives or at
    a flush; a flush also waits until W&B's core has written them to the run's file."""

    def __init__(self, run, run_file: Optional[RunFileTail]):
        self.run = run
        self.run_file = run_file
        self.step: Optional[int] = None
        self.pending: Dict[str, float] = {}
        self.sent: Optional[int] = None

    def add_scalar(self, tag: str, value, step: int) -> None:
        if step != self.step:
            self._send()
            self.step = step
        self.pending[tag] = float(value)

    def _send(self) -> None:
        if self.pending:
            self.run.log(dict(self.pending, **{STEP_METRIC: self.step}))
            self.pending = {}
            self.sent = self.step

    def flush(self) -> None:
        self._send()
        if self.run_file is None or self.sent is None:
            return
        deadline = time.monotonic() + RUN_FILE_WAIT_S
        try:
            while (self.run_file.newest_step() or 0) < self.sent:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"step {self.sent} not there after {RUN_FILE_WAIT_S:.0f} s")
                time.sleep(0.01)
        except Exception as err:    # W&B's own file: a metrics check never stops training
            logger.warning("W&B's core has not written %s (%s); checkpoints no longer wait "
                           "for it, and a kill may lose the last steps in W&B",
                           self.run_file.path, err)
            self.run_file = None

    def close(self) -> None:
        self._send()
        with untouched_random_state():
            self.run.finish()


class MetricWriter:
    """Fans each scalar out to every configured sink."""

    def __init__(self, sinks: List):
        self.sinks = sinks

    def add_scalar(self, tag: str, value, step: int) -> None:
        for sink in self.sinks:
            sink.add_scalar(tag, value, step)

    def flush(self) -> None:
        """Everything added so far is on disk (or with W&B's core) when this returns."""
        for sink in self.sinks:
            sink.flush()

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
    settings = dict(console="off", disable_code=True, save_code=False, disable_git=True,
                    x_disable_meta=True, disable_job_creation=True)
    # Older versions write the run file only in whole blocks and at the end: no flush wait.
    writes_often = "x_transaction_log_flush_interval" in wandb.Settings.model_fields
    if writes_often:
        settings["x_transaction_log_flush_interval"] = RUN_FILE_WRITE_INTERVAL_S
    with untouched_random_state():
        run_id = _run_id(exp_dir)
        kwargs = dict(project=w.project or None, entity=w.entity or None,
                      name=scrub_text(w.name or os.path.basename(os.path.abspath(exp_dir))),
                      group=scrub_text(w.group) or None,
                      tags=[scrub_text(t) for t in w.tags] or None,
                      notes=scrub_text(w.notes) or None, dir=directory, id=run_id,
                      resume="allow", config=redact_shared(to_dict(cfg)),
                      settings=wandb.Settings(**settings))
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
    return WandbSink(run, RunFileTail(run.settings.sync_file) if writes_often else None)


def open_metric_writer(cfg: Config, exp_dir: str, step: int) -> Optional[MetricWriter]:
    """Rank 0's writer; None when neither TensorBoard nor W&B is on."""
    sinks = []
    if cfg.training.tensorboard:
        sinks.append(TensorBoardSink(os.path.join(exp_dir, "tensorboard"), step + 1))
    if cfg.training.wandb.mode != "disabled":
        sinks.append(open_wandb(cfg, exp_dir))
    return MetricWriter(sinks) if sinks else None
