"""File-system primitives of the store and of publishing: durable renames, and placing a
file as a reflink, a copy or a hard link.

Durability: a rename publishes only what is on disk, so the file is fsynced before it is
renamed and the directory holding the new name is fsynced after (otherwise a power cut
can leave the new name pointing to an empty file, or no name at all).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from tpubuild import io_counters, progress
from tpubuild.atomic import replacing
from tpubuild.digests import hash_fd, hash_fd_arriving
from tpubuild.errors import StageError

# linux/fs.h: _IOW(0x94, 9, int). Shares the source's extents (btrfs, XFS with
# reflink=1, bcachefs, ...): instant, and a later write to either file unshares it.
FICLONE = 0x40049409
# The bytes one copy_file_range call moves at most: large enough that the calls cost
# nothing beside the copy, small enough that a copy of gigabytes reports its progress.
COPY_STEP = 64 << 20


def clone_or_copy(fsrc, fdst) -> str:
    """Fill the new, empty open file `fdst` as a reflink of the open file `fsrc` where the
    file system can, else as a copy (from the open file: the one whose kind and owner were
    checked, not whatever its name is now). Either way `fdst` is its own inode: writing it
    never changes the source. Returns how."""
    try:
        fcntl.ioctl(fdst.fileno(), FICLONE, fsrc.fileno())
        return "reflink"
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EPERM):
            raise
    _copy_range(fsrc, fdst)
    return "copy"


def _copy_range(fsrc, fdst) -> None:
    """Kernel-side copy (copy_file_range, else sendfile): no pass through Python's memory."""
    size = os.fstat(fsrc.fileno()).st_size
    offset = 0
    copy = getattr(os, "copy_file_range", None)
    while offset < size:
        step = min(size - offset, COPY_STEP)  # a step at a time: a terminal shows the bytes done (progress.py)
        try:
            n = copy(fsrc.fileno(), fdst.fileno(), step) if copy else os.sendfile(
                fdst.fileno(), fsrc.fileno(), offset, step)
        except OSError as exc:
            if copy is None or exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            copy = None  # copy_file_range refused this pair of files: sendfile can do it
            fsrc.seek(offset)
            fdst.seek(offset)
            continue
        if n == 0:
            break
        offset += n
        progress.advance(n)


def open_regular(src: Path | str, follow: bool = False) -> tuple[int, os.stat_result]:
    """An fd of `src` and its fstat, when `src` is a regular file. Opened without following
    a final symbolic link unless `follow`, and without blocking (a FIFO would block a
    plain open until a writer comes); anything else is a StageError naming it."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(src, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise StageError(f"{src}: a symbolic link, not a regular file; not linked or copied through") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise StageError(f"{src}: not a regular file; not linked or copied")
    return fd, st


@contextmanager
def _space_named(dst: Path | str) -> Iterator[None]:
    """A full disk while writing `dst` is one line naming it (a StageError)."""
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise StageError(f"no space left on device while writing {dst}") from None
        raise


def place_file(src: Path | str, dst: Path | str, link_type: str = "copy", durable: bool = True,
               follow: bool = False, expect: str | None = None, dst_dir_fd: int | None = None,
               known: Callable[[os.stat_result], str | None] | None = None) -> str:
    """Create `dst` (which must not exist; relative to the directory `dst_dir_fd` when
    given) with the content of `src`: a hard link when `link_type` is "hardlink" (falling
    back to a copy across file systems), else a reflink or copy. The file is read-only
    (0444) and fsynced when `durable`.

    `src` (a store object) must be a regular file, never reached through a final symbolic
    link (`follow` is for a user's own source files): `os.link` on a symlink links the
    symlink itself, and a copy through it copies whatever it points to now. A hard link is
    made only to a file this user owns and only when the name still is the inode that was
    checked: another user's file in a shared cache can be rewritten by its owner later,
    so it is copied. A copy is a new file (O_EXCL, O_NOFOLLOW): never written through a
    link or into an existing file.

    With `expect` (the object's BLAKE3), what was written is hashed and must be it, else
    `dst` is removed and a StageError names `src`: the object was checked earlier (its
    lookup), and whoever can write the cache can change it between that check and this
    copy (publish attests these bytes). A hard link of an inode this process hashed
    itself and holds unchanged, read-only (`known`, store/objects.py known_object, says
    it is `expect`), is not read again: its bytes are the ones that were hashed, under the
    trust the store gives its own stage outputs (issue 54: the 4 GiB of an 8 GiB model's
    bfloat16 artifact, ~1 s of publish)."""
    fd, st = open_regular(src, follow)
    try:
        with _space_named(dst):
            how = None
            if link_type == "hardlink" and st.st_uid == os.getuid():
                try:
                    os.link(src, dst, dst_dir_fd=dst_dir_fd, follow_symlinks=False)
                    linked = os.stat(dst, dir_fd=dst_dir_fd, follow_symlinks=False)
                    if (linked.st_dev, linked.st_ino) == (st.st_dev, st.st_ino):
                        how = "hardlink"
                    else:
                        os.unlink(dst, dir_fd=dst_dir_fd)  # the name was swapped after the check: copy what was checked
                except OSError as exc:
                    if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                        raise
            if how is None:
                out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                              dir_fd=dst_dir_fd)
                with os.fdopen(out, "wb") as fdst, os.fdopen(os.dup(fd), "rb") as fsrc:
                    how = clone_or_copy(fsrc, fdst)
                    os.fchmod(fdst.fileno(), 0o444)
                    if durable:
                        fdst.flush()
                        os.fsync(fdst.fileno())
            if expect is not None:
                now = os.fstat(fd)
                if how == "hardlink" and known is not None and known(now) == expect:
                    progress.advance(now.st_size)  # done, as a check would have counted it
                    return how
                # A copy's bytes were counted as they were copied; a reflink's or a link's are
                # counted as this check reads them (progress.py).
                with progress.uncounted() if how == "copy" else nullcontext():
                    _check_written(src, dst, expect, dst_dir_fd)
            return how
    finally:
        os.close(fd)


def copy_hashed(src: Path | str, dst: str, follow: bool = False, dst_dir_fd: int | None = None) -> str:
    """Create `dst` (a new name; in `dst_dir_fd` when given) as a read-only, fsynced copy of
    the regular file `src` (opened as place_file opens it), and return the BLAKE3 of what
    was written, read back from the copy. The kernel copies a step at a time on a thread
    while this one hashes each step already copied (its pages just written, in the page
    cache), and the copy's fsync runs while the last steps are hashed: a source of 8 GiB
    was copied, fsynced, then hashed one after the other in 12.4 s here (issue 54), where
    the copy is mostly waiting for the disk and the hash for the CPU. A reflink is hashed
    whole; where the kernel cannot copy between the two files (copy_file_range refused),
    the copy is made as place_file makes it, then hashed."""
    import queue
    import threading

    fd, st = open_regular(src, follow)
    try:
        with _space_named(dst):
            out = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                          dir_fd=dst_dir_fd)
            try:
                copy = getattr(os, "copy_file_range", None)
                first = min(st.st_size, COPY_STEP)
                copied: int | None
                try:
                    fcntl.ioctl(out, FICLONE, fd)
                    copied = -1  # a reflink: nothing to copy
                except OSError as exc:
                    if exc.errno not in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS,
                                         errno.EPERM):
                        raise
                    copied = _copy_step(copy, fd, out, 0, first) if copy is not None and first else None
                if copied is None or copied == -1:
                    if copied is None:  # no kernel copy between these files: as place_file copies
                        with os.fdopen(os.dup(out), "wb") as fdst, os.fdopen(os.dup(fd), "rb") as fsrc:
                            _copy_range(fsrc, fdst)
                    os.fchmod(out, 0o444)
                    os.fsync(out)
                    # A copy's bytes were counted as they were copied; a reflink's as they are hashed.
                    with progress.uncounted() if copied is None else nullcontext():
                        return hash_fd(out, os.fstat(out).st_size)
                steps: queue.Queue[int | None] = queue.Queue()
                failed: list[BaseException] = []
                stop = threading.Event()
                start = copied
                helper_io: list[dict[str, int] | None] = []

                def copier() -> None:
                    offset = start
                    before = io_counters.read(io_counters.THREAD)
                    try:
                        steps.put(start)
                        while offset < st.st_size and not stop.is_set():
                            n = _copy_step(copy, fd, out, offset, min(st.st_size - offset, COPY_STEP))
                            if n is None or n == 0:
                                raise OSError(errno.EIO, f"{src}: the kernel's copy stopped at {offset} "
                                                         f"of {st.st_size} bytes")
                            offset += n
                            steps.put(n)
                        os.fchmod(out, 0o444)
                        os.fsync(out)  # beside the hash of the last steps
                    except BaseException as exc:  # raised by the hashing thread, below
                        failed.append(exc)
                    finally:
                        helper_io.append(io_counters.since(before, io_counters.THREAD))
                        steps.put(None)

                thread = threading.Thread(target=copier, name="tpubuild-copy", daemon=True)
                thread.start()

                def arriving():
                    while (n := steps.get()) is not None:
                        yield n

                try:
                    digest = hash_fd_arriving(out, arriving())
                finally:
                    stop.set()
                    thread.join()
                    io_counters.charge(helper_io[0] if helper_io else None)  # the stage's row counts the copy
                if failed:
                    raise failed[0]
                return digest
            finally:
                os.close(out)
    finally:
        os.close(fd)


def _copy_step(copy, fd: int, out: int, offset: int, length: int) -> int | None:
    """Copy `length` bytes at `offset` of `fd` to the same offset of `out` in the kernel
    (copy_file_range, looping over short counts); the bytes copied (fewer only at the
    source's end), or None when the kernel cannot copy between these two files."""
    done = 0
    while done < length:
        try:
            n = copy(fd, out, length - done, offset + done, offset + done)
        except OSError as exc:
            if done == 0 and offset == 0 and exc.errno in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                return None
            raise
        if n == 0:
            break
        done += n
    return done


def _check_written(src: Path | str, dst: Path | str, expect: str, dst_dir_fd: int | None = None) -> None:
    """`dst` (a copy, reflink or hard link of `src`; in `dst_dir_fd` when given) hashes to
    `expect`, or it is removed and a StageError says `src` changed. A hard link is the
    object's own inode: hashed too, as cheap as a copy's pages, which the copy left in the
    page cache. Read through a descriptor opened without following a link."""
    fd = os.open(dst, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dst_dir_fd)
    try:
        actual = hash_fd(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    if actual != expect:
        os.unlink(dst, dir_fd=dst_dir_fd)
        raise StageError(f"cache object {src} changed after it was checked (what was read from it hashes "
                         f"{actual[:16]}, not {expect[:16]}); nothing published, build again")


def replace_file(src: Path | str, dst: Path | str, link_type: str = "copy", expect: str | None = None,
                 dst_dir_fd: int | None = None) -> None:
    """Atomically replace `dst` with a fresh file holding `src`'s content (temp + rename):
    a reader that has `dst` open keeps the old inode, a new open gets the new content.
    `expect`: as place_file's, checked before the rename. With `dst_dir_fd`, `dst` is a
    name in that directory."""
    with replacing(dst, dst_dir_fd) as tmp:
        place_file(src, tmp, link_type, expect=expect, dst_dir_fd=dst_dir_fd)
