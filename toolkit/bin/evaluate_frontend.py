"""Phone error rate and streaming speed of a phone front end (task phone_ctc).

  python -m toolkit.bin.evaluate_frontend --frontend exp/ds_tcn_phone/export \
      --data reserved=data/reserved/test/data.list --data festival=data/festival/test/data.list \
      --out-dir exp/ds_tcn_phone/eval

The lists need `tokens` made with the front end's unit list (make_datalist --lexicon
--units). PER is the edit distance of greedy CTC decoding to the reference phones over the
reference phones; each set is decoded whole and streamed in --chunk-ms chunks, which must
agree. The real-time factor streams --rtf-seconds of the first set's audio on one thread.
Writes <out-dir>/results.md (also printed) and results.json."""
import argparse
import json
import os
import sys

from toolkit.errors import UserError, cli


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frontend", required=True,
                   help="pretrained:NAME, a phone_ctc export dir or its model.safetensors")
    p.add_argument("--data", action="append", required=True, metavar="NAME=LIST",
                   help="a named test list (repeat)")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--chunk-ms", type=float, default=100.0, help="streaming chunk length")
    p.add_argument("--rtf-seconds", type=float, default=60.0)
    p.add_argument("--max-utts", type=int, default=0, help="per set; 0: all")
    args = p.parse_args(argv)
    for item in args.data:
        if "=" not in item:
            p.error(f"--data {item!r}: expected NAME=LIST")
    return args


@cli
def main(argv=None):
    args = get_args(argv)
    import numpy as np
    import torch
    from toolkit.data.augment import load_mono
    from toolkit.data.datalist import DataList
    from toolkit.logging_utils import setup_logging
    from toolkit.tasks.kws.frontend import PhoneFrontEnd, phone_error_rate, streaming_rtf
    setup_logging()
    torch.set_num_threads(1)
    frontend = PhoneFrontEnd(args.frontend)
    rows, first_waves = [], []
    for item in args.data:
        name, path = item.split("=", 1)
        data = DataList.load(path, require_label=False)
        if not len(data):
            raise UserError(f"{path}: no usable utterances")
        n = len(data) if args.max_utts <= 0 else min(len(data), args.max_utts)
        entries = [data.entry(i) for i in range(n)]
        whole = phone_error_rate(frontend, entries)
        streamed = phone_error_rate(frontend, entries, chunk_ms=args.chunk_ms)
        if streamed["errors"] != whole["errors"]:
            raise UserError(f"{name}: streamed decoding gives {streamed['errors']} errors, whole "
                            f"utterances {whole['errors']}: the front end does not stream exactly")
        rows.append({"set": name, "list": path, **whole})
        if not first_waves:
            rate = int(frontend.fbank_metadata["sample_rate"])
            total = 0.0
            for e in entries:
                w = load_mono(e["wav"], rate)
                first_waves.append(w)
                total += len(w) / rate
                if total >= args.rtf_seconds:
                    break
    wave = np.concatenate(first_waves)
    rtf = streaming_rtf(frontend, wave, args.chunk_ms)
    lines = [f"Phone error rate of {args.frontend} ({len(frontend.units) - 1} phones, greedy "
             f"CTC decoding; whole utterances and {args.chunk_ms:g} ms chunks agree)", "",
             "| test set | utterances | hours | reference phones | PER % |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['set']} | {r['utterances']} | {r['seconds'] / 3600:.2f} | "
                     f"{r['reference']} | {100 * r['per']:.1f} |")
    lines += ["", f"Streaming real-time factor: {rtf:.4f} (one thread, {args.chunk_ms:g} ms "
              f"chunks, features included, {len(wave) / 16000:.0f} s of audio)"]
    text = "\n".join(lines) + "\n"
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.join(args.out_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump({"frontend": args.frontend, "rows": rows, "rtf": rtf,
                   "chunk_ms": args.chunk_ms}, f, indent=1)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
