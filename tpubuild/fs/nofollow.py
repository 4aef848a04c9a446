"""Walks, reads, writes and removals in a directory others can write (a shared cache) that
never go through a symbolic link: openat-style, each component opened with
`O_DIRECTORY | O_NOFOLLOW` relative to its parent's descriptor, and every change made
with `dir_fd=` on a directory opened that way.

A path is resolved again at each use, so a directory checked with lstat can be replaced
by a link before the next call that names it (a co-user renames `v1/trees/<digest>` and
puts a link to your home directory there: a later `unlink(path/name)` deletes your
file). A descriptor keeps naming the directory that was checked, whatever its name
becomes. Special files (FIFOs, devices, sockets) are never opened for reading without
`O_NONBLOCK`, and never read.
"""

from __future__ import annotations

import errno
import os
import stat
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

from tpubuild.errors import file_kind

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# errno of opening a symbolic link with O_NOFOLLOW (Linux: ELOOP; some BSDs: EMLINK,
# EFTYPE), and of O_DIRECTORY on something else.
_LINK_ERRNOS = {errno.ELOOP, errno.EMLINK, getattr(errno, "EFTYPE", errno.ELOOP)}


class NotAFile(OSError):
    """A name that should be a regular file (or a directory) is something else; `kind`
    says what ("a symbolic link", "a FIFO (named pipe)", "a directory")."""

    def __init__(self, path: str, kind: str):
        super().__init__(errno.EINVAL, f"{kind}, not what tpubuild writes there", path)
        self.kind = kind


def lstat_at(name: str, dir_fd: int | None) -> os.stat_result | None:
    """lstat of `name` in the directory `dir_fd`, or None when there is nothing there."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def open_dir(name: str, dir_fd: int | None = None) -> int:
    """A descriptor of the directory `name` (in `dir_fd`), never reached through a final
    symbolic link: a link or a non-directory there is NotAFile."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS or exc.errno == errno.ENOTDIR:
            st = lstat_at(name, dir_fd)
            if st is not None:
                raise NotAFile(name, file_kind(st.st_mode)) from None
        raise


def open_regular_at(name: str, dir_fd: int | None) -> tuple[int, os.stat_result]:
    """A read-only descriptor of the regular file `name` and its fstat. A link, a FIFO, a
    device... is NotAFile, and is never read (O_NONBLOCK: opening a FIFO cannot block)."""
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS or exc.errno in (errno.EISDIR, errno.ENXIO):
            st = lstat_at(name, dir_fd)
            if st is not None:
                raise NotAFile(name, file_kind(st.st_mode)) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotAFile(name, file_kind(st.st_mode))
    return fd, st


def read_regular_at(name: str, dir_fd: int | None, limit: int) -> bytes:
    """The bytes of the regular file `name` (at most `limit`; more is a ValueError)."""
    fd, st = open_regular_at(name, dir_fd)
    try:
        if st.st_size > limit:
            raise ValueError(f"{st.st_size} bytes, more than the {limit} expected")
        chunks, left = [], limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise ValueError(f"more than the {limit} bytes expected")
        return data
    finally:
        os.close(fd)


def make_dir(name: str, dir_fd: int | None, mode: int) -> int:
    """A descriptor of the directory `name`, made with exactly `mode` (whatever the umask)
    if it did not exist; an existing one is opened as it is (a link there: NotAFile)."""
    try:
        os.mkdir(name, 0o700, dir_fd=dir_fd)  # nobody else can enter it before its chmod
    except FileExistsError:
        return open_dir(name, dir_fd)
    fd = open_dir(name, dir_fd)
    try:
        os.fchmod(fd, mode)
    except OSError:
        os.close(fd)
        raise
    return fd


@contextmanager
def opened(fd: int) -> Iterator[int]:
    """`fd`, closed on leaving."""
    try:
        yield fd
    finally:
        os.close(fd)


def descend(fd: int, parts: Iterable[str], step: Callable[[str, int], int]) -> int:
    """The directory reached from `fd` (taken: closed here) one component at a time,
    `step(name, parent_fd)` opening each child by its caller's policy on links (refuse:
    open_path, the store's layout; remove and make: a mount's, transport/mount.py). Every
    descriptor but the one returned is closed, also when a step raises."""
    try:
        for part in parts:
            child = step(part, fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_path(root_fd: int, rel: str, create_mode: int | None = None) -> int:
    """A descriptor of the directory `rel` (a relative POSIX path) below `root_fd`, each
    component opened without following a link (made with `create_mode` when given and
    absent)."""

    def step(part: str, fd: int) -> int:
        if part == "..":
            raise NotAFile(rel, "a path leaving its directory")
        return make_dir(part, fd, create_mode) if create_mode is not None else open_dir(part, fd)

    return descend(os.dup(root_fd), [p for p in rel.split("/") if p], step)


# How deep a walk or a removal goes by descriptor: a directory tpubuild writes (a SavedModel,
# a checkout) is a few levels deep; a co-user can plant one 5000 deep, which a recursive walk
# met as RecursionError (and one descriptor a level would run out of descriptors).
MAX_DEPTH = 64
# How many entries one removal takes on before it gives up and leaves the rest (said by its
# caller): damage of any width or depth costs a bounded time.
MAX_REMOVED = 1_000_000


def walk_regular(dir_fd: int, display: str) -> list[tuple[str, os.stat_result]]:
    """Every regular file below the directory `dir_fd` as (relative POSIX path, lstat),
    sorted; subdirectories entered by descriptor, never through a link, iteratively and at
    most MAX_DEPTH levels down. A link, a special file or a directory deeper than that
    anywhere is a StageError naming it (`display` is the directory's path; the error's
    `path` and `kind` say which and what)."""
    out: list[tuple[str, os.stat_result]] = []

    def refuse(rel: str, what: str, message: str) -> Exception:
        error: Any = _stage_error(f"{display}/{rel}: {message}")
        error.path, error.kind = f"{display}/{rel}", what
        return error

    # (descriptor to close when done, or None for the caller's, relative prefix, depth)
    pending: list[tuple[int, int | None, str, int]] = [(dir_fd, None, "", 0)]
    try:
        while pending:
            fd, owned, rel_dir, depth = pending.pop()
            try:
                with os.scandir(fd) as it:
                    items = sorted((item.name, item.stat(follow_symlinks=False)) for item in it)
                for name, st in items:
                    rel = f"{rel_dir}{name}"
                    if stat.S_ISDIR(st.st_mode):
                        if depth + 1 > MAX_DEPTH:
                            raise refuse(rel, f"a directory more than {MAX_DEPTH} levels deep",
                                         f"more than {MAX_DEPTH} directory levels deep; not entered")
                        try:
                            child = open_dir(name, fd)
                        except NotAFile as exc:  # replaced by a link since the listing
                            raise refuse(rel, exc.kind, f"{exc.kind}, not a directory") from None
                        pending.append((child, child, f"{rel}/", depth + 1))
                    elif stat.S_ISREG(st.st_mode):
                        out.append((rel, st))
                    elif stat.S_ISLNK(st.st_mode):
                        try:
                            target = os.readlink(name, dir_fd=fd)
                        except OSError:
                            target = "?"
                        raise refuse(rel, "a symbolic link",
                                     f"a symbolic link (to {target}); stage outputs must be regular files")
                    else:
                        raise refuse(rel, file_kind(st.st_mode), f"{file_kind(st.st_mode)}, not a regular file")
            finally:
                if owned is not None:
                    os.close(owned)
    finally:
        for _fd, owned, _rel, _depth in pending:  # left open by an error above
            if owned is not None:
                os.close(owned)
    out.sort()
    return out


def remove_at(name: str, dir_fd: int | None) -> bool:
    """Remove `name` from the directory `dir_fd` whatever it is: a link or a file is
    unlinked (never what a link points to), a directory emptied by descriptor, never
    through a link found inside, iteratively (no recursion, whatever its depth). False
    when something could not be removed (another user's file in a directory of theirs,
    or more than MAX_REMOVED entries): what is left stays, for the caller to say."""
    st = lstat_at(name, dir_fd)
    if st is None:
        return True
    if stat.S_ISDIR(st.st_mode):
        try:
            fd = open_dir(name, dir_fd)
        except NotAFile:  # replaced by a link or a file meanwhile: that is what goes
            fd = None
        except FileNotFoundError:
            return True
        except OSError:
            return False
        if fd is not None:
            with opened(fd):
                ok = _empty(fd)
            try:
                os.rmdir(name, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            except OSError:
                return False
            return ok
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def _empty(top: int) -> bool:
    """Remove everything in the directory `top`, depth first by descriptor, with an explicit
    stack of at most MAX_DEPTH open directories: a directory met deeper than that is renamed
    up into `top` (renameat moves the name, never follows it) and emptied from there, so a
    tree of any depth costs MAX_DEPTH descriptors. Every entry is tried, even past one that
    stays. False when something stays."""
    ok = True
    budget = MAX_REMOVED
    # Per level: (descriptor, its name in the level above, names still to remove there).
    stack: list[tuple[int, str, list[str]]] = [(top, "", sorted(os.listdir(top), reverse=True))]
    try:
        while stack:
            fd, _name, todo = stack[-1]
            if not todo:
                if len(stack) == 1:
                    break
                stack.pop()
                os.close(fd)
                parent = stack[-1][0]
                try:
                    os.rmdir(_name, dir_fd=parent)
                except FileNotFoundError:
                    pass
                except OSError:
                    ok = False
                continue
            entry = todo.pop()
            budget -= 1
            if budget < 0:
                return False
            st = lstat_at(entry, fd)
            if st is None:
                continue
            if not stat.S_ISDIR(st.st_mode):
                try:
                    os.unlink(entry, dir_fd=fd)
                except FileNotFoundError:
                    pass
                except OSError:
                    ok = False
                continue
            if len(stack) >= MAX_DEPTH:
                hoisted = f".removing-{os.urandom(6).hex()}"
                try:
                    os.rename(entry, hoisted, src_dir_fd=fd, dst_dir_fd=top)
                    stack[0][2].append(hoisted)
                except FileNotFoundError:
                    pass
                except OSError:
                    ok = False
                continue
            try:
                child = open_dir(entry, fd)
            except NotAFile:  # replaced by a link or a file since its lstat: unlinked next time round
                todo.append(entry)
                continue
            except FileNotFoundError:
                continue
            except OSError:
                ok = False
                continue
            try:
                names = sorted(os.listdir(child), reverse=True)
            except OSError:
                os.close(child)
                ok = False
                continue
            stack.append((child, entry, names))
    finally:
        for fd, _name, _todo in stack[1:]:
            os.close(fd)
    return ok


def write_atomic_at(name: str, dir_fd: int, data: bytes, mode: int) -> None:
    """Replace `name` in `dir_fd` with a file of `data` and exactly `mode`: a fresh temp
    file (O_EXCL, so never an existing file or link), fsynced, renamed over the name
    (which replaces a link there, never its target), then the directory fsynced."""
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    _write_new(tmp, dir_fd, data, mode)
    try:
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    fsync_fd(dir_fd)


def create_exclusive_at(name: str, dir_fd: int, data: bytes) -> bool:
    """Create `name` in `dir_fd` holding `data` unless something is there already (a link
    too, dangling or not: it is never followed nor replaced); True when created. As
    atomic.create_text_exclusive, by descriptor: a fresh temp file, hard-linked to `name`
    (linkat fails on anything there), the directory fsynced; the file has the mode a plain
    `open` gives (the umask's): it is the user's."""
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    _write_new(tmp, dir_fd, data, None)
    try:
        os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
        try:  # O_EXCL | O_NOFOLLOW still never replaces nor follows; a crash could leave it short
            _write_new(name, dir_fd, data, None)
        except FileExistsError:
            return False
    finally:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
    fsync_fd(dir_fd)
    return True


# What link(2) says on a file system that has no hard links (FAT, some network mounts),
# as atomic.py's create_text_exclusive reads it.
_NO_HARD_LINKS = {getattr(errno, name) for name in ("EPERM", "ENOTSUP", "EOPNOTSUPP", "EMLINK", "ENOSYS")
                  if hasattr(errno, name)}


def _write_new(name: str, dir_fd: int, data: bytes, mode: int | None) -> None:
    """A new file `name` in `dir_fd` (O_EXCL | O_NOFOLLOW: never an existing file or a link)
    holding `data`, fsynced; with exactly `mode`, else the umask's. Removed if writing fails."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600 if mode is not None else 0o666, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if mode is not None:
                os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        try:
            os.unlink(name, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def fsync_fd(fd: int) -> None:
    """fsync an open directory; a file system that refuses (some network ones) is skipped."""
    try:
        os.fsync(fd)
    except OSError:
        pass


def _stage_error(message: str) -> Exception:
    from tpubuild.errors import StageError

    return StageError(message)
