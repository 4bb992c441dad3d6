"""openWakeWord's custom verifier ("only my voice") as a peer for the personal wake word:
per enrolled voice, a verifier trained by openWakeWord's own train_custom_verifier on three
of the voice's keyword clips, scored on the voice's other clips (FRR), other voices' clips
(impostor acceptance, IA) and general negatives (FA/h).

What openWakeWord 0.5.1 does (openwakeword/custom_verifier_model.py, model.py):
  * training (train_custom_verifier): one openwakeword.Model streams each positive
    reference clip 5 times (N=5), each time from a random offset in [0, 1280) samples, in
    80 ms chunks, and keeps the model's input window -- the last 16 speech embeddings,
    16 x 96 -- of every chunk whose wake-word score is >= 0.5; it streams each negative
    reference clip once (N=1) and keeps the window of every chunk (threshold 0.0). The
    Model is not reset between clips. Classifier: make_pipeline(FunctionTransformer(
    flatten -> 1536 values), StandardScaler(), LogisticRegression(C=0.001, max_iter=2000,
    random_state=0)), pickled. No positive window at all -> ValueError.
  * inference (Model.predict, one 80 ms chunk): w = the wake-word model's score of the last
    16 embeddings; if w >= custom_verifier_threshold (default 0.1) the verifier's
    predict_proba of the same 16 x 96 window replaces it; the application compares the
    returned score with its detection threshold. So a chunk fires when
    (w >= cvt and p >= T) or (T <= w < cvt).

How it is reproduced here, efficiently:
  * every evaluation clip (positives and negatives of the plan) is streamed ONCE through
    openwakeword.Model (its own AudioFeatures and the ONNX wake-word model, no verifier)
    in 80 ms chunks: each kept chunk's score w and its embedding are stored;
  * each enrolled voice's verifier is trained by train_custom_verifier itself (its 3
    enrolment clips, padded as below, against the plan's negative_reference clips);
  * every verifier is then applied offline (the pickled pipeline's predict_proba) to the
    stored 16 x 96 windows of the chunks that can matter (w >= min(detector threshold,
    custom_verifier_threshold)), and the decisions below are counted per clip.

Rule (that of tools/benchmarks/oww_compare.py): each clip is played after --lead-s (2 s)
and before --tail-s (0.5 s) of white noise at -60 dBFS seeded by its key; chunks whose
audio ends inside the lead are dropped; at most one detection per clip (a clip counts
once when any kept chunk fires); FA/h = accepted negatives per hour of the negatives'
own durations (padding excluded). The detector threshold T_d is the --fa-target (1) FA/h
operating point of the UNGATED openWakeWord model on the plan's negatives (DET counting of
toolkit.tasks.kws.scoring over the grid 0, 0.001, ..., 1 plus 1 - m 10^-k, k = 4..7:
the lowest grid threshold with FA/h <= target), or --detector-threshold.
For an enrolled voice v: FRR_v = share of v's positives outside its enrolment that are not
accepted; IA_v = share of the other voices' positives accepted (all of them, their
enrolment clips included); FA/h_v = accepted negatives per negative hour. Reported means are over the enrolled voices:
  * ungated: the openWakeWord model alone at T_d;
  * verifier curve (the gate): a clip is accepted when some chunk has w >= T_d and the
    verifier's p >= theta, theta over the grid; for theta >= T_d this is exactly
    openWakeWord's own rule with custom_verifier_threshold = T_d and threshold theta;
  * openWakeWord's defaults as an application runs them: custom_verifier_threshold = 0.1
    (its default, read from Model.__init__) and the detection threshold T_d; plus the
    curve of its own rule with that default as the detection threshold T is swept;
  * the gate with theta = 0.1 (custom_verifier_threshold's default read as a threshold on
    the verifier's probability);
  * --match-frr X: the IA (and FA/h) at the theta whose mean FRR is closest to X from
    below (ties: the lowest IA), on both curves.

  python tools/benchmarks/oww_verifier.py --plan plan.json --out-dir exp/oww_verifier \\
      --match-frr 0.05

Plan (JSON): {"keyword": "hey jarvis",
  "positives": [{"key", "wav", "spk"}, ...], "negatives": [{"key", "wav", "duration"}, ...],
  "negative_reference": [wav, ...], "enrol": {voice: [positive key, ...], ...}}
16 kHz mono WAV files. Writes <out-dir>/results.json, results.md (also printed) and the
pickled verifiers under <out-dir>/verifiers/. A bad plan is one error line naming the
key or file (exit status 2). Needs `tools/install_oww.sh` (openWakeWord 0.5.1 with
scikit-learn; its models: CC BY-NC-SA 4.0, non-commercial).
"""
import argparse
import contextlib
import inspect
import io
import json
import logging
import math
import multiprocessing as mp
import os
import pickle
import re
import sys
import zlib
from typing import Dict, List, Optional, Sequence, Tuple

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oww_compare import OWW_MODELS, OWW_WINDOW, RATE, padded  # noqa: E402  (sibling tool)

logger = logging.getLogger("oww_verifier")

CHUNK = 1280                 # samples per openWakeWord step (80 ms)
ENROL_THRESHOLD = 0.5        # train_custom_verifier's score for a positive window (fixed there)
TABLE_THRESHOLDS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999)
APPLY_BATCH = 4096           # windows per predict_proba call


class PlanError(Exception):
    """A bad plan: its message is the one line the command prints."""


# ----------------------------------------------------------------------------- plan

def _entries(path: str, plan: dict, field: str, needs: Sequence[str]) -> List[dict]:
    items = plan[field]
    if not isinstance(items, list) or not items:
        raise PlanError(f"{path}: '{field}' must be a non-empty list")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise PlanError(f"{path}: {field}[{i}] is not an object")
        for need in needs:
            if need not in item:
                name = f" (key {item['key']!r})" if "key" in item else ""
                raise PlanError(f"{path}: {field}[{i}]{name} has no '{need}'")
    return items


def _check_wav(path: str, where: str) -> None:
    import soundfile as sf
    if not isinstance(path, str) or not os.path.isfile(path):
        raise PlanError(f"{where}: wav file {path} not found")
    try:
        info = sf.info(path)
    except Exception as e:  # noqa: BLE001  (libsndfile's many reasons)
        raise PlanError(f"{where}: {path} is not readable audio ({e})")
    if info.samplerate != RATE or info.channels != 1:
        raise PlanError(f"{where}: {path} is {info.samplerate} Hz, {info.channels} channel(s); "
                        f"{RATE} Hz mono expected")


def load_plan(path: str) -> dict:
    """The plan, checked: every field, key and file, or PlanError naming the first fault."""
    try:
        with open(path, encoding="utf-8") as f:
            plan = json.load(f)
    except OSError as e:
        raise PlanError(f"{path}: cannot read the plan ({e.strerror})")
    except json.JSONDecodeError as e:
        raise PlanError(f"{path}: not valid JSON ({e})")
    if not isinstance(plan, dict):
        raise PlanError(f"{path}: a JSON object expected")
    for field in ("keyword", "positives", "negatives", "negative_reference", "enrol"):
        if field not in plan:
            raise PlanError(f"{path}: missing '{field}'")
    if plan["keyword"] not in OWW_MODELS:
        raise PlanError(f"{path}: no openWakeWord model for keyword {plan['keyword']!r} "
                        f"(known: {', '.join(OWW_MODELS)})")
    positives = _entries(path, plan, "positives", ("key", "wav", "spk"))
    negatives = _entries(path, plan, "negatives", ("key", "wav", "duration"))
    seen: Dict[str, str] = {}
    for field, items in (("positives", positives), ("negatives", negatives)):
        for i, item in enumerate(items):
            key = str(item["key"])
            if key in seen:
                raise PlanError(f"{path}: key {key!r} appears twice ({seen[key]} and {field})")
            seen[key] = field
            _check_wav(item["wav"], f"{path}: {field}[{i}] (key {key!r})")
    for i, item in enumerate(negatives):
        d = item["duration"]
        if not isinstance(d, (int, float)) or not d > 0:
            raise PlanError(f"{path}: negatives[{i}] (key {item['key']!r}) has duration {d!r}; "
                            "seconds > 0 expected")
    refs = plan["negative_reference"]
    if not isinstance(refs, list) or not refs:
        raise PlanError(f"{path}: 'negative_reference' must be a non-empty list of wav files")
    for i, ref in enumerate(refs):
        _check_wav(ref, f"{path}: negative_reference[{i}]")
    enrol = plan["enrol"]
    if not isinstance(enrol, dict) or not enrol:
        raise PlanError(f"{path}: 'enrol' must map each voice to its enrolment keys")
    spk_of = {str(p["key"]): str(p["spk"]) for p in positives}
    for voice, keys in enrol.items():
        if not isinstance(keys, list) or not keys:
            raise PlanError(f"{path}: enrol[{voice!r}] must be a non-empty list of positive keys")
        if len(set(map(str, keys))) != len(keys):
            raise PlanError(f"{path}: enrol[{voice!r}] names a key twice")
        for key in map(str, keys):
            if key not in spk_of:
                raise PlanError(f"{path}: enrol[{voice!r}] names key {key!r}, which is not "
                                "among the positives")
            if spk_of[key] != str(voice):
                raise PlanError(f"{path}: enrol[{voice!r}] names key {key!r}, a clip of voice "
                                f"{spk_of[key]!r}")
    return plan


# ----------------------------------------------------------------------------- audio

def read_wave(path: str) -> np.ndarray:
    """A 16 kHz mono file's float samples."""
    import soundfile as sf
    wave, rate = sf.read(path, dtype="float32")
    if rate != RATE or wave.ndim != 1:
        raise PlanError(f"{path}: {RATE} Hz mono expected")
    return wave


def to_int16(wave: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1) -> openWakeWord's 16-bit PCM (a 16-bit file's own values)."""
    return np.clip(np.round(wave * 32768.0), -32768, 32767).astype(np.int16)


def padded_int16(wave: np.ndarray, key: str, lead_s: float, tail_s: float) -> np.ndarray:
    return to_int16(padded(wave, key, lead_s, tail_s))


# ----------------------------------------------------------------------------- scoring

_WORKER: Dict[str, object] = {}


def oww_model(model_path: str):
    """This process's openwakeword.Model with only `model_path` (ONNX), no verifier."""
    if _WORKER.get("path") != model_path or _WORKER.get("pid") != os.getpid():
        import openwakeword
        _WORKER["model"] = openwakeword.Model(wakeword_models=[model_path],
                                              inference_framework="onnx")
        _WORKER["path"], _WORKER["pid"] = model_path, os.getpid()
    return _WORKER["model"]


def stream_clip(model, name: str, audio: np.ndarray, lead_s: float
                ) -> Tuple[np.ndarray, np.ndarray]:
    """One pass of Model.predict over the padded clip in 80 ms chunks. Returns the kept
    chunks' scores (n,) and embeddings (n + 15, 96): kept chunk j's model input -- what
    preprocessor.get_features(16) hands the wake-word model and a verifier -- is rows
    j .. j + 15. Kept chunks end after the lead, whose 2 s of noise flush every buffer the
    window reads (76 mel frames + 15 embeddings = 1.96 s), so a clip's kept chunks do not
    depend on the clip streamed before it."""
    scores, embeddings = [], []
    for start in range(0, len(audio) - CHUNK + 1, CHUNK):
        scores.append(float(model.predict(audio[start:start + CHUNK])[name]))
        embeddings.append(model.preprocessor.feature_buffer[-1].astype(np.float32))
    ends = (np.arange(len(scores)) + 1) * CHUNK / RATE
    keep = np.flatnonzero(ends > lead_s + 1e-9)
    if keep.size == 0:
        return np.zeros(0, np.float32), np.zeros((0, 96), np.float32)
    first = int(keep[0])
    return (np.asarray(scores[first:], np.float32),
            np.asarray(embeddings[first - OWW_WINDOW + 1:], np.float32))


def _score_chunk(job) -> List[Tuple[str, np.ndarray, np.ndarray]]:
    clips, model_path, lead_s, tail_s = job
    model = oww_model(model_path)
    name = os.path.splitext(os.path.basename(model_path))[0]
    out = []
    for clip in clips:
        audio = padded_int16(read_wave(clip["wav"]), str(clip["key"]), lead_s, tail_s)
        w, emb = stream_clip(model, name, audio, lead_s)
        out.append((str(clip["key"]), w, emb))
    return out


def score_clips(clips: List[dict], model_path: str, lead_s: float, tail_s: float, nj: int
                ) -> Dict[str, Tuple[np.ndarray, np.ndarray]]:
    """key -> (kept chunks' wake scores, their embeddings), each clip streamed once."""
    chunks = [clips[i::max(1, nj)] for i in range(max(1, nj))]
    jobs = [(c, model_path, lead_s, tail_s) for c in chunks if c]
    if len(jobs) == 1:
        results = [_score_chunk(jobs[0])]
    else:
        with mp.get_context("fork").Pool(len(jobs)) as pool:
            results = pool.map(_score_chunk, jobs)
    return {key: (w, emb) for res in results for key, w, emb in res}


def detector_threshold(scores: Dict[str, Tuple[np.ndarray, np.ndarray]], positives: List[dict],
                       negatives: List[dict], target: float) -> Tuple[Optional[float], dict]:
    """oww_compare's rule: the ungated model's operating point at `target` FA/h."""
    from toolkit.tasks.kws import scoring
    clips = positives + negatives
    probs = [scores[str(c["key"])][0][:, None] for c in clips]
    labels = [0] * len(positives) + [-1] * len(negatives)
    durations = [0.0] * len(positives) + [float(c["duration"]) for c in negatives]
    grid = scoring.threshold_grid(0.001, tail_decades=4)
    longest = max(len(p) for p in probs) + 1
    det = scoring.compute_det(probs, labels, durations, 1, grid, smooth_frames=1,
                              refractory_frames=longest)
    point = scoring.operating_point(det.thresholds, det.fa_per_hour[:, 0], det.frr[:, 0], target)
    return point.threshold, {"target_fa_per_hour": target, "frr_all_positives": point.frr,
                             "fa_per_hour": point.fa_per_hour}


# ----------------------------------------------------------------------------- verifiers

def _voice_file(voice: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._+-]", "_", voice)
    return f"{safe}_{zlib.crc32(voice.encode('utf-8')):08x}.pkl"


def _train_one(job) -> dict:
    """openWakeWord's own train_custom_verifier for one voice (stdout/tqdm silenced)."""
    voice, pos_audio, neg_audio, model_path, out_path = job
    from openwakeword.custom_verifier_model import train_custom_verifier
    np.random.seed(zlib.crc32(voice.encode("utf-8")))   # its random offsets, reproducible
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            train_custom_verifier(pos_audio, neg_audio, out_path, model_path,
                                  inference_framework="onnx")
    except ValueError as e:
        return {"voice": voice, "verifier": None, "error": f"train_custom_verifier: {e}"}
    with open(out_path, "rb") as f:
        pipe = pickle.load(f)
    total = int(pipe.named_steps["standardscaler"].n_samples_seen_)
    # Negatives: every chunk of each clip, N=1 (range(0, len - 1280, 1280) in its loop).
    negative = sum(len(range(0, len(a) - CHUNK, CHUNK)) for a in neg_audio)
    return {"voice": voice, "verifier": out_path, "error": None,
            "train_windows": {"positive": total - negative, "negative": negative}}


def train_verifiers(plan: dict, model_path: str, out_dir: str, lead_s: float, tail_s: float,
                    enrol_pad: bool, nj: int) -> Dict[str, dict]:
    wav_of = {str(p["key"]): p["wav"] for p in plan["positives"]}
    neg_audio = [to_int16(read_wave(p)) for p in plan["negative_reference"]]
    os.makedirs(os.path.join(out_dir, "verifiers"), exist_ok=True)
    jobs = []
    for voice, keys in plan["enrol"].items():
        pos = []
        for key in map(str, keys):
            wave = read_wave(wav_of[key])
            pos.append(padded_int16(wave, key, lead_s, tail_s) if enrol_pad else to_int16(wave))
        jobs.append((str(voice), pos, neg_audio, model_path,
                     os.path.join(out_dir, "verifiers", _voice_file(str(voice)))))
    if nj <= 1 or len(jobs) == 1:
        done = [_train_one(j) for j in jobs]
    else:
        with mp.get_context("fork").Pool(min(nj, len(jobs))) as pool:
            done = pool.map(_train_one, jobs)
    return {d["voice"]: d for d in done}


def load_verifier(path: str):
    with open(path, "rb") as f:
        return pickle.load(f)


def verifier_probs(pipe, windows: np.ndarray) -> np.ndarray:
    """p = predict_proba(window)[:, -1], as Model.predict asks it of a (1, 16, 96) window."""
    out = np.zeros(len(windows), np.float64)
    for i in range(0, len(windows), APPLY_BATCH):
        out[i:i + APPLY_BATCH] = pipe.predict_proba(windows[i:i + APPLY_BATCH])[:, -1]
    return out


# ----------------------------------------------------------------------------- decisions

def default_custom_verifier_threshold() -> float:
    """Model.__init__'s default custom_verifier_threshold (its re_arg decorator hides the
    signature; the function it wraps is in the closure)."""
    import openwakeword
    init = openwakeword.Model.__init__
    for cell in init.__closure__ or ():
        if inspect.isfunction(cell.cell_contents) and cell.cell_contents.__name__ == "__init__":
            init = cell.cell_contents
    return float(inspect.signature(init).parameters["custom_verifier_threshold"].default)


class Frames:
    """The kept chunks of the evaluation clips (in `keys` order) and the windows of those
    that can reach a decision (w >= gate)."""

    def __init__(self, keys: List[str], scores: Dict[str, Tuple[np.ndarray, np.ndarray]],
                 gate: float):
        self.keys = keys
        self.w = [scores[k][0].astype(np.float64) for k in keys]
        self.max_w = np.array([w.max() if w.size else -np.inf for w in self.w])
        clip_of, windows, cand_w = [], [], []
        for i, k in enumerate(keys):
            w, emb = self.w[i], scores[k][1]
            for j in np.flatnonzero(w >= gate).tolist():
                clip_of.append(i)
                cand_w.append(w[j])
                windows.append(emb[j:j + OWW_WINDOW])
        self.clip_of = np.asarray(clip_of, np.int64)
        self.cand_w = np.asarray(cand_w, np.float64)
        self.windows = (np.stack(windows).astype(np.float32) if windows
                        else np.zeros((0, OWW_WINDOW, 96), np.float32))

    def clip_max(self, values: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Per clip, the max of `values` over its candidate chunks in `mask` (-inf: none)."""
        out = np.full(len(self.keys), -np.inf)
        np.maximum.at(out, self.clip_of[mask], values[mask])
        return out

    def gate_max(self, p: np.ndarray, t_d: float) -> np.ndarray:
        """The gate: max p over chunks with w >= T_d; accepted at theta iff >= theta."""
        return self.clip_max(p, self.cand_w >= t_d)

    def runtime_max(self, p: np.ndarray, cvt: float) -> np.ndarray:
        """openWakeWord's returned score, max over chunks: p where w >= cvt, else w."""
        verified = self.clip_max(p, self.cand_w >= cvt)
        raw = np.array([w[w < cvt].max() if np.any(w < cvt) else -np.inf for w in self.w])
        return np.maximum(verified, raw)


def accepted_share(values: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """Per threshold, the share of clips whose max score is >= it (NaN: no clips)."""
    if values.size == 0:
        return np.full(len(thresholds), np.nan)
    s = np.sort(values)
    return (s.size - np.searchsorted(s, thresholds, side="left")) / s.size


def accepted_count(values: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    s = np.sort(values)
    return s.size - np.searchsorted(s, thresholds, side="left")


def voice_curve(clip_max: np.ndarray, own: np.ndarray, others: np.ndarray, neg: np.ndarray,
                neg_hours: float, thresholds: np.ndarray) -> dict:
    return {"frr": 1.0 - accepted_share(clip_max[own], thresholds),
            "ia": accepted_share(clip_max[others], thresholds),
            "fa_per_hour": accepted_count(clip_max[neg], thresholds) / neg_hours}


def grid_index(thresholds: np.ndarray, t: float) -> int:
    i = int(np.searchsorted(thresholds, t))
    if i >= len(thresholds) or thresholds[i] != t:
        raise ValueError(f"threshold {t} is not on the grid")
    return i


def _num(x) -> Optional[float]:
    x = float(x)
    return None if math.isnan(x) else x


def point(curve: dict, i: int) -> dict:
    return {k: _num(curve[k][i]) for k in ("frr", "ia", "fa_per_hour")}


def mean_curve(curves: List[dict]) -> dict:
    out = {}
    for k in ("frr", "ia", "fa_per_hour"):
        stack = np.stack([c[k] for c in curves])
        with np.errstate(invalid="ignore"), _quiet_nanmean():
            out[k] = np.nanmean(stack, axis=0)
    return out


@contextlib.contextmanager
def _quiet_nanmean():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def match_frr(thresholds: np.ndarray, curve: dict, target: float) -> Optional[dict]:
    """The threshold whose FRR is closest to `target` from below (<= target); among equal
    FRRs the lowest IA, then the lowest FA/h, then the lowest threshold. None: no
    threshold has FRR <= target."""
    frr = np.asarray(curve["frr"], np.float64)
    ok = np.flatnonzero(frr <= target + 1e-12)
    if ok.size == 0:
        return None
    best = ok[frr[ok] == frr[ok].max()]
    ia = np.nan_to_num(np.asarray(curve["ia"], np.float64)[best], nan=np.inf)
    fa = np.asarray(curve["fa_per_hour"], np.float64)[best]
    i = int(best[np.lexsort((thresholds[best], fa, ia))[0]])
    return {"target_frr": target, "threshold": float(thresholds[i]), **point(curve, i)}


def separation(p: np.ndarray, frames: Frames, cvt: float, own: np.ndarray, others: np.ndarray
               ) -> dict:
    """Verifier probability per clip (max over chunks where openWakeWord would run it,
    w >= cvt): mean over the voice's held-out clips vs other voices' clips, and the AUC
    (chance that an own clip scores above another voice's; ties count half)."""
    clip = frames.clip_max(p, frames.cand_w >= cvt)
    a, b = clip[own], clip[others]
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    out = {"own_clips": int(a.size), "other_clips": int(b.size),
           "mean_prob_own": _num(a.mean()) if a.size else None,
           "mean_prob_others": _num(b.mean()) if b.size else None, "auc": None}
    if a.size and b.size:
        out["auc"] = float(((a[:, None] > b[None]).sum() + 0.5 * (a[:, None] == b[None]).sum())
                           / (a.size * b.size))
    return out


# ----------------------------------------------------------------------------- evaluation

def evaluate(plan: dict, scores: Dict[str, Tuple[np.ndarray, np.ndarray]],
             trained: Dict[str, dict], t_d: float, cvt: float,
             match: Optional[float]) -> dict:
    from toolkit.tasks.kws import scoring
    thresholds = scoring.threshold_grid(0.001, tail_decades=4)
    positives, negatives = plan["positives"], plan["negatives"]
    keys = [str(c["key"]) for c in positives + negatives]
    spk = np.array([str(c["spk"]) for c in positives] + [""] * len(negatives), dtype=object)
    is_pos = np.arange(len(keys)) < len(positives)
    neg = np.flatnonzero(~is_pos)
    neg_hours = sum(float(c["duration"]) for c in negatives) / 3600.0
    frames = Frames(keys, scores, min(t_d, cvt))
    index = {k: i for i, k in enumerate(keys)}
    thresholds = np.unique(np.concatenate([thresholds, [t_d, cvt]]))   # both on the grid
    t_d_i, cvt_i = grid_index(thresholds, t_d), grid_index(thresholds, cvt)

    voices, gate_curves, runtime_curves, ungated_curves, gate_default = {}, [], [], [], []
    for voice, keys_v in plan["enrol"].items():
        voice = str(voice)
        enrolled = {index[str(k)] for k in keys_v}
        own = np.array([i for i in np.flatnonzero(is_pos & (spk == voice)) if i not in enrolled],
                       np.int64)
        others = np.flatnonzero(is_pos & (spk != voice))
        info = trained[voice]
        row = {"enrol": [str(k) for k in keys_v], "verifier": info["verifier"],
               "error": info["error"], "train_windows": info.get("train_windows"),
               "held_out_positives": int(own.size), "impostor_positives": int(others.size)}
        ung = voice_curve(frames.max_w, own, others, neg, neg_hours, thresholds)
        row["ungated"] = point(ung, t_d_i)
        if info["verifier"] is None:
            voices[voice] = row
            continue
        p = verifier_probs(load_verifier(info["verifier"]), frames.windows)
        gate = voice_curve(frames.gate_max(p, t_d), own, others, neg, neg_hours, thresholds)
        runtime = voice_curve(frames.runtime_max(p, cvt), own, others, neg, neg_hours,
                              thresholds)
        row["oww_defaults"] = point(runtime, t_d_i)
        row["gate_at_default"] = point(gate, cvt_i)
        row["separation"] = separation(p, frames, cvt, own, others)
        table = [grid_index(thresholds, t) for t in TABLE_THRESHOLDS]
        row["gate_curve"] = {"threshold": list(TABLE_THRESHOLDS),
                             **{k: [_num(gate[k][i]) for i in table] for k in gate}}
        voices[voice] = row
        gate_curves.append(gate)
        runtime_curves.append(runtime)
        ungated_curves.append(ung)
        gate_default.append(row["gate_at_default"])

    result = {"thresholds": thresholds, "voices": voices,
              "enrolled": len(gate_curves), "failed": [v for v, r in voices.items()
                                                       if r["verifier"] is None],
              "negative_hours": neg_hours, "negatives": int(neg.size),
              "positives": int(is_pos.sum()), "t_d_index": t_d_i, "cvt_index": cvt_i}
    if gate_curves:
        gate_m, runtime_m, ung_m = (mean_curve(gate_curves), mean_curve(runtime_curves),
                                    mean_curve(ungated_curves))
        result["mean"] = {"ungated": point(ung_m, t_d_i),
                          "oww_defaults": point(runtime_m, t_d_i),
                          "gate_at_default": point(gate_m, cvt_i),
                          "gate_curve": gate_m, "runtime_curve": runtime_m}
        if match is not None:
            result["match_frr"] = {"target": match,
                                   "gate": match_frr(thresholds, gate_m, match),
                                   "runtime": match_frr(thresholds, runtime_m, match)}
    return result


# ----------------------------------------------------------------------------- report

def fmt(x: Optional[float]) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def fmt_fa(x: Optional[float]) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def markdown(res: dict, args, t_d: float, cvt: float, notes: List[str]) -> str:
    lines = [f"# openWakeWord's custom verifier ({res['keyword']})", "",
             f"{res['enrolled']} enrolled voice(s) with a verifier"
             + (f", {len(res['failed'])} without (train_custom_verifier failed: "
                f"{', '.join(res['failed'])})" if res["failed"] else "")
             + f"; {res['positives']} positives, {res['negatives']} negatives "
             f"({res['negative_hours']:.3f} h). Detector threshold T_d = {t_d:g} "
             f"({res['t_d_source']}). Means over the enrolled voices: FRR on each voice's "
             "clips outside its enrolment, IA on the other voices' clips, FA/h on the "
             "negatives.", "",
             "| system | threshold | FRR | IA | FA/h |", "|---|---|---|---|---|"]
    mean = res.get("mean")
    if mean:
        rows = [("openWakeWord alone (ungated)", f"{t_d:g}", mean["ungated"]),
                (f"+ verifier, openWakeWord defaults (custom_verifier_threshold {cvt:g}, "
                 f"detection threshold T_d)", f"{t_d:g}", mean["oww_defaults"]),
                (f"+ verifier, gate w >= T_d and verifier p >= {cvt:g}", f"{cvt:g}",
                 mean["gate_at_default"])]
        mf = res.get("match_frr")
        if mf:
            for kind, label in (("gate", "gate w >= T_d, p >= theta"),
                                ("runtime", f"openWakeWord's rule, cvt {cvt:g}, threshold T")):
                m = mf[kind]
                if m:
                    rows.append((f"+ verifier at FRR <= {100 * mf['target']:g}% ({label})",
                                 f"{m['threshold']:g}", m))
                else:
                    rows.append((f"+ verifier at FRR <= {100 * mf['target']:g}% ({label}): "
                                 "no threshold", "—", {"frr": None, "ia": None,
                                                       "fa_per_hour": None}))
        for name, thr, r in rows:
            lines.append(f"| {name} | {thr} | {fmt(r['frr'])} | {fmt(r['ia'])} | "
                         f"{fmt_fa(r['fa_per_hour'])} |")
        th = res["thresholds_list"]
        lines += ["", "Verifier curve (means): a clip is accepted when a chunk has wake score "
                  f"w >= T_d = {t_d:g} and verifier probability p >= theta (for theta >= T_d, "
                  "openWakeWord's own rule with custom_verifier_threshold = T_d); right: "
                  f"openWakeWord's rule with custom_verifier_threshold {cvt:g} and detection "
                  "threshold T = theta (score p where w >= "
                  f"{cvt:g}, else w).", "",
                  "| theta | FRR | IA | FA/h | FRR (cvt rule) | IA (cvt rule) | FA/h (cvt rule) |",
                  "|---|---|---|---|---|---|---|"]
        for t in TABLE_THRESHOLDS:
            i = grid_index(np.asarray(th), t)
            g, r = point(mean["gate_curve"], i), point(mean["runtime_curve"], i)
            lines.append(f"| {t:g} | {fmt(g['frr'])} | {fmt(g['ia'])} | "
                         f"{fmt_fa(g['fa_per_hour'])} | {fmt(r['frr'])} | {fmt(r['ia'])} | "
                         f"{fmt_fa(r['fa_per_hour'])} |")
    lines += ["", "Per voice (ungated at T_d; with the verifier at openWakeWord's defaults; "
              "separation: the verifier's probability per clip, max over chunks with "
              f"w >= {cvt:g}):", "",
              "| voice | held-out / impostor clips | train windows +/- | ungated FRR / IA | "
              "defaults FRR / IA / FA/h | p own / others | AUC |",
              "|---|---|---|---|---|---|---|"]
    for v, r in res["voices"].items():
        u = r["ungated"]
        if r["verifier"] is None:
            lines.append(f"| {v} | {r['held_out_positives']} / {r['impostor_positives']} | "
                         f"— | {fmt(u['frr'])} / {fmt(u['ia'])} | no verifier: "
                         f"{r['error']} | — | — |")
            continue
        d, s, tw = r["oww_defaults"], r["separation"], r["train_windows"]
        p_own = "—" if s["mean_prob_own"] is None else f"{s['mean_prob_own']:.3f}"
        p_oth = "—" if s["mean_prob_others"] is None else f"{s['mean_prob_others']:.3f}"
        lines.append(f"| {v} | {r['held_out_positives']} / {r['impostor_positives']} | "
                     f"{tw['positive']} / {tw['negative']} | {fmt(u['frr'])} / {fmt(u['ia'])} | "
                     f"{fmt(d['frr'])} / {fmt(d['ia'])} / {fmt_fa(d['fa_per_hour'])} | "
                     f"{p_own} / {p_oth} | "
                     + ("—" if s["auc"] is None else f"{s['auc']:.3f}") + " |")
    lines += ["", "Rule: each clip after " f"{args.lead_s:g} s and before {args.tail_s:g} s of "
              "white noise at -60 dBFS; chunks ending in the lead dropped; one detection per "
              "clip; FA/h over the negatives' own hours (as tools/benchmarks/oww_compare.py). "
              "openWakeWord 0.5.1 (openwakeword.Model, ONNX) streamed once per clip; verifiers "
              "trained by its train_custom_verifier on each voice's enrolment clips"
              + (" (padded as the rule pads)" if args.enrol_pad else " (as given)")
              + " against the plan's negative_reference, applied offline to the stored "
              "16 x 96 windows."]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    lines += ["", "openWakeWord's code is Apache-2.0; its models (used here, not copied) are "
              "CC BY-NC-SA 4.0 (non-commercial)."]
    return "\n".join(lines) + "\n"


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return [_num(v) for v in x.tolist()]
    if isinstance(x, (np.floating, float)):
        return _num(x)
    if isinstance(x, np.integer):
        return int(x)
    return x


# ----------------------------------------------------------------------------- main

def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", required=True, help="the plan (JSON), see above")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--match-frr", type=float, default=None, metavar="X",
                   help="also report the IA at the verifier threshold whose mean FRR is "
                        "closest to X (a fraction, e.g. 0.05) from below")
    p.add_argument("--fa-target", type=float, default=1.0,
                   help="FA/h of the ungated model that fixes the detector threshold "
                        "(default %(default)s)")
    p.add_argument("--detector-threshold", type=float, default=None,
                   help="fix the detector threshold T_d instead (e.g. oww_compare's)")
    p.add_argument("--lead-s", type=float, default=2.0)
    p.add_argument("--tail-s", type=float, default=0.5)
    p.add_argument("--no-enrol-pad", dest="enrol_pad", action="store_false",
                   help="give train_custom_verifier the enrolment clips as they are, not "
                        "padded with the lead/tail noise of the rule")
    p.add_argument("--oww-model-dir", default="",
                   help="where hey_jarvis_v0.1.onnx etc. are (default: the installed package)")
    p.add_argument("--nj", type=int, default=2, help="processes (default %(default)s)")
    args = p.parse_args(argv)
    if args.lead_s < 2.0 - 1e-9:
        # 76 mel frames + 15 embeddings (1.96 s) plus a mel block's 480 samples of context
        p.error("--lead-s must be >= 2 s: the kept chunks' windows must lie inside the padding")
    if args.match_frr is not None and not 0 <= args.match_frr <= 1:
        p.error("--match-frr is a fraction in [0, 1]")
    return args


def main(argv=None) -> int:
    args = get_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s oww_verifier %(message)s")
    import importlib.util
    from toolkit.data.features import OWW_INSTALL, oww_model_dir
    model_dir = args.oww_model_dir or oww_model_dir()
    if importlib.util.find_spec("openwakeword") is None or importlib.util.find_spec(
            "sklearn") is None or not model_dir or not os.path.isdir(model_dir):
        print("error: openWakeWord with scikit-learn is not installed: bash "
              f"tools/install_oww.sh ({OWW_INSTALL})", file=sys.stderr)
        return 2
    try:
        plan = load_plan(args.plan)
    except PlanError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model_path = os.path.join(model_dir, OWW_MODELS[plan["keyword"]])
    if not os.path.isfile(model_path):
        print(f"error: {model_path} not found", file=sys.stderr)
        return 2
    os.makedirs(args.out_dir, exist_ok=True)
    cvt = default_custom_verifier_threshold()
    notes: List[str] = []
    clips = plan["positives"] + plan["negatives"]
    logger.info("streaming %d clips through openWakeWord once", len(clips))
    scores = score_clips(clips, model_path, args.lead_s, args.tail_s, args.nj)
    if args.detector_threshold is not None:
        t_d, t_d_info = float(args.detector_threshold), {"given": True}
        t_d_source = "given"
    else:
        t_d, t_d_info = detector_threshold(scores, plan["positives"], plan["negatives"],
                                           args.fa_target)
        if t_d is None:
            print(f"error: no threshold of the ungated model reaches {args.fa_target:g} FA/h "
                  "on the plan's negatives; give --detector-threshold", file=sys.stderr)
            return 2
        t_d_source = f"ungated model at {args.fa_target:g} FA/h on the plan's negatives"
    logger.info("detector threshold %g; training %d verifiers with train_custom_verifier",
                t_d, len(plan["enrol"]))
    trained = train_verifiers(plan, model_path, args.out_dir, args.lead_s, args.tail_s,
                              args.enrol_pad, args.nj)
    for v, info in trained.items():
        if info["error"]:
            notes.append(f"voice {v}: no verifier ({info['error']}); left out of the means")
    res = evaluate(plan, scores, trained, t_d, cvt, args.match_frr)
    res["keyword"] = plan["keyword"]
    res["t_d_source"] = t_d_source
    res["thresholds_list"] = [float(t) for t in res["thresholds"]]
    for v, r in res["voices"].items():
        if r["verifier"] is not None and r["held_out_positives"] == 0:
            notes.append(f"voice {v}: no positives outside its enrolment; its FRR is left out")
    if args.match_frr is not None and res.get("match_frr") and res["match_frr"]["gate"] is None:
        notes.append(f"no verifier threshold gives a mean FRR <= {args.match_frr:g} (the gate "
                     "at T_d alone misses more)")
    text = markdown(res, args, t_d, cvt, notes)
    out = {"plan": os.path.abspath(args.plan), "keyword": plan["keyword"],
           "args": vars(args),
           "openwakeword": {"model": model_path, "custom_verifier_threshold_default": cvt,
                            "enrol_score_threshold": ENROL_THRESHOLD,
                            "trainer": "openwakeword.custom_verifier_model.train_custom_verifier"},
           "detector_threshold": t_d, "detector_threshold_source": t_d_source,
           "detector": t_d_info, "positives": res["positives"], "negatives": res["negatives"],
           "negative_hours": res["negative_hours"], "enrolled": res["enrolled"],
           "failed": res["failed"], "voices": res["voices"], "notes": notes}
    if "mean" in res:
        m = res["mean"]
        out["mean"] = {"ungated": m["ungated"], "oww_defaults": m["oww_defaults"],
                       "gate_at_default": m["gate_at_default"]}
        out["curve"] = {"rule": "accepted when a chunk has w >= detector_threshold and "
                                "verifier p >= threshold",
                        "threshold": res["thresholds_list"], **m["gate_curve"]}
        out["runtime_curve"] = {"rule": f"openWakeWord's rule: score p where w >= {cvt:g}, "
                                        "else w; accepted when score >= threshold",
                                "threshold": res["thresholds_list"], **m["runtime_curve"]}
        out["match_frr"] = res.get("match_frr")
    with open(os.path.join(args.out_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(_jsonable(out), f, indent=1)
    with open(os.path.join(args.out_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
