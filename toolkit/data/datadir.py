"""Kaldi data directories: validate (every problem at once), fix, split and combine.

A data dir holds `key value` tables, each sorted by key in C (byte) order, keys unique:
  per utterance: text, utt2spk, utt2dur, any other utt2*, feats.scp, and `segments`
                 (`utt rec start end`) or, without segments, wav.scp
  per recording: wav.scp (when segments exists), reco2dur, any other reco2*
  per speaker:   spk2utt (derived from utt2spk), spk2gender, cmvn.scp
Only wav.scp (or feats.scp) is required; the other tables are checked when present.
Files of other names (data.list, fbank/, ...) are never read or touched.

Also a small CLI for the shell wrappers without a binary of their own:
  python -m toolkit.data.datadir split-scp [--utt2spk FILE] IN OUT1 [OUT2 ...]
  python -m toolkit.data.datadir combine OUT IN1 [IN2 ...]
"""
import argparse
import multiprocessing as mp
import os
import shutil
import sys
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from toolkit.data.audio import BadEntry, read_audio
from toolkit.data.kaldi import Line, Table, c_order, scan_table, spk2utt_of, write_table  # noqa: F401
from toolkit.fileio import atomic_write_text

SHOW = 5  # keys quoted per message; the count tells how many there are in all
SCP_NAMES = ("wav.scp", "feats.scp", "cmvn.scp")


def _few(items: Iterable[str], n: int = SHOW) -> str:
    items = list(items)
    text = ", ".join(items[:n])
    return text + (f", ... (+{len(items) - n} more)" if len(items) > n else "")


def table_kind(name: str, has_segments: bool) -> Optional[str]:
    """'utt', 'reco', 'spk' or None (not a data-dir table)."""
    if "." in name and name not in SCP_NAMES:
        return None  # skips data.list, utt2dur.tmp, editor backups, ...
    if name == "wav.scp":
        return "reco" if has_segments else "utt"
    if name in ("text", "segments", "feats.scp") or name.startswith("utt2"):
        return "utt"
    if name.startswith("reco2"):
        # Without segments each recording is one utterance with the same key.
        return "reco" if has_segments else "utt"
    if name == "cmvn.scp" or name.startswith("spk2"):
        return "spk"
    return None


def load_tables(path: str) -> Dict[str, Table]:
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: not a directory")
    has_segments = os.path.isfile(os.path.join(path, "segments"))
    tables = {}
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if os.path.isfile(full) and table_kind(name, has_segments):
            tables[name] = scan_table(full)
    return tables


def _positive(kind: type) -> Callable[[str], Optional[str]]:
    def check(value: str) -> Optional[str]:
        try:
            ok = kind(value) > 0
        except ValueError:
            ok = False
        return None if ok else f"'{value}' is not a positive {kind.__name__}"
    return check


def _single_token(value: str) -> Optional[str]:
    return None if len(value.split()) == 1 else f"'{value}' has more than one field"


VALUE_CHECKS: Dict[str, Callable[[str], Optional[str]]] = {
    "utt2dur": _positive(float), "reco2dur": _positive(float),
    "utt2num_frames": _positive(int), "utt2spk": _single_token,
}


def value_problem(name: str, value: str) -> Optional[str]:
    """Why a non-empty value is malformed for table `name`, or None."""
    if name == "segments":
        return parse_segment(value)[1] or None
    check = VALUE_CHECKS.get(name)
    return check(value) if check else None


def parse_segment(value: str) -> Tuple[Optional[Tuple[str, float, float]], str]:
    """'rec start end' -> ((rec, start, end), '') or (None, why)."""
    parts = value.split()
    if len(parts) != 3:
        return None, f"expected 'rec start end', got '{value}'"
    try:
        start, end = float(parts[1]), float(parts[2])
    except ValueError:
        return None, f"times are not numbers: '{value}'"
    if start < 0:
        return None, f"start {parts[1]} < 0"
    if end <= start:
        return None, f"end <= start ({parts[2]} <= {parts[1]})"
    return (parts[0], start, end), ""


# ---------------------------------------------------------------------------- validate

def _check_lines(t: Table) -> List[str]:
    """Problems inside one table: encoding, blank lines, order, duplicates, values."""
    problems = []
    if t.undecodable:
        problems.append(f"{t.path}: {len(t.undecodable)} line(s) not valid UTF-8: "
                        f"lines {_few(map(str, t.undecodable))}")
    if t.blank:
        problems.append(f"{t.path}: {len(t.blank)} blank line(s): lines {_few(map(str, t.blank))}")
    prev = None
    for line in t.lines:
        if prev is not None and c_order(line.key) < c_order(prev):
            problems.append(f"{t.path}:{line.lineno}: not sorted in C order (LC_ALL=C sort): "
                            f"'{line.key}' comes after '{prev}' (first such line)")
            break
        prev = line.key
    seen: Dict[str, List[int]] = {}
    for line in t.lines:
        seen.setdefault(line.key, []).append(line.lineno)
    dups = [f"{k} (lines {', '.join(map(str, v))})" for k, v in seen.items() if len(v) > 1]
    if dups:
        problems.append(f"{t.path}: {len(dups)} duplicate key(s): {_few(dups)}")
    empty = [f"line {x.lineno} ({x.key})" for x in t.lines if not x.value]
    if empty:
        what = "utterance(s) with empty text" if t.name == "text" else "line(s) without a value"
        problems.append(f"{t.path}: {len(empty)} {what}: {_few(empty)}")
    bad: List[str] = []
    for line in t.lines:
        why = line.value and value_problem(t.name, line.value)
        if why:
            bad.append(f"line {line.lineno} ({line.key}: {why})")
    if bad:
        what = "bad segment(s)" if t.name == "segments" else "malformed value(s)"
        problems.append(f"{t.path}: {len(bad)} {what}: {_few(bad)}")
    return problems


def _check_coverage(tables: Sequence[Table], what: str) -> List[str]:
    """Every table of one kind must hold the same keys."""
    keys = {t.name: set(x.key for x in t.lines) for t in tables}
    universe = set().union(*keys.values()) if keys else set()
    problems = []
    for t in tables:
        missing = sorted(universe - keys[t.name], key=c_order)
        if missing:
            holders = [o.name for o in tables if o is not t and keys[o.name] & set(missing)]
            problems.append(f"{t.path}: lacks {len(missing)} of the {len(universe)} {what} "
                            f"listed in {', '.join(holders)}: {_few(missing)}")
    return problems


def _check_speakers(path: str, tables: Dict[str, Table]) -> List[str]:
    problems = []
    u2s_t, s2u_t = tables.get("utt2spk"), tables.get("spk2utt")
    if s2u_t and not u2s_t:
        return [f"{os.path.join(path, 'utt2spk')}: missing while spk2utt exists"]
    if not u2s_t:
        return []
    u2s = {k: line.value for k, line in u2s_t.first().items() if line.value}
    if not s2u_t:
        problems.append(f"{os.path.join(path, 'spk2utt')}: missing while utt2spk exists "
                        "(utils/fix_data_dir.sh regenerates it)")
    else:
        listed: Dict[str, List[str]] = {}
        for spk, line in s2u_t.first().items():
            for utt in line.value.split():
                listed.setdefault(utt, []).append(spk)
        only_u2s = sorted((u for u in u2s if u not in listed), key=c_order)
        only_s2u = sorted((u for u in listed if u not in u2s), key=c_order)
        wrong = sorted((f"{u} ({u2s[u]} vs {'/'.join(listed[u])})"
                        for u in listed if u in u2s and listed[u] != [u2s[u]]), key=c_order)
        lead = f"{path}: utt2spk and spk2utt disagree:"
        if only_u2s:
            problems.append(f"{lead} {len(only_u2s)} utterance(s) in utt2spk but not in "
                            f"spk2utt: {_few(only_u2s)}")
        if only_s2u:
            problems.append(f"{lead} {len(only_s2u)} utterance(s) in spk2utt but not in "
                            f"utt2spk: {_few(only_s2u)}")
        if wrong:
            problems.append(f"{lead} {len(wrong)} utterance(s) under another speaker or listed "
                            f"twice (utt2spk vs spk2utt): {_few(wrong)}")
    speakers = set(u2s.values())
    for name, t in tables.items():
        if table_kind(name, False) == "spk" and name != "spk2utt":
            keys = set(x.key for x in t.lines)
            for diff, what in ((speakers - keys, "lacks speaker(s) of utt2spk"),
                               (keys - speakers, "has speaker(s) not in utt2spk")):
                if diff:
                    problems.append(f"{t.path}: {what}: {len(diff)}: "
                                    f"{_few(sorted(diff, key=c_order))}")
    return problems


def _probe_audio(item: Tuple[str, int, str]) -> Tuple[str, int, str]:
    """(key, lineno, source) -> (key, lineno, '' or why it cannot be decoded)."""
    key, lineno, source = item
    try:
        audio, _ = read_audio(source)
        return key, lineno, "" if len(audio) else "empty_audio: no samples"
    except BadEntry as err:
        why = f"{err.reason}: {err.detail}" if err.detail else err.reason
    except Exception as err:  # decoders raise many types; each is one bad entry
        why = f"unreadable_audio: {err}"
    return key, lineno, why[:300]


def _parallel_map(fn, items: list, nj: int) -> list:
    if nj > 1 and len(items) > 1:
        with mp.get_context("fork").Pool(min(nj, len(items))) as pool:
            return pool.map(fn, items, chunksize=max(1, len(items) // (nj * 8)))
    return [fn(x) for x in items]


def validate_data_dir(path: str, check_audio: bool = True, nj: int = 2) -> List[str]:
    """Every problem of the data dir at `path` (empty list: valid). Does not stop at the
    first problem, so one run tells everything there is to fix."""
    try:
        tables = load_tables(path)
    except FileNotFoundError as err:
        return [str(err)]
    problems: List[str] = []
    if "wav.scp" not in tables and "feats.scp" not in tables:
        problems.append(f"{path}: has neither wav.scp nor feats.scp")
    for t in tables.values():
        problems += _check_lines(t)
    has_seg = "segments" in tables
    by_kind: Dict[str, List[Table]] = {}
    for name, t in tables.items():
        by_kind.setdefault(table_kind(name, has_seg) or "", []).append(t)
    problems += _check_coverage(by_kind.get("utt", []), "utterances")
    if has_seg:
        problems += _check_coverage(by_kind.get("reco", []), "recordings")
        seg, wav = tables["segments"], tables.get("wav.scp")
        recs = set(wav.first()) if wav else set()
        used = set()
        unknown = []
        for line in seg.lines:
            rec = line.value.split()[0] if line.value else ""
            used.add(rec)
            if rec and rec not in recs:
                unknown.append(f"line {line.lineno} ({line.key} -> {rec})")
        if unknown:
            problems.append(f"{seg.path}: {len(unknown)} segment(s) reference unknown "
                            f"recording(s) not in wav.scp: {_few(unknown)}")
        unused = sorted(recs - used, key=c_order)
        if wav and unused:
            problems.append(f"{wav.path}: {len(unused)} recording(s) not used by any segment: "
                            f"{_few(unused)}")
    problems += _check_speakers(path, tables)
    if check_audio and "wav.scp" in tables:
        wav = tables["wav.scp"]
        items = [(k, x.lineno, x.value) for k, x in wav.first().items() if x.value]
        for key, lineno, why in _parallel_map(_probe_audio, items, nj):
            if why:
                problems.append(f"{wav.path}:{lineno}: {key}: cannot read audio: {why}")
    return problems


# ---------------------------------------------------------------------------- fix

def _write_table(path: str, rows: Dict[str, str], backup_dir: str, report: List[str]) -> None:
    """Writes rows sorted in C order; backs the old file up first, only when it changes,
    so rerunning on a fixed dir leaves the first backup (the true original) in place."""
    text = "".join(f"{k} {rows[k]}\n" for k in sorted(rows, key=c_order))
    name = os.path.basename(path)
    old = None
    if os.path.exists(path):
        with open(path, "rb") as f:
            old = f.read()
    if old == text.encode("utf-8"):
        return
    if old is not None:
        os.makedirs(backup_dir, exist_ok=True)
        shutil.copy2(path, os.path.join(backup_dir, name))
    write_table(path, rows)
    report.append(f"{name}: rewritten, {len(rows)} line(s)"
                  + (f" (original in {os.path.join(os.path.basename(backup_dir), name)})"
                     if old is not None else " (new)"))


def _clean(t: Table, report: List[str]) -> Dict[str, str]:
    """First line of each key with a valid value; reports what it drops."""
    rows: Dict[str, str] = {}
    seen = set()
    dups, empty, bad = [], [], []
    for line in t.lines:
        if line.key in seen:
            dups.append(line.key)
            continue
        seen.add(line.key)
        if not line.value:
            empty.append(line.key)
        elif value_problem(t.name, line.value):
            bad.append(line.key)
        else:
            rows[line.key] = line.value
    for items, what in ((t.blank, "blank line(s)"), (t.undecodable, "non-UTF-8 line(s)")):
        if items:
            report.append(f"{t.name}: dropped {len(items)} {what}: lines {_few(map(str, items))}")
    for items, what in ((dups, "duplicate line(s), kept each key's first"),
                        (empty, "line(s) without a value"), (bad, "malformed line(s)")):
        if items:
            report.append(f"{t.name}: dropped {len(items)} {what}: {_few(items)}")
    return rows


def fix_data_dir(path: str) -> List[str]:
    """Sorts every table, drops duplicate keys (keeps the first), bad lines, and the
    utterances not present in all per-utterance tables (or whose recording or speaker is
    gone), keeps only the recordings and speakers still used, regenerates spk2utt from
    utt2spk. Changed files are backed up to <path>/.backup/. Returns what it did.
    Audio is not looked at: validate_data_dir reports unreadable recordings."""
    tables = load_tables(path)
    report: List[str] = []
    has_seg = "segments" in tables
    rows = {name: _clean(t, report) for name, t in tables.items() if name != "spk2utt"}
    if "utt2spk" not in rows and "spk2utt" in tables:
        rows["utt2spk"] = {}
        for spk, line in tables["spk2utt"].first().items():
            for utt in line.value.split():
                rows["utt2spk"].setdefault(utt, spk)
        report.append("utt2spk: derived from spk2utt")
    kinds = {name: table_kind(name, has_seg) for name in rows}

    def common(kind: str) -> Optional[set]:
        sets = [set(r) for n, r in rows.items() if kinds[n] == kind]
        return set.intersection(*sets) if sets else None

    utts = common("utt") or set()
    if has_seg:
        recs = common("reco") or set()
        utts = {u for u in utts if rows["segments"][u].split()[0] in recs}
    if "utt2spk" in rows:
        speakers = common("spk")
        if speakers is not None:
            utts = {u for u in utts if rows["utt2spk"][u] in speakers}
    all_utts = set().union(*(r for n, r in rows.items() if kinds[n] == "utt"))
    dropped = sorted(all_utts - utts, key=c_order)
    if not utts:
        raise ValueError(f"{path}: no utterance is present in every per-utterance file; "
                         "nothing written")
    if dropped:
        report.append(f"kept {len(utts)} of {len(all_utts)} utterance(s); dropped {len(dropped)} "
                      f"missing from some file or with an unknown recording/speaker: "
                      f"{_few(dropped)}")
    recs = {rows["segments"][u].split()[0] for u in utts} if has_seg else set()
    speakers = {rows["utt2spk"][u] for u in utts} if "utt2spk" in rows else set()
    keep = {"utt": utts, "reco": recs, "spk": speakers}
    backup = os.path.join(path, ".backup")
    for name, r in rows.items():
        if kinds[name] == "spk" and "utt2spk" not in rows:
            continue  # no speaker map to filter by: leave spk2gender etc. as they are
        kept = {k: v for k, v in r.items() if k in keep[kinds[name]]}
        if kinds[name] != "utt" and len(kept) < len(r):
            unused = sorted(set(r) - set(kept), key=c_order)
            report.append(f"{name}: dropped {len(unused)} unused "
                          f"{'recording' if kinds[name] == 'reco' else 'speaker'}(s): "
                          f"{_few(unused)}")
        _write_table(os.path.join(path, name), kept, backup, report)
    if "utt2spk" in rows:
        _write_table(os.path.join(path, "spk2utt"), spk2utt_of(
            {u: s for u, s in rows["utt2spk"].items() if u in utts}), backup, report)
    return report


# ---------------------------------------------------------------------------- split

def split_scp(in_path: str, out_paths: Sequence[str], utt2spk: Optional[str] = None) -> List[int]:
    """Splits the lines of `in_path` into len(out_paths) contiguous parts, in order.
    Without utt2spk the sizes differ by at most one; with it, each speaker's lines stay in
    one part (so per-speaker steps such as CMVN see the whole speaker) and part sizes are
    as even as speaker boundaries allow. Returns the part sizes."""
    n = len(out_paths)
    if n < 1:
        raise ValueError("split_scp: no output files given")
    table = scan_table(in_path)
    if table.undecodable:
        raise ValueError(f"{in_path}:{table.undecodable[0]}: not valid UTF-8")
    with open(in_path, "rb") as f:
        raw = [r.decode("utf-8").rstrip("\r\n") for r in f]
    lines = [(x.lineno, x.key, raw[x.lineno - 1]) for x in table.lines]
    if len(lines) < n:
        raise ValueError(f"split_scp: {in_path} has {len(lines)} line(s), fewer than the "
                         f"{n} parts asked for")
    if utt2spk is None:
        base, extra = divmod(len(lines), n)
        sizes = [base + (i < extra) for i in range(n)]
    else:
        sizes = _speaker_sizes(in_path, lines, utt2spk, n)
    pos = 0
    for out, size in zip(out_paths, sizes):
        atomic_write_text(out, "".join(text + "\n" for _, _, text in lines[pos:pos + size]))
        pos += size
    return sizes


def _speaker_sizes(in_path: str, lines: list, utt2spk_path: str, n: int) -> List[int]:
    u2s = {k: x.value for k, x in scan_table(utt2spk_path).first().items()}
    groups: List[int] = []   # line counts of consecutive runs of one speaker
    done = set()
    prev = None
    for lineno, key, _ in lines:
        if key not in u2s:
            raise ValueError(f"{in_path}:{lineno}: utterance {key} is not in {utt2spk_path}")
        spk = u2s[key]
        if spk != prev:
            if spk in done:
                raise ValueError(f"{in_path}:{lineno}: speaker {spk} appears again after other "
                                 "speakers; sort so each speaker's utterances are together "
                                 "(Kaldi: make speaker ids prefixes of utterance ids)")
            done.add(spk)
            groups.append(0)
            prev = spk
        groups[-1] += 1
    if len(groups) < n:
        raise ValueError(f"split_scp: {in_path} has {len(groups)} speaker(s), fewer than the "
                         f"{n} parts asked for (a speaker is never split)")
    cum = [0]
    for g in groups:
        cum.append(cum[-1] + g)
    total, bounds = cum[-1], [0]
    for k in range(1, n):
        # The speaker boundary nearest the ideal cut, leaving a speaker for each later part.
        lo, hi = bounds[-1] + 1, len(groups) - (n - k)
        target = k * total / n
        bounds.append(min(range(lo, hi + 1), key=lambda b: (abs(cum[b] - target), b)))
    bounds.append(len(groups))
    return [cum[b] - cum[a] for a, b in zip(bounds, bounds[1:])]


# ---------------------------------------------------------------------------- combine

def combine_data_dirs(out: str, dirs: Sequence[str]) -> List[str]:
    """Concatenates the tables of `dirs` into `out`, sorted; spk2utt is regenerated. A
    table missing from some input is left out (reported). The same utterance in two
    inputs is an error; a recording or speaker may repeat with an identical value."""
    if not dirs:
        raise ValueError("combine_data_dirs: no input dirs")
    absolute = [os.path.abspath(d) for d in dirs]
    if os.path.abspath(out) in absolute:
        raise ValueError(f"combine_data_dirs: output {out} is also an input")
    if len(set(absolute)) < len(absolute):
        raise ValueError("combine_data_dirs: the same input dir is given twice")
    inputs = {d: load_tables(d) for d in dirs}
    with_seg = [d for d, t in inputs.items() if "segments" in t]
    if with_seg and len(with_seg) != len(dirs):
        without = [d for d in dirs if d not in with_seg]
        raise ValueError(f"combine_data_dirs: segments exists in {_few(with_seg)} but not in "
                         f"{_few(without)}; wav.scp would mix recordings and utterances")
    has_seg = bool(with_seg)
    names = [set(n for n in t if n != "spk2utt") for t in inputs.values()]
    shared, seen_any = set.intersection(*names), set.union(*names)
    report = [f"{n}: skipped, missing from "
              f"{_few(d for d in dirs if n not in inputs[d])}"
              for n in sorted(seen_any - shared)]
    merged: Dict[str, Dict[str, str]] = {}
    clashes: Dict[Tuple[str, str], List[str]] = {}   # (key, where) -> tables
    for name in sorted(shared):
        rows: Dict[str, str] = {}
        origin: Dict[str, str] = {}
        per_utt = table_kind(name, has_seg) == "utt"
        for d in dirs:
            t = inputs[d][name]
            if t.undecodable:
                raise ValueError(f"{t.path}:{t.undecodable[0]}: not valid UTF-8")
            for line in t.lines:
                if line.key in rows:
                    if per_utt or rows[line.key] != line.value:
                        where = (f"twice in {d}" if origin[line.key] == d
                                 else f"in {origin[line.key]} and {d}")
                        clashes.setdefault((line.key, where), []).append(name)
                    continue
                rows[line.key], origin[line.key] = line.value, d
        merged[name] = rows
    if clashes:
        listed = [f"{key} {where} ({', '.join(names)})"
                  for (key, where), names in sorted(clashes.items())]
        raise ValueError(f"combine_data_dirs: {len(listed)} key(s) in more than one place: "
                         f"{_few(listed)}")
    os.makedirs(out, exist_ok=True)
    if "utt2spk" in merged:
        merged["spk2utt"] = spk2utt_of(merged["utt2spk"])
    # Tables left in `out` by an earlier run would describe other data: remove them.
    for name in sorted(os.listdir(out)):
        full = os.path.join(out, name)
        if name not in merged and os.path.isfile(full) and table_kind(name, has_seg):
            os.remove(full)
            report.append(f"{name}: removed stale copy from {out}")
    for name, rows in merged.items():
        text = "".join(f"{k} {rows[k]}\n" for k in sorted(rows, key=c_order))
        atomic_write_text(os.path.join(out, name), text)
    n_utts = max((len(r) for n, r in merged.items() if table_kind(n, has_seg) == "utt"),
                 default=0)
    report.append(f"combined {len(dirs)} dir(s) into {out}: {n_utts} utterance(s), "
                  f"tables {' '.join(sorted(merged))}")
    return report


# ---------------------------------------------------------------------------- CLI

def get_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m toolkit.data.datadir", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("split-scp", help="split a table into N contiguous parts")
    s.add_argument("--utt2spk", help="keep each speaker's lines in one part")
    s.add_argument("input")
    s.add_argument("outputs", nargs="+")
    c = sub.add_parser("combine", help="combine data dirs into one")
    c.add_argument("out")
    c.add_argument("dirs", nargs="+")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = get_args(argv)
    try:
        if args.command == "split-scp":
            split_scp(args.input, args.outputs, args.utt2spk)
        else:
            for line in combine_data_dirs(args.out, args.dirs):
                print(line)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
