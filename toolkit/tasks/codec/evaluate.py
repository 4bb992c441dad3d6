"""Objective evaluation of an exported codec on a test data list (toolkit.bin.evaluate_codec):
metrics of the codec and of signal-processing baselines at stated bitrates averaged over
the utterances, a Markdown table, results.json and a spectrogram figure of one utterance.
"""
import json
import os
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import torch

from toolkit.config import ConfigError
from toolkit.data.audio import BadEntry
from toolkit.data.pipeline import evaluation_pipeline
from toolkit.errors import DataError
from toolkit.tasks.codec.runtime import ExportedCodec


def parse_baseline(text: str):
    """`mulaw:TARGET_RATE:BITS` or `melgl:N_MELS:FRAME_RATE:BITS` -> (name, codec function
    (wave, sample_rate) -> (decoded, bitrate))."""
    from toolkit.tasks.codec.baselines import melgl_codec, mulaw_codec
    parts = text.split(":")
    try:
        numbers = [int(p) for p in parts[1:]]
    except ValueError:
        numbers = []
    if parts[0] == "mulaw" and len(numbers) == 2:
        target, bits = numbers
        return f"mu-law {target / 1000:g} kHz {bits} bit", \
            lambda x, sr: mulaw_codec(x, sr, target, bits)
    if parts[0] == "melgl" and len(numbers) == 3:
        n_mels, frame_rate, bits = numbers
        return f"mel+Griffin-Lim {n_mels} mels {frame_rate} fps {bits} bit", \
            lambda x, sr: melgl_codec(x, sr, n_mels, frame_rate, bits)
    raise ConfigError(f"baseline {text!r}: expected mulaw:TARGET_RATE:BITS or "
                      "melgl:N_MELS:FRAME_RATE:BITS")


METRIC_COLUMNS = (("mel_distance", "mel distance (lower better)", "{:.3f}"),
                  ("stft_distance", "STFT distance (lower better)", "{:.3f}"),
                  ("si_sdr", "SI-SDR dB (higher better)", "{:.2f}"),
                  ("stoi", "STOI (higher better)", "{:.3f}"))


def evaluate_list(codec: ExportedCodec, test_data: str, baselines: List[Tuple[str, Any]],
                  max_utts: int = 0, plot_key: str = "",
                  n_qs: Sequence[int] = ()) -> Dict[str, Any]:
    """Metrics (toolkit.tasks.codec.metrics.evaluate_pair) of the codec and each baseline,
    averaged over the usable utterances of `test_data`; the waveforms of one utterance
    (`plot_key`, else the first) are kept for the spectrogram figure. `n_qs`: the codec
    also at these numbers of codebooks (rows `codec n_q=K`, lower bitrates of the same
    codes: residual VQ's first K stages)."""
    from toolkit.config import DatasetConfig
    from toolkit.data.datalist import BadCounter, DataList
    from toolkit.tasks.codec.metrics import evaluate_pair
    test = DataList.load(test_data, require_label=False)
    pipeline = evaluation_pipeline(DatasetConfig(sample_rate=codec.sample_rate))
    reduced = {f"codec n_q={k}": k for k in sorted(set(n_qs), reverse=True)
               if codec.check_n_q(k) < codec.n_codebooks}
    names = ["codec"] + list(reduced) + [name for name, _ in baselines]
    sums: Dict[str, Dict[str, float]] = {n: {} for n in names}
    rates = {"codec": codec.bitrate, **{n: codec.bitrate_at(k) for n, k in reduced.items()}}
    bad, used, plot = BadCounter(), 0, None
    for i in range(len(test)):
        if max_utts and used >= max_utts:
            break
        entry = test.entry(i)
        try:
            wave = pipeline.load(entry)
        except BadEntry as err:
            bad.add(err.reason, entry["key"], err.detail)
            continue
        codes = codec.encode(wave)
        decoded = {"codec": codec.decode(codes, len(wave))}
        for name, k in reduced.items():
            decoded[name] = codec.decode(codes[:k], len(wave))
        for name, fn in baselines:
            decoded[name], rates[name] = fn(wave, codec.sample_rate)
        for name in names:
            for k, v in evaluate_pair(wave, decoded[name], codec.sample_rate).items():
                sums[name][k] = sums[name].get(k, 0.0) + v
        used += 1
        if plot is None or entry["key"] == plot_key:
            plot = {"key": entry["key"], "original": wave, **decoded}
    if not used:
        raise DataError(f"{test_data}: no usable utterance ({bad.summary()})")
    systems = []
    for name in names:
        row = {"system": name, "bitrate": rates[name]}
        for key, _, _ in METRIC_COLUMNS:
            row[key] = sums[name][key] / used if key in sums[name] else None
        systems.append(row)
    return {"utterances": used, "skipped": bad.total(), "systems": systems, "plot": plot,
            "fingerprint": codec.fingerprint, "sample_rate": codec.sample_rate}


def markdown_table(result: Dict[str, Any]) -> str:
    header = "| system | kbit/s | " + " | ".join(c[1] for c in METRIC_COLUMNS) + " |"
    lines = [header, "|" + "---|" * (2 + len(METRIC_COLUMNS))]
    for row in result["systems"]:
        cells = [row["system"], f"{row['bitrate'] / 1000:g}"]
        cells += ["n/a" if row[k] is None else fmt.format(row[k]) for k, _, fmt in METRIC_COLUMNS]
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
    with open(paths["markdown"], "w", encoding="utf-8") as f:
        f.write(f"Codec evaluation over {result['utterances']} utterances "
                f"({result['skipped']} skipped), model {result['fingerprint']}; baselines use "
                "no entropy coding.\n\n" + markdown_table(result))
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    rates = {r["system"]: r["bitrate"] for r in result["systems"]}
    plot_spectrograms(result["plot"], rates, result["sample_rate"], paths["png"])
    return paths
