"""Training-step cost of a codec config on in-memory batches (no data loading): steps/s
in each phase (reconstruction; adversarial; perceptual, when the config has that phase),
peak memory, and the share of the step taken by each part, timed around the real
CodecTask.train_step.

  python tools/benchmarks/codec_train.py --config egs/tts_codec/s0/conf/codec_cpu.yaml \\
      [--steps 10] [--warmup 2] [--threads 2] [--device cpu|cuda] [overrides ...]

Parts: generator forward, split into the decoder and the rest (encoder, VQ); each
discriminator's forward (MPD, MRSD), in the discriminator step (real + detached fake) and
in the generator step (frozen); the losses (mel, the discriminators' LSGAN loss, the
generator's adversarial and feature-matching terms); the frozen teachers (distillation:
teacher, head and loss; the perceptual teacher's forward); the backward of each optimizer's
loss; each optimizer step (clip, step, zero_grad, LR). Comparing decoders at equal bitrate:
run it twice, e.g. with `model.decoder=istft` as an override. The
step context here is the trainer's (toolkit.trainer.context.TrainerStepContext) with timers: the
same scaling, clipping and freezing. Batches hold speech-like signals (harmonic tones with
vibrato in noise) of the config's segment length and batch size. Each boundary is
synchronised on CUDA, which costs a little throughput, so that time lands in its part.

Output: one line per phase with ms per step, steps/s and CPU seconds per step (all
threads; under contention from other jobs the CPU time of a one-thread run stays close to
its wall time on an idle core), peak RSS (and CUDA memory), then a table of mean ms per
step and share per part in the adversarial phase. The training time of a config follows
as max_steps x (start_fraction / reconstruction steps/s + (1 - start_fraction) /
adversarial steps/s), plus validation, checkpoints and start-up.
"""
import argparse
import contextlib
import math
import resource
import statistics
import sys
import time
from collections import defaultdict

import numpy as np
import torch


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--steps", type=int, default=10, help="timed steps per phase")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per phase first")
    p.add_argument("--batch", type=int, default=0,
                   help="segments per batch (0: the config's, as the trainer batches them)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("overrides", nargs="*", help="config overrides key=value")
    return p.parse_args(argv)


class Timers:
    """Wall time per named part, synchronised on CUDA at every boundary."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.total = defaultdict(float)
        self.on = True

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    @contextlib.contextmanager
    def part(self, name: str):
        start = self.now()
        try:
            yield
        finally:
            if self.on:
                self.total[name] += self.now() - start

    def hook(self, module: torch.nn.Module, name_of):
        """Times `module.forward` under the name name_of() gives at call time."""
        starts = []
        module.register_forward_pre_hook(lambda m, a: starts.append(self.now()))

        def done(m, a, out):
            if self.on:
                self.total[name_of()] += self.now() - starts.pop()
            else:
                starts.pop()
        module.register_forward_hook(done)

    def wrap(self, fn, name: str):
        def timed(*args, **kwargs):
            with self.part(name):
                return fn(*args, **kwargs)
        return timed


def speech_like(batch: int, samples: int, sample_rate: int, rng) -> torch.Tensor:
    """Harmonic tones (100-250 Hz, 1/k partials, vibrato) in low noise, at -20 dBFS."""
    t = np.arange(samples) / sample_rate
    out = np.zeros((batch, samples), np.float32)
    for b in range(batch):
        f0 = rng.uniform(100, 250) * (1 + 0.03 * np.sin(2 * np.pi * rng.uniform(3, 6) * t))
        phase = 2 * np.pi * np.cumsum(f0) / sample_rate
        wave = sum(np.sin(k * phase) / k for k in range(1, 20) if k * f0.max() < sample_rate / 2)
        wave = wave + 0.05 * rng.standard_normal(samples)
        out[b] = 0.1 * wave / np.sqrt(np.mean(wave ** 2))
    return torch.from_numpy(out)


def main(argv=None):
    args = get_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import toolkit.tasks  # noqa: F401
    from toolkit.config import TASKS, load_config
    from toolkit.data.datalist import BadCounter
    from toolkit.tasks.codec import task as codec_task
    from toolkit.trainer.optim import build_optimizer, build_schedule
    from toolkit.memory import release_free_memory
    from toolkit.trainer.context import TrainerStepContext as _StepContext
    from toolkit.trainer.trainer import Trainer, amp_dtype
    cfg = load_config(args.config, args.overrides)
    if cfg.task.type != "codec":
        raise SystemExit(f"{args.config}: task.type is {cfg.task.type!r}, not codec")
    device = torch.device(args.device)
    task = TASKS.get("codec")(cfg)
    torch.manual_seed(0)
    modules = {n: m.to(device).train() for n, m in task.build_modules().items()}
    groups = task.optimizer_modules()
    optimizers = {n: build_optimizer([p for m in groups[n] for p in modules[m].parameters()],
                                     cfg.optim[n]) for n in task.optimizers}
    ds = cfg.dataset
    batch_size = args.batch or (ds.max_frames_in_batch // task.segment_frames
                                if ds.max_frames_in_batch > 0 else ds.batch_size)
    total_steps = cfg.training.max_steps or 1000

    # The trainer's own step context, over a stand-in holding what it reads.
    trainer = Trainer.__new__(Trainer)
    trainer.cfg, trainer.task, trainer.device = cfg, task, device
    trainer.modules, trainer.views, trainer.wrapped = modules, dict(modules), {}
    trainer.optimizers, trainer.optimizer_modules = optimizers, groups
    trainer.amp_dtype = amp_dtype(cfg, device)
    trainer.scalers = ({n: torch.amp.GradScaler(device.type) for n in task.optimizers}
                       if trainer.amp_dtype == torch.float16 else {})
    trainer.schedules = {n: build_schedule(o, cfg.optim[n].scheduler, total_steps)
                         for n, o in optimizers.items()}
    trainer.nonfinite_run = {n: 0 for n in task.optimizers}
    trainer.nonfinite_total = dict(trainer.nonfinite_run)
    trainer.total_steps, trainer.epoch = total_steps, 0
    trainer.phase_starts, trainer.ramp_totals = {}, [(0, total_steps)]
    timers = Timers(device)
    frozen = [False]
    phase_of = lambda: "G step" if frozen[0] else "D step"
    disc = modules["discriminator"]
    for name in ("mpd", "mrsd"):
        sub = getattr(disc, name)
        if sub is not None:
            timers.hook(sub, lambda name=name: f"{name} forward ({phase_of()})")
    timers.hook(modules["generator"], lambda: "generator forward: encoder + VQ")
    timers.hook(modules["generator"].decoder, lambda: "generator forward: decoder")
    if "distill_head" in modules:
        task._distillation = timers.wrap(task._distillation,
                                         "distillation (teacher, head, loss)")
    if task.perceptual_on:
        teacher = task.teacher("perceptual", device)
        teacher.features = timers.wrap(teacher.features, "perceptual teacher forward")
    timers.hook(task.mel_loss, lambda: "loss: mel")
    for fn, label in (("discriminator_loss", "loss: discriminator LSGAN"),
                      ("generator_adversarial_loss", "loss: adversarial"),
                      ("feature_matching_loss", "loss: feature matching")):
        setattr(codec_task, fn, timers.wrap(getattr(codec_task, fn), label))

    class TimedContext(_StepContext):
        def backward(self, loss, optimizer):
            with timers.part(f"backward {optimizer}"):
                super().backward(loss, optimizer)

        def step(self, optimizer):
            with timers.part(f"optimizer step {optimizer}"):
                super().step(optimizer)

        @contextlib.contextmanager
        def frozen(self, *names):
            with super().frozen(*names):
                frozen[0] = True
                try:
                    yield
                finally:
                    frozen[0] = False

    rng = np.random.default_rng(0)
    d_start = trainer.start_step("discriminator")
    perceptual = cfg.loss.perceptual.active_from()
    p_start = (int(math.ceil(perceptual * total_steps - 1e-9))
               if cfg.loss.perceptual.unit == "fraction" else int(perceptual)) \
        if task.perceptual_on else total_steps
    phases = [("reconstruction", 0)]
    if d_start < total_steps:
        phases.append(("adversarial", max(d_start, 1) + 10))
    if p_start < total_steps and p_start > d_start:
        phases.append(("perceptual", p_start + 10))
    results = {}
    for phase, step_index in phases:
        times, cpu_times, parts = [], [], defaultdict(float)
        for i in range(args.warmup + args.steps):
            audio = speech_like(batch_size, task.segment, cfg.model.sample_rate, rng)
            batch = task.batch_of(audio.numpy(), [f"u{j}" for j in range(batch_size)])
            batch.bad = BadCounter()
            trainer.step = step_index + i
            timers.on = i >= args.warmup
            timers.total.clear()
            start, cpu = timers.now(), time.process_time()
            task.train_step(batch, TimedContext(trainer, True))
            elapsed, cpu = timers.now() - start, time.process_time() - cpu
            if device.type == "cpu" and cfg.training.malloc_trim_interval:
                release_free_memory()
            if timers.on:
                times.append(elapsed)
                cpu_times.append(cpu)
                for k, v in timers.total.items():
                    parts[k] += v
        results[phase] = (times, parts, cpu_times)

    seconds = batch_size * task.segment / cfg.model.sample_rate
    print(f"config {args.config} {' '.join(args.overrides)}".rstrip())
    print(f"device {device}, threads {torch.get_num_threads()}, batch {batch_size} x "
          f"{task.segment} samples ({seconds:g} s of audio), amp {trainer.amp_dtype}")
    print(task.describe(modules))
    for phase, (times, _, cpu_times) in results.items():
        median = statistics.median(times)
        print(f"{phase} step: median {median * 1000:.1f} ms (min {min(times) * 1000:.1f}, max "
              f"{max(times) * 1000:.1f}) over {len(times)} steps: {1 / median:.3f} steps/s, "
              f"{seconds / median:.2f} s of audio per s; CPU time {statistics.median(cpu_times) * 1000:.1f} ms "
              "per step (all threads)")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    line = f"peak RSS {rss:.0f} MiB"
    if device.type == "cuda":
        line += f", peak CUDA memory {torch.cuda.max_memory_allocated() / 2 ** 20:.0f} MiB"
    print(line)
    phase = list(results)[-1]
    times, parts, _ = results[phase]
    step_ms = 1000 * sum(times) / len(times)
    parts = dict(parts)
    # The decoder's hook runs inside the generator's: take its time out of the rest.
    decoder = parts.get("generator forward: decoder", 0.0)
    parts["generator forward: encoder + VQ"] = parts.get(
        "generator forward: encoder + VQ", 0.0) - decoder
    parts["other (glue, stats)"] = max(0.0, sum(times) - sum(parts.values()))
    print(f"\nparts of the {phase} step (mean {step_ms:.1f} ms):")
    print(f"| part | ms per step | share |\n|---|---:|---:|")
    for name, total in sorted(parts.items(), key=lambda kv: -kv[1]):
        ms = 1000 * total / len(times)
        print(f"| {name} | {ms:.1f} | {100 * ms / step_ms:.1f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
