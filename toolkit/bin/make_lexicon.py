"""Lexicon and unit list for CTC targets, from the words of Kaldi data dirs.

  python -m toolkit.bin.make_lexicon --unit phone data/train data/dev data/test \\
      --lexicon data/dict/lexicon.txt --units data/dict/units.txt

`--unit phone` asks espeak-ng for pronunciations (`--voice`, default en-us); `--unit char`
spells words (any script). units.txt starts with <blank>, the CTC blank. With
`--lexicon-in`, an existing lexicon (e.g. a hand-made one) is used and only the unit
list is written; words of the data dirs missing from it are reported.
"""
import argparse
import logging
import os
import sys

from toolkit.tasks.kws.tokens import (LEXICON_BUILDERS, read_lexicon, transcript_words, units_of,
                                 write_lexicon)
from toolkit.fileio import atomic_write_text
from toolkit.logging_utils import setup_logging
from toolkit.errors import cli

logger = logging.getLogger("make_lexicon")


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data_dirs", nargs="+", help="Kaldi data dirs whose `text` words are covered")
    p.add_argument("--unit", default="phone", choices=LEXICON_BUILDERS.names())
    p.add_argument("--voice", default="en-us", help="espeak-ng voice for --unit phone")
    p.add_argument("--lexicon-in", help="use this lexicon instead of building one")
    p.add_argument("--lexicon", required=True, help="lexicon to write")
    p.add_argument("--units", required=True, help="unit list to write (<blank> first)")
    return p.parse_args(argv)


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    texts = [os.path.join(d, "text") for d in args.data_dirs]
    for t in texts:
        if not os.path.exists(t):
            logger.error("%s not found", t)
            return 2
    words = transcript_words(texts)
    if args.lexicon_in:
        lexicon = read_lexicon(args.lexicon_in)
    else:
        lexicon = LEXICON_BUILDERS.get(args.unit)(words, args.voice)
    missing = [w for w in words if w not in lexicon]
    if missing:
        logger.warning("%d of %d words have no pronunciation (their utterances get no CTC "
                       "targets), e.g. %s", len(missing), len(words), ", ".join(missing[:5]))
    for path in (args.lexicon, args.units):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_lexicon(args.lexicon, lexicon)
    units = units_of(lexicon)
    atomic_write_text(args.units, "".join(u + "\n" for u in units))
    logger.info("wrote %s (%d words) and %s (%d units incl. blank)", args.lexicon, len(lexicon),
                args.units, len(units))
    return 0


if __name__ == "__main__":
    sys.exit(main())
