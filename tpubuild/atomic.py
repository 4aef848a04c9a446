"""Atomic writes: a temp file in the same directory, fsync, then os.replace.

TensorFlow-free and shared by the engine (lock files, cache records) and the stages
(saved_model.pb, reports), so every published file is written the same way.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replacing(path: Path | str, dir_fd: int | None = None) -> Iterator[str]:
    """A fresh name beside `path` for the caller to create and fill; renamed over `path`
    when the block ends (readers see the old file or the new one, never a part), then the
    directory is fsynced (the rename survives a crash only once its directory is on disk).
    Removed if the block raises. With `dir_fd`, `path` is a name in that directory. The one
    temp-then-rename of every write that replaces a file (write_atomic, fs/place.py
    replace_file)."""
    directory, name = os.path.split(os.fspath(path))
    tmp = os.path.join(directory, f".{name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        raise
    if dir_fd is not None and not directory:
        try:
            os.fsync(dir_fd)
        except OSError:
            pass  # as fsync_path: a directory its file system will not fsync
    else:
        fsync_path(directory or ".")


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so readers see the old or the new file, never a part."""
    with replacing(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)  # as mkstemp made it
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def fsync_path(path: Path | str) -> None:
    """fsync a file or directory by path (a read-only descriptor is enough on Linux). A
    file's failure raises; a directory that its file system will not open or fsync (some
    network file systems) is skipped, since there is nothing more to do for it."""
    directory = os.path.isdir(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        if directory:
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not directory:
            raise
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    write_atomic(path, text.encode("utf-8"))


def create_text_exclusive(path: Path, text: str) -> bool:
    """Create `path` holding `text` unless something is there already (never replaced);
    True when created. Atomic and durable as write_atomic, but made with the mode a
    plain `open` gives (the umask's), since a file the user edits and commits is theirs."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # fails when `path` exists: nothing is ever overwritten
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise
            return _create_in_place(path, text)  # a file system without hard links
    finally:
        os.unlink(tmp)
    fsync_path(path.parent)
    return True


# What link(2) says on a file system that has no hard links (FAT, some network mounts).
_NO_HARD_LINKS = {getattr(errno, name) for name in ("EPERM", "ENOTSUP", "EOPNOTSUPP", "EMLINK", "ENOSYS")
                  if hasattr(errno, name)}


def _create_in_place(path: Path, text: str) -> bool:
    """create_text_exclusive without a hard link: O_EXCL still never replaces a file, but a
    crash while writing these few bytes could leave them short."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as f:
        f.write(text.encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())
    fsync_path(path.parent)
    return True
