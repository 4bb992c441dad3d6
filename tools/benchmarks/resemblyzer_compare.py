"""Resemblyzer beside a speaker recipe, on the same trial lists, scored by the same
`toolkit.bin.score_speaker`.

Resemblyzer 0.1.4 (Apache-2.0) is a GE2E speaker encoder (3-layer LSTM, 40 mel bins,
256-d) trained on real speech, its weights inside the wheel. Every utterance of each test
set is embedded as its authors embed one: `VoiceEncoder("cpu").embed_utterance(
preprocess_wav(audio, sample_rate))` (volume normalisation, long silences cut with
webrtcvad, then the mean of the partial embeddings). The embeddings are written as Kaldi
vectors (kaldiio, what utils/speaker_embed.sh writes in a speaker recipe's stage 6) and each trial list is
scored with score_speaker:

  * `resemblyzer`: plain cosine, no cohort (as Resemblyzer is meant to be used);
  * `resemblyzer_cohort` (with --cohort-dir): the recipe's own scoring, the mean of a
    training cohort subtracted and AS-Norm over it (the cohort embedded by Resemblyzer:
    speaker means of the first --cohort-utts-per-spk utterances of each speaker).

Test sets and trial lists are found as a speaker recipe's stage 6 names them in a recipe's data
dir: each set's `trials` and `trials_*`, named by file (the first set) or `<set>_<file>`
with `/` as `_` and a trailing /test dropped (the other sets), so that each --exp's
`score/<name>/result.json` is the same list scored by the recipe; the table puts them side
by side.

  bash tools/install_resemblyzer.sh        # opt-in: resemblyzer, webrtcvad-wheels, librosa
  python tools/benchmarks/resemblyzer_compare.py --data egs/tts_speakers/v1/data \\
      --test-sets "test outside/test" --cohort-dir egs/tts_speakers/v1/data/train \\
      --exp egs/tts_speakers/v1/exp/ecapa --out-dir egs/tts_speakers/v1/exp/resemblyzer

Writes <out-dir>/embeddings/<set>/embeddings.scp (reused when its wav.scp is older),
<out-dir>/score/<system>/<name>/ (score_speaker's outputs), results.json and results.md (also
printed): for every trial list, EER and minDCF of each system.
"""
import argparse
import glob
import json
import logging
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from toolkit.errors import DataError, MissingInputError, UserError, cli  # noqa: E402

logger = logging.getLogger("resemblyzer_compare")

RESEMBLYZER_VERSION = "0.1.4"
INSTALL_HINT = "bash tools/install_resemblyzer.sh"


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="the recipe's data dir (e.g. "
                   "egs/tts_speakers/v1/data)")
    p.add_argument("--test-sets", default="test",
                   help="test data dirs under --data, spaces between them, the first as the "
                        "recipe's test_set (default %(default)s)")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--exp", action="append", default=[], metavar="DIR",
                   help="a recipe exp dir whose score/<name>/result.json go beside; repeat")
    p.add_argument("--cohort-dir", default="",
                   help="Kaldi data dir (wav.scp, utt2spk) of the cohort, e.g. data/train: "
                        "adds the system resemblyzer_cohort (mean subtraction + AS-Norm)")
    p.add_argument("--cohort-utts-per-spk", type=int, default=4,
                   help="the first N utterances of each cohort speaker (default %(default)s)")
    p.add_argument("--as-norm-top", type=int, default=100,
                   help="AS-Norm cohort scores kept per side (default %(default)s)")
    p.add_argument("--nj", type=int, default=2, help="parallel embedding processes")
    return p.parse_args(argv)


# ------------------------------------------------------------------------------ trials

def score_name(test_set: str, first_set: str, trials_path: str) -> str:
    """The score dir name utils/speaker_score.sh gives a trial list."""
    name = os.path.basename(trials_path)
    if name.endswith(".txt"):
        name = name[:-4]
    if test_set == first_set:
        return name
    prefix = test_set[:-len("/test")] if test_set.endswith("/test") else test_set
    return prefix.replace("/", "_") + "_" + name


def find_trials(data: str, test_sets: Sequence[str]) -> List[Tuple[str, str, str]]:
    """(set, trials path, score name) of every `trials` and `trials_*` of each set."""
    out = []
    for test_set in test_sets:
        folder = os.path.join(data, test_set)
        if not os.path.isfile(os.path.join(folder, "wav.scp")):
            raise MissingInputError(f"{folder}/wav.scp not found (run the recipe's stage 0)")
        paths = sorted(glob.glob(os.path.join(folder, "trials")) +
                       glob.glob(os.path.join(folder, "trials_*")))
        if not paths:
            raise MissingInputError(f"{folder} has no trials file")
        out += [(test_set, p, score_name(test_set, test_sets[0], p)) for p in paths]
    return out


# --------------------------------------------------------------------------- embedding

def load_encoder():
    """(preprocess_wav, VoiceEncoder on the CPU); UserError with the install command when
    Resemblyzer (or its webrtcvad) is missing or another version."""
    try:
        from importlib.metadata import version
        import resemblyzer
        have = version("resemblyzer")
    except ImportError as err:
        raise UserError(f"Resemblyzer is not installed ({err}): {INSTALL_HINT}") from None
    if have != RESEMBLYZER_VERSION:
        raise UserError(f"Resemblyzer {have} is installed, this comparison is of "
                        f"{RESEMBLYZER_VERSION}: {INSTALL_HINT}")
    import torch
    torch.set_num_threads(1)
    return resemblyzer.preprocess_wav, resemblyzer.VoiceEncoder("cpu", verbose=False)


def _untrimmed(audio: np.ndarray, rate: int) -> np.ndarray:
    """Resemblyzer's preprocessing without its silence trimming: what it embeds when its
    voice activity detector finds no speech (a short crop in noise)."""
    from resemblyzer import audio as ra
    from toolkit.data.audio import resample
    wav = np.ascontiguousarray(audio.mean(axis=1)).astype(np.float32)
    if rate != ra.sampling_rate:
        wav = resample(wav, rate, ra.sampling_rate)
    return ra.normalize_volume(wav, ra.audio_norm_target_dBFS, increase_only=True)


def _embed_part(args) -> Tuple[int, Dict[str, np.ndarray], List[str]]:
    part, items = args
    from toolkit.data.audio import BadEntry, read_audio
    preprocess_wav, encoder = load_encoder()
    out, skipped = {}, []
    untrimmed = 0
    for key, source in items:
        try:
            audio, rate = read_audio(source)
        except BadEntry as err:
            skipped.append(f"{key}: {err}")
            continue
        wav = preprocess_wav(np.ascontiguousarray(audio.mean(axis=1)), source_sr=rate)
        if len(wav) == 0:
            # Its VAD heard no speech (short noisy crops): embedded untrimmed, and counted.
            wav = _untrimmed(audio, rate)
            untrimmed += 1
        if len(wav) == 0:
            skipped.append(f"{key}: no audio left after Resemblyzer's preprocessing")
            continue
        out[key] = np.asarray(encoder.embed_utterance(wav), np.float32)
    if untrimmed:
        logger.info("part %d: %d utterances embedded without silence trimming (Resemblyzer's "
                    "VAD found no speech in them)", part, untrimmed)
    return part, out, skipped


def embed_items(items: Sequence[Tuple[str, str]], nj: int) -> Dict[str, np.ndarray]:
    """key -> embedding of every (key, wav.scp source); DataError naming the utterances
    that could not be embedded."""
    parts = [(i, list(items[i::nj])) for i in range(nj) if items[i::nj]]
    vectors: Dict[str, np.ndarray] = {}
    skipped: List[str] = []
    if len(parts) > 1:
        import multiprocessing as mp
        with mp.get_context("fork").Pool(len(parts)) as pool:
            results = pool.map(_embed_part, parts)
    else:
        results = [_embed_part(p) for p in parts]
    for _, got, bad in results:
        vectors.update(got)
        skipped += bad
    if skipped:
        raise DataError(f"{len(skipped)} utterances could not be embedded, e.g. {skipped[0]}")
    return vectors


def write_vectors(path_scp: str, vectors: Dict[str, np.ndarray]) -> None:
    """Kaldi float vectors, sorted by key, written under temporary names then renamed."""
    import kaldiio
    ark = path_scp[:-4] + ".ark"
    with kaldiio.WriteHelper(f"ark,scp:{ark}.tmp,{path_scp}.tmp") as writer:
        for key in sorted(vectors):
            writer(key, vectors[key])
    with open(path_scp + ".tmp", encoding="utf-8") as f:
        lines = [line.replace(f"{ark}.tmp:", f"{ark}:") for line in f]
    os.replace(ark + ".tmp", ark)
    with open(path_scp + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(lines)
    os.replace(path_scp + ".tmp", path_scp)


def embed_set(data_dir: str, out_dir: str, nj: int, utts_per_spk: int = 0) -> str:
    """Embeds the utterances of a Kaldi data dir (the first `utts_per_spk` of each speaker
    when > 0, then also their speaker means) into out_dir; returns the scp scoring reads
    (speaker means for a cohort). Reused when newer than the data dir's wav.scp."""
    from toolkit.data import kaldi
    wav_scp = os.path.join(data_dir, "wav.scp")
    target = os.path.join(out_dir, "speaker_embeddings.scp" if utts_per_spk else
                          "embeddings.scp")
    if os.path.exists(target) and os.path.getmtime(target) > os.path.getmtime(wav_scp):
        logger.info("%s: reusing %s", data_dir, target)
        return target
    wavs = kaldi.read_table(wav_scp)
    keys = sorted(wavs, key=kaldi.c_order)
    utt2spk = kaldi.read_table(os.path.join(data_dir, "utt2spk")) if utts_per_spk else {}
    if utts_per_spk:
        seen: Dict[str, int] = {}
        chosen = []
        for key in keys:
            if key not in utt2spk:
                raise DataError(f"{data_dir}/utt2spk has no speaker for {key}")
            seen[utt2spk[key]] = seen.get(utt2spk[key], 0) + 1
            if seen[utt2spk[key]] <= utts_per_spk:
                chosen.append(key)
        keys = chosen
    t0 = time.time()
    vectors = embed_items([(k, wavs[k]) for k in keys], nj)
    logger.info("%s: %d utterances embedded in %.1f s", data_dir, len(vectors), time.time() - t0)
    os.makedirs(out_dir, exist_ok=True)
    if utts_per_spk:
        by_spk: Dict[str, List[np.ndarray]] = {}
        for key, v in vectors.items():
            by_spk.setdefault(utt2spk[key], []).append(v)
        write_vectors(target, {s: np.mean(vs, axis=0).astype(np.float32)
                               for s, vs in by_spk.items()})
    else:
        write_vectors(target, vectors)
    return target


# ------------------------------------------------------------------------------ scoring

def score(trials: str, embeddings: str, out_dir: str, name: str, cohort: Optional[str],
          as_norm_top: int) -> Dict[str, dict]:
    """score_speaker on one trial list; its result.json's systems."""
    from toolkit.bin import score_speaker
    args = ["--trials", trials, "--embeddings", embeddings, "--out-dir", out_dir,
            "--name", name]
    if cohort:
        args += ["--cohort", cohort, "--as-norm-top", str(as_norm_top)]
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()):
        status = score_speaker.main(args)
    if status != 0:
        raise DataError(f"score_speaker failed on {trials} (exit {status})")
    with open(os.path.join(out_dir, "result.json"), encoding="utf-8") as f:
        return json.load(f)["systems"]


def exp_results(exp: str, name: str, trials: str) -> Optional[Dict[str, dict]]:
    """The systems an exp dir scored on the same trial list, or None."""
    path = os.path.join(exp, "score", name, "result.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        result = json.load(f)
    if os.path.realpath(result.get("trials", "")) != os.path.realpath(trials):
        logger.warning("%s scored %s, not %s: left out", path, result.get("trials"), trials)
        return None
    return result["systems"]


def table(rows: Sequence[dict]) -> str:
    out = ["| trials | system | trials (target) | EER | minDCF(0.01) | minDCF(0.05) |",
           "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        s = r["summary"]
        out.append(f"| {r['trials']} | {r['system']} | {s['trials']} ({s['targets']}) | "
                   f"{s['eer_percent']:.2f} % | {s['min_dcf_0.01']:.3f} | "
                   f"{s['min_dcf_0.05']:.3f} |")
    return "\n".join(out) + "\n"


@cli
def main(argv=None):
    args = get_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s resemblyzer_compare %(levelname)s %(message)s")
    if args.nj < 1:
        raise UserError(f"--nj must be >= 1, got {args.nj}")
    test_sets = args.test_sets.split()
    if not test_sets:
        raise UserError("--test-sets names no test set")
    listed = find_trials(args.data, test_sets)
    for exp in args.exp:
        if not os.path.isdir(os.path.join(exp, "score")):
            raise MissingInputError(f"{exp}/score not found (run the recipe's stage 6)")
    load_encoder()                     # a missing install fails before any work
    embeddings = {s: embed_set(os.path.join(args.data, s),
                               os.path.join(args.out_dir, "embeddings", s), args.nj)
                  for s in test_sets}
    cohort = None
    if args.cohort_dir:
        cohort = embed_set(args.cohort_dir, os.path.join(args.out_dir, "embeddings", "cohort"),
                           args.nj, max(1, args.cohort_utts_per_spk))
    rows, results = [], {}
    for test_set, trials, name in listed:
        systems = {"resemblyzer": score(trials, embeddings[test_set], os.path.join(
            args.out_dir, "score", "resemblyzer", name), f"resemblyzer {name}", None, 0)}
        if cohort:
            systems["resemblyzer_cohort"] = score(
                trials, embeddings[test_set],
                os.path.join(args.out_dir, "score", "resemblyzer_cohort", name),
                f"resemblyzer_cohort {name}", cohort, args.as_norm_top)
        for exp in args.exp:
            got = exp_results(exp, name, trials)
            if got:
                systems[os.path.basename(os.path.normpath(exp))] = got
        results[name] = {"trials": trials, "systems": systems}
        for system, scored in systems.items():
            for variant, summary in scored.items():
                label = system if variant == "cosine" and system == "resemblyzer" \
                    else f"{system}: {variant}"
                rows.append({"trials": name, "system": label, "summary": summary})
    text = table(rows)
    with open(os.path.join(args.out_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
