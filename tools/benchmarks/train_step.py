"""Training-step cost of a task config on in-memory batches (no data loading): forward,
loss, backward and the clipped optimizer step, with a per-part profile and the achieved
FLOP/s against a measured GEMM peak.

  python tools/benchmarks/train_step.py --config egs/wake_word/s0/conf/ds_tcn.yaml \\
      --batch 40 --frames 250 [--compile] [--peak] [--profile] [overrides ...]

Prints: seconds per step (median of --steps after --warmup), FLOPs per step (3 x the
forward FLOPs that torch.utils.flop_counter counts: its backward count of grouped and
depthwise convolutions ignores the groups, 10.5 G instead of 0.08 G for one 256-channel
depthwise layer here), GFLOP/s and the share of the GEMM peak, and with --profile the top
operators by self CPU time. Training options (malloc trimming, thread
count) are those the trainer uses.
"""
import argparse
import statistics
import sys
import time

import torch


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--batch", type=int, default=40, help="utterances per batch")
    p.add_argument("--frames", type=int, default=250, help="frames per utterance")
    p.add_argument("--vary", type=int, default=0,
                   help="vary the frame count by up to this much per step (as bucketing does)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--trim-interval", type=int, default=-1,
                   help="malloc_trim every N steps (-1: the config's training.malloc_trim_interval)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (inductor)")
    p.add_argument("--peak", action="store_true", help="also measure the fp32 GEMM peak")
    p.add_argument("--profile", action="store_true", help="print the top operators")
    p.add_argument("overrides", nargs="*")
    return p.parse_args(argv)


def gemm_peak(n: int = 2048, repeats: int = 10) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(2):
        a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * n ** 3 * repeats / (time.perf_counter() - start) / 1e9


def main(argv=None):
    args = get_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import numpy as np

    import toolkit.tasks  # noqa: F401
    from toolkit.config import apply_overrides, load_yaml
    from toolkit.config import TASKS, resolve_config
    from toolkit.data.datalist import BadCounter
    from toolkit.trainer.clip import clip_and_step
    from toolkit.trainer.optim import build_optimizer
    from toolkit.memory import release_free_memory
    raw = apply_overrides(load_yaml(args.config), args.overrides)
    task_type = raw.get("task", {}).get("type")
    inventory = ["keyword"] if task_type == "kws" else [f"c{i}" for i in range(10)]
    cfg, _ = resolve_config(raw, source=args.config, inventory=inventory)
    task_cls = TASKS.get(cfg.task.type)
    task = task_cls(cfg, inventory)
    torch.manual_seed(0)
    modules = task.build_modules()
    model = modules["model"].train()
    params = [p for m in modules.values() for p in m.parameters()]
    optimizer = build_optimizer(params, cfg.optim["model"])
    trim = cfg.training.malloc_trim_interval if args.trim_interval < 0 else args.trim_interval
    if args.compile:
        model = torch.compile(model, dynamic=True)
    rng = np.random.default_rng(0)
    dim = cfg.dataset.feature.num_mel_bins

    def batch(step):
        from toolkit.tasks.kws.data import collate
        frames = args.frames + (int(rng.integers(-args.vary, args.vary + 1)) if args.vary else 0)
        feats = [rng.standard_normal((frames, dim)).astype(np.float32) for _ in range(args.batch)]
        labels = [0 if i % 4 == 0 else -1 for i in range(args.batch)]
        ends = [frames - 20 if l == 0 else -1 for l in labels]
        return collate([f"u{i}" for i in range(args.batch)], feats, labels, 0.0, BadCounter(),
                       dim, None, ends)

    def step(b):
        out = model(b.feats)
        loss, _ = task._loss(out, b, torch.device("cpu"), 0, 1)
        loss.backward()
        clip_and_step(params, optimizer, cfg.training.grad_clip)
        optimizer.zero_grad(set_to_none=True)

    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(batch(0).feats)
    flops = 3 * counter.get_total_flops()
    times = []
    for i in range(args.warmup + args.steps):
        b = batch(i)
        start = time.perf_counter()
        step(b)
        if trim and (i + 1) % trim == 0:
            release_free_memory()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    import resource
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"config {args.config} {' '.join(args.overrides)}")
    print(f"threads {torch.get_num_threads()}, batch {args.batch} x {args.frames} frames, "
          f"trim every {trim or 'never'}, compile {args.compile}")
    print(f"step: median {median * 1000:.1f} ms (min {min(times) * 1000:.1f}, max "
          f"{max(times) * 1000:.1f}) over {len(times)} steps; {1 / median:.2f} steps/s")
    print(f"FLOPs per step {flops / 1e9:.2f} G -> {flops / median / 1e9:.1f} GFLOP/s")
    print(f"process: CPU user {usage.ru_utime:.1f} s, system {usage.ru_stime:.1f} s, minor page "
          f"faults {usage.ru_minflt}, peak RSS {usage.ru_maxrss / 2 ** 20:.2f} GB")
    if args.peak:
        peak = gemm_peak()
        print(f"fp32 GEMM peak (2048x2048, {torch.get_num_threads()} threads): {peak:.1f} GFLOP/s;"
              f" the step reaches {100 * flops / median / 1e9 / peak:.1f} % of it")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(3):
                step(batch(i))
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    return 0


if __name__ == "__main__":
    sys.exit(main())
