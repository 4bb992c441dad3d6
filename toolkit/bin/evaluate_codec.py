"""Objective quality of an exported codec, of reference codecs, or of both, on a test data
list: per system its bitrate, its delay (estimated once from the first utterances and
removed before every metric) and the chosen metrics averaged over the utterances, as a
Markdown table (results.md) and JSON (results.json, with seconds per utterance of each
system and metric), plus log-mel spectrograms of one utterance (original, each system) in
spectrograms.png.

  python -m toolkit.bin.evaluate_codec --model exp/codec/export \\
      --test-data data/test/data.list --out-dir exp/codec/eval \\
      --baseline codec2:2400 --baseline opus:6 --baseline mulaw:8000:8
  python -m toolkit.bin.evaluate_codec --sample-rate 16000 --test-data data/test/data.list \\
      --out-dir exp/baselines --baseline codec2:3200 --baseline opus:8    # no model

--n-q K adds a row for the codec with its first K codebooks (K x frame rate x log2(codebook
size) bit/s): residual VQ's lower bitrates of the same codes, decoded through the export's
model.safetensors (the graphs take every codebook).

DNSMOS (--metrics dnsmos_ovrl,dnsmos_sig,dnsmos_bak,dnsmos_p808) scores each decoded signal
without a reference; --baseline original adds the input's own row: the intrusive metrics'
ceiling and the DNSMOS of the clean input.

A metric or baseline whose package is missing (they come with tools/install.sh), or a
metric that cannot score a pair, stops the run with one `error:` line: a table never has
gaps.
"""
import argparse
import logging
import sys

from toolkit.errors import cli
from toolkit.logging_utils import setup_logging

logger = logging.getLogger("evaluate_codec")


def _baseline(text: str):
    from toolkit.config import ConfigError
    from toolkit.tasks.codec.baselines import parse_baseline
    try:
        return parse_baseline(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _metrics(text: str):
    from toolkit.tasks.codec.metrics import METRICS
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in METRICS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown metric {', '.join(unknown) or '(none given)'}; known: "
            f"{', '.join(METRICS.names())}")
    return names


def _epilog() -> str:
    from toolkit.tasks.codec.baselines import baseline_help
    from toolkit.tasks.codec.metrics import ALL_METRICS, DNSMOS_METRICS, METRICS
    listed = ALL_METRICS + DNSMOS_METRICS
    names = listed + tuple(n for n in METRICS.names() if n not in listed)
    metrics = "\n".join(f"  {n}: {METRICS.get(n).title}" for n in names)
    return (f"baselines (--baseline SPEC, repeatable):\n{baseline_help()}\n\n"
            f"metrics (--metrics NAME,NAME,...; default: the first {len(ALL_METRICS)}, in "
            f"this order;\nthe DNSMOS ones score the decoded signal alone):\n{metrics}")


def get_args(argv=None):
    from toolkit.tasks.codec.metrics import ALL_METRICS
    p = argparse.ArgumentParser(description=__doc__, epilog=_epilog(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="",
                   help="codec export dir (toolkit.bin.export_model) or pretrained:NAME (a "
                   "codec shipped with the toolkit); without it only the baselines are "
                   "evaluated")
    p.add_argument("--sample-rate", type=int, default=0,
                   help="evaluation rate without --model (with it: the model's rate)")
    p.add_argument("--test-data", required=True, help="data list (JSON lines with `wav`)")
    p.add_argument("--out-dir", required=True, help="where results.md/.json/.png go")
    p.add_argument("--backend", choices=("onnx", "torch", "safetensors"), default="onnx",
                   help="graphs to run: onnx (onnxruntime), torch (TorchScript) or "
                   "safetensors (PyTorch modules from the weights; a pretrained:NAME always)")
    p.add_argument("--baseline", action="append", default=[], type=_baseline,
                   metavar="SPEC", help="a reference codec, KIND:ARGS (listed below; "
                   "repeatable)")
    p.add_argument("--metrics", type=_metrics, default=list(ALL_METRICS),
                   metavar="NAMES", help="comma-separated metrics (listed below; default: all "
                   "but DNSMOS)")
    p.add_argument("--n-q", action="append", default=[], type=int, metavar="K",
                   help="also evaluate the codec with its first K codebooks only (a lower "
                   "bitrate of the same model, trained by quantizer dropout; repeatable)")
    p.add_argument("--max-utts", type=int, default=0,
                   help="evaluate at most this many utterances (0: all)")
    p.add_argument("--calibration-utts", type=int, default=8,
                   help="utterances each system's delay is estimated from (default: 8)")
    p.add_argument("--max-delay-ms", type=float, default=100.0,
                   help="largest delay searched, either way (default: 100 ms)")
    p.add_argument("--plot-key", default="", help="utterance for the spectrogram figure "
                   "(default: the first evaluated)")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads of the codec model (default: 1)")
    p.add_argument("--jobs", type=int, default=1,
                   help="processes computing the metrics beside the decoding (default: 1; "
                   "the table is the same for any number)")
    args = p.parse_args(argv)
    if not args.model and not args.sample_rate:
        p.error("without --model, give --sample-rate")
    if not args.model and not args.baseline:
        p.error("nothing to evaluate: give --model, --baseline or both")
    return args


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    import torch
    torch.set_num_threads(max(1, args.threads))
    from toolkit.tasks.codec.evaluate import evaluate_list, markdown_table, write_report
    from toolkit.tasks.codec.runtime import open_codec
    codec = open_codec(args.model, args.backend, args.threads) if args.model else None
    result = evaluate_list(codec, args.test_data, args.baseline, args.max_utts, args.plot_key,
                           args.n_q, args.metrics, args.sample_rate or None,
                           args.calibration_utts, args.max_delay_ms, args.jobs)
    paths = write_report(result, args.out_dir)
    sys.stdout.write(markdown_table(result))
    seconds = result["timing"]["seconds_per_utterance"]
    logger.info("seconds per utterance (%.2f s of audio): decoding %s; each metric per system "
                "%s", result["timing"]["audio_seconds_per_utterance"],
                ", ".join(f"{k} {v:.3f}" for k, v in seconds["decode"].items()),
                ", ".join(f"{k} {v:.3f}" for k, v in seconds["metric_per_system"].items()))
    logger.info("wrote %s", ", ".join(paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
