"""Objective evaluation of an exported codec, of registered baselines (Codec2, Opus, naive
codecs: toolkit.tasks.codec.baselines) or of both on a test data list: registered metrics
(toolkit.tasks.codec.metrics) averaged over the utterances after each system's delay is
removed (toolkit.tasks.codec.delay), bitrates, a Markdown table, results.json and a
spectrogram figure of one utterance.
"""
import json
import logging
import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from toolkit.config import ConfigError
from toolkit.data.audio import BadEntry
from toolkit.data.pipeline import evaluation_pipeline
from toolkit.errors import DataError
from toolkit.tasks.codec.baselines import Baseline, parse_baseline
from toolkit.tasks.codec.delay import apply_delay, estimate_delay
from toolkit.tasks.codec.metrics import ALL_METRICS, MetricError, get_metrics
from toolkit.tasks.codec.runtime import ExportedCodec

logger = logging.getLogger(__name__)

__all__ = ["parse_baseline", "evaluate_list", "markdown_table", "write_report"]

Outputs = Dict[str, Tuple[np.ndarray, float]]      # system -> (decoded, bitrate)


class _Systems:
    """Decodes one utterance with every system: the codec (all codebooks, then its first
    n_q), then the baselines; keeps each system's decoding seconds."""

    def __init__(self, codec: Optional[ExportedCodec], n_qs: Sequence[int],
                 baselines: Sequence[Baseline]):
        self.codec, self.baselines = codec, list(baselines)
        self.reduced = {}
        if codec is not None:
            self.reduced = {f"codec n_q={k}": k for k in sorted(set(n_qs), reverse=True)
                            if codec.check_n_q(k) < codec.n_codebooks}
        elif n_qs:
            raise ConfigError("--n-q needs a codec model (--model)")
        self.names = (["codec"] + list(self.reduced) if codec is not None else []) + \
            [b.name for b in self.baselines]
        repeated = sorted({n for n in self.names if self.names.count(n) > 1})
        if repeated:
            raise ConfigError(f"systems given twice: {', '.join(repeated)}")
        self.seconds = {n: 0.0 for n in self.names}

    def run(self, wave: np.ndarray, sample_rate: int) -> Outputs:
        out: Outputs = {}
        if self.codec is not None:
            start = time.perf_counter()
            codes = self.codec.encode(wave)
            out["codec"] = (self.codec.decode(codes, len(wave)), self.codec.bitrate)
            self.seconds["codec"] += time.perf_counter() - start
            for name, k in self.reduced.items():
                start = time.perf_counter()
                out[name] = (self.codec.decode(codes[:k], len(wave)), self.codec.bitrate_at(k))
                self.seconds[name] += time.perf_counter() - start
        for baseline in self.baselines:
            start = time.perf_counter()
            decoded, bitrate = baseline.run(wave, sample_rate)
            out[baseline.name] = (np.asarray(decoded, dtype=np.float32), float(bitrate))
            self.seconds[baseline.name] += time.perf_counter() - start
        return out


class PairMetricError(MetricError):
    """A metric that cannot score one pair: args (metric name, reason), which the
    evaluation turns into a message naming the system and the utterance too."""


def score_pair(reference: np.ndarray, decoded: np.ndarray, sample_rate: int,
               metric_names: Sequence[str]) -> Tuple[Dict[str, float], Dict[str, float]]:
    """(value, seconds) of each metric on one aligned pair; a module-level function so that
    metric workers can run it."""
    values, seconds = {}, {}
    for metric in get_metrics(metric_names):
        start = time.perf_counter()
        try:
            value = metric.compute(reference, decoded, sample_rate)
        except MetricError as err:
            raise PairMetricError(metric.name, str(err)) from None
        seconds[metric.name] = time.perf_counter() - start
        if not np.isfinite(value):
            raise PairMetricError(metric.name, f"the score is {value}")
        values[metric.name] = value
    return values, seconds


def _one_thread() -> None:
    """Metric workers: one torch thread each, as `jobs` of them share the cores."""
    torch.set_num_threads(1)


def _named(err: PairMetricError, system: str, key: str) -> MetricError:
    metric, reason = err.args
    return MetricError(f"{metric} of {system} on utterance {key}: {reason}")


class _Scores:
    """Per-system sums of the metrics on delay-compensated pairs, of bitrate x duration,
    and the seconds each metric took. With jobs > 1 the metrics run in that many worker
    processes (spawned: they load no codec) while the caller decodes the next utterances;
    the sums are taken in utterance order, so the table is the same for any `jobs`."""

    def __init__(self, names: Sequence[str], metrics, sample_rate: int, jobs: int = 1):
        self.names, self.sample_rate = list(names), sample_rate
        self.metric_names = [m.name for m in metrics]
        self.sums = {n: {m: 0.0 for m in self.metric_names} for n in names}
        self.bits = {n: 0.0 for n in names}
        self.seconds = {m: 0.0 for m in self.metric_names}
        self.duration = 0.0
        self.used = 0
        self.pool = None
        if jobs > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor
            self.pool = ProcessPoolExecutor(jobs, multiprocessing.get_context("spawn"),
                                            initializer=_one_thread)
        self.backlog_limit = 2 * max(1, jobs)       # utterances in flight: bounded memory
        self.pending: List[Tuple[str, Dict[str, Any]]] = []

    def add(self, key: str, wave: np.ndarray, outputs: Outputs, delays: Dict[str, int]):
        jobs = {}
        for name in self.names:
            decoded, bitrate = outputs[name]
            try:
                ref, dec = apply_delay(wave, decoded, delays[name])
            except ValueError as err:
                raise DataError(f"utterance {key}, system {name}: {err}") from None
            self.bits[name] += bitrate * len(wave) / self.sample_rate
            if self.pool is None:
                jobs[name] = self._run(key, name, ref, dec)
            else:
                jobs[name] = self.pool.submit(score_pair, ref, dec, self.sample_rate,
                                              self.metric_names)
        self.duration += len(wave) / self.sample_rate
        self.pending.append((key, jobs))
        while len(self.pending) > (self.backlog_limit if self.pool is not None else 0):
            self._collect_oldest()

    def _run(self, key, name, ref, dec):
        try:
            return score_pair(ref, dec, self.sample_rate, self.metric_names)
        except PairMetricError as err:
            raise _named(err, name, key) from None

    def _collect_oldest(self) -> None:
        key, jobs = self.pending.pop(0)
        for name in self.names:
            result = jobs[name]
            if self.pool is not None:
                try:
                    result = result.result()
                except PairMetricError as err:
                    raise _named(err, name, key) from None
            values, seconds = result
            for metric in self.metric_names:
                self.sums[name][metric] += values[metric]
                self.seconds[metric] += seconds[metric]
        self.used += 1

    def finish(self) -> None:
        while self.pending:
            self._collect_oldest()
        self.close()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


def evaluate_list(codec: Optional[ExportedCodec], test_data: str,
                  baselines: Sequence[Baseline] = (), max_utts: int = 0, plot_key: str = "",
                  n_qs: Sequence[int] = (), metrics: Sequence[str] = ALL_METRICS,
                  sample_rate: Optional[int] = None, calibration_utts: int = 8,
                  max_delay_ms: float = 100.0, jobs: int = 1) -> Dict[str, Any]:
    """`metrics` (registered names) of the codec (`codec`, None for baselines only) and
    each baseline, averaged over the usable utterances of `test_data` (at most `max_utts`,
    0: all) at the codec's sample rate (else `sample_rate`). `n_qs`: the codec also at
    these numbers of codebooks (rows `codec n_q=K`, residual VQ's first K stages).

    Each system's delay is estimated once, pooled over the first `calibration_utts`
    utterances (toolkit.tasks.codec.delay; at most `max_delay_ms` either way), and removed
    before every metric. Every metric's and baseline's package is checked before any work:
    a missing one, or a metric that cannot score a pair, stops the evaluation with a
    MissingPackageError / MetricError naming it. `jobs` > 1: the metrics run in that many
    worker processes beside the decoding (same table). The waveforms of one utterance
    (`plot_key`, else the first) are kept, aligned, for the spectrogram figure."""
    from toolkit.config import DatasetConfig
    from toolkit.data.datalist import BadCounter, DataList
    try:
        chosen = get_metrics(metrics)
    except KeyError as err:
        raise ConfigError(f"metrics: {err.args[0]}") from None
    if not chosen:
        raise ConfigError(f"no metric chosen; known: {', '.join(ALL_METRICS)}")
    if calibration_utts < 1 or max_delay_ms < 0 or jobs < 1:
        raise ConfigError("calibration_utts and jobs must be >= 1 and max_delay_ms >= 0")
    if codec is None and not baselines:
        raise ConfigError("nothing to evaluate: give a codec model, a baseline or both")
    sample_rate = codec.sample_rate if codec is not None else sample_rate
    if not sample_rate or sample_rate <= 0:
        raise ConfigError("without a codec model the evaluation needs a sample rate")
    for metric in chosen:
        metric.check()
    for baseline in baselines:
        baseline.check()
    systems = _Systems(codec, n_qs, baselines)
    test = DataList.load(test_data, require_label=False)
    pipeline = evaluation_pipeline(DatasetConfig(sample_rate=sample_rate))
    max_delay = int(round(max_delay_ms * sample_rate / 1000))
    bad, plot = BadCounter(), None
    delays: Optional[Dict[str, int]] = None
    calibration: List[Tuple[str, np.ndarray, Outputs]] = []
    estimate_seconds = 0.0

    def score(key: str, wave: np.ndarray, outputs: Outputs) -> None:
        nonlocal plot
        scores.add(key, wave, outputs, delays)
        if plot is None or key == plot_key:
            aligned = {n: apply_delay(wave, outputs[n][0], delays[n])[1] for n in systems.names}
            plot = {"key": key, "original": wave, **aligned}

    def calibrate() -> None:
        nonlocal delays, estimate_seconds
        start = time.perf_counter()
        delays = {n: estimate_delay([(w, out[n][0]) for _, w, out in calibration],
                                    sample_rate, max_delay) for n in systems.names}
        estimate_seconds = time.perf_counter() - start
        logger.info("delays (samples at %d Hz, from %d utterances): %s", sample_rate,
                    len(calibration), ", ".join(f"{n} {d}" for n, d in delays.items()))
        for item in calibration:
            score(*item)
        calibration.clear()

    scores = _Scores(systems.names, chosen, sample_rate, jobs)
    used = 0
    try:
        for i in range(len(test)):
            if max_utts and used >= max_utts:
                break
            entry = test.entry(i)
            try:
                wave = pipeline.load(entry)
            except BadEntry as err:
                bad.add(err.reason, entry["key"], err.detail)
                continue
            outputs = systems.run(wave, sample_rate)
            used += 1
            if delays is None:
                calibration.append((entry["key"], wave, outputs))
                if len(calibration) >= calibration_utts:
                    calibrate()
            else:
                score(entry["key"], wave, outputs)
        if not used:
            raise DataError(f"{test_data}: no usable utterance ({bad.summary()})")
        if delays is None:
            calibrate()
        scores.finish()
    finally:
        scores.close()
    rows = []
    for name in systems.names:
        row = {"system": name, "bitrate": scores.bits[name] / scores.duration,
               "delay_samples": delays[name], "delay_ms": 1000.0 * delays[name] / sample_rate}
        row.update({m.name: scores.sums[name][m.name] / scores.used for m in chosen})
        rows.append(row)
    pairs = scores.used * len(systems.names)
    timing = {"seconds_per_utterance": {"decode": {n: s / scores.used
                                                   for n, s in systems.seconds.items()},
                                        "metric_per_system": {k: v / pairs for k, v in
                                                              scores.seconds.items()},
                                        "delay_estimate_all_systems":
                                            estimate_seconds / min(used, calibration_utts)},
              "audio_seconds_per_utterance": scores.duration / scores.used}
    return {"utterances": scores.used, "skipped": bad.total(), "systems": rows, "plot": plot,
            "metrics": [m.name for m in chosen], "timing": timing,
            "delay": {"calibration_utterances": min(used, calibration_utts),
                      "max_delay_ms": max_delay_ms},
            "fingerprint": codec.fingerprint if codec is not None else None,
            "sample_rate": sample_rate}


def markdown_table(result: Dict[str, Any]) -> str:
    metrics = get_metrics(result["metrics"])
    header = "| system | kbit/s | delay ms | " + " | ".join(m.title for m in metrics) + " |"
    lines = [header, "|" + "---|" * (3 + len(metrics))]
    for row in result["systems"]:
        cells = [row["system"], f"{row['bitrate'] / 1000:.4g}", f"{row['delay_ms']:.1f}"]
        cells += [m.fmt.format(row[m.name]) for m in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_spectrograms(plot: Dict[str, Any], rates: Dict[str, float], sample_rate: int,
                      path: str) -> None:
    """Log-mel spectrograms (80 bands, 1024-point window, hop 256) one above the other."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from toolkit.nn.spectral import log_mel_spectrogram
    names = ["original"] + [k for k in plot if k not in ("key", "original")]
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 2.2 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        wave = torch.from_numpy(np.ascontiguousarray(plot[name], dtype=np.float32))[None]
        spec = log_mel_spectrogram(wave, sample_rate, 1024, 256, n_mels=80)[0].numpy()
        ax.imshow(spec, origin="lower", aspect="auto", vmin=-5.0, vmax=float(spec.max()),
                  extent=(0, len(plot[name]) / sample_rate, 0, spec.shape[0]))
        title = name if name == "original" else f"{name} ({rates[name] / 1000:g} kbit/s)"
        ax.set_title(f"{plot['key']}: {title}", fontsize=9)
        ax.set_ylabel("mel band")
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(result: Dict[str, Any], out_dir: str) -> Dict[str, str]:
    """results.md, results.json and spectrograms.png in `out_dir`; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"markdown": os.path.join(out_dir, "results.md"),
             "json": os.path.join(out_dir, "results.json"),
             "png": os.path.join(out_dir, "spectrograms.png")}
    summary = {k: v for k, v in result.items() if k != "plot"}
    model = f"model {result['fingerprint']}" if result["fingerprint"] else "no codec model"
    with open(paths["markdown"], "w", encoding="utf-8") as f:
        f.write(f"Codec evaluation over {result['utterances']} utterances "
                f"({result['skipped']} skipped) at {result['sample_rate']} Hz, {model}. Each "
                "system's delay was estimated once from the first "
                f"{result['delay']['calibration_utterances']} utterances and removed before "
                "every metric; mu-law and mel+Griffin-Lim rows use no entropy coding; Opus "
                "kbit/s are measured from the packet bytes.\n\n" + markdown_table(result))
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    rates = {r["system"]: r["bitrate"] for r in result["systems"]}
    plot_spectrograms(result["plot"], rates, result["sample_rate"], paths["png"])
    return paths
