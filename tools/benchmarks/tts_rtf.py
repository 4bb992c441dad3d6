"""Real-time factor of every TTS engine installed here, and Kokoro's speed options.

Each engine speaks the same sentences (the read-speech grammar of toolkit.tasks.codec.corpus,
fixed seed) with its first voices, the clip cache off; RTF = synthesis wall time / audio
seconds, model loading excluded (reported apart). Engines that are not installed are
listed as such. For Kokoro it also measures:

- the int8 and float32 graphs (float32: `python -m toolkit.bin.install_kokoro --graphs
  int8,float32` first) with 1 and 2 ONNX Runtime threads, and with idle threads spinning;
- whether the graph takes a batch of more than one utterance;
- rendering as the corpus generators do, in 2 forked children of one thread each:
  seconds of audio per second of wall time on the 2 cores.

Variants are measured in interleaved rounds and the best round is kept, so that other
load on the machine disturbs the comparison less; the load average is printed.

  python tools/benchmarks/tts_rtf.py                    # everything installed
  python tools/benchmarks/tts_rtf.py --engines kokoro --rounds 3
"""
import argparse
import os
import sys
import tempfile
import time

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ["TOOLKIT_TTS_CACHE"] = "off"      # measure synthesis, not the cache

import numpy as np  # noqa: E402

from toolkit.voicebank import training_voices  # noqa: E402
from toolkit.voicebank.engines import ENGINES, engine_class  # noqa: E402
from toolkit.voicebank.pool import run_forked  # noqa: E402
from toolkit.tasks.codec.corpus import sentence  # noqa: E402

ENGINE_ORDER = ["espeak", "flite", "festival", "rhvoice", "pico", "mbrola", "kokoro"]


def texts(n: int, seed: int = 5):
    rng = np.random.default_rng(seed)
    return [sentence(rng) for _ in range(n)]


def time_engine(engine, voices, sentences):
    """(audio seconds, synthesis wall seconds, CPU seconds of this process and its
    children: every thread, and the engines that run a binary per clip) over the
    sentences, voices in turn."""
    audio_s = wall = cpu = 0.0
    for i, text in enumerate(sentences):
        voice = voices[i % len(voices)]
        t, c = time.perf_counter(), _cpu_s()
        speech = engine.synth(text, voice)
        wall += time.perf_counter() - t
        cpu += _cpu_s() - c
        audio_s += len(speech.audio) / speech.sample_rate
    return audio_s, wall, cpu


def _cpu_s() -> float:
    import resource
    own, kids = resource.getrusage(resource.RUSAGE_SELF), \
        resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def engine_rtf(name, sentences, work):
    """In a fresh child: espeak-ng and ONNX Runtime state stay out of the parent."""
    def run(_):
        cls = engine_class(name)
        voices = [v for v in cls.voices() if v.engine == name][:4]
        engine = cls(work)
        t = time.perf_counter()
        engine.synth("hello", voices[0])             # loads models, warms up
        load = time.perf_counter() - t
        return time_engine(engine, voices, sentences) + (load,)
    return run_forked(run, [None], 1, work)[0]


def kokoro_variant(graph, threads, spin, sentences, work):
    def run(_):
        from toolkit.voicebank import kokoro as K
        engine = K.KokoroEngine(work, graph=graph, threads=threads)
        t = time.perf_counter()
        engine._load()
        if spin:
            path = os.path.join(K.assets.kokoro_dir(), K.assets.GRAPHS[graph][0])
            import onnxruntime as ort
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            engine._kokoro.sess = ort.InferenceSession(path, so,
                                                       providers=["CPUExecutionProvider"])
        engine.synth("hello", K.kokoro_voice("af_bella"))
        load = time.perf_counter() - t
        voices = training_voices(K.kokoro_voices())[:4]
        return time_engine(engine, voices, sentences) + (load,)
    return run_forked(run, [None], 1, work)[0]


def kokoro_forked(graph, sentences, work, nj=2):
    """Corpus-style rendering: nj children, one thread each, sentences split between them;
    audio seconds per wall second, model loading included (each child loads it)."""
    def run(chunk):
        from toolkit.voicebank import kokoro as K
        engine = K.KokoroEngine(work, graph=graph, threads=1)
        voices = training_voices(K.kokoro_voices())[:4]
        c = _cpu_s()
        audio_s = time_engine(engine, voices, chunk)[0]
        return audio_s, _cpu_s() - c
    chunks = [sentences[i::nj] for i in range(nj)]
    t = time.perf_counter()
    done = run_forked(run, chunks, nj, work)
    return sum(a for a, _ in done), time.perf_counter() - t, sum(c for _, c in done)


def kokoro_batch_check(work):
    """Does the graph run on a batch of 2 utterances? The answer, in words."""
    def run(_):
        import onnxruntime as ort
        from toolkit.voicebank import kokoro as K
        path = os.path.join(K.assets.kokoro_dir(), K.assets.GRAPHS["int8"][0])
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        shapes = {i.name: i.shape for i in sess.get_inputs()}
        tokens = np.zeros((2, 12), np.int64)
        tokens[:, 1:-1] = 50
        style = np.zeros((2, 256), np.float32)
        try:
            out = sess.run(None, {"tokens": tokens, "style": style,
                                  "speed": np.ones(2, np.float32)})
            return f"inputs {shapes}: batch 2 ran, audio shape {out[0].shape}"
        except Exception as err:      # the runtime's own words are the finding
            return f"inputs {shapes}: batch 2 fails ({str(err).splitlines()[0][:160]})"
    return run_forked(run, [None], 1, work)[0]


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", default=",".join(ENGINE_ORDER))
    p.add_argument("--sentences", type=int, default=8, help="sentences per measurement")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds; best kept")
    args = p.parse_args()
    sentences = texts(args.sentences)
    names = [n for n in args.engines.split(",") if n]
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    rows = {}
    with tempfile.TemporaryDirectory(prefix="tts_rtf_") as work:
        variants = []
        for name in names:
            if name not in ENGINES:
                print(f"{name}: unknown engine")
                continue
            reason = engine_class(name).unavailable_reason()
            if reason:
                print(f"{name}: not installed ({reason})")
                continue
            if name != "kokoro":
                variants.append((name, lambda n=name: engine_rtf(n, sentences, work)))
                continue
            from toolkit.voicebank import kokoro_assets
            graphs = [g for g in kokoro_assets.GRAPHS
                      if kokoro_assets.is_current(graphs=(g,))]
            for graph in graphs:
                for threads in (1, 2):
                    variants.append((f"kokoro {graph}, {threads} thread{'s' * (threads > 1)}",
                                     lambda g=graph, t=threads:
                                     kokoro_variant(g, t, False, sentences, work)))
                variants.append((f"kokoro {graph}, 2 threads spinning",
                                 lambda g=graph: kokoro_variant(g, 2, True, sentences, work)))
                variants.append((f"kokoro {graph}, 2 forked children x 1 thread",
                                 lambda g=graph: kokoro_forked(g, sentences, work) + (None,)))
            missing = sorted(set(kokoro_assets.GRAPHS) - set(graphs))
            if missing:
                print(f"kokoro graphs not derived: {', '.join(missing)} (python -m "
                      f"toolkit.bin.install_kokoro --graphs {','.join(kokoro_assets.GRAPHS)})")
            print("kokoro batching:", kokoro_batch_check(work))
        for r in range(args.rounds):
            for label, fn in variants:
                audio_s, wall, cpu, load = fn()
                best = rows.get(label)
                if best is None or wall / audio_s < best[1] / best[0]:
                    rows[label] = (audio_s, wall, cpu, load)
                print(f"  round {r + 1}: {label}: RTF {wall / audio_s:.3f}, CPU "
                      f"{cpu / audio_s:.3f}", flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    # Under other load, wall time overstates; CPU seconds per audio second do not
    # (for one thread), and audio per wall second is the throughput actually had.
    print("\n| engine | audio s | RTF (wall / audio) | CPU s per audio s | audio s per wall s "
          "| load s |")
    print("|---|---|---|---|---|---|")
    for label, (audio_s, wall, cpu, load) in rows.items():
        load_text = f"{load:.2f}" if load is not None else "incl."
        print(f"| {label} | {audio_s:.1f} | {wall / audio_s:.3f} | {cpu / audio_s:.3f} | "
              f"{audio_s / wall:.2f} | {load_text} |")


if __name__ == "__main__":
    sys.exit(main())
