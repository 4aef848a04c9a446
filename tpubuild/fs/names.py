"""Names read from a place others can write (a publish destination, a shared cache), checked
before they become paths or numbers.

A seal's `final`, a manifest's file list, a listed object key or a claim's name is data a
co-writer chose: `a/../../home/you/.bashrc`, `/etc/passwd`, `x//y`, `²` or a number above
int64 must never reach `open`, `rename` or `int()` as they are. These functions say whether
a name is one tpubuild itself would have written; anything else is left alone by the caller.
"""

from __future__ import annotations

import re

# TF Serving reads a version directory's name with strings::safe_strto64
# (tensorflow_serving/sources/storage_path/file_system_storage_path_source.cc,
# ParseVersionNumber): a version is an int64. tpubuild writes and accepts only what it writes
# itself: ASCII decimal digits, no sign, no leading zero, within int64 (str.isdigit() also
# accepts "²" and other Unicode digits, which int() then refuses).
INT64_MAX = 2**63 - 1
_DECIMAL = re.compile(r"(?:0|[1-9][0-9]{0,18})")
# A component tpubuild never writes: control characters (a newline would cut a message), and
# the backslash some object-store tools read as a separator.
_BAD_CHARACTERS = re.compile(r"[\x00-\x1f\x7f\\]")


def version_number(name: str) -> int | None:
    """The number `name` spells when it is a decimal within int64 as tpubuild writes one
    (`"12"`, not `"012"`, `"+12"`, `"²"` or `"9223372036854775808"`); else None."""
    if not isinstance(name, str) or not _DECIMAL.fullmatch(name):
        return None
    number = int(name)
    return number if number <= INT64_MAX else None


def clean_relative(name: object) -> str | None:
    """`name` when it is a relative path of clean components (no `..`, `.`, empty component,
    absolute start, trailing or doubled `/`, control character or backslash); else None."""
    if not isinstance(name, str) or not name or len(name) > 4096:
        return None
    parts = name.split("/")
    if any(part in ("", ".", "..") or len(part) > 255 or _BAD_CHARACTERS.search(part) for part in parts):
        return None
    return name


def inside(name: object, prefix: str) -> str | None:
    """The part of `name` below `prefix/` when `name` is clean and under it; else None
    (`inside("toy/2/a.pb", "toy/2")` is `"a.pb"`; `inside("toy/2/../3", "toy/2")` is None)."""
    rel = clean_relative(name)
    if rel is None or not rel.startswith(f"{prefix}/"):
        return None
    return rel[len(prefix) + 1:]


def shown(name: str) -> str:
    """`name` (a file name from the command line, a path) as it can be shown on one line
    and inside a YAML comment: as it is when every character is printable (str.isprintable:
    no line break of any kind, LF, CR, U+0085, U+2028, U+2029, VT, FF and the C0/C1 controls,
    no format character, surrogate or unassigned code point), else quoted and escaped as a
    JSON string of ASCII characters."""
    import json

    return name if name.isprintable() else json.dumps(name)
