"""Argument helpers shared by the binaries."""
import argparse
from typing import List, Sequence, Tuple


def path_pairs(parser: argparse.ArgumentParser, paths: Sequence[str],
               names: str) -> List[Tuple[str, str]]:
    """INPUT OUTPUT INPUT OUTPUT ... as (input, output) pairs: one binary start serves a
    recipe's every set. An odd count is a usage error naming the expected `names`."""
    if len(paths) % 2:
        parser.error(f"expected {names} pairs, got an odd number of paths ({len(paths)})")
    return list(zip(paths[::2], paths[1::2]))
