"""Where a wake-word training process's memory goes, phase by phase, in one process (one
thread, precomputed features, kws_throughput.py's model and batches):

  python tools/benchmarks/kws_memory_breakdown.py --data /tmp/kws_corpus/data [--steps 12] [--plain]

Printed: resident memory (anonymous / file-backed, MB, from /proc/self/smaps_rollup) after
the imports, after the trainer is built (data lists, batch plan, model, optimizer) and after
reading one epoch's batches without training (the feature store and collation); the
process's peak RSS (getrusage) before and after --steps training steps on the epoch's
longest batches; the bytes autograd keeps for the backward pass of the longest batch.
--plain takes the plain modules instead of the lean training pass (toolkit.nn.lean). This
script keeps its environment (the training binary preloads mimalloc itself): start it with
`LD_PRELOAD=$(python -c 'from toolkit.memory import mimalloc_library; print(mimalloc_library())')`
and without to see the allocator's share.
"""
import argparse
import contextlib
import os
import resource
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def rollup():
    fields = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1])
    return fields["Rss"] // 1024, fields["Anonymous"] // 1024


def report(phase, peak=None):
    rss, anon = rollup()
    extra = f"  peak RSS {peak} MB" if peak is not None else ""
    print(f"{phase:<44} RSS {rss:5d} MB  anon {anon:5d}  file {rss - anon:4d}{extra}",
          flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="the corpus's data dir (kws_throughput --build)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--plain", action="store_true")
    args = p.parse_args(argv)
    report("start (python)")
    import torch
    import yaml
    import toolkit.tasks  # noqa: F401  (registers the tasks)
    from kws_throughput import CONFIG
    from toolkit.data.plan import rank_batches
    from toolkit.nn.lean import plain_pass
    from toolkit.trainer.distributed import DistInfo
    from toolkit.trainer.run import resolve_config
    from toolkit.trainer.context import TrainerStepContext as _StepContext
    from toolkit.trainer.trainer import Trainer
    torch.set_num_threads(1)
    report("imports (torch, toolkit)")
    d = args.data
    conf = os.path.join(tempfile.mkdtemp(prefix="kws_memory_"), "conf.yaml")
    with open(conf, "w") as f:
        yaml.safe_dump(CONFIG, f)
    ns = argparse.Namespace(config=conf, train_data=f"{d}/train/fbank/data.list",
                            dev_data=f"{d}/dev/fbank/data.list",
                            inventory=f"{d}/dict/keywords.txt",
                            cmvn=f"{d}/train/global_cmvn.json", overrides=[], units=None,
                            num_gpus=None, init_checkpoint=None, task_inputs=None)
    cfg, task_cls, inventory = resolve_config(ns)
    task = task_cls(cfg, inventory)
    trainer = Trainer(cfg, task, tempfile.mkdtemp(prefix="kws_memory_exp_"),
                      DistInfo(1, 0, 0, 1, torch.device("cpu")))
    report("trainer built (lists, plan, model, optim)")
    plan = trainer._global_plan(0)
    loader = trainer.train_list.loader(rank_batches(plan, 0, 1), trainer.train_builder, 0, 0,
                                       0, 2, 0)
    longest, frames = [], 0
    for batch in loader:
        frames += batch.feats.numel() // batch.feats.shape[-1]
        longest.append(batch)
        longest = sorted(longest, key=lambda b: -b.feats.shape[1])[:args.steps]
    report(f"one epoch read ({frames} padded frames)")
    model = trainer.modules["model"].train()
    saved = 0

    def pack(t):
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    mode = plain_pass() if args.plain else contextlib.nullcontext()
    with mode:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out, _ = model(longest[0].feats)
        out.sum().backward()
        model.zero_grad(set_to_none=True)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
        for batch in longest:
            task.train_step(batch, _StepContext(trainer, True, True, 1.0, 1.0))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
    shape = tuple(longest[0].feats.shape)
    print(f"autograd keeps {saved / 2 ** 20:.0f} MB for a batch of {shape} "
          f"({'plain modules' if args.plain else 'lean pass'})")
    print(f"peak RSS after one forward and backward of it {before} MB")
    report(f"after {len(longest)} training steps", peak)
    print(f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '(unset)')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
