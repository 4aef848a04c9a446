"""Content hashes: BLAKE3 of files, and a Merkle hash of directory trees.

The scheme name is part of every tree hash and of the store layout, so a future change
of algorithm or layout gets a new name instead of a permanent "legacy" store.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

import blake3

from tpubuild import progress
from tpubuild.errors import file_kind

SCHEME = "blake3-tree-v1"
# Below this size the thread pool costs more than it saves.
THREADED_MIN_SIZE = 4 << 20
# The one size tpubuild reads bytes in: a file hashed below THREADED_MIN_SIZE (one read),
# and each range request of a download from a remote (transport/backends.py), where it is
# large enough that a request's round trip is small beside its transfer and small enough
# that a trickling server is cut off by one request's deadline.
CHUNK = 8 << 20


def hash_bytes(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


def hash_file(path: Path | str, size: int | None = None) -> str:
    """BLAKE3 of a file's bytes; big files are memory-mapped and hashed on all cores."""
    if size is None:
        size = os.stat(path).st_size
    if size >= THREADED_MIN_SIZE and progress.current() is None:
        hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
        hasher.update_mmap(os.fspath(path))
        return hasher.hexdigest()
    if size >= THREADED_MIN_SIZE:  # a terminal shows how far it is: hashed in counted slices
        fd = os.open(path, os.O_RDONLY)
        try:
            return _hash_mapped(fd)
        finally:
            os.close(fd)
    hasher = blake3.blake3()
    fd = os.open(path, os.O_RDONLY)  # not open(): its buffered file object costs more than hashing a small file
    try:
        while chunk := os.read(fd, CHUNK):
            hasher.update(chunk)
            progress.advance(len(chunk))
    finally:
        os.close(fd)
    return hasher.hexdigest()


def hash_fd(fd: int, size: int) -> str:
    """BLAKE3 of the bytes of an open file (from offset 0): what a descriptor opened and
    checked reads, not whatever file its name points to by now."""
    if size >= THREADED_MIN_SIZE:
        return _hash_mapped(fd)
    hasher = blake3.blake3()
    offset = 0
    while chunk := os.pread(fd, CHUNK, offset):
        hasher.update(chunk)
        offset += len(chunk)
        progress.advance(len(chunk))
    return hasher.hexdigest()


# A mapped file is hashed in slices this large when a terminal shows the progress: each
# slice is still hashed on all cores (BLAKE3's tree splits it), and counted after it.
PROGRESS_SLICE = 64 << 20


def _hash_mapped(fd: int) -> str:
    import mmap

    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
        hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
        if progress.current() is None:
            hasher.update(mapped)
            return hasher.hexdigest()
        view = memoryview(mapped)
        try:
            for offset in range(0, len(view), PROGRESS_SLICE):
                piece = view[offset:offset + PROGRESS_SLICE]
                hasher.update(piece)
                progress.advance(len(piece))
                piece.release()
        finally:
            view.release()
        return hasher.hexdigest()


def hash_fd_arriving(fd: int, pieces: Iterable[int]) -> str:
    """BLAKE3 of an open file's bytes from offset 0, hashed piece by piece as they arrive:
    `pieces` yields each next piece's length once its bytes are in the file (a copy that
    another thread is writing, fs/place.py copy_hashed). The same digest as hash_fd of the
    whole file (BLAKE3's incremental update is exact); each piece memory-mapped and
    hashed on all cores, counted (progress.py) after it."""
    import mmap

    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    offset = 0
    for length in pieces:
        if length >= THREADED_MIN_SIZE:
            start = offset - offset % mmap.ALLOCATIONGRANULARITY  # a mapping starts on a page
            with mmap.mmap(fd, offset + length - start, access=mmap.ACCESS_READ, offset=start) as mapped:
                view = memoryview(mapped)
                try:
                    hasher.update(view[offset - start:])
                finally:
                    view.release()
        else:
            done = 0
            while done < length:
                chunk = os.pread(fd, min(CHUNK, length - done), offset + done)
                if not chunk:
                    raise OSError(f"hash_fd_arriving: the file ends at {offset + done} bytes, short of a piece")
                hasher.update(chunk)
                done += len(chunk)
        offset += length
        progress.advance(length)
    return hasher.hexdigest()


class FileEntry:
    """One file of a tree: POSIX path relative to the tree root, content hash, size.

    Modes are not part of the hash: stored objects are read-only hardlinks, one mode each.
    Immutable, compared and hashed by value. Not a dataclass and not a tuple: importing
    dataclasses costs `build --check` 5 ms, and publish tells a FileEntry from a
    (FileEntry, path) pair by `isinstance(item, tuple)` (publish/targets.py)."""

    __slots__ = ("hash", "path", "size")
    path: str
    hash: str
    size: int

    def __init__(self, path: str, hash: str, size: int):
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "hash", hash)
        object.__setattr__(self, "size", size)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"FileEntry is immutable: cannot set {name}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"FileEntry is immutable: cannot delete {name}")

    def _fields(self) -> tuple[str, str, int]:
        return self.path, self.hash, self.size

    def __eq__(self, other: object) -> bool:
        return other._fields() == self._fields() if other.__class__ is self.__class__ else NotImplemented

    def __hash__(self) -> int:
        return hash(self._fields())

    def __reduce__(self) -> tuple:  # pickling (Ray ships entries) and copy build it anew
        return FileEntry, self._fields()

    def __repr__(self) -> str:
        return f"FileEntry(path={self.path!r}, hash={self.hash!r}, size={self.size!r})"


def tree_digest(entries: list[FileEntry]) -> str:
    """The Merkle hash of (relative path, file hash) pairs, in path order."""
    hasher = blake3.blake3(f"{SCHEME}\n".encode())
    for entry in sorted(entries, key=lambda e: e.path):
        hasher.update(f"{entry.path}\0{entry.hash}\n".encode())
    return hasher.hexdigest()


def walk_files(root: Path | str, symlinks: str = "inside") -> list[tuple[str, os.stat_result]]:
    """Every regular file below `root` as (relative POSIX path, stat), sorted.

    Never follows a link out of the tree: with `symlinks="inside"` (a user's SavedModel) a
    symbolic link whose target is inside `root` is read as its target, one pointing
    anywhere else is an error; with `symlinks="reject"` (a stage's output, which goes into
    the store) every symbolic link is an error. FIFOs, sockets and devices are always
    errors: reading one blocks or never ends. Errors name the path."""
    root_str = os.fspath(root)
    out: list[tuple[str, os.stat_result]] = []
    seen_dirs: set[str] = set()  # real paths of the directories links led to (and the root's), once one did

    def visit(directory: str, rel_dir: str) -> None:
        with os.scandir(directory) as it:
            items = sorted(it, key=lambda e: e.name)
        for item in items:
            rel = f"{rel_dir}{item.name}"
            full = os.path.join(directory, item.name)
            st = item.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                real_root = os.path.realpath(root_str)  # only where a link needs it: a realpath costs a stat per component
                target = os.path.realpath(full)
                if symlinks != "inside":
                    raise _stage_error(f"{full}: a symbolic link (to {os.readlink(full)}); "
                                       "stage outputs must be regular files")
                if os.path.commonpath([real_root, target]) != real_root:
                    raise _stage_error(f"{full}: a symbolic link to {target}, outside {root_str}")
                try:
                    st = os.stat(full)
                except FileNotFoundError:
                    raise _stage_error(f"{full}: a symbolic link to {target}, which does not exist") from None
                if stat.S_ISDIR(st.st_mode):
                    seen_dirs.add(real_root)
                    if target in seen_dirs:
                        raise _stage_error(f"{full}: a symbolic link to {target}, which makes a cycle")
                    seen_dirs.add(target)
            if stat.S_ISDIR(st.st_mode):
                visit(full, f"{rel}/")
            elif stat.S_ISREG(st.st_mode):
                out.append((rel, st))
            else:
                raise _stage_error(f"{full}: {file_kind(st.st_mode)}, not a regular file")

    visit(root_str, "")
    out.sort()
    return out


def _stage_error(message: str) -> Exception:
    # Imported on error only: `build --check` hashes trees without tpubuild.errors.
    from tpubuild.errors import StageError

    return StageError(message)


