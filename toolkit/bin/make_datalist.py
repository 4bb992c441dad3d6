"""Kaldi data dir -> data list (one JSON object per line: key, wav, txt, duration, label,
and `tokens`, the CTC target ids, when --lexicon and --units are given). A `kw_times`
file in the data dir (`utt start end`, seconds) adds `kw_start`/`kw_end` to those
utterances: the max-pooling loss can then score a keyword where it ends.

Labels come from the inventory: `--label-mode keyword` gives the index of the keyword
whose words occur in the transcript (else -1, filler); `--label-mode class` needs the
transcript to be a class name; `--label-mode speaker` takes the utterance's speaker
(utt2spk); `--label-mode none` labels nothing (-1 everywhere: phone recognition, whose
targets are the `tokens`). Utterances whose label cannot be resolved are reported.

Several DATA_DIR OUTPUT pairs in one call share one start-up (a recipe's train, dev and
test sets).
"""
import argparse
import logging
import sys
from collections import Counter

from toolkit.cli import path_pairs
import toolkit.tasks  # noqa: F401  (registers the tasks' label modes)
from toolkit.data.datalist import write_datalist
from toolkit.data.inventory import read_inventory
from toolkit.data.kaldi import LABELERS, labelled_entries, read_table
from toolkit.errors import DataError, cli
from toolkit.logging_utils import setup_logging
from toolkit.tasks.kws.labels import kw_times_annotator, tokens_annotator
from toolkit.tasks.kws.tokens import Tokenizer, read_lexicon, read_units

logger = logging.getLogger("make_datalist")


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pairs", nargs="+", metavar="DATA_DIR OUTPUT",
                   help="Kaldi data dir with wav.scp and text, then the data list to write "
                   "(repeatable as pairs)")
    p.add_argument("--inventory", help="keyword/class inventory, one per line (required "
                   "unless --label-mode none)")
    p.add_argument("--label-mode", default="keyword", choices=LABELERS.names())
    p.add_argument("--nj", type=int, default=2, help="parallel jobs for missing durations")
    p.add_argument("--feats-scp", help="Kaldi feats.scp (e.g. <data_dir>/feats.scp): entries get "
                   "`feat` and train straight from these features")
    p.add_argument("--lexicon", help="lexicon (word unit ...) for CTC targets; needs --units")
    p.add_argument("--units", help="unit list (<blank> first) from toolkit.bin.make_lexicon")
    args = p.parse_args(argv)
    if not args.inventory and args.label_mode != "none":
        p.error(f"--label-mode {args.label_mode} needs --inventory")
    if bool(args.lexicon) != bool(args.units):
        p.error("--lexicon and --units go together")
    args.pairs = path_pairs(p, args.pairs, "DATA_DIR OUTPUT")
    if args.feats_scp and len(args.pairs) > 1:
        p.error("--feats-scp belongs to one data dir: give one DATA_DIR OUTPUT pair with it")
    return args


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    inventory = []
    try:
        if args.inventory:
            inventory = read_inventory(args.inventory)
    except ValueError as err:
        raise DataError(str(err)) from None
    labeler = LABELERS.get(args.label_mode)(inventory)
    feats = read_table(args.feats_scp) if args.feats_scp else None
    tokenizer = (Tokenizer(read_lexicon(args.lexicon), read_units(args.units))
                 if args.lexicon else None)
    for data_dir, output in args.pairs:
        write_one(data_dir, output, inventory, labeler, feats, tokenizer, args)
    return 0


def write_one(data_dir, output, inventory, labeler, feats, tokenizer, args) -> None:
    entries, problems = labelled_entries(
        data_dir, labeler, args.nj, feats,
        before=kw_times_annotator(data_dir),
        after=tokens_annotator(tokenizer) if tokenizer is not None else None)
    for reason, what in (("no_features", f"have no features in {args.feats_scp} and were left out"),
                         ("no_label", f"have no label in {args.inventory} and were left out"),
                         # Kept for the other losses; a CTC loss skips and counts them.
                         ("note", f"have no CTC targets (words not in {args.lexicon})")):
        keys = problems.get(reason, [])
        if keys:
            logger.warning("%s: %d utterances %s, e.g. %s", data_dir, len(keys), what,
                           ", ".join(keys[:3]))
    n = write_datalist(output, entries)
    counts = Counter(e["label"] for e in entries)
    if len(counts) > 12:
        summary = f"{len(counts)} classes"
    else:
        names = dict(enumerate(inventory))
        summary = ", ".join(f"{names.get(k, 'filler')}={v}" for k, v in sorted(counts.items()))
    logger.info("wrote %s: %d utterances (%s)", output, n, summary)


if __name__ == "__main__":
    sys.exit(main())
