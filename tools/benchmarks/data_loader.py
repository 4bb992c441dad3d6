"""Data pipeline speed: utterances/s and audio-seconds/s of ONE loader worker for each
input form (raw WAV list, tar shards, precomputed feats), and the ratio

    (training step time with the real loader) / (step time on the same batches in memory)

for a training config (goal <= 1.10 with the configured worker count).

  python tools/benchmarks/data_loader.py --config egs/wake_word/s0/conf/ds_tcn.yaml \\
      --raw egs/wake_word/s0/data/train/data.list \\
      --feats egs/wake_word/s0/data/train/fbank/data.list [--shards DIR/shards.list]
"""
import argparse
import os
import time

import torch

from toolkit.config import load_config
from toolkit.data.datalist import DataList
from toolkit.data.dataset import (BatchDataset, UtteranceProcessor, make_loader, open_source,
                                  plan_batches, workers_per_rank)
from toolkit.tasks.kws.losses import build_loss
from toolkit.tasks.kws.models import build_model
from toolkit.trainer.clip import clip_and_step
from toolkit.trainer.optim import build_optimizer


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--raw", help="data list with wav entries")
    p.add_argument("--feats", help="data list with feat entries (compute_feats output)")
    p.add_argument("--shards", help="shard list (make_shards output)")
    p.add_argument("--batches", type=int, default=20, help="batches per measurement")
    p.add_argument("overrides", nargs="*")
    return p.parse_args(argv)


def worker_speed(name, make_batches):
    """Throughput of one worker: the loader runs in one subprocess, the main process
    only receives batches, so this is what a single worker delivers."""
    start = time.perf_counter()
    utts = seconds = 0.0
    for batch in make_batches():
        utts += len(batch)
        seconds += batch.audio_seconds
    elapsed = time.perf_counter() - start
    print(f"{name:>6}: {utts / elapsed:8.0f} utt/s  {seconds / elapsed:8.0f} audio-s/s per worker "
          f"({int(utts)} utterances)")


def list_batches(path, cfg, count, workers):
    datalist = DataList.load(path)
    processor = UtteranceProcessor(cfg.dataset, seed=cfg.training.seed, train=True,
                                   from_features=datalist.has_features())
    batches = plan_batches(datalist, cfg.dataset, cfg.training.seed, 0, True)[:count]
    dataset = BatchDataset(datalist, batches, processor, epoch=0)
    return make_loader(dataset, 0, workers, cfg.dataset.prefetch_factor, cfg.training.seed)


def shard_batches(path, cfg, count, workers):
    source = open_source("shard", path)
    processor = UtteranceProcessor(cfg.dataset, seed=cfg.training.seed, train=True)
    batches = source.plan(cfg.dataset, cfg.training.seed, 0, True)[:count]
    return source.loader(batches, processor, 0, 0, workers, cfg.dataset.prefetch_factor,
                         cfg.training.seed)


def step_ratio(cfg, path, count):
    cfg.model.input_dim = cfg.model.input_dim or cfg.dataset.feature.num_mel_bins
    cfg.model.num_outputs = cfg.model.num_outputs or 1
    torch.manual_seed(0)
    model = build_model(cfg.model).train()
    loss_fn = build_loss(cfg.loss)
    optimizer = build_optimizer(model.parameters(), cfg.optim)

    def step(batch):
        logits, _ = model(batch.feats)
        loss, _ = loss_fn(logits, batch.lengths, batch.labels)
        loss.backward()
        clip_and_step(model.parameters(), optimizer, cfg.training.grad_clip)
        optimizer.zero_grad(set_to_none=True)

    workers = workers_per_rank(cfg.dataset.num_workers, 1)
    in_memory = list(list_batches(path, cfg, count, workers))
    for batch in in_memory[:3]:
        step(batch)                                   # warm-up
    start = time.perf_counter()
    for batch in in_memory:
        step(batch)
    memory_time = time.perf_counter() - start
    start = time.perf_counter()
    utts = 0
    for batch in list_batches(path, cfg, count, workers):
        step(batch)
        utts += len(batch)
    loader_time = time.perf_counter() - start
    print(f"training step with the real loader ({workers} workers): {loader_time / count * 1000:.1f} "
          f"ms/step ({utts / loader_time:.0f} utt/s); same batches in memory: "
          f"{memory_time / count * 1000:.1f} ms/step; ratio {loader_time / memory_time:.3f}")


def main(argv=None):
    args = get_args(argv)
    cfg = load_config(args.config, args.overrides)
    torch.set_num_threads(max(1, (os.cpu_count() or 2)))
    if args.raw:
        worker_speed("raw", lambda: list_batches(args.raw, cfg, args.batches, 1))
    if args.shards:
        worker_speed("shards", lambda: shard_batches(args.shards, cfg, args.batches, 1))
    if args.feats:
        worker_speed("feats", lambda: list_batches(args.feats, cfg, args.batches, 1))
    target = args.feats or args.raw
    if target:
        step_ratio(cfg, target, args.batches)


if __name__ == "__main__":
    main()
