"""Stage -1 of the corpus recipes: make a corpus archive available, verified, in --corpus-dir.

1. The corpus is already extracted there (--marker, a file or directory relative to
   --corpus-dir, exists): nothing to do.
2. Otherwise the archive --archive is used when present, else downloaded from --url
   (an interrupted download is continued where it stopped, when the server allows).
3. Its digest is checked against --checksums (`sha256sum`/`md5sum` format: `<hex>  <file
   name>`; 64 hex digits are a sha256, 32 an md5, as corpus sites publish one or the
   other). A file name without a known checksum there is reported together with its
   computed sha256; with --verify true that stops the recipe until the value is filled in
   (after comparing it with a source you trust), --verify false goes on unverified.
4. The archive (.tar, .tar.gz, .tgz, .tar.bz2 or .zip) is extracted into --corpus-dir.
"""
import argparse
import hashlib
import os
import re
import sys
import tarfile
import urllib.error
import urllib.request
import zipfile

from toolkit.errors import cli

# Digest length in hex digits -> hashlib algorithm.
ALGORITHMS = {64: "sha256", 32: "md5"}


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--archive", required=True, help="where the archive is (or is downloaded to)")
    p.add_argument("--corpus-dir", required=True, help="directory to extract into")
    p.add_argument("--marker", required=True,
                   help="file or directory (relative to --corpus-dir) that the extracted corpus has")
    p.add_argument("--checksums", required=True,
                   help="sha256sum/md5sum-format file (`<hex>  <file name>` lines)")
    p.add_argument("--verify", choices=["true", "false"], default="true")
    p.add_argument("--timeout", type=float, default=30.0, help="network timeout in seconds")
    return p.parse_args(argv)


def say(message: str) -> None:
    print(f"[download] {message}", file=sys.stderr, flush=True)


def known_checksum(checksums: str, name: str):
    """(algorithm, hex digest) recorded for `name`: sha256 for 64 hex digits, md5 for 32;
    None when the file records none (or UNKNOWN)."""
    if not os.path.isfile(checksums):
        return None
    with open(checksums, encoding="utf-8") as f:
        for line in f:
            parts = line.split("#", 1)[0].split()
            if len(parts) == 2 and parts[1].lstrip("*") == name:
                value = parts[0].lower()
                if re.fullmatch(r"[0-9a-f]+", value) and len(value) in ALGORITHMS:
                    return ALGORITHMS[len(value)], value
                return None
    return None


def file_digest(path: str, algorithm: str) -> str:
    """Hex digest of a file, read in 1 MiB blocks (archives are many GB)."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download(url: str, dest: str, timeout: float) -> None:
    """Downloads into `dest`.part, then renames. A .part left by an interrupted run is
    continued with an HTTP Range request; a server that ignores it (200 instead of 206)
    sends the whole file again, which then replaces the partial one."""
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    part = dest + ".part"
    have = os.path.getsize(part) if os.path.isfile(part) else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        if err.code != 416 or not have:       # 416: nothing left past `have`
            raise
        say(f"{part} is already complete ({have} bytes)")
        os.replace(part, dest)
        return
    with response:
        resumed = have and response.status == 206
        if resumed:
            say(f"resuming {url} at {have / 2**20:.1f} MiB -> {dest}")
        else:
            have = 0
            say(f"downloading {url} -> {dest}")
        total = int(response.headers.get("Content-Length") or 0) + have
        done, next_report = have, 0.0
        with open(part, "ab" if resumed else "wb") as out:
            for block in iter(lambda: response.read(1 << 20), b""):
                out.write(block)
                done += len(block)
                if total and done / total >= next_report:
                    say(f"{done / 2**20:.0f} / {total / 2**20:.0f} MiB")
                    next_report += 0.1
    os.replace(part, dest)


def extract_zip(archive: str, corpus_dir: str) -> None:
    with zipfile.ZipFile(archive) as zf:
        root = os.path.realpath(corpus_dir)
        for member in zf.infolist():
            target = os.path.realpath(os.path.join(corpus_dir, member.filename))
            if os.path.isabs(member.filename) or ".." in member.filename.replace("\\", "/").split("/") \
                    or not (target == root or target.startswith(root + os.sep)):
                raise RuntimeError(f"unsafe path in archive: {member.filename}")
        zf.extractall(corpus_dir)


def extract(archive: str, corpus_dir: str) -> None:
    say(f"extracting {archive} into {corpus_dir}")
    os.makedirs(corpus_dir, exist_ok=True)
    if zipfile.is_zipfile(archive):
        extract_zip(archive, corpus_dir)
        return
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
    known = known_checksum(args.checksums, name)
    if args.verify == "true" or known:
        algorithm, expected = known or ("sha256", None)
        say(f"computing {algorithm} of {args.archive}")
        actual = file_digest(args.archive, algorithm)
        if expected is None:
            say(f"no known sha256 for {name} in {args.checksums}; this archive's is {actual}")
            if args.verify == "true":
                say(f"error: cannot verify {name}. Compare {actual} with a source you trust, "
                    f"write `{actual}  {name}` into {args.checksums} and rerun, or rerun with "
                    f"--verify-checksum false to use the archive unverified")
                return 1
            say("warning: continuing with an unverified archive (--verify-checksum false)")
        elif actual != expected:
            say(f"error: {algorithm} mismatch for {args.archive}: expected {expected} "
                f"({args.checksums}), got {actual}. The file is corrupt or a different "
                f"release: delete it and rerun")
            return 1
        else:
            say(f"{algorithm} verified: {actual}")
    else:
        say(f"warning: using {name} unverified (--verify-checksum false, no known checksum)")
    try:
        extract(args.archive, args.corpus_dir)
    except (tarfile.TarError, zipfile.BadZipFile, OSError, RuntimeError) as err:
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
