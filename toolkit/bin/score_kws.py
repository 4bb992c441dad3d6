"""Score keyword-spotting posteriors: DET curves, operating points, plot.

Replays the deployment decision rule (toolkit.decision) for every threshold of
a grid and writes, into --out-dir:
  det_<keyword>.txt  threshold, FA/h, FRR columns
  det.json           all curves, operating points, config
  det.png            FRR vs FA/h, one curve per keyword
  summary.txt        one line per keyword (also printed to stdout), each FRR with
                     its 95% bootstrap interval over resampled test utterances
                     (or whole speakers: --bootstrap-unit speaker)
  errors_<keyword>.txt
                     at the threshold selected for --target-fa-per-hour: every
                     false alarm (key, speaker, text, time, peak score), each
                     speaker's miss rate, every missed positive (the data
                     list's optional "spk" and "txt" fields name them)

Example:
  python -m toolkit.bin.score_kws --data-list data/test/data.list \\
      --posteriors exp/x/test_probs.ark --keywords data/dict/keywords.txt \\
      --out-dir exp/x/score
"""
import argparse
import logging
import sys

from toolkit.tasks.kws import decision, scoring
from toolkit.errors import cli, report


def _float_list(text: str):
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative numbers, got {text!r}")
    return values


def get_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m toolkit.bin.score_kws",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-list", required=True,
                        help="JSON-lines list with key, duration (s), label (keyword index or -1)")
    parser.add_argument("--posteriors", required=True,
                        help="Kaldi .ark (or .scp) of key -> frame posteriors [T, K]")
    parser.add_argument("--inventory", required=True,
                        help="keywords.txt, one phrase per line; line index = keyword index")
    parser.add_argument("--out-dir", required=True, help="directory for the outputs")
    parser.add_argument("--frame-shift-ms", type=float, default=decision.DEFAULT_FRAME_SHIFT_MS,
                        help="posterior frame shift (default %(default)s)")
    parser.add_argument("--smooth-frames", type=int, default=decision.DEFAULT_SMOOTH_FRAMES,
                        help="causal moving-average window in frames, 1 = none (default %(default)s)")
    parser.add_argument("--refractory-s", type=float,
                        default=decision.DEFAULT_REFRACTORY_FRAMES * decision.DEFAULT_FRAME_SHIFT_MS / 1000,
                        help="no new detection for this long after one (default %(default)s)")
    parser.add_argument("--target-fa-per-hour", type=float, default=1.0,
                        help="FA/h at which to select the deployment threshold (default %(default)s)")
    parser.add_argument("--fa-targets", type=_float_list, default=list(scoring.DEFAULT_FA_TARGETS),
                        help="comma-separated FA/h values to report FRR at (default 0.5,1,2)")
    parser.add_argument("--threshold-step", type=float, default=0.001,
                        help="threshold grid step over [0, 1] (default %(default)s)")
    parser.add_argument("--threshold-tail-decades", type=int, default=4, metavar="N",
                        help="also thresholds 1 - m*10^-k, m = 1..9, for the N powers of ten "
                             "below the step (0.9991 ... 0.9999999 by default), for models "
                             "whose negatives score above 1 - step (default %(default)s)")
    parser.add_argument("--max-missing-fraction", type=float,
                        default=scoring.DEFAULT_MAX_MISSING_FRACTION,
                        help="fail if more than this fraction of utterances lack posteriors "
                             "(default %(default)s)")
    parser.add_argument("--bootstrap", type=int, default=1000, metavar="N",
                        help="resample the test utterances N times and report the 95%% interval "
                             "of each FRR (0: off; default %(default)s)")
    parser.add_argument("--bootstrap-unit", choices=scoring.BOOTSTRAP_UNITS, default="utterance",
                        help="what each bootstrap draw picks: single utterances, or whole "
                             "speakers (the data list's 'spk') with all their utterances, for "
                             "the spread over another set of voices (default %(default)s)")
    parser.add_argument("--bootstrap-seed", type=int, default=0,
                        help="seed of the resampling (default %(default)s)")
    parser.add_argument("--deployed-threshold", type=float, default=None, metavar="T",
                        help="the threshold the model ships with (chosen on a dev set): also "
                             "report this set's FRR, FA/h, neighbours and accents at it")
    parser.add_argument("--plot-max-fa-per-hour", type=float, default=None,
                        help="x-axis limit of det.png (default max(5, 2.5 x largest target))")
    args = parser.parse_args(argv)
    if args.frame_shift_ms <= 0:
        parser.error("--frame-shift-ms must be > 0")
    if args.smooth_frames < 1:
        parser.error("--smooth-frames must be >= 1")
    if args.refractory_s < 0:
        parser.error("--refractory-s must be >= 0")
    if not 0 < args.threshold_step <= 1:
        parser.error("--threshold-step must be in (0, 1]")
    if not 0 <= args.threshold_tail_decades <= 6:
        parser.error("--threshold-tail-decades must be in [0, 6] (float32 posteriors resolve "
                     "about 1e-7 below 1)")
    if args.target_fa_per_hour < 0:
        parser.error("--target-fa-per-hour must be >= 0")
    if args.bootstrap < 0:
        parser.error("--bootstrap must be >= 0")
    return args


@cli
def main(argv=None) -> int:
    args = get_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # Same rounding a deployment config should use to turn seconds into frames.
    refractory_frames = int(round(args.refractory_s * 1000.0 / args.frame_shift_ms))
    thresholds = scoring.threshold_grid(args.threshold_step,
                                        tail_decades=args.threshold_tail_decades)
    try:
        result = scoring.score(args.data_list, args.posteriors, args.inventory,
                               thresholds=thresholds, smooth_frames=args.smooth_frames,
                               refractory_frames=refractory_frames, fa_targets=args.fa_targets,
                               target_fa_per_hour=args.target_fa_per_hour,
                               max_missing_fraction=args.max_missing_fraction,
                               bootstrap_replicates=args.bootstrap,
                               bootstrap_seed=args.bootstrap_seed,
                               frame_shift_ms=args.frame_shift_ms,
                               bootstrap_unit=args.bootstrap_unit,
                               deployed_threshold=args.deployed_threshold)
    except (ValueError, OSError) as err:
        return report(err)
    config = {
        "data_list": args.data_list, "posteriors": args.posteriors, "keywords": args.inventory,
        "frame_shift_ms": args.frame_shift_ms, "smooth_frames": args.smooth_frames,
        "refractory_s": args.refractory_s, "refractory_frames": refractory_frames,
        "threshold_step": args.threshold_step,
        "threshold_tail_decades": args.threshold_tail_decades, "target_fa_per_hour": args.target_fa_per_hour,
        "fa_targets": args.fa_targets, "bootstrap": args.bootstrap,
        "bootstrap_seed": args.bootstrap_seed, "bootstrap_unit": args.bootstrap_unit,
        "deployed_threshold": args.deployed_threshold,
    }
    scoring.write_outputs(args.out_dir, result, config, args.plot_max_fa_per_hour)
    for line in result.summary:
        print(line)
    logging.info("wrote DET outputs to %s", args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
