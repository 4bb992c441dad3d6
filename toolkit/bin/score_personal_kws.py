"""Measure a personal wake word on a test set of several voices: each voice in turn is the
enrolled user (--enrol-clips of its keyword clips on which the detector fired, never
scored), the others are the household's other talkers. The detector runs ungated once
over every clip at its own threshold (the one a user gets: stored in the model, or
--threshold); each firing's window is embedded once by the speaker encoder; the gate's
threshold per voice is calibrated from its enrolment and the encoder's cohort alone
(toolkit.tasks.kws.enrol). Reported per voice and averaged over voices: FRR without and
with the gate, impostors accepted (the other voices' keyword clips, alone and in carrier
phrases), false alarms per hour on the general negatives (neg and noise clips), and the
impostor acceptance when each voice's threshold is moved to the --match-frr FRR.

  python -m toolkit.bin.score_personal_kws --model exp/jarvis/export/model.onnx \\
      --fuse-zero-shot --test-dir data/outside_kokoro/test --out-dir exp/jarvis/score_personal_kokoro \\
      --negative-reference data/dev/data.list
  python -m toolkit.bin.score_personal_kws ... --test-dir data/dev --user-lean 0,0.25,0.5,0.75
      # the gate calibration's lean, chosen on the dev set (one table row each)

Writes OUT_DIR/results.json, results.md (one table row, also printed) and plan.json (the
enrolment and the test split, for tools/benchmarks/oww_verifier.py --plan)."""
import argparse
import json
import logging
import sys

from toolkit.errors import cli
from toolkit.logging_utils import setup_logging

logger = logging.getLogger("score_personal_kws")


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="model.onnx, model.zip, .safetensors or .pt")
    src.add_argument("--keywords", help="zero-shot: comma-separated keywords")
    p.add_argument("--fuse-zero-shot", action="store_true",
                   help="with --model on phone posteriors: the fused score (fused_threshold)")
    p.add_argument("--threshold", type=float, default=None,
                   help="detection threshold (default: the model's; zero-shot: the search's)")
    p.add_argument("--fa-per-hour", type=float, default=None,
                   help="set the detector's threshold at this many false alarms per hour of the "
                        "test set's general negatives (neg, noise) instead of its stored one")
    p.add_argument("--test-dir", required=True,
                   help="Kaldi dir of a wake-word test set (wav.scp, utt2kind, utt2spk)")
    p.add_argument("--speaker-model", default="",
                   help="the gate's encoder (default toolkit.tasks.kws.enrol.DEFAULT_SPEAKER_ENCODER)")
    p.add_argument("--enrol-clips", type=int, default=3)
    p.add_argument("--context-s", type=float, default=None,
                   help="audio either side of the keyword that is embedded (default the gate's)")
    p.add_argument("--seed", type=int, default=777, help="which clips each voice enrols with")
    p.add_argument("--match-frr", type=float, default=None,
                   help="also report impostor acceptance at this FRR %% (default: the gated FRR)")
    p.add_argument("--negative-reference", default="",
                   help="data list of other speech (not test voices) for a peer's verifier, "
                        "written into plan.json (its first --num-reference entries)")
    p.add_argument("--num-reference", type=int, default=60)
    p.add_argument("--user-lean", default="",
                   help="the gate calibration's user_lean (toolkit.tasks.kws.enrol.USER_LEAN); "
                        "a comma list tables each (choose it on a dev set, never a test)")
    p.add_argument("--name", default="", help="the test set's name in the table")
    p.add_argument("--out-dir", required=True)
    args = p.parse_args(argv)
    try:
        args.user_lean = [float(x) for x in args.user_lean.split(",") if x.strip()]
    except ValueError:
        p.error(f"--user-lean {args.user_lean!r}: expected numbers in [0, 1], e.g. 0.33,0.5")
    if any(not 0.0 <= x <= 1.0 for x in args.user_lean):
        p.error("--user-lean: each value must be in [0, 1]")
    if args.enrol_clips < 1:
        p.error("--enrol-clips must be >= 1")
    if args.fa_per_hour is not None and args.threshold is not None:
        p.error("--fa-per-hour sets the threshold: no --threshold with it")
    if args.fa_per_hour is not None and args.fa_per_hour <= 0:
        p.error("--fa-per-hour must be > 0")
    if args.fuse_zero_shot and not args.model:
        p.error("--fuse-zero-shot fuses a --model with zero-shot search of its keywords")
    return args


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    import os

    from toolkit.data.datalist import DataList
    from toolkit.tasks.kws import enrol, personal_eval
    from toolkit.tasks.kws.detector import Detector
    from toolkit.tasks.speaker.embed import Embedder
    if args.model:
        detector = Detector.from_path(args.model, args.threshold,
                                      fuse_zero_shot=args.fuse_zero_shot)
    else:
        keywords = [k.strip() for k in args.keywords.split(",") if k.strip()]
        detector = Detector.zero_shot(keywords, threshold=args.threshold)
    encoder = args.speaker_model or enrol.DEFAULT_SPEAKER_ENCODER
    context_s = enrol.DEFAULT_CONTEXT_S if args.context_s is None else args.context_s
    embedder = Embedder.from_path(encoder)
    cohort = enrol.load_cohort(encoder)
    clips = personal_eval.read_test_set(args.test_dir)
    if args.fa_per_hour is not None:
        detector = Detector(detector.backend, personal_eval.negatives_threshold(
            detector, clips, args.fa_per_hour))
    logger.info("%s: %d clips; detector %s at threshold %.4f; gate %s (%s)", args.test_dir,
                len(clips), args.model or "zero-shot", detector.threshold, encoder,
                "AS-Norm" if cohort is not None else "cosine")
    personal_eval.scan(detector, embedder, clips, context_s)
    enrolment = personal_eval.pick_enrolment(clips, args.enrol_clips, args.seed)
    name = args.name or os.path.basename(os.path.normpath(args.test_dir))
    rows = {}
    for lean in args.user_lean or [enrol.USER_LEAN]:
        result = personal_eval.evaluate(clips, enrolment, cohort, user_lean=lean)
        rows[f"{name}, user_lean {lean:.2f}" if args.user_lean else name] = result
        result["user_lean"] = lean
    match = result["mean"]["frr_gated"] if args.match_frr is None else args.match_frr
    result["ia_at_frr"] = {"frr": match, "ia": personal_eval.ia_at_frr(result, match)}
    result.update({"test_dir": args.test_dir, "model": args.model or args.keywords,
                   "threshold": detector.threshold, "fa_per_hour_target": args.fa_per_hour, "speaker_model": encoder,
                   "scoring": "as-norm" if cohort is not None else "cosine",
                   "enrol_clips": args.enrol_clips, "context_s": context_s,
                   "enrolment": enrolment})
    if len(rows) > 1:
        result["sweep"] = {k: dict(r["mean"], user_lean=r["user_lean"]) for k, r in rows.items()}
    os.makedirs(args.out_dir, exist_ok=True)
    table = personal_eval.format_table(rows)
    from toolkit.fileio import atomic_write_text
    atomic_write_text(os.path.join(args.out_dir, "results.json"),
                      json.dumps(personal_eval.jsonable(result), indent=1) + "\n")
    atomic_write_text(os.path.join(args.out_dir, "results.md"), table)
    references = []
    if args.negative_reference:
        entries = DataList.load(args.negative_reference, require_label=False)
        references = [entries.entry(i)["wav"] for i in range(min(len(entries), args.num_reference))]
    keyword = ",".join(detector.keywords)
    personal_eval.write_plan(os.path.join(args.out_dir, "plan.json"), keyword, clips, enrolment,
                             references)
    print(table, end="")
    print(f"impostors accepted at {match:.1f} % FRR (one speaker threshold for every voice): "
          f"{result['ia_at_frr']['ia']:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
