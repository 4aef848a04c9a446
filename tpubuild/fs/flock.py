"""flock locks on files in a directory others can write (the cache's `v1/lock` and the
per-session `v1/tmp/<session>.lock`).

Whoever can read a lock file can hold flock on it (a co-user of a shared cache, a stray
`flock` command), so every wait here has a deadline and says what it waits for and who
holds it: the holder's pid comes from the kernel's own table, /proc/locks (a flock's
owner is not written into the file: the file is never written, never truncated). A lock
file is opened read-only, without following a link and without blocking (a FIFO there
would block a plain open forever); anything but a regular file is NotAFile, for the
caller to remove as damage.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from typing import Callable

from tpubuild.errors import file_kind
from tpubuild.fs.nofollow import NotAFile, lstat_at

# Between two tries of a busy lock: short at first (a session opens in milliseconds).
_POLL_FIRST, _POLL_MAX = 0.02, 0.5


class LockTimeout(Exception):
    """The lock stayed busy past its deadline; `holder` says who held it last."""

    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


def open_lock_file(name: str, dir_fd: int | None, mode: int, create: bool = True) -> int:
    """A read-only descriptor of the regular file `name` in `dir_fd` (made with exactly
    `mode` when absent and `create`, else FileNotFoundError). Something else there (a
    link, a directory, a FIFO) is NotAFile, found by lstat before any open: a device is
    never opened."""
    for _ in range(10):  # a file removed between two calls: open again
        st = lstat_at(name, dir_fd)
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise NotAFile(name, file_kind(st.st_mode))
        if st is None and not create:
            raise FileNotFoundError(errno.ENOENT, "no lock file", name)
        if st is None:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=dir_fd)
            except FileExistsError:
                continue
            try:
                os.fchmod(fd, mode)
            except OSError:
                os.close(fd)
                raise
            return fd
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            continue
        except OSError as exc:
            st = lstat_at(name, dir_fd)
            if st is not None and not stat.S_ISREG(st.st_mode):
                raise NotAFile(name, file_kind(st.st_mode)) from exc
            raise
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):  # swapped between the lstat and the open
            os.close(fd)
            raise NotAFile(name, file_kind(found.st_mode))
        return fd
    raise FileNotFoundError(name)


def try_lock(fd: int) -> bool:
    """Take the exclusive flock of `fd` now if it is free."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)


def wait_lock(fd: int, wait: float, notify: Callable[[str], None], what: str) -> None:
    """Take the flock of `fd`, waiting up to `wait` seconds. When it is busy, one line
    (`notify`) says what is awaited, who holds it and for how long at most; past the
    deadline, LockTimeout."""
    if try_lock(fd):
        return
    notify(f"waiting for {what} ({holder(fd)}); giving up after {wait:g} s")
    deadline = time.monotonic() + wait
    pause = _POLL_FIRST
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise LockTimeout(holder(fd))
        time.sleep(min(pause, left))
        pause = min(pause * 2, _POLL_MAX)
        if try_lock(fd):
            return


def holder(fd: int, kinds: tuple[str, ...] = ("FLOCK",)) -> str:
    """Who holds a lock of `kinds` (FLOCK; sqlite's are POSIX) on the file of `fd`:
    "held by pid 123, uid 1001, tpubuild" from /proc/locks (Linux), else "holder unknown"."""
    st = os.fstat(fd)
    pids = []
    try:
        with open("/proc/locks") as table:
            lines = table.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->" or fields[1] not in kinds:  # "->": a waiter, not the holder
            continue
        try:
            major, minor, ino = fields[5].split(":")
            pid = int(fields[4])
        except ValueError:
            continue
        if int(ino) != st.st_ino:
            continue
        exact = (int(major, 16), int(minor, 16)) == (os.major(st.st_dev), os.minor(st.st_dev))
        pids.append((not exact, pid))  # an overlay file system may show another device
    if not pids:
        return "holder unknown"
    pid = min(pids)[1]
    if pid <= 0:
        return "held by a process outside this pid namespace"
    return f"held by pid {pid}{_process(pid)}"


def _process(pid: int) -> str:
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
        with open(f"/proc/{pid}/comm") as comm:
            name = comm.read().strip()
    except OSError:
        return ""
    return f", uid {uid}, {name}"
