"""Speaker verification scoring: cosine scores of a trial list from embeddings, with
mean subtraction and length normalisation, optionally adaptive s-norm (AS-Norm, top-N of
a cohort); EER and minDCF (p_target 0.01 and 0.05), a DET curve PNG, summary.txt and
result.json.

Trial lists: VoxCeleb (`1 id1/utt.wav id2/utt.wav`) or Kaldi (`enroll test target`);
keys are looked up in the embeddings as given, then without the `.wav` extension, then
with `/` as `-` (Kaldi-style utterance ids such as id10270-x6uYqmx31kE-00001).

  python -m toolkit.bin.score_speaker --trials data/trials/vox1_O.txt \\
      --embeddings exp/resnet/embeddings/test/embeddings.scp \\
      --cohort exp/resnet/embeddings/train/speaker_embeddings.scp --as-norm-top 300 \\
      --out-dir exp/resnet/score
"""
import argparse
import json
import logging
import os
import sys

import numpy as np

from toolkit.errors import DataError, MissingInputError, cli
from toolkit.logging_utils import setup_logging

logger = logging.getLogger("score_speaker")


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", required=True, help="trial list (VoxCeleb or Kaldi form)")
    p.add_argument("--embeddings", required=True, help="embeddings.scp of the trial utterances")
    p.add_argument("--cohort", help="embeddings (e.g. training speaker means): their mean is "
                   "subtracted, and they are the AS-Norm cohort")
    p.add_argument("--as-norm-top", type=int, default=300,
                   help="AS-Norm: cohort scores kept per side (0: no AS-Norm)")
    p.add_argument("--no-length-norm", action="store_true", help="skip length normalisation")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--name", default="", help="system name in the summary (default: trial file)")
    return p.parse_args(argv)


def _lookup(embeddings, key):
    # VoxCeleb trials name `id10270/x6uYqmx31kE/00001.wav`, Kaldi-style dirs the utterance
    # `id10270-x6uYqmx31kE-00001`: the extension goes and the slashes become dashes.
    stem = key[:-4] if key.endswith(".wav") else key
    for candidate in (key, stem, key.replace("/", "-"), stem.replace("/", "-")):
        if candidate in embeddings:
            return np.asarray(embeddings[candidate], np.float64)
    return None


def load_vectors(path: str):
    import kaldiio
    if not os.path.exists(path):
        raise MissingInputError(f"{path} not found (run the extraction stage first)")
    return {k: np.asarray(v, np.float64) for k, v in kaldiio.load_scp(path).items()}


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    from toolkit.tasks.speaker import scoring
    trials = scoring.read_trials(args.trials)
    embeddings = load_vectors(args.embeddings)
    vectors, missing = {}, []
    for key in set(trials.enroll) | set(trials.test):
        v = _lookup(embeddings, key)
        if v is None:
            missing.append(key)
        else:
            vectors[key] = v
    if missing:
        raise DataError(f"{args.trials}: {len(missing)} trial utterances have no embedding in "
                        f"{args.embeddings} (e.g. {', '.join(sorted(missing)[:3])})")
    cohort = mean = None
    if args.cohort:
        cohort = np.stack(list(load_vectors(args.cohort).values()))
        mean = scoring.embedding_mean(cohort, length_norm=not args.no_length_norm)
    length_norm = not args.no_length_norm
    systems = {"cosine": scoring.score_trials(trials, vectors, mean, length_norm)}
    if cohort is not None and args.as_norm_top > 0:
        systems[f"cosine + AS-Norm top {args.as_norm_top}"] = scoring.score_trials(
            trials, vectors, mean, length_norm, cohort, min(args.as_norm_top, len(cohort)))
    os.makedirs(args.out_dir, exist_ok=True)
    name = args.name or os.path.basename(args.trials)
    results, lines = {}, []
    for system, scores in systems.items():
        summary = scoring.summarize(scores, trials.labels)
        results[system] = summary
        lines.append(f"{name} {system}: {scoring.format_summary(summary)}")
    labels = np.asarray(trials.labels)
    scoring.plot_det(os.path.join(args.out_dir, "det.png"),
                     {k: (v, labels) for k, v in systems.items()}, title=name)
    with open(os.path.join(args.out_dir, "scores.txt"), "w", encoding="utf-8") as f:
        for i, (e, t) in enumerate(zip(trials.enroll, trials.test)):
            f.write(f"{e} {t} {'target' if labels[i] else 'nontarget'} "
                    + " ".join(f"{s[i]:.6f}" for s in systems.values()) + "\n")
    with open(os.path.join(args.out_dir, "summary.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out_dir, "result.json"), "w", encoding="utf-8") as f:
        json.dump({"trials": args.trials, "embeddings": args.embeddings, "cohort": args.cohort,
                   "systems": results}, f, indent=1)
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
