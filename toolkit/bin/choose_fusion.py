"""Choose the weights of a head fused with zero-shot search and its verifier on a dev set
(toolkit.tasks.kws.fusion) and store them in the exported models as `fusion_weights`.

Input: the dev set's fusion components from
  python -m toolkit.bin.compute_posteriors --fuse-zero-shot --fusion-components \\
      --model exp/x/export/model.onnx --data-list data/dev/data.list --output dev_parts.ark
and the same data list, whose `kind` and `cat` fields (make_datalist from a wake-word
corpus's utt2kind/utt2cat) say which clips are positives, general negatives and
neighbours. Writes <out-dir>/fusion.json and fusion.md (every candidate's threshold, FRR
and neighbour false accepts on dev).

  python -m toolkit.bin.choose_fusion --components exp/x/fusion/dev_parts.ark \\
      --data-list data/dev/data.list --export-dir exp/x/export --out-dir exp/x/fusion
"""
import argparse
import json
import logging
import os
import sys

from toolkit.errors import DataError, cli
from toolkit.logging_utils import setup_logging

logger = logging.getLogger("choose_fusion")


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--components", required=True,
                   help="ark of key -> (T, 3K) [head | search | verifier] (compute_posteriors "
                        "--fuse-zero-shot --fusion-components)")
    p.add_argument("--data-list", required=True, help="the dev data list (with kind fields)")
    p.add_argument("--export-dir", required=True, help="exported models to store the weights in")
    p.add_argument("--out-dir", required=True, help="for fusion.json and fusion.md")
    p.add_argument("--target-fa-per-hour", type=float, default=1.0,
                   help="false alarms per hour of general negatives (default %(default)s)")
    p.add_argument("--fused-output", default="",
                   help="also write the dev set's fused scores at the chosen weights to this "
                        "ark, as compute_posteriors --fuse-zero-shot would with them stored "
                        "(utils/kws_score.sh --posteriors scores it without a second search)")
    args = p.parse_args(argv)
    if args.target_fa_per_hour < 0:
        p.error("--target-fa-per-hour must be >= 0")
    return args


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    from toolkit.export import update_metadata
    from toolkit.fileio import atomic_write_text
    from toolkit.tasks.kws import fusion
    from toolkit.tasks.kws.scoring import load_posteriors, read_data_list

    utts = read_data_list(args.data_list)
    if not any(u.kind for u in utts):
        raise DataError(f"{args.data_list}: no 'kind' fields (make_datalist of a wake-word "
                        "corpus with utt2kind writes them): positives, general negatives and "
                        "neighbours cannot be told apart")
    table = load_posteriors(args.components)
    missing = [u.key for u in utts if u.key not in table]
    if missing:
        raise DataError(f"{args.components}: {len(missing)} of {len(utts)} utterances of "
                        f"{args.data_list} missing (first: {missing[0]!r})")
    clips = [fusion.DevClip(u.kind, u.label, u.duration, u.category) for u in utts]
    best, candidates = fusion.choose_weights([table[u.key] for u in utts], clips,
                                             args.target_fa_per_hour)
    os.makedirs(args.out_dir, exist_ok=True)
    atomic_write_text(os.path.join(args.out_dir, "fusion.json"), json.dumps({
        "chosen": best, "target_fa_per_hour": args.target_fa_per_hour,
        "data_list": args.data_list,
        "candidates": [{"weights": c.weights, "threshold": c.threshold, "frr": c.frr,
                        "neighbour_fa": c.neighbour_fa} for c in candidates]}, indent=1) + "\n")
    text = fusion.markdown(best, candidates, args.target_fa_per_hour)
    atomic_write_text(os.path.join(args.out_dir, "fusion.md"), text)
    if args.fused_output:
        fusion.write_fused(args.fused_output, [(u.key, table[u.key]) for u in utts], best)
    done = update_metadata(args.export_dir, {"fusion_weights": best})
    if not done:
        raise DataError(f"{args.export_dir}: no exported model (model.onnx, model.zip, "
                        "config.json) to store the weights in")
    logger.info("fusion weights %s stored in %d exported files", best, len(done))
    print(text.split("\n\n")[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
