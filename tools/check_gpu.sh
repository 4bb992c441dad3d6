#!/usr/bin/env bash
# GPU checks that CI (CPU only) cannot run: CUDA AMP fp16/bf16 training through torchrun
# with NCCL-capable launch, GradScaler state saved and restored on resume, an NCCL
# all-reduce, and training-step throughput. Run on a GPU machine from the repo root:
#   bash tools/check_gpu.sh [OUT_DIR]
set -euo pipefail
out=${1:-/tmp/gpu_check_out}
work=$(mktemp -d)
mkdir -p "$out"
export PYTHONPATH="$PWD:$PWD/tests:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
nvidia-smi -L || true
python3 - <<'PY'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0),
      "bf16", torch.cuda.is_bf16_supported())
PY

echo "== NCCL all-reduce through torchrun"
cat > "$work/nccl.py" <<'PY'
import os, torch, torch.distributed as dist
dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])))
t = torch.ones(4, device="cuda") * (dist.get_rank() + 1)
dist.all_reduce(t)
print("nccl all_reduce ok:", t.tolist(), "world", dist.get_world_size(), "backend", dist.get_backend())
dist.destroy_process_group()
PY
torchrun --standalone --nproc-per-node=1 "$work/nccl.py"

echo "== tiny corpus"
python3 - "$work" <<'PY'
import sys
from train_utils import Corpus, TINY_CONFIG
import copy
cfg = copy.deepcopy(TINY_CONFIG)
cfg["dataset"]["num_workers"] = 4
Corpus(sys.argv[1], num_train=120, num_dev=20, config=cfg)
PY
args=(--config "$work/conf.yaml" --train-data "$work/train.list" --dev-data "$work/dev.list"
      --inventory "$work/keywords.txt")

for dtype in float16 bfloat16; do
  echo "== CUDA AMP $dtype: 1 epoch, then resume to 2"
  exp=$work/exp_$dtype
  utils/torchrun.sh 0 1 1 0 x -m toolkit.bin.train "${args[@]}" --exp-dir "$exp" \
    training.use_amp=true training.amp_dtype=$dtype training.max_epoch=1 2>&1 | tail -4
  python3 - "$exp" <<'PY' > "$work/scaler_before.txt"
import sys
from train_utils import latest_payload
p = latest_payload(sys.argv[1]); print(p["scaler"])
PY
  utils/torchrun.sh 0 1 1 0 x -m toolkit.bin.train "${args[@]}" --exp-dir "$exp" \
    training.use_amp=true training.amp_dtype=$dtype training.max_epoch=2 2>&1 | grep -E "resumed|finished|dev:" | tail -3
  python3 - "$exp" "$dtype" "$(cat "$work/scaler_before.txt")" <<'PY'
import sys, torch
from train_utils import latest_payload
p = latest_payload(sys.argv[1])
print(sys.argv[2], "epoch", p["epoch"], "step", p["step"], "scaler before resume:", sys.argv[3],
      "after:", p["scaler"])
assert p["epoch"] == 2
assert (p["scaler"] != {}) == (sys.argv[2] == "float16")
assert all(torch.isfinite(v).all() for v in p["model"].values() if v.is_floating_point())
PY
done

echo "== training-step throughput (in-memory batches 256 x 250 frames)"
for conf in ds_tcn mdtc; do
  for amp in none bf16 fp16; do
    python3 tools/benchmarks/train_step.py --config egs/wake_word/s0/conf/$conf.yaml \
      --device cuda --amp $amp --steps 50 | tee -a "$out/throughput.txt"
  done
done
echo "GPU checks passed"
