"""The stat cache: the stat of a path -> its content hash.

Timestamps never decide a rebuild; they only say "this file is unchanged, reuse its
hash". The stat compared is (device, inode, size, mtime_ns, ctime_ns): mtime alone can be
set back (tar, `SOURCE_DATE_EPOCH`, `touch -d`), but any write or rename also sets ctime,
which no user call can set, and a file replaced on a reused inode or another device
differs in those.

Racy entries (git's "racy clean" problem): a file written in the same timestamp tick as
it was hashed could change again without its stat changing. So a hash is remembered
across commands only when the file's mtime and ctime are older than the racy window
before the hash was taken. The window follows the file system's timestamp granularity,
read from the file's own ctime (which no user call can set): a ctime on a whole second
means a coarse file system (FAT's 2 s mtime, ext3, HFS+, many network file systems), so
2 s; otherwise the timestamps are fine-grained but advance with the kernel's clock tick
(at most 10 ms), so 100 ms. Fresher files are hashed again by the next command, once.

Pruning: entries of files that no longer exist (or whose stat changed, so they would be
rehashed anyway) are dropped when the cache is saved, so the file does not grow forever.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import nullcontext
from pathlib import Path

from tpubuild import progress
from tpubuild.atomic import write_text_atomic
from tpubuild.digests.hashing import (
    SCHEME,
    FileEntry,
    hash_fd,
    hash_file,
    tree_digest,
    walk_files,
)
from tpubuild.trace_events import span

# A file hashed of this size or more is an event of `build --profile`'s trace; smaller
# ones only add to their stage's planning event.
TRACED_HASH_BYTES = 1 << 20
RACY_COARSE_NS = 2_000_000_000
RACY_FINE_NS = 100_000_000
FORMAT = 2  # entries: path -> [dev, ino, size, mtime_ns, ctime_ns, hash]


def stat_key(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def racy_window(ctime_ns: int) -> int:
    """How long after its last change a file's stat cannot prove its content (above)."""
    return RACY_COARSE_NS if ctime_ns % 1_000_000_000 == 0 else RACY_FINE_NS


def is_racy(mtime_ns: int, ctime_ns: int, hashed_at: int) -> bool:
    """Whether a hash read at `hashed_at` may miss a change made in the same tick."""
    return max(mtime_ns, ctime_ns) + racy_window(ctime_ns) >= hashed_at


class StatCache:
    """In memory while a command runs; saved as JSON under `.tpubuild/` only if it changed."""

    def __init__(self, path: Path | None):
        self.path = path
        self.entries: dict[str, list] = {}
        self.seen: set[str] = set()  # paths looked up or recorded by this command
        self.dirty = False
        self.files_hashed = 0
        self.bytes_hashed = 0
        if path is not None:
            try:
                data = json.loads(path.read_text())
                if data.get("scheme") == SCHEME and data.get("format") == FORMAT:
                    self.entries = data["entries"]
            except (OSError, ValueError, KeyError, AttributeError):
                pass  # a missing or damaged cache only costs rehashing

    def file_hash(self, path: str, st: os.stat_result | None = None) -> str:
        """The content hash of `path` (absolute), from the cache when its stat is unchanged."""
        if st is None:
            st = os.stat(path)
        self.seen.add(path)
        cached = self.entries.get(path)
        if cached is not None and cached[:5] == stat_key(st):
            return cached[5]
        started = time.time_ns()
        with span("hashing", cat="hash", file=path, bytes=st.st_size) if st.st_size >= TRACED_HASH_BYTES \
                else nullcontext():
            digest = hash_file(path, st.st_size)
        self.files_hashed += 1
        self.bytes_hashed += st.st_size
        self.record(path, st, digest, started)
        return digest

    def fd_hash(self, path: str, fd: int) -> str:
        """The content hash of the open file `fd`, whose name is `path`: from the cache
        when its fstat is the cached one, else read from the descriptor. The stat and the
        bytes are then the same file's, even if the name is swapped meanwhile."""
        st = os.fstat(fd)
        self.seen.add(path)
        cached = self.entries.get(path)
        if cached is not None and cached[:5] == stat_key(st):
            return cached[5]
        started = time.time_ns()
        with span("hashing", cat="hash", file=path, bytes=st.st_size) if st.st_size >= TRACED_HASH_BYTES \
                else nullcontext():
            digest = hash_fd(fd, st.st_size)
        self.files_hashed += 1
        self.bytes_hashed += st.st_size
        self.record(path, st, digest, started)
        return digest

    def record(self, path: str, st: os.stat_result, digest: str, hashed_at: int | None = None) -> None:
        """Remember that `path` with stat `st` has content `digest`, unless `st` is too
        fresh to prove it (`hashed_at`: when the content was read; default now)."""
        self.seen.add(path)
        hashed_at = time.time_ns() if hashed_at is None else hashed_at
        if not is_racy(st.st_mtime_ns, st.st_ctime_ns, hashed_at):
            entry = [*stat_key(st), digest]
            if self.entries.get(path) != entry:
                self.entries[path] = entry
                self.dirty = True
        elif self.entries.pop(path, None) is not None:
            self.dirty = True

    def tree(self, root: Path) -> tuple[str, list[FileEntry]]:
        """(Merkle hash, entries) of the directory `root`."""
        root = Path(os.path.abspath(root))
        found = list(walk_files(root))
        to_hash = sum(st.st_size for rel, st in found
                      if (self.entries.get(os.path.join(root, rel)) or [None])[:5] != stat_key(st))
        entries = []
        with progress.meter(f"hashing {root.name}", to_hash):  # on a terminal, a large model's
            for rel, st in found:
                full = os.path.join(root, rel)
                entries.append(FileEntry(rel, self.file_hash(full, st), st.st_size))
        return tree_digest(entries), entries

    def prune(self) -> int:
        """Drop the entries of files that are gone or changed (not looked at by this
        command, so unchecked): one lstat each, no hashing. Returns how many."""
        gone = []
        for path, entry in self.entries.items():
            if path in self.seen:
                continue
            try:
                if stat_key(os.stat(path)) != entry[:5]:
                    gone.append(path)
            except OSError:
                gone.append(path)
        for path in gone:
            del self.entries[path]
        if gone:
            self.dirty = True
        return len(gone)

    def save(self, prune: bool = True) -> None:
        """Write the cache if it changed. It is only an optimization: a failed write (a
        full disk, a read-only state dir) costs rehashing next time, never the command."""
        if prune:
            self.prune()
        if self.dirty and self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                write_text_atomic(self.path, json.dumps({"scheme": SCHEME, "format": FORMAT, "entries": self.entries}))
            except OSError:
                return
            self.dirty = False
