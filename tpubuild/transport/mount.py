"""Paths below the root of a shared directory (a file:// publish destination or remote
cache on a group mount), reached without following a symbolic link at any component.

Everyone who can write the mount can replace `toy/.tpubuild/staging` by a link to your
home directory; `os.rename(root/toy/.tpubuild/staging/2023, ...)` or `os.walk` of a
linked prefix would then act on your files. Here the root is opened once (the URL the
user gave: it may itself be a link, e.g. a mount point), and every component below it is
opened relative to its parent's descriptor with `O_NOFOLLOW` (fs/nofollow.py), and every
change is made with `dir_fd=` on the directory so opened. A link met on the way means the
name is not in the destination: a read finds nothing, a removal removes nothing; where a
write needs a directory, a link there is removed (never what it points to) and the
directory made, said in one line. Walks and removals are iterative, with bounds on depth and on
entries: a deep or huge tree a co-writer planted costs a bounded time and is said in one
line, never a RecursionError.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tpubuild.fs import NotAFile, descend, lstat_at, open_dir

# Deeper than anything tpubuild writes (a SavedModel's assets are a few levels) by far;
# one descriptor is open per level of a walk.
MAX_DEPTH = 64
# Entries one walk or one removal visits at most.
MAX_ENTRIES = 1_000_000
_ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class LinkInPath(OSError):
    """A component of a name below the root is a symbolic link (or not a directory): the
    name is not in the destination, and nothing is written through it."""

    def __init__(self, rel: str, kind: str):
        super().__init__(errno.ELOOP, f"{kind} on the way; not followed", rel)
        self.kind = kind


def parts_of(rel: str) -> list[str]:
    """The components of a relative name as the backends pass it (`toy/1/`, `toy/1/x.pb`);
    `..`, `.` or an empty component inside is a LinkInPath (never a name tpubuild uses)."""
    parts = rel.strip("/").split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise LinkInPath(rel, "a name leaving the directory")
    return parts


def open_root(root: Path) -> int:
    return os.open(root, _ROOT_FLAGS)


def _descend(fd: int, parts: list[str], rel: str, create: bool, notes: list[str] | None = None) -> int:
    """A descriptor of `parts` below `fd` (closed here), each opened without following a
    link; made (mode from the umask, setgid inherited as mkdir(2) does) when `create`,
    a symbolic link in the way then unlinked first (a line in `notes`)."""
    done: list[str] = []

    def step(part: str, fd: int) -> int:
        done.append(part)
        if create:
            st = lstat_at(part, fd)
            if st is not None and stat.S_ISLNK(st.st_mode):
                # Only the link goes: what it points to is never touched.
                os.unlink(part, dir_fd=fd)
                if notes is not None:
                    notes.append(f"{'/'.join(done)}: a symbolic link, not a directory; replaced by "
                                 "one (what it pointed to untouched)")
            try:
                os.mkdir(part, 0o777, dir_fd=fd)
            except FileExistsError:
                pass
        try:
            return open_dir(part, fd)
        except NotAFile as exc:
            raise LinkInPath(rel, exc.kind) from None

    return descend(fd, parts, step)


@contextmanager
def parent(root: Path, rel: str, create: bool = False, notes: list[str] | None = None
           ) -> Iterator[tuple[int, str]]:
    """(a descriptor of the directory holding `rel`, `rel`'s last component); its
    directories made when `create` (`notes`: as `_descend`'s)."""
    parts = parts_of(rel)
    if create:
        root.mkdir(parents=True, exist_ok=True)  # the URL the user gave (the remote cache's v1/ made on first push)
    fd = _descend(open_root(root), parts[:-1], rel, create, notes)
    try:
        yield fd, parts[-1]
    finally:
        os.close(fd)


@contextmanager
def directory(root: Path, rel: str) -> Iterator[int]:
    """A descriptor of the directory `rel` below `root` ("" is the root itself)."""
    parts = parts_of(rel) if rel.strip("/") else []
    fd = _descend(open_root(root), parts, rel, False)
    try:
        yield fd
    finally:
        os.close(fd)


def walk(root: Path, rel_prefix: str, say_once: list[str] | None = None
         ) -> Iterator[tuple[str, str, os.stat_result]]:
    """(relative path of the entry from `root`, kind "file"/"dir"/"link", lstat) of everything
    below `rel_prefix` but special files, directories entered by descriptor, links never
    followed. Depth and entry count are bounded; what a
    bound cut off is one line in `say_once`. A prefix that is absent or reached through a
    link: nothing."""
    try:
        top = _descend(open_root(root), parts_of(rel_prefix) if rel_prefix.strip("/") else [], rel_prefix, False)
    except (FileNotFoundError, NotADirectoryError, LinkInPath):
        return
    base = rel_prefix.strip("/")
    stack: list[tuple[int, str, Iterator[os.DirEntry]]] = []
    seen = 0
    try:
        stack.append((top, base, iter(list(os.scandir(top)))))
        while stack:
            fd, rel_dir, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
                os.close(fd)
                continue
            seen += 1
            if seen > MAX_ENTRIES:
                if say_once is not None:
                    say_once.append(f"{base or '.'}: more than {MAX_ENTRIES} entries; the rest not read")
                return
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                yield rel, "dir", st
                if len(stack) >= MAX_DEPTH:
                    if say_once is not None:
                        say_once.append(f"{rel}: more than {MAX_DEPTH} levels deep; not read")
                    continue
                try:
                    child = open_dir(entry.name, fd)
                except (NotAFile, FileNotFoundError, PermissionError):
                    continue
                try:
                    listed = list(os.scandir(child))
                except OSError:
                    os.close(child)
                    continue
                stack.append((child, rel, iter(listed)))
            elif stat.S_ISREG(st.st_mode):
                yield rel, "file", st
            elif stat.S_ISLNK(st.st_mode):
                yield rel, "link", st
    finally:
        for fd, _rel, _entries in stack:
            os.close(fd)


def remove_below(dir_fd: int, name: str, display: str) -> list[str]:
    """Remove `name` in `dir_fd` whatever it is (a link or a file unlinked, never what a
    link points to; a directory emptied by descriptor), iteratively, within MAX_DEPTH and
    MAX_ENTRIES. Returns one line per thing left (what could not be removed)."""
    left: list[str] = []
    st = lstat_at(name, dir_fd)
    if st is None:
        return left
    if not stat.S_ISDIR(st.st_mode):
        _unlink_at(name, dir_fd, display, left)
        return left
    try:
        top = open_dir(name, dir_fd)
    except NotAFile:  # replaced by a link or a file meanwhile: that is what goes
        _unlink_at(name, dir_fd, display, left)
        return left
    except FileNotFoundError:
        return left
    except OSError as exc:
        return [f"{display}: cannot open ({exc.strerror}); left in place"]
    # Each frame: (descriptor, its display path, its remaining names, parent descriptor, name there).
    stack: list[tuple[int, str, Iterator[str], int, str]] = [(top, display, iter(_names(top)), dir_fd, name)]
    seen = 0
    try:
        while stack:
            fd, where, names, parent_fd, own = stack[-1]
            entry = next(names, None)
            if entry is None:
                stack.pop()
                os.close(fd)
                try:
                    os.rmdir(own, dir_fd=parent_fd)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    if not left:  # one line for the tree: its first cause says why
                        left.append(f"{where}: cannot remove ({exc.strerror}); left in place")
                continue
            seen += 1
            path = f"{where}/{entry}"
            if seen > MAX_ENTRIES:
                left.append(f"{display}: more than {MAX_ENTRIES} entries; the rest left in place")
                break
            est = lstat_at(entry, fd)
            if est is None:
                continue
            if not stat.S_ISDIR(est.st_mode):
                _unlink_at(entry, fd, path, left)
                continue
            if len(stack) >= MAX_DEPTH:
                left.append(f"{path}: more than {MAX_DEPTH} levels deep; left in place")
                continue
            try:
                child = open_dir(entry, fd)
            except NotAFile:
                _unlink_at(entry, fd, path, left)
                continue
            except OSError as exc:
                left.append(f"{path}: cannot open ({exc.strerror}); left in place")
                continue
            stack.append((child, path, iter(_names(child)), fd, entry))
    finally:
        for fd, *_rest in stack:
            os.close(fd)
    return left[:1] + ([f"... and {len(left) - 1} more"] if len(left) > 1 else [])


def _names(fd: int) -> list[str]:
    try:
        return sorted(os.listdir(fd))
    except OSError:
        return []


def _unlink_at(name: str, dir_fd: int, display: str, left: list[str]) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        left.append(f"{display}: cannot remove ({exc.strerror}); left in place")
