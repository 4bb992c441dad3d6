"""Kokoro-82M (Apache-2.0), a neural TTS, as the engine `kokoro`: 28 English voices
(American a*, British b*; female *f_, male *m_) and blends of them, 24 kHz.

    bash tools/install_voices.sh kokoro      # model + voices into the cache, kokoro-onnx

A voice is a table of style vectors (510 x 1 x 256, one row per phoneme count), so a
weighted sum of voices is a new voice: a blend, `Voice.mix` = ((name, weight), ...),
made by `blend_voice` or drawn by `kokoro_blends(n, seed)` (2-3 voices, Dirichlet
weights, never a reserved voice: toolkit.voicebank.RESERVED_VOICES). A blend speaks with the
accent (en-us / en-gb phonemes) of its heaviest component.

Rate: Kokoro's own speed (rate / 175). Pitch (0-100, 50: the voice's own): a resampling
shift by toolkit.voicebank.pitch_ratio, +-2 semitones over the recipes' 25-75. The model is
asked for speech `ratio` times slower and the result is resampled `ratio` times shorter,
so the duration is the rate's while pitch and formants both move by the ratio - a
shorter or longer vocal tract, i.e. another speaker rather than the same one singing.
Range and seed change nothing (the graph has no noise source), so clips differing only
there are one clip in the cache.

Output: float32 on the 16-bit grid (k / 32768), so that the clip cache keeps it exactly
in half the space; word onsets from the durations the derived graph reports
(toolkit.voicebank.kokoro_assets), when espeak-ng's phoneme words line up with the text's
words (it joins some, e.g. "in the"), else None.

Speed: one ONNX Runtime session per process, one intra-op thread by default (corpus
renderers fork nj children that fill the cores; TOOLKIT_KOKORO_THREADS overrides), the
graph in kokoro_assets.DEFAULT_GRAPH (TOOLKIT_KOKORO_GRAPH: int8 or float32). Measured
with tools/benchmarks/tts_rtf.py on this 2-core AVX2 machine: CPU seconds per audio
second 0.49 (int8, 1 thread), 0.51 (float32, 1 thread), 0.51 / 0.55 with 2 threads, and
0.75 / 0.83 when idle threads spin; so int8, which is also bit-identical whatever the
thread count (float32 is not) and a quarter of the size, with one thread, not spinning.
The graph takes one utterance at a time (its inputs are declared with batch 1).

GPU: TOOLKIT_KOKORO_PROVIDER=cuda runs the sessions on ONNX Runtime's CUDA provider; it
needs onnxruntime-gpu in place of onnxruntime, and takes the float32 graph unless
TOOLKIT_KOKORO_GRAPH says otherwise (`install_kokoro --graphs int8,float32`): the int8 graph
is quantized for CPU kernels. No GPU speed is measured here. `auto` takes CUDA when this
onnxruntime offers it. CUDA output differs from the CPU's in the last bits, so its clips
are cached apart. The default is `cpu`: a corpus does not change with what happens to be
installed.
"""
import hashlib
import importlib.util
import logging
import os
from functools import lru_cache
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from toolkit.voicebank import (RESERVED_VOICES, Speech, SynthError, Voice, pitch_ratio,
                               seeded_rng, word_char_starts)
from toolkit.voicebank import kokoro_assets as assets
from toolkit.voicebank.engines import ENGINES, Engine

logger = logging.getLogger(__name__)

ENGINE = "kokoro"
INSTALL_HINT = assets.INSTALL_COMMAND
SAMPLE_RATE = 24000
SPEED_RANGE = (0.5, 2.0)          # what kokoro-onnx accepts
THREADS_ENV = "TOOLKIT_KOKORO_THREADS"
GRAPH_ENV = "TOOLKIT_KOKORO_GRAPH"
PROVIDER_ENV = "TOOLKIT_KOKORO_PROVIDER"
PROVIDER_CHOICES = ("cpu", "cuda", "auto")
_CUDA = "CUDAExecutionProvider"
GPU_GRAPH = "float32"   # the int8 graph's quantized nodes are tuned for CPU kernels
# Bump when this module's rendering changes (pitch shift, quantization, pauses):
# cached clips then miss.
RENDER_VERSION = 1
# Pitch shifts are quantized so that the resampling ratio is (SAMPLE_RATE + k * 100) /
# SAMPLE_RATE: a short polyphase filter, steps of 0.07 semitones.
_PITCH_STEP_HZ = 100
_BLEND_DECIMALS = 4
_PUNCTUATION = set(';:,.!?¡¿—…"«»“”()')


# phonemizer warns on every call where espeak-ng joins words ("on the" -> one word),
# thousands of lines a corpus; _word_onsets lays joined words out itself.
_PHONEMIZER_LOG = logging.getLogger(__name__ + ".phonemizer")
_PHONEMIZER_LOG.setLevel(logging.ERROR)


def lang_of(name: str) -> str:
    """espeak-ng language of a Kokoro voice: a* American, b* British."""
    return {"a": "en-us", "b": "en-gb"}[name[0]]


def kokoro_voice(name: str) -> Voice:
    if name not in assets.ENGLISH_VOICES:
        raise SynthError(f"Kokoro has no English voice {name!r}; known: "
                         f"{' '.join(assets.ENGLISH_VOICES)}")
    return Voice(f"kokoro_{name}", ENGINE, name)


def kokoro_voices() -> List[Voice]:
    """All 28 English voices, the reserved ones included (filter with
    toolkit.voicebank.training_voices)."""
    return [kokoro_voice(n) for n in assets.ENGLISH_VOICES]


def blend_voice(mix: Sequence[Tuple[str, float]]) -> Voice:
    """The blend of `mix` ((voice, weight), ...): at least two distinct English voices,
    none reserved, positive weights. Weights are normalised to sum 1 and rounded to
    4 decimals (the rounded values are the ones mixed, so the name is exact)."""
    names = [str(n) for n, _ in mix]
    weights = np.array([float(w) for _, w in mix], np.float64)
    if len(names) < 2 or len(set(names)) != len(names):
        raise SynthError(f"a blend needs two or more distinct voices, got {names}")
    for n in names:
        if (ENGINE, n) in RESERVED_VOICES:
            raise SynthError(f"blend {'+'.join(names)}: {n} is reserved for evaluation "
                             "(toolkit.voicebank.RESERVED_VOICES) and never goes into a blend")
        kokoro_voice(n)
    if not np.all(np.isfinite(weights)) or np.any(weights <= 0):
        raise SynthError(f"blend {'+'.join(names)}: weights must be positive, got "
                         f"{weights.tolist()}")
    scale = 10 ** _BLEND_DECIMALS
    units = np.round(weights / weights.sum() * scale).astype(np.int64)
    units[int(np.argmax(units))] += scale - int(units.sum())     # sum exactly 1
    if np.any(units <= 0):
        raise SynthError(f"blend {'+'.join(names)}: a weight rounds to 0 "
                         f"({weights.tolist()})")
    rounded = tuple((n, int(u) / scale) for n, u in zip(names, units))
    name = "+".join(f"{n}*{w:.{_BLEND_DECIMALS}f}" for n, w in rounded)
    spk = "kokoro_mix_" + hashlib.sha256(name.encode()).hexdigest()[:10]
    return Voice(spk, ENGINE, name, mix=rounded)


def kokoro_blends(n: int, seed: int, pool: Optional[Sequence[str]] = None,
                  components: Tuple[int, int] = (2, 3), alpha: float = 1.0) -> List[Voice]:
    """`n` distinct blends, a pure function of the arguments: each draws 2-3 voices of
    `pool` (default: every English voice that is not reserved) and Dirichlet(alpha)
    weights. A reserved voice in `pool` is an error."""
    pool = [v for v in assets.ENGLISH_VOICES if (ENGINE, v) not in RESERVED_VOICES] \
        if pool is None else list(pool)
    reserved = [v for v in pool if (ENGINE, v) in RESERVED_VOICES]
    if reserved:
        raise SynthError(f"blend pool: {', '.join(reserved)} reserved for evaluation "
                         "(toolkit.voicebank.RESERVED_VOICES) and never go into a blend")
    for v in pool:
        kokoro_voice(v)
    lo, hi = components
    if len(set(pool)) < 2 or not 2 <= lo <= hi or n < 0:
        raise SynthError(f"blends: need n >= 0, 2 <= components, and a pool of 2 or more "
                         f"voices; got n={n}, components={components}, pool={pool}")
    pool = sorted(set(pool))
    hi = min(hi, len(pool))
    rng = seeded_rng(seed, 24)
    out: Dict[str, Voice] = {}
    for _ in range(100 * n + 100):
        if len(out) == n:
            break
        k = int(rng.integers(lo, hi + 1))
        chosen = [pool[i] for i in sorted(rng.choice(len(pool), size=k, replace=False))]
        weights = rng.dirichlet(np.full(k, float(alpha)))
        # Keep every component audible (>= 5 %): a 0.01 share is the other voice alone.
        weights = 0.05 + weights * (1 - 0.05 * k)
        voice = blend_voice(list(zip(chosen, weights)))
        out.setdefault(voice.name, voice)
    if len(out) < n:
        raise SynthError(f"blends: only {len(out)} distinct blends of {len(pool)} voices, "
                         f"{n} asked for")
    return list(out.values())


def style_table(voice: Voice, tables) -> np.ndarray:
    """The (510, 1, 256) style table of a voice or blend, from the voices' tables."""
    if not voice.mix:
        return np.asarray(tables[voice.name], np.float32)
    acc = np.zeros(assets.VOICE_SHAPE, np.float32)
    for name, weight in voice.mix:
        acc += np.float32(weight) * np.asarray(tables[name], np.float32)
    return acc


def voice_lang(voice: Voice) -> str:
    if not voice.mix:
        return lang_of(voice.name)
    heaviest = max(voice.mix, key=lambda c: c[1])[0]     # first of equals
    return lang_of(heaviest)


def pitch_step(pitch: float) -> int:
    """The pitch ratio as the input rate of the shift: SAMPLE_RATE * ratio, rounded
    to _PITCH_STEP_HZ (SAMPLE_RATE itself: no shift)."""
    return int(round(SAMPLE_RATE * pitch_ratio(pitch) / _PITCH_STEP_HZ)) * _PITCH_STEP_HZ


def graph_name() -> str:
    """TOOLKIT_KOKORO_GRAPH, else the float32 graph on CUDA and the default one on the CPU."""
    name = os.environ.get(GRAPH_ENV, "").strip() or (
        GPU_GRAPH if session_device() == "cuda" else assets.DEFAULT_GRAPH)
    if name not in assets.GRAPHS:
        raise SynthError(f"{GRAPH_ENV}={name!r}: known graphs {', '.join(assets.GRAPHS)}")
    return name


def session_threads() -> int:
    value = os.environ.get(THREADS_ENV, "").strip() or "1"
    try:
        threads = int(value)
    except ValueError:
        threads = 0
    if threads < 1:
        raise SynthError(f"{THREADS_ENV}={value!r}: need a positive number of threads")
    return threads


def session_device() -> str:
    """`cpu` or `cuda`: where the sessions run, from TOOLKIT_KOKORO_PROVIDER (see the module
    docstring); SynthError for an unknown value or for cuda where onnxruntime has no CUDA."""
    value = os.environ.get(PROVIDER_ENV, "").strip().lower() or "cpu"
    if value not in PROVIDER_CHOICES:
        raise SynthError(f"{PROVIDER_ENV}={value!r}: one of {', '.join(PROVIDER_CHOICES)}")
    if value == "cpu":
        return "cpu"
    import onnxruntime as ort
    available = ort.get_available_providers()
    if _CUDA in available:
        return "cuda"
    if value == "cuda":
        raise SynthError(f"{PROVIDER_ENV}=cuda: this onnxruntime {ort.__version__} offers only "
                         f"{', '.join(available)}; install onnxruntime-gpu in its place "
                         f"(pip uninstall onnxruntime; pip install onnxruntime-gpu)")
    return "cpu"


def make_session(path: str, threads: int, device: str = "cpu"):
    """An ONNX Runtime session tuned for one renderer process: `threads` intra-op
    threads that do not spin when idle (forked siblings want the cores), sequential
    execution, all graph optimisations; on `device` cuda, the CUDA provider first (nodes
    it lacks fall back to the CPU)."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3
    providers = ([_CUDA] if device == "cuda" else []) + ["CPUExecutionProvider"]
    return ort.InferenceSession(path, so, providers=providers)


@lru_cache(maxsize=None)
def _package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return "missing"


@ENGINES.register(ENGINE)
class KokoroEngine(Engine):
    name = ENGINE
    install_hint = INSTALL_HINT
    cache_clips = True

    def __init__(self, work_dir: str, graph: Optional[str] = None,
                 threads: Optional[int] = None):
        """`graph`: int8 or float32 (default: TOOLKIT_KOKORO_GRAPH, else the fastest
        measured here); `threads`: ONNX Runtime intra-op threads (default 1)."""
        super().__init__(work_dir)
        self.graph = graph or graph_name()
        if self.graph not in assets.GRAPHS:
            raise SynthError(f"unknown Kokoro graph {self.graph!r}; known: "
                             f"{', '.join(assets.GRAPHS)}")
        self.threads = threads or session_threads()
        self.device = session_device()
        self._kokoro = None            # loaded on the first synth, in the rendering process
        self._tables = None
        self._phonemizers: Dict[str, object] = {}

    @classmethod
    def unavailable_reason(cls) -> str:
        if importlib.util.find_spec("kokoro_onnx") is None:
            return f"the Kokoro runtime (Python package kokoro-onnx) is missing: {INSTALL_HINT}"
        if not assets.is_current(graphs=(graph_name(),)):
            return (f"Kokoro's model and voices are not installed (or not current) in "
                    f"{assets.kokoro_dir()}: {INSTALL_HINT}")
        return ""

    @classmethod
    def voices(cls) -> List[Voice]:
        return kokoro_voices() if cls.available() else []

    @classmethod
    def blends(cls, n: int, seed: int) -> List[Voice]:
        return kokoro_blends(n, seed)

    @classmethod
    def fingerprint(cls) -> str:
        """Model, voices and graph hashes from the manifest, the runtime packages
        (kokoro-onnx, onnxruntime, and espeak-ng's phonemes through phonemizer and
        espeakng-loader), and this module's RENDER_VERSION."""
        device = session_device()
        return _fingerprint(graph_name()) + ("" if device == "cpu" else f",device={device}")

    def effective_args(self, rate, pitch, prange, seed, time_words):
        # The graph is in the fingerprint of the class default; an engine made with
        # another graph says so here.
        # Word onsets cost a few ms and are always made, so time_words is not in the key:
        # recipes that time words and those that do not share clips.
        args = {"speed": _speed(rate), "pitch_rate": pitch_step(pitch)}
        if self.graph != graph_name():
            args["graph"] = self.graph
        if assets.GRAPHS[self.graph][1]:
            # float32 sums in a thread-dependent order (1-LSB differences); int8 does not
            args["threads"] = self.threads
        if self.device != "cpu":
            args["device"] = self.device
        return args

    # ----------------------------------------------------------------------------------

    def _load(self) -> None:
        reason = self.unavailable_reason()
        if reason:
            raise SynthError(f"kokoro: {reason}")
        from kokoro_onnx import Kokoro
        directory = assets.kokoro_dir()
        graph_path = os.path.join(directory, assets.GRAPHS[self.graph][0])
        session = make_session(graph_path, self.threads, self.device)
        if self.device == "cuda" and _CUDA not in session.get_providers():
            raise SynthError(f"kokoro: {PROVIDER_ENV} asks for CUDA, but ONNX Runtime could "
                             f"not start it (no GPU visible, or its CUDA libraries missing): "
                             f"providers {session.get_providers()}")
        voices_path = os.path.join(directory, assets.VOICES_FILE)
        self._kokoro = Kokoro.from_session(session, voices_path)
        self._tables = self._kokoro.voices

    def phonemes(self, text: str, lang: str) -> str:
        """espeak-ng phonemes as kokoro-onnx makes them (phonemizer, punctuation and
        stress kept, characters outside the model's vocabulary dropped), from one
        phonemizer backend per language (phonemizer.phonemize would load a fresh copy
        of libespeak-ng for every call)."""
        from phonemizer.backend import EspeakBackend
        from phonemizer.separator import default_separator
        if lang not in self._phonemizers:
            self._phonemizers[lang] = EspeakBackend(lang, preserve_punctuation=True,
                                                    with_stress=True, logger=_PHONEMIZER_LOG)
        out = self._phonemizers[lang].phonemize([text.strip()], separator=default_separator,
                                                strip=False, njobs=1)[0]
        vocab = self._kokoro.tokenizer.vocab
        return "".join(p for p in out if p in vocab).strip()

    def _synth(self, text: str, voice: Voice, rate: int, pitch: int, prange: int,
               seed: int, time_words: bool) -> Speech:
        if self._kokoro is None:
            self._load()
        missing = [n for n in voice.components if n not in self._tables]
        if missing:
            raise SynthError(f"kokoro: voice {', '.join(missing)} is not in "
                             f"{assets.VOICES_FILE}")
        phonemes = self.phonemes(text, voice_lang(voice))
        if not phonemes:
            raise SynthError(f"kokoro: no phonemes for {text!r}")
        in_rate = pitch_step(pitch)
        ratio = in_rate / SAMPLE_RATE
        # Slower by the pitch ratio here, shorter by it after the shift.
        speed = min(max(_speed(rate) / ratio, SPEED_RANGE[0]), SPEED_RANGE[1])
        try:
            audio, sr, timings = self._kokoro.create_timed(
                phonemes, style_table(voice, self._tables), speed=speed, is_phonemes=True)
        except ValueError as err:      # kokoro-onnx's word for bad input
            raise SynthError(f"kokoro failed for {text!r} ({voice.name}): {err}") from None
        audio = np.asarray(audio, np.float32)
        if in_rate != SAMPLE_RATE:
            from toolkit.data.audio import resample
            audio = resample(audio, in_rate, SAMPLE_RATE)
        audio = (np.round(np.clip(audio, -1.0, 32767 / 32768) * 32768) / 32768).astype(np.float32)
        onsets = None
        if timings:
            lang = voice_lang(voice)
            isolated = [self._bare_phonemes(w, lang) for w in text.split()]
            onsets = _word_onsets(text, timings, isolated, SAMPLE_RATE / ratio, len(audio))
        return Speech(audio, SAMPLE_RATE, onsets)

    def _bare_phonemes(self, word: str, lang: str) -> str:
        """A word's phonemes said alone, without stress or punctuation (a number may
        become several words)."""
        return "".join(p for p in self.phonemes(word, lang)
                       if p not in _PUNCTUATION and p not in _STRESS).strip()


def _speed(rate: float) -> float:
    return round(float(rate) / 175.0, 4)


@lru_cache(maxsize=None)
def _fingerprint(graph: str) -> str:
    manifest = assets.read_manifest() or {}
    files = manifest.get("files", {})
    parts = [f"render={RENDER_VERSION}", f"graph={graph}"]
    for name in (assets.GRAPHS[graph][0], assets.VOICES_FILE):
        parts.append(f"{name}={files.get(name, {}).get('sha256', 'missing')[:16]}")
    for package in ("kokoro-onnx", "onnxruntime", "phonemizer", "espeakng-loader"):
        parts.append(f"{package}={_package_version(package)}")
    parts.append(f"cpu={_cpu_kernels()}")
    return ",".join(parts)


def _cpu_kernels() -> str:
    """The instruction sets ONNX Runtime picks its kernels by: clips made with other
    kernels (a cache shared between machines) may differ in the last bits."""
    import platform
    flags = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    wanted = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni",
              "avx_vnni", "amx_int8", "amx_bf16", "neon", "asimd")
    return platform.machine() + "+" + "+".join(f for f in wanted if f in flags)


_STRESS = set("ˈˌ")


def _word_onsets(text: str, timings, isolated: Sequence[str], rate: float, n_samples: int):
    """(1-based character of each text word, its first sample) from the phoneme timings
    (seconds in the model's audio; `rate` output samples a second of it) and each text
    word's phonemes said alone (`isolated`: stress and punctuation dropped, spaces kept).
    When every text word is one phoneme word alone and the utterance has as many phoneme
    words, word i starts with phoneme word i. espeak-ng joins some words ("on the" ->
    "ɔnðə"), so otherwise the text's words are laid over the utterance's phonemes by the
    lengths of their isolated phonemes: word i starts where the phonemes of words < i end.
    None when neither fits (context changed a word's phonemes, or a number became words)."""
    stream: List[Tuple[float, bool]] = []        # (start, first phoneme of a word)
    word_starts: List[float] = []                # stress marks included: they take time
    new_word = True
    for t in timings:
        if t.phoneme == " ":
            new_word = True
        elif t.phoneme not in _PUNCTUATION:
            if new_word:
                word_starts.append(t.start)
            if t.phoneme not in _STRESS:
                stream.append((t.start, new_word))
            new_word = False
    chars = word_char_starts(text)
    limit = max(n_samples - 1, 0)
    if len(isolated) != len(chars):
        return None
    if len(word_starts) == len(chars) and not any(" " in p for p in isolated):
        return [(c, min(int(round(s * rate)), limit)) for c, s in zip(chars, word_starts)]
    lengths = [len(p.replace(" ", "")) for p in isolated]
    if sum(lengths) != len(stream) or 0 in lengths:
        return None
    starts = set(np.cumsum([0] + lengths[:-1]).tolist())
    if any(first and i not in starts for i, (_, first) in enumerate(stream)):
        return None
    onsets, at = [], 0
    for c, n in zip(chars, lengths):
        onsets.append((c, min(int(round(stream[at][0] * rate)), limit)))
        at += n
    return onsets
