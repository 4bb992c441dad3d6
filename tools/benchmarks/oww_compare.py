"""openWakeWord's pretrained detectors (and, on request, microWakeWord's and PocketSphinx's)
and this recipe's models, side by side, on TTS voices no model was trained on, scored by one
common rule.

For each keyword ("hey jarvis", "alexa") and each engine (espeak-ng on the voices the
recipe's corpus of --seed holds out; flite, if installed, and festival, never used in
training (they share speakers), on all their voices; Kokoro on its seven reserved voices,
which no training list or blend holds) a test set is generated with
`synth_kws_data --test-only` (toolkit.tasks.kws.corpus). Then every clip is scored by:

  (a) openWakeWord 0.5.1's pretrained model (hey_jarvis_v0.1.onnx, alexa_v0.1.onnx): the
      toolkit's speech_embedding front end (its melspectrogram.onnx + embedding_model.onnx
      run with ONNX Runtime, see toolkit/data/features.py) gives an embedding every 80 ms;
      the model scores each step from the last 16 embeddings -> one score per 80 ms;
  (a') with --micro-wakeword, microWakeWord's builtin streaming model (pymicro-wakeword
      2.5.0, Apache-2.0: hey_jarvis.tflite, alexa.tflite) on its own micro-frontend
      features, one score per model step (30 ms): its streaming probability, the mean of
      its last 5 outputs;
  (a'') with --pocketsphinx, CMU PocketSphinx 5.1.1's keyphrase search (BSD; its bundled
      en-us acoustic model and dictionary) reporting every candidate: one score per
      detection at its end, a logistic map of the detection's log score (kws_peers.py);
  (b) each recipe model given with --exp (its export/model.onnx, with the front end its
      metadata names: fbank or the toolkit's phone front end every 10 ms, or speech
      embeddings every 80 ms);
  (b') with --fused DIR, a recipe model on phone posteriors fused with zero-shot search of
      its keyword and the search's verifier (the weights its stage 6 chose on the dev set,
      toolkit.tasks.kws.search.FusedBackend);
  (c) with --zero-shot FRONTEND, the keyword's espeak-ng phones searched in that phone
      front end's posteriors, untrained on the keyword (toolkit.tasks.kws.search).

Common rule, identical for every system:
  * each clip is played after --lead-s (2 s) and followed by --tail-s (0.5 s) of white
    noise at -60 dBFS (seeded by the clip's key), so that openWakeWord's 16-embedding
    window is full from the clip's first sample and a keyword at the very end still gets
    scored; frames whose input ends inside the lead are dropped;
  * the decision rule of toolkit/tasks/kws/decision.py (no smoothing) with a refractory
    period longer than any clip: at most one detection per clip, so a positive counts as
    detected and a negative as one false alarm when any kept frame reaches the threshold;
  * scored as a product is judged (toolkit.tasks.kws.product): the threshold for a
    target false-alarm rate is set on the general negatives alone (random words and noise,
    utt2kind neg and noise): the lowest at which at most target x their hours of them
    fire, their hours counted without the padding; FRR at 0.5/1/2/5 FA/h at those
    thresholds; at the 1 FA/h threshold, the share of the keyword's neighbours that fire
    (real words by category, utt2cat; inside-word reported apart) and of its accent
    variants accepted (utt2kind accent).

  python tools/benchmarks/oww_compare.py --out-dir exp/oww_compare --size full \\
      --exp egs/wake_word/s0/exp/jarvis_fbank --exp egs/wake_word/s0/exp/jarvis_oww \\
      --exp egs/wake_word/s0/exp/alexa_fbank --exp egs/wake_word/s0/exp/alexa_oww

Writes <out-dir>/results.md (also printed), results.json and the test sets under
<out-dir>/data/<keyword>/<engine>/test (reused when rerun with the same arguments).
Needs `tools/install_oww.sh` (openWakeWord's models: CC BY-NC-SA 4.0, non-commercial);
--micro-wakeword and --pocketsphinx need `tools/install_kws_peers.sh`.
"""
import argparse
import json
import logging
import multiprocessing as mp
import os
import sys
import zlib
from typing import Dict, List, Optional, Sequence, Tuple

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kws_peers import MicroWakeWordSystem, PocketSphinxSystem, missing  # noqa: E402  (sibling)

logger = logging.getLogger("oww_compare")

OWW_MODELS = {"hey jarvis": "hey_jarvis_v0.1.onnx", "alexa": "alexa_v0.1.onnx"}
OWW_WINDOW = 16            # embeddings one openWakeWord model call looks at
ENGINES = ("espeak", "flite", "festival", "kokoro")
SIZES = {"tiny": (6, 12), "small": (300, 1350), "full": (1200, 5400)}   # (pos, neg) per set
FA_TARGETS = (0.5, 1.0, 2.0, 5.0)
PAD_DBFS = -60.0
RATE = 16000
# The optional peers, in their row order: flag (args attribute) -> (class, its package).
PEERS = {"micro_wakeword": (MicroWakeWordSystem, "pymicro_wakeword"),
         "pocketsphinx": (PocketSphinxSystem, "pocketsphinx")}


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--exp", action="append", default=[], metavar="DIR",
                   help="a trained recipe exp dir (with export/model.onnx); repeat. Its "
                        "keyword and front end come from the model's metadata")
    p.add_argument("--fused", action="append", default=[], metavar="DIR",
                   help="a recipe exp dir whose model reads phone posteriors, scored fused with "
                        "zero-shot search of its keyword; repeat")
    p.add_argument("--zero-shot", action="append", default=[], metavar="FRONTEND",
                   help="also score zero-shot CTC keyword search in this phone front end's "
                        "posteriors (pretrained:NAME or a phone_ctc export); repeat")
    p.add_argument("--micro-wakeword", action="store_true",
                   help="also score microWakeWord's builtin model (tools/install_kws_peers.sh)")
    p.add_argument("--pocketsphinx", action="store_true",
                   help="also score PocketSphinx keyphrase search (tools/install_kws_peers.sh)")
    p.add_argument("--keywords", default="hey jarvis,alexa",
                   help=f"comma list, of {', '.join(OWW_MODELS)} (default %(default)s)")
    p.add_argument("--engines", default=",".join(ENGINES),
                   help="comma list; engines not installed are skipped with a note "
                        "(default %(default)s)")
    p.add_argument("--size", choices=sorted(SIZES), default="small",
                   help="positives/negatives per keyword and engine: "
                        + ", ".join(f"{k} {v[0]}/{v[1]}" for k, v in SIZES.items())
                        + " (default %(default)s)")
    p.add_argument("--num-pos", type=int, default=0, help="overrides --size")
    p.add_argument("--num-neg", type=int, default=0, help="overrides --size")
    p.add_argument("--seed", type=int, default=777,
                   help="the recipe's corpus seed: the espeak-ng voices held out by it "
                        "(default %(default)s)")
    p.add_argument("--lead-s", type=float, default=2.0)
    p.add_argument("--tail-s", type=float, default=0.5)
    p.add_argument("--oww-model-dir", default="",
                   help="where hey_jarvis_v0.1.onnx etc. are (default: the installed package)")
    p.add_argument("--nj", type=int, default=2, help="processes for synthesis and scoring")
    args = p.parse_args(argv)
    if args.lead_s < (OWW_WINDOW - 1) * 0.08:
        p.error(f"--lead-s must be >= {(OWW_WINDOW - 1) * 0.08:.2f} s (openWakeWord's window)")
    return args


# ----------------------------------------------------------------------------- test sets

def make_test_set(keyword: str, engine: str, out_dir: str, num_pos: int, num_neg: int,
                  seed: int, nj: int) -> str:
    from toolkit.tasks.kws.corpus import Sizes, generate_corpus
    sizes = Sizes(train_pos=0, train_neg=0, dev_pos=0, dev_neg=0, test_pos=num_pos,
                  test_neg=num_neg)
    generate_corpus([keyword], out_dir, seed=seed, sizes=sizes, nj=nj, engines=[engine],
                    test_only=True)
    return os.path.join(out_dir, "test")


def read_test_set(test_dir: str) -> List[dict]:
    from toolkit.data.kaldi import read_table
    tables = {n: read_table(os.path.join(test_dir, n))
              for n in ("wav.scp", "utt2kind", "utt2dur", "utt2cat", "text", "utt2spk")}
    return [{"key": k, "wav": w, "kind": tables["utt2kind"][k],
             "duration": float(tables["utt2dur"][k]), "category": tables["utt2cat"].get(k, ""),
             "text": tables["text"][k], "speaker": tables["utt2spk"][k]}
            for k, w in sorted(tables["wav.scp"].items())]


# ----------------------------------------------------------------------------- systems

class OwwSystem:
    """openWakeWord's pretrained model over the toolkit's speech_embedding front end."""

    def __init__(self, keyword: str, model_dir: str):
        from toolkit.data.features import build_extractor
        from toolkit.config import FeatureConfig
        self.name = f"openWakeWord {OWW_MODELS[keyword]}"
        self.keyword = keyword
        self.path = os.path.join(model_dir, OWW_MODELS[keyword])
        self.extractor = build_extractor(FeatureConfig(type="speech_embedding"), RATE)
        self.feature = self.extractor.metadata()
        self._session = None

    def frame_end_s(self, n: int) -> np.ndarray:
        return self.extractor.frame_end_times(n)

    def scores(self, feats: np.ndarray) -> np.ndarray:
        """(E, 96) embeddings -> (E, 1): step t scores embeddings t-15..t (0 before 16)."""
        if self._session is None:
            import onnxruntime as ort
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = opts.inter_op_num_threads = 1
            self._session = ort.InferenceSession(self.path, opts,
                                                 providers=["CPUExecutionProvider"])
        name = self._session.get_inputs()[0].name
        out = np.zeros((len(feats), 1), np.float32)
        for t in range(OWW_WINDOW - 1, len(feats)):
            window = feats[None, t - OWW_WINDOW + 1:t + 1].astype(np.float32)
            out[t, 0] = float(self._session.run(None, {name: window})[0].reshape(-1)[0])
        return out


class RecipeSystem:
    """A recipe model's export/model.onnx with the front end its metadata names."""

    def __init__(self, exp_dir: str, fused: bool = False):
        from toolkit.data.features import extractor_from_metadata
        from toolkit.tasks.kws.detector import load_backend
        self.backend = load_backend(os.path.join(exp_dir, "export", "model.onnx"),
                                    fuse_zero_shot=fused)
        meta = self.backend.metadata
        self.feature = meta["feature"]
        if len(meta["keywords"]) != 1:
            raise SystemExit(f"{exp_dir}: one keyword per model expected, got {meta['keywords']}")
        self.keyword = meta["keywords"][0]
        self.extractor = extractor_from_metadata(self.feature)
        kind = {"speech_embedding": "speech_embedding", "phone_frontend": "phone_frontend"}.get(
            self.feature["type"], "fbank")
        fusion = " fused with zero-shot search" if fused else ""
        self.name = (f"recipe {meta['model_type']} on {kind}{fusion} "
                     f"({os.path.basename(os.path.normpath(exp_dir))})")

    def frame_end_s(self, n: int) -> np.ndarray:
        ends = self.extractor.frame_end_times(n)
        if ends is None:         # fbank: frame t spans [t shift, t shift + length)
            f = self.feature
            ends = (np.arange(n) * f["frame_shift_ms"] + f["frame_length_ms"]) / 1000.0
        return ends

    def scores(self, feats: np.ndarray) -> np.ndarray:
        self.backend.reset()
        return self.backend.step(feats)


class ZeroShotSystem:
    """The keyword's espeak-ng phones searched in a phone front end's posteriors (no
    training on the keyword; toolkit.tasks.kws.search)."""

    def __init__(self, keyword: str, frontend: str):
        from toolkit.data.features import extractor_from_metadata
        from toolkit.tasks.kws.search import ZeroShotBackend
        self.backend = ZeroShotBackend([keyword], frontend)
        self.feature = self.backend.metadata["feature"]
        self.extractor = extractor_from_metadata(self.feature)
        self.name = f"zero-shot CTC keyword search ({frontend})"

    frame_end_s = RecipeSystem.frame_end_s

    def scores(self, feats: np.ndarray) -> np.ndarray:
        self.backend.reset()
        return self.backend.step(feats)


def feature_key(feature: dict) -> str:
    return json.dumps(feature, sort_keys=True)


def padded(wave: np.ndarray, key: str, lead_s: float, tail_s: float) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(key.encode("utf-8")))
    amp = 10.0 ** (PAD_DBFS / 20.0)
    lead = (amp * rng.standard_normal(int(round(lead_s * RATE)))).astype(np.float32)
    tail = (amp * rng.standard_normal(int(round(tail_s * RATE)))).astype(np.float32)
    return np.concatenate([lead, wave.astype(np.float32), tail])


_WORKER: Dict[str, object] = {}


def _score_chunk(job) -> List[Tuple[str, List[np.ndarray]]]:
    """Worker: kept frames' scores of every system for some clips."""
    clips, spec, lead_s, tail_s = job
    if _WORKER.get("spec") != spec:          # systems built once per process (sessions too)
        keyword, exps, model_dir, zero_shot, peers = spec
        _WORKER["systems"] = [OwwSystem(keyword, model_dir)] \
            + [PEERS[p][0](keyword) for p in PEERS if p in peers] \
            + [RecipeSystem(*e) for e in exps] + [ZeroShotSystem(keyword, f) for f in zero_shot]
        _WORKER["spec"] = spec
    systems = _WORKER["systems"]
    import soundfile as sf
    out = []
    for clip in clips:
        wave, rate = sf.read(clip["wav"], dtype="float32")
        if rate != RATE:
            raise SystemExit(f"{clip['wav']}: {rate} Hz, expected {RATE}")
        audio = padded(wave, clip["key"], lead_s, tail_s)
        cache: Dict[str, np.ndarray] = {}
        per_system = []
        for system in systems:
            fk = feature_key(system.feature)
            if fk not in cache:
                cache[fk] = system.extractor.compute(audio)
            feats = cache[fk]
            probs = system.scores(feats)
            keep = system.frame_end_s(len(probs)) > lead_s + 1e-9
            per_system.append(np.asarray(probs[keep], dtype=np.float32))
        out.append((clip["key"], per_system))
    return out


def score_clips(clips: List[dict], keyword: str, exps: List[Tuple[str, bool]], model_dir: str,
                lead_s: float, tail_s: float, nj: int, zero_shot: Sequence[str] = (),
                peers: Sequence[str] = ()) -> List[List[np.ndarray]]:
    """Per system, the kept-frame scores of every clip (in `clips` order): openWakeWord,
    the `peers` (keys of PEERS) in PEERS' order, the recipe models, zero-shot search."""
    spec = (keyword, tuple(exps), model_dir, tuple(zero_shot), tuple(peers))
    chunks = [clips[i::max(1, nj)] for i in range(max(1, nj))]
    jobs = [(c, spec, lead_s, tail_s) for c in chunks if c]
    if len(jobs) == 1:
        results = [_score_chunk(jobs[0])]
    else:
        with mp.get_context("fork").Pool(len(jobs)) as pool:
            results = pool.map(_score_chunk, jobs)
    by_key = {key: scores for res in results for key, scores in res}
    num_systems = len(next(iter(by_key.values())))
    return [[by_key[c["key"]][s] for c in clips] for s in range(num_systems)]


# ----------------------------------------------------------------------------- scoring

def product_row(probs: List[np.ndarray], clips: List[dict]) -> dict:
    """FRR at FA_TARGETS on general negatives and the product report at 1 FA/h."""
    from toolkit.tasks.kws import product
    peaks = np.array([float(p.max()) if len(p) else 0.0 for p in probs])
    general = [i for i, c in enumerate(clips) if c["kind"] in product.GENERAL]
    hours = sum(clips[i]["duration"] for i in general) / 3600.0
    pos = np.array([c["kind"] == "pos" for c in clips])
    thresholds = {str(t): product.peak_threshold(peaks[general], hours, t) for t in FA_TARGETS}
    frr = {t: (None if thr is None or not pos.any() else float(np.mean(peaks[pos] < thr)))
           for t, thr in thresholds.items()}
    at = thresholds[str(1.0)]
    outcomes = [product.ClipOutcome(c["kind"], bool(at is not None and peaks[i] >= at),
                                    c["category"], c["text"], c["speaker"])
                for i, c in enumerate(clips)]
    return {"positives": int(pos.sum()), "general_hours": hours, "frr": frr,
            "threshold": thresholds, "product": product.product_report(outcomes, at, 1.0)}


def fmt(frr: Optional[float]) -> str:
    return "—" if frr is None else f"{100 * frr:.1f}%"


def _fired(rep: dict, names: Sequence[str]) -> str:
    cats = [rep["categories"][n] for n in names if n in rep["categories"]]
    clips = sum(c["clips"] for c in cats)
    return "—" if not clips or rep["threshold"] is None else \
        f"{100 * sum(c['fired'] for c in cats) / clips:.1f}%"


def markdown(rows: List[dict], notes: List[str], args) -> str:
    from toolkit.tasks.kws.neighbours import CATEGORIES
    targets = " | ".join(f"FRR @{t:g}" for t in FA_TARGETS)
    lines = ["# Wake words on unseen TTS voices, scored as products", "",
             f"FRR at 0.5/1/2/5 false alarms per hour of general negatives (random words and "
             f"noise); at the 1 FA/h threshold, the neighbours that fire (real words that sound "
             f"like the keyword; inside-word apart) and the accent variants accepted. Size "
             f"{args.num_pos} positives / {args.num_neg} negatives per keyword and engine, seed "
             f"{args.seed}. — : no threshold meets the target.", "",
             "Rule (the same for every system): each clip after "
             f"{args.lead_s:g} s and before {args.tail_s:g} s of white noise at {PAD_DBFS:g} dBFS; "
             "frames ending in the lead dropped; a clip fires when a kept frame's score "
             "reaches the threshold (one detection per clip at most); FA/h over the general "
             "negatives' own hours. openWakeWord: its pretrained model on the last 16 speech "
             "embeddings, one score per 80 ms, through this toolkit's ONNX Runtime front end.",
             "", f"| keyword | engine | system | pos | general neg h | {targets} | neighbours "
             "fire @1 | inside-word fire @1 | accent accepted @1 |",
             "|" + "---|" * 3 + "---:|" * (5 + len(FA_TARGETS))]
    for r in rows:
        a, rep = r["scores"], r["scores"]["product"]
        lines.append(f"| {r['keyword']} | {r['engine']} | {r['system']} | {a['positives']} | "
                     f"{a['general_hours']:.2f} | "
                     + " | ".join(fmt(a["frr"][str(t)]) for t in FA_TARGETS)
                     + f" | {fmt(rep['neighbours']['share'])} | {_fired(rep, ['inside_word'])}"
                     f" | {fmt(rep['accent']['share'])} |")
    lines += ["", "Neighbours firing at 1 FA/h, by category (toolkit.tasks.kws.neighbours):", "",
              "| keyword | engine | system | " + " | ".join(CATEGORIES) + " |",
              "|" + "---|" * 3 + "---:|" * len(CATEGORIES)]
    for r in rows:
        rep = r["scores"]["product"]
        lines.append(f"| {r['keyword']} | {r['engine']} | {r['system']} | "
                     + " | ".join(_fired(rep, [c]) for c in CATEGORIES) + " |")
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    lines += ["", "openWakeWord's code is Apache-2.0; its pretrained models (used here, not "
              "copied) are CC BY-NC-SA 4.0 (non-commercial)."
              + (" microWakeWord (pymicro-wakeword) is Apache-2.0." if args.micro_wakeword
                 else "") + (" PocketSphinx is BSD." if args.pocketsphinx else "")]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = get_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s oww_compare %(message)s")
    from toolkit.data.features import OWW_INSTALL, oww_model_dir
    from toolkit.voicebank.engines import engine_class
    model_dir = args.oww_model_dir or oww_model_dir()
    if not model_dir or not os.path.isdir(model_dir):
        print(f"openWakeWord is not installed: bash tools/install_oww.sh ({OWW_INSTALL})",
              file=sys.stderr)
        return 2
    peers = [p for p in PEERS if getattr(args, p)]
    for p in peers:
        why = missing(PEERS[p][1])
        if why:
            print(f"--{p.replace('_', '-')}: {why}", file=sys.stderr)
            return 2
    default_pos, default_neg = SIZES[args.size]
    args.num_pos, args.num_neg = args.num_pos or default_pos, args.num_neg or default_neg
    keywords = [k.strip() for k in args.keywords.split(",") if k.strip()]
    unknown = [k for k in keywords if k not in OWW_MODELS]
    if unknown:
        print(f"no openWakeWord model for {unknown}; known: {', '.join(OWW_MODELS)}",
              file=sys.stderr)
        return 2
    exps_of: Dict[str, List[Tuple[str, bool]]] = {k: [] for k in keywords}
    name_of: Dict[Tuple[str, bool], str] = {}     # a system's row name, from its one load here
    notes: List[str] = []
    for exp, fused in [(e, False) for e in args.exp] + [(e, True) for e in args.fused]:
        system = RecipeSystem(exp, fused)
        if system.keyword not in exps_of:
            notes.append(f"{exp}: keyword {system.keyword!r} not compared; skipped")
            continue
        exps_of[system.keyword].append((exp, fused))
        name_of[exp, fused] = system.name
    engines = []
    for e in [x.strip() for x in args.engines.split(",") if x.strip()]:
        reason = engine_class(e).unavailable_reason()
        if reason:
            notes.append(f"{e} skipped: {reason}")
        else:
            engines.append(e)
    rows = []
    for keyword in keywords:
        for engine in engines:
            data = os.path.join(args.out_dir, "data", keyword.replace(" ", "_"), engine)
            clips = read_test_set(make_test_set(keyword, engine, data, args.num_pos,
                                                args.num_neg, args.seed, args.nj))
            logger.info("%s / %s: %d clips; scoring %d systems", keyword, engine, len(clips),
                        1 + len(peers) + len(exps_of[keyword]) + len(args.zero_shot))
            names = [f"openWakeWord {OWW_MODELS[keyword]}"] + \
                [PEERS[p][0].title(keyword) for p in peers] + \
                [name_of[e] for e in exps_of[keyword]] + \
                [f"zero-shot CTC keyword search ({f})" for f in args.zero_shot]
            per_system = score_clips(clips, keyword, exps_of[keyword], model_dir,
                                     args.lead_s, args.tail_s, args.nj, args.zero_shot, peers)
            for name, probs in zip(names, per_system):
                rows.append({"keyword": keyword, "engine": engine, "system": name,
                             "scores": product_row(probs, clips)})
    os.makedirs(args.out_dir, exist_ok=True)
    text = markdown(rows, notes, args)
    with open(os.path.join(args.out_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.join(args.out_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump({"args": vars(args), "rows": rows, "notes": notes}, f, indent=1)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
