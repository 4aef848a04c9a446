"""The stat cache: (size, mtime_ns, inode) of a path -> its content hash.

Timestamps never decide a rebuild; they only say "this file is unchanged, reuse its
hash". A file modified within RACY_NS of being hashed is not cached, because a second
edit in the same clock tick would keep the same stat (git's "racy clean" problem).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tpubuild.atomic import write_text_atomic
from tpubuild.engine.hashing import SCHEME, FileEntry, hash_file, tree_digest, walk_files

RACY_NS = 50_000_000


class StatCache:
    """In memory while a command runs; saved as JSON under `.tpubuild/` only if it changed."""

    def __init__(self, path: Path | None):
        self.path = path
        self.entries: dict[str, list] = {}
        self.dirty = False
        self.files_hashed = 0
        self.bytes_hashed = 0
        self.racy: dict[str, tuple[list, str]] = {}  # hashed too soon after a write
        if path is not None:
            try:
                data = json.loads(path.read_text())
                if data.get("scheme") == SCHEME:
                    self.entries = data["entries"]
            except (OSError, ValueError, KeyError):
                pass  # a missing or damaged cache only costs rehashing

    def file_hash(self, path: str, st: os.stat_result | None = None) -> str:
        """The content hash of `path` (absolute), from the cache when its stat is unchanged."""
        if st is None:
            st = os.stat(path)
        stat_key = [st.st_size, st.st_mtime_ns, st.st_ino]
        cached = self.entries.get(path)
        if cached is not None and cached[:3] == stat_key:
            return cached[3]
        digest = hash_file(path, st.st_size)
        self.files_hashed += 1
        self.bytes_hashed += st.st_size
        self.record(path, st, digest)
        return digest

    def record(self, path: str, st: os.stat_result, digest: str) -> None:
        """Remember that `path` with stat `st` has content `digest` (unless racy)."""
        stat_key = [st.st_size, st.st_mtime_ns, st.st_ino]
        cached = self.entries.get(path)
        if time.time_ns() - st.st_mtime_ns > RACY_NS:
            self.entries[path] = [*stat_key, digest]
            self.dirty = True
        else:
            self.racy[path] = (stat_key, digest)
            if cached is not None:
                self.entries.pop(path, None)
                self.dirty = True

    def tree(self, root: Path) -> tuple[str, list[FileEntry]]:
        """(Merkle hash, entries) of the directory `root`."""
        root = Path(os.path.abspath(root))
        entries = []
        for rel, st in walk_files(root):
            full = os.path.join(root, rel)
            entries.append(FileEntry(rel, self.file_hash(full, st), st.st_size))
        return tree_digest(entries), entries

    def settle(self) -> None:
        """Once the racy window has passed, rehash the files that were too fresh to cache
        (git's answer to "racy clean" entries), so the next command finds them cached."""
        if not self.racy:
            return
        newest = max(stat_key[1] for stat_key, _ in self.racy.values())
        time.sleep(max(0.0, (newest + RACY_NS - time.time_ns()) / 1e9))
        for path, (stat_key, digest) in self.racy.items():
            try:
                st = os.stat(path)
                if [st.st_size, st.st_mtime_ns, st.st_ino] == stat_key and hash_file(path, st.st_size) == digest:
                    self.entries[path] = [*stat_key, digest]
                    self.dirty = True
            except OSError:
                continue
        self.racy.clear()

    def save(self) -> None:
        self.settle()
        if self.dirty and self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.path, json.dumps({"scheme": SCHEME, "entries": self.entries}))
            self.dirty = False
