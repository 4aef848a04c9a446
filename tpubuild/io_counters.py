"""What a stage reads and writes: the kernel's I/O counters of a process or a thread
(proc(5), /proc/<pid>/io), for `tpubuild build --json` rows and benchmarks/large_models.py.

`rchar`/`wchar` count the bytes of every read()/write()-like call (pread, copy_file_range,
sendfile), whether the page cache served them or not; `read_bytes`/`write_bytes` what
reached the storage layer (a read the page cache served is not in it; a write is counted
when its pages are dirtied). Memory-mapped reads (BLAKE3 of a large file, hashing.py) are
in neither char count, only in read_bytes when they fault pages in from disk. Linux only:
elsewhere, and where /proc is not readable, None.
"""

from __future__ import annotations

import threading

FIELDS = ("rchar", "wchar", "read_bytes", "write_bytes")
SELF = "/proc/self/io"
# The calling thread's own counters: the build's engine stores one stage's outputs while
# another thread stores another's (-j N), and the process's would mix them.
THREAD = "/proc/thread-self/io"


def read(path: str = SELF) -> dict[str, int] | None:
    """The counters of `path`; THREAD's include what helper threads did for this thread
    (`charge`): a stage's row counts the copy a thread made for it."""
    try:
        with open(path) as f:
            values = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        counters = {name: int(values[name]) for name in FIELDS}
    except (OSError, KeyError, ValueError):
        return None
    if path == THREAD:
        charged = getattr(_charged, "io", None)
        if charged is not None:
            counters = {name: counters[name] + charged[name] for name in FIELDS}
    return counters


_charged = threading.local()


def charge(io: dict[str, int] | None) -> None:
    """Count `io` (a helper thread's own `since`, taken on that thread) as the calling
    thread's, in its THREAD reads from now on: fs/place.py copy_hashed's copying thread."""
    if io is not None:
        _charged.io = add(getattr(_charged, "io", None), io)


def since(before: dict[str, int] | None, path: str = SELF) -> dict[str, int] | None:
    """The counters' growth since `before` (a `read` of the same path)."""
    now = read(path)
    if before is None or now is None:
        return None
    return {name: max(0, now[name] - before[name]) for name in FIELDS}


def add(a: dict[str, int] | None, b: dict[str, int] | None) -> dict[str, int] | None:
    if a is None or b is None:
        return a or b
    return {name: a[name] + b[name] for name in FIELDS}
