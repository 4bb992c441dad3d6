"""Class inventories (keywords, speakers, command words): one name per line, the line
order being the class index. The one reader and writer of the format."""
from collections import Counter
from typing import List, Sequence

from toolkit.fileio import atomic_write_text


def read_inventory(path: str) -> List[str]:
    """Names in index order. A blank line inside the list would shift every later index,
    so it is an error naming its line; blank lines at the end are ignored."""
    try:
        with open(path, "rb") as f:
            raw_lines = f.read().split(b"\n")
    except FileNotFoundError:
        raise FileNotFoundError(f"inventory {path} not found") from None
    while raw_lines and not raw_lines[-1].strip():
        raw_lines.pop()
    names = []
    for lineno, raw in enumerate(raw_lines, 1):
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError as err:
            raise ValueError(f"{path}:{lineno}: not valid UTF-8 ({err.reason})") from None
        if not line:
            raise ValueError(f"{path}:{lineno}: blank line inside the inventory (line order "
                             "is the class index; remove the line)")
        names.append(line)
    if not names:
        raise ValueError(f"{path}: empty inventory")
    dup = [n for n, c in Counter(names).items() if c > 1]
    if dup:
        raise ValueError(f"{path}: duplicate entries {dup}")
    return names


def write_inventory(path: str, names: Sequence[str]) -> None:
    atomic_write_text(path, "".join(f"{name}\n" for name in names))


def inventory_differences(old: Sequence[str], new: Sequence[str], show: int = 5) -> List[str]:
    """Human-readable first differences between two inventories (order matters)."""
    out = []
    if len(old) != len(new):
        out.append(f"{len(old)} -> {len(new)} entries")
    for i, (a, b) in enumerate(zip(old, new)):
        if a != b:
            out.append(f"index {i}: {a!r} -> {b!r}")
            if len(out) >= show:
                break
    if not out and list(old) != list(new):
        extra = list(new[len(old):]) or list(old[len(new):])
        out.append(f"entries {extra[:show]} added or removed at the end")
    return out
