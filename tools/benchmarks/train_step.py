"""Training-step throughput of a model config on in-memory batches (no data loading):
forward + loss + backward + clipped optimizer step, on CPU or CUDA, fp32/fp16/bf16.

  python tools/benchmarks/train_step.py --config egs/wake_word/s0/conf/ds_tcn.yaml \\
      --device cuda --amp bf16 --batch 256 --frames 250
"""
import argparse
import time

import torch

from toolkit.config import load_config
from toolkit.tasks.kws.losses import build_loss
from toolkit.tasks.kws.models import build_model, count_parameters
from toolkit.trainer.clip import clip_and_step
from toolkit.trainer.optim import build_optimizer

DTYPES = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--amp", choices=sorted(DTYPES), default="none")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--frames", type=int, default=250, help="frames per utterance (10 ms each)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--num-outputs", type=int, default=1)
    p.add_argument("overrides", nargs="*")
    return p.parse_args(argv)


def main(argv=None):
    args = get_args(argv)
    cfg = load_config(args.config, args.overrides)
    cfg.model.input_dim = cfg.model.input_dim or cfg.dataset.feature.num_mel_bins
    cfg.model.num_outputs = args.num_outputs
    device = torch.device(args.device)
    model = build_model(cfg.model).to(device).train()
    loss_fn = build_loss(cfg.loss)
    optimizer = build_optimizer(model.parameters(), cfg.optim)
    dtype = DTYPES[args.amp]
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
    feats = torch.randn(args.batch, args.frames, cfg.model.input_dim, device=device) * 3 + 10
    lengths = torch.full((args.batch,), args.frames, device=device)
    labels = torch.randint(-1, args.num_outputs, (args.batch,), device=device)

    def step():
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits, _ = model(feats)
        loss, _ = loss_fn(logits, lengths, labels)
        (scaler.scale(loss) if scaler else loss).backward()
        clip_and_step(model.parameters(), optimizer, cfg.training.grad_clip, scaler)
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    per_step = elapsed / args.steps
    print(f"{cfg.model.type} ({count_parameters(model)} params) {args.device} amp={args.amp} "
          f"batch {args.batch}x{args.frames} frames: {1000 * per_step:.2f} ms/step, "
          f"{args.batch / per_step:.0f} utt/s, {args.batch * args.frames / 100 / per_step:.0f} "
          f"audio-s/s")


if __name__ == "__main__":
    main()
