"""Content hashes: BLAKE3 of files, and a Merkle hash of directory trees.

The scheme name is part of every tree hash and of the store layout, so a future change
of algorithm or layout gets a new name instead of a permanent "legacy" store.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import blake3

SCHEME = "blake3-tree-v1"
# Below this size the thread pool costs more than it saves.
THREADED_MIN_SIZE = 4 << 20
CHUNK = 1 << 20


def hash_bytes(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


def hash_file(path: Path | str, size: int | None = None) -> str:
    """BLAKE3 of a file's bytes; big files are memory-mapped and hashed on all cores."""
    if size is None:
        size = os.stat(path).st_size
    if size >= THREADED_MIN_SIZE:
        hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
        hasher.update_mmap(os.fspath(path))
        return hasher.hexdigest()
    hasher = blake3.blake3()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


@dataclass(frozen=True)
class FileEntry:
    """One file of a tree: POSIX path relative to the tree root, content hash, size.

    Modes are not part of the hash: stored objects are read-only hardlinks, one mode each."""

    path: str
    hash: str
    size: int


def tree_digest(entries: list[FileEntry]) -> str:
    """The Merkle hash of (relative path, file hash) pairs, in path order."""
    hasher = blake3.blake3(f"{SCHEME}\n".encode())
    for entry in sorted(entries, key=lambda e: e.path):
        hasher.update(f"{entry.path}\0{entry.hash}\n".encode())
    return hasher.hexdigest()


def walk_files(root: Path) -> list[tuple[str, os.stat_result]]:
    """Every regular file below `root` (symlinks followed) as (relative POSIX path, stat)."""
    out: list[tuple[str, os.stat_result]] = []
    root_str = os.fspath(root)
    for dirpath, dirnames, filenames in os.walk(root_str, followlinks=True):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root_str)
        for name in filenames:
            full = os.path.join(dirpath, name)
            st = os.stat(full)
            rel = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
            out.append((rel, st))
    out.sort()
    return out
