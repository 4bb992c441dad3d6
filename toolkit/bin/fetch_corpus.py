"""Stage -1 of the corpus recipes: make a corpus archive available, verified, in --corpus-dir.

1. The corpus is already extracted there (--marker, a file or directory relative to
   --corpus-dir, exists): nothing to do.
2. Otherwise the archive --archive is used when present, else downloaded from --url.
3. Its sha256 is checked against --checksums (`sha256sum` format: `<hex>  <file name>`).
   A file name without a known checksum there is reported together with the computed
   value; with --verify true that stops the recipe until the value is filled in (after
   comparing it with a source you trust), --verify false goes on unverified.
4. The archive is extracted into --corpus-dir.
"""
import argparse
import os
import re
import sys
import tarfile
import urllib.error
import urllib.request

from toolkit.fileio import sha256_file
from toolkit.errors import cli


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--archive", required=True, help="where the archive is (or is downloaded to)")
    p.add_argument("--corpus-dir", required=True, help="directory to extract into")
    p.add_argument("--marker", required=True,
                   help="file or directory (relative to --corpus-dir) that the extracted corpus has")
    p.add_argument("--checksums", required=True, help="sha256sum-format file")
    p.add_argument("--verify", choices=["true", "false"], default="true")
    p.add_argument("--timeout", type=float, default=30.0, help="network timeout in seconds")
    return p.parse_args(argv)


def say(message: str) -> None:
    print(f"[download] {message}", file=sys.stderr, flush=True)


def known_checksum(checksums: str, name: str):
    """The recorded sha256 of `name`, or None when the file records none (or UNKNOWN)."""
    if not os.path.isfile(checksums):
        return None
    with open(checksums, encoding="utf-8") as f:
        for line in f:
            parts = line.split("#", 1)[0].split()
            if len(parts) == 2 and parts[1].lstrip("*") == name:
                value = parts[0].lower()
                return value if re.fullmatch(r"[0-9a-f]{64}", value) else None
    return None


def download(url: str, dest: str, timeout: float) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    part = dest + ".part"
    say(f"downloading {url} -> {dest}")
    with urllib.request.urlopen(url, timeout=timeout) as response, open(part, "wb") as out:
        total = int(response.headers.get("Content-Length") or 0)
        done, next_report = 0, 0.0
        for block in iter(lambda: response.read(1 << 20), b""):
            out.write(block)
            done += len(block)
            if total and done / total >= next_report:
                say(f"{done / 2**20:.0f} / {total / 2**20:.0f} MiB")
                next_report += 0.1
    os.replace(part, dest)


def extract(archive: str, corpus_dir: str) -> None:
    say(f"extracting {archive} into {corpus_dir}")
    os.makedirs(corpus_dir, exist_ok=True)
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):       # refuses absolute paths, .., devices
            tar.extractall(corpus_dir, filter="data")
        else:
            for member in tar.getmembers():
                if member.name.startswith("/") or ".." in member.name.split("/"):
                    raise RuntimeError(f"unsafe path in archive: {member.name}")
            tar.extractall(corpus_dir)


@cli
def main(argv=None):
    args = get_args(argv)
    marker = args.marker
    if os.path.exists(os.path.join(args.corpus_dir, marker)):
        say(f"corpus present in {args.corpus_dir}, nothing to download")
        return 0
    name = os.path.basename(args.archive)
    if not os.path.isfile(args.archive):
        try:
            download(args.url, args.archive, args.timeout)
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", err)
            say(f"error: cannot download {args.url}: {reason}")
            say(f"without network access: fetch {name} on another machine and copy it to "
                f"{os.path.abspath(args.archive)}, then rerun this stage (it verifies and "
                f"extracts it); or extract it yourself and pass --corpus-dir DIR (the directory "
                f"holding {marker}) with --stage 0")
            return 1
    expected = known_checksum(args.checksums, name)
    if args.verify == "true" or expected:
        say(f"computing sha256 of {args.archive}")
        actual = sha256_file(args.archive)
        if expected is None:
            say(f"no known sha256 for {name} in {args.checksums}; this archive's is {actual}")
            if args.verify == "true":
                say(f"error: cannot verify {name}. Compare {actual} with a source you trust, "
                    f"write `{actual}  {name}` into {args.checksums} and rerun, or rerun with "
                    f"--verify-checksum false to use the archive unverified")
                return 1
            say("warning: continuing with an unverified archive (--verify-checksum false)")
        elif actual != expected:
            say(f"error: sha256 mismatch for {args.archive}: expected {expected} "
                f"({args.checksums}), got {actual}. The file is corrupt or a different "
                f"release: delete it and rerun")
            return 1
        else:
            say(f"sha256 verified: {actual}")
    else:
        say(f"warning: using {name} unverified (--verify-checksum false, no known checksum)")
    try:
        extract(args.archive, args.corpus_dir)
    except (tarfile.TarError, OSError, RuntimeError) as err:
        say(f"error: cannot extract {args.archive}: {err}")
        return 1
    if not os.path.exists(os.path.join(args.corpus_dir, marker)):
        name = os.path.basename(marker)
        found = [d for d, dirs, files in os.walk(args.corpus_dir) if name in files + dirs]
        hint = f" (found in {found[0]}: pass --corpus-dir {found[0]})" if found else ""
        say(f"error: {args.archive} did not put {marker} into {args.corpus_dir}{hint}")
        return 1
    say(f"corpus ready in {args.corpus_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
