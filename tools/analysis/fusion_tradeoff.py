"""Every fusion-weight candidate of toolkit.tasks.kws.fusion on one scored set, as a product
is judged: FRR at the set's own 1 FA/h threshold of general negatives, neighbours firing
and accent variants accepted there. For reading a trade-off on outside test sets after
the weights were chosen on the dev set (choose_fusion), never for choosing them.

  python -m toolkit.bin.compute_posteriors --model exp/x/export/model.onnx --fuse-zero-shot \\
      --fusion-components --data-list data/outside_kokoro/test/data.list --output parts.ark
  python tools/analysis/fusion_tradeoff.py --components parts.ark \\
      --data-list data/outside_kokoro/test/data.list
"""
import argparse
import sys

import numpy as np


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--components", required=True, help="compute_posteriors --fusion-components ark")
    p.add_argument("--data-list", required=True, help="the scored list (with kind fields)")
    p.add_argument("--target-fa-per-hour", type=float, default=1.0)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = get_args(argv)
    from toolkit.tasks.kws import fusion
    from toolkit.tasks.kws.scoring import load_posteriors, read_data_list
    utts = read_data_list(args.data_list)
    table = load_posteriors(args.components)
    clips = [fusion.DevClip(u.kind, u.label, u.duration, u.category) for u in utts]
    parts = [fusion.split_components(np.asarray(table[u.key], np.float32)) for u in utts]
    accent = np.array([u.kind == "accent" for u in utts])
    print("| head | search | verifier | FRR | neighbours fire | accent accepted |")
    print("|---:|---:|---:|---:|---:|---:|")
    for weights in fusion.grid():
        peaks = fusion.fused_peaks(parts, clips, weights)
        thr, frr, fa = fusion.evaluate(peaks, clips, args.target_fa_per_hour)
        acc = float(np.mean(peaks[accent] >= thr)) if accent.any() and thr is not None else None
        cells = ["—" if x is None else f"{100 * x:.1f}%" for x in (frr, fa, acc)]
        print(f"| {weights['head']:g} | {weights['search']:g} | {weights['verifier']:g} | "
              + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
