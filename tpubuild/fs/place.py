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
from contextlib import nullcontext
from pathlib import Path

from tpubuild import progress
from tpubuild.atomic import replacing
from tpubuild.digests import hash_fd
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


def place_file(src: Path | str, dst: Path | str, link_type: str = "copy", durable: bool = True,
               follow: bool = False, expect: str | None = None, dst_dir_fd: int | None = None) -> str:
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
    copy (publish attests these bytes)."""
    fd, st = open_regular(src, follow)
    try:
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
            # A copy's bytes were counted as they were copied; a reflink's or a link's are
            # counted as this check reads them (progress.py).
            with progress.uncounted() if how == "copy" else nullcontext():
                _check_written(src, dst, expect, dst_dir_fd)
        return how
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise StageError(f"no space left on device while writing {dst}") from None
        raise
    finally:
        os.close(fd)


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
