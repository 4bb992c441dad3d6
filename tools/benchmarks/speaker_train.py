"""Speaker-embedding training cost on this CPU.

1. Throughput of the training step (fbank chunks in memory -> embedding network -> AAM
   head -> cross entropy -> backward -> SGD step) for ResNet34 and ECAPA-TDNN C=512 and
   C=1024 (80 bins, 2 s chunks, random weights): chunks/s by the wall clock and per CPU
   second of the process (the second is what a busy machine still measures fairly), and
   the peak RSS. Each model runs in a fresh subprocess, so each peak is its own.
2. With --wav-list (and --feat-list), the share of a training step spent waiting for the
   next batch: the real loader of the speaker task (random chunks, the config's
   augmentation, fbank) from WAVs with each worker count of --workers, and from
   precomputed features (compute_feats output) in the training process.

  python tools/benchmarks/speaker_train.py                       # part 1, all cores
  python tools/benchmarks/speaker_train.py --models resnet34 --batch 16 --steps 5 \\
      --wav-list data/train/data.list --feat-list data/train/fbank/data.list \\
      --config egs/tts_speakers/v1/conf/resnet.yaml --workers 0,1,2
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

MODELS = {
    "resnet34": {"type": "resnet", "embed_dim": 256, "num_blocks": [3, 4, 6, 3],
                 "base_channels": 32},
    "ecapa_c512": {"type": "ecapa_tdnn", "embed_dim": 192, "channels": 512},
    "ecapa_c1024": {"type": "ecapa_tdnn", "embed_dim": 192, "channels": 1024},
}


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help="comma list of " + ",".join(MODELS))
    p.add_argument("--batch", type=int, default=32, help="chunks per step")
    p.add_argument("--frames", type=int, default=200, help="frames per chunk")
    p.add_argument("--bins", type=int, default=80)
    p.add_argument("--speakers", type=int, default=5994, help="classes of the head")
    p.add_argument("--steps", type=int, default=5, help="timed steps (after 2 warm-up)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    p.add_argument("--config", help="speaker config for part 2 (model, features, augmentation)")
    p.add_argument("--wav-list", help="part 2: data list with wav entries (labels: speakers)")
    p.add_argument("--feat-list", help="part 2: the same utterances' feature list")
    p.add_argument("--workers", default="0,2", help="part 2: worker counts for the WAV list")
    p.add_argument("--noise-list", default="", help="part 2: dataset.noise.noise_list")
    p.add_argument("--rir-list", default="", help="part 2: dataset.reverb.rir_list")
    p.add_argument("--loader-batches", type=int, default=10, help="part 2: batches per measurement")
    p.add_argument("--one", help=argparse.SUPPRESS)      # child: measure this model only
    p.add_argument("overrides", nargs="*", help="part 2: config overrides")
    return p.parse_args(argv)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def build(model_cfg: dict, bins: int, speakers: int):
    import toolkit.tasks  # noqa: F401
    from toolkit.tasks.speaker.heads import SPEAKER_HEADS, build_speaker_head
    from toolkit.tasks.speaker.models import SPEAKER_MODELS, build_speaker_model
    cfg = dict(model_cfg, input_dim=bins)
    model = build_speaker_model(SPEAKER_MODELS.get(cfg["type"]).Config(**cfg))
    head_cfg = SPEAKER_HEADS.get("aam_softmax").Config(type="aam_softmax", num_classes=speakers)
    return model, build_speaker_head(head_cfg, cfg["embed_dim"])


def sgd_step(model, head, optimizer, feats, labels, margin=0.2):
    import torch.nn.functional as F
    loss = F.cross_entropy(head(model(feats), labels, margin), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def measure_one(args) -> dict:
    import torch
    torch.manual_seed(0)
    model, head = build(MODELS[args.one], args.bins, args.speakers)
    model.train()
    optimizer = torch.optim.SGD(list(model.parameters()) + list(head.parameters()), lr=0.01,
                                momentum=0.9, nesterov=True)
    feats = torch.randn(args.batch, args.frames, args.bins)
    labels = torch.randint(0, args.speakers, (args.batch,))
    walls, cpus = [], []
    for i in range(2 + args.steps):
        w, c = time.perf_counter(), time.process_time()
        sgd_step(model, head, optimizer, feats, labels)
        if i >= 2:
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    return {"model": args.one, "params": sum(p.numel() for p in model.parameters()),
            "threads": torch.get_num_threads(), "chunks_per_s": args.batch / wall,
            "chunks_per_cpu_s": args.batch / cpu, "step_s": wall, "peak_rss_mb": peak_rss_mb()}


def throughput(args) -> None:
    print(f"training step: batch {args.batch} x {args.frames} frames x {args.bins} bins, AAM "
          f"head over {args.speakers} speakers, SGD; median of {args.steps} steps")
    for name in args.models.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--one", name, "--batch", str(args.batch),
               "--frames", str(args.frames), "--bins", str(args.bins), "--speakers",
               str(args.speakers), "--steps", str(args.steps), "--threads", str(args.threads)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            print(f"{name}: failed\n{out.stderr[-2000:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{name:>12}: {r['params'] / 1e6:6.2f} M params, {r['threads']} threads: "
              f"{r['chunks_per_s']:7.1f} chunks/s ({r['step_s']:.2f} s/step), "
              f"{r['chunks_per_cpu_s']:7.1f} chunks per CPU-s, peak RSS {r['peak_rss_mb']:.0f} MB")


def loader_share(args) -> None:
    """Waiting share of the step for each input form (part 2)."""
    import numpy as np
    import torch
    import toolkit.tasks  # noqa: F401
    from toolkit.config import apply_overrides, load_yaml
    from toolkit.data.datalist import DataList
    from toolkit.data.pipeline import FeaturePipeline
    from toolkit.config import resolve_config
    from toolkit.data.sources import open_source
    from toolkit.tasks.speaker.task import SpeakerTask
    overrides = list(args.overrides)
    if args.noise_list:
        overrides.append(f"dataset.noise.noise_list={args.noise_list}")
    if args.rir_list:
        overrides.append(f"dataset.reverb.rir_list={args.rir_list}")
    labels = [json.loads(line)["label"] for line in open(args.wav_list, encoding="utf-8")]
    inventory = [f"s{i}" for i in range(max(labels) + 1)]
    cfg, _ = resolve_config(apply_overrides(load_yaml(args.config), overrides),
                            source=args.config, inventory=inventory)
    task = SpeakerTask(cfg, inventory)
    torch.manual_seed(0)
    modules = task.build_modules()
    model, head = modules["model"].train(), modules["head"]
    optimizer = torch.optim.SGD(list(model.parameters()) + list(head.parameters()), lr=0.01,
                                momentum=0.9, nesterov=True)
    noise = DataList.load(args.noise_list, require_label=False) if args.noise_list else None
    rirs = DataList.load(args.rir_list, require_label=False) if args.rir_list else None
    d = cfg.dataset
    print(f"loader: {args.config} {' '.join(args.overrides)}; model {cfg.model.type}, batch "
          f"{d.batch_size} x {cfg.task.chunk_frames} frames, noise prob "
          f"{d.noise.prob.final if noise else 0:g}, reverb prob {d.reverb.prob.final if rirs else 0:g}, "
          f"{torch.get_num_threads()} training threads")
    forms = [("wav", args.wav_list, int(w)) for w in args.workers.split(",")]
    if args.feat_list:
        forms.append(("feats", args.feat_list, 0))
    for form, path, workers in forms:
        source = open_source("auto", path, task.data_requirements("train"), d, task.example_frames)
        batches = source.plan(d, cfg.training.seed, 0, True)[:args.loader_batches + 1]
        builder = task.example_builder(FeaturePipeline(d, cfg.training.seed, True, noise, rirs,
                                                       len(batches), len(batches)))
        loader = source.loader(batches, builder, 0, 0, workers, d.prefetch_factor,
                               cfg.training.seed)
        waits, steps = [], []
        it = iter(loader)
        for i in range(len(batches)):
            t0 = time.perf_counter()
            batch = next(it)
            t1 = time.perf_counter()
            sgd_step(model, head, optimizer, batch.feats, batch.labels)
            t2 = time.perf_counter()
            if i:                       # the first batch waits for the workers to start
                waits.append(t1 - t0)
                steps.append(t2 - t1)
        del it
        share = sum(waits) / (sum(waits) + sum(steps))
        print(f"{form:>5} {workers} workers: {np.mean(steps) * 1000:7.0f} ms compute, "
              f"{np.mean(waits) * 1000:7.0f} ms waiting per step -> {100 * share:5.1f} % of the "
              f"step waiting for data")


def main(argv=None) -> int:
    args = get_args(argv)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    if args.one:
        print(json.dumps(measure_one(args)))
        return 0
    throughput(args)
    if args.wav_list:
        if not args.config:
            print("--wav-list needs --config", file=sys.stderr)
            return 2
        loader_share(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
