"""The workspace lock: one `tpubuild build` at a time writes a workspace's outputs and lock
files (the store has its own lock in `cache_dir`, see store.py).

A `filelock` lock (an flock) on `.tpubuild/build.lock`: the kernel drops it when the
holder dies, even by SIGKILL, so a killed build never leaves a stale lock behind. The
holder writes its pid into the file, for the message of whoever waits.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from filelock import FileLock, Timeout

from tpubuild.errors import UsageError
from tpubuild.gitignore import ignore_itself


class WorkspaceLock:
    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / "build.lock"
        self.lock: FileLock | None = None

    def acquire(self, wait: float, notify: Callable[[str], None] = lambda m: None) -> None:
        """Take the lock, waiting up to `wait` seconds for another build to finish."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        ignore_itself(self.path.parent)  # the state directory is tpubuild's alone: never in git
        lock = FileLock(self.path, thread_local=False, on_acquired=_write_pid)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            notify(f"waiting for another tpubuild build of this workspace ({_holder(self.path)})")
            try:
                lock.acquire(timeout=wait)
            except Timeout:
                raise UsageError(
                    f"another tpubuild build is running in this workspace ({_holder(self.path)}); "
                    f"gave up after {wait:g} s"
                ) from None
        self.lock = lock

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def __enter__(self) -> WorkspaceLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _write_pid(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)


def _holder(path: Path) -> str:
    try:
        text = path.read_text()[:64].strip()
    except OSError:
        text = ""
    return text or "pid unknown"
