"""Ships an export as one of the toolkit's pretrained models: copies model.safetensors and
config.json into toolkit/pretrained/NAME/ and writes its model card (README.md) from the
recipe's template, filling {{name}}, {{sha256}}, {{config_sha256}}, {{parameters}},
{{size_kb}}, {{commit}}, {{date}}, {{task}}, {{summary}} (the --summary files' lines), each
--set KEY=VALUE and each --set-file KEY=FILE (the file's text).
A model over 10 MiB, a template field nobody fills, or a NAME already shipped (unless
--overwrite) is refused. The card always carries the sha256 lines of the weights and of
config.json that loading checks; an existing model is replaced so that NAME always loads.

  python -m toolkit.bin.package_pretrained --export-dir exp/ecapa_c192/export \\
      --name ecapa-voicebank-v1 --card conf/card.md --summary exp/ecapa_c192/score/summary.txt \\
      --set "recipe=egs/voice_bank/speaker_encoder/run.sh" --set "train_minutes=38"
"""
import argparse
import logging
import sys

from toolkit.errors import ConfigError, cli
from toolkit.logging_utils import setup_logging

logger = logging.getLogger("package_pretrained")


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--export-dir", required=True, help="dir with model.safetensors + config.json")
    p.add_argument("--name", required=True, help="the model's name (toolkit/pretrained/NAME)")
    p.add_argument("--card", required=True, help="model card template (Markdown, {{key}} fields)")
    p.add_argument("--summary", action="append", default=[], metavar="FILE",
                   help="figures to quote in {{summary}} (repeatable)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a card field of the recipe's own (repeatable)")
    p.add_argument("--set-file", action="append", default=[], metavar="KEY=FILE",
                   help="a card field filled with a file's text (repeatable)")
    p.add_argument("--out-root", default=None,
                   help="where model dirs go (default: the installed toolkit/pretrained)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a model of the same NAME (default: refuse)")
    return p.parse_args(argv)


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    from toolkit.pretrained import ROOT, file_sha256
    from toolkit.pretrained.package import package
    extra = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        extra[key] = value
    for item in args.set_file:
        key, sep, path = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set-file {item!r}: expected KEY=FILE")
        with open(path, encoding="utf-8") as f:
            extra[key] = f.read().strip()
    out = package(args.export_dir, args.name, args.card, extra, args.summary,
                  root=args.out_root or ROOT, overwrite=args.overwrite)
    logger.info("wrote %s (model.safetensors sha256 %s)", out,
                file_sha256(f"{out}/model.safetensors"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
