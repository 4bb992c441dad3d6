"""Write a speaker (class) inventory: one name per line, sorted in C order, line order =
class index. From a data dir's utt2spk, or from the `spk` fields of a data list — then
`--relabel` rewrites that list's labels from its speakers, which is how speed-perturbed
copies (compute_feats --speed-copies: speaker `sp0.9-<spk>`) become new classes.
`<inventory>.map` keeps each class's original speaker and speed (class, speaker, speed).

  python -m toolkit.bin.make_inventory data/dict/speakers.txt --utt2spk data/train/utt2spk
  python -m toolkit.bin.make_inventory data/dict/speakers.txt \\
      --data-list data/train/fbank/data.list --relabel
"""
import argparse
import json
import logging
import re
import sys

from toolkit.errors import DataError, cli
from toolkit.logging_utils import setup_logging

logger = logging.getLogger("make_inventory")
SPEED_PREFIX = re.compile(r"^sp([0-9.]+)-(.+)$")


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("output", help="inventory file to write")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--utt2spk", help="Kaldi utt2spk")
    src.add_argument("--data-list", help="data list whose entries carry `spk`")
    p.add_argument("--relabel", action="store_true",
                   help="with --data-list: rewrite its `label` fields from `spk`")
    return p.parse_args(argv)


def original_of(name: str):
    m = SPEED_PREFIX.match(name)
    return (m.group(2), float(m.group(1))) if m else (name, 1.0)


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    from toolkit.data.datalist import write_datalist
    from toolkit.data.inventory import write_inventory
    from toolkit.data.kaldi import c_order, read_table
    from toolkit.fileio import atomic_write_text
    entries = None
    if args.utt2spk:
        speakers = set(read_table(args.utt2spk).values())
    else:
        entries = []
        with open(args.data_list, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                entry = json.loads(line)
                if not isinstance(entry.get("spk"), str) or not entry["spk"]:
                    raise DataError(f"{args.data_list}:{lineno}: entry {entry.get('key')} "
                                    "has no `spk`")
                entries.append(entry)
        speakers = {e["spk"] for e in entries}
    names = sorted(speakers, key=c_order)
    write_inventory(args.output, names)
    atomic_write_text(args.output + ".map", "".join(
        f"{n} {original_of(n)[0]} {original_of(n)[1]:g}\n" for n in names))
    if args.relabel:
        if entries is None:
            raise DataError("--relabel needs --data-list")
        index = {n: i for i, n in enumerate(names)}
        for e in entries:
            e["label"] = index[e["spk"]]
        write_datalist(args.data_list, entries)
    originals = {original_of(n)[0] for n in names}
    logger.info("wrote %s: %d classes (%d original speakers)", args.output, len(names),
                len(originals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
