"""The workspace lock: one `tpubuild build` at a time writes a workspace's cache and outputs.

An flock on `.tpubuild/build.lock`: the kernel drops it when the holder dies, even by
SIGKILL, so a killed build never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Callable

from tpubuild.errors import UsageError


class WorkspaceLock:
    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / "build.lock"
        self.fd: int | None = None

    def acquire(self, wait: float, notify: Callable[[str], None] = lambda m: None) -> None:
        """Take the lock, waiting up to `wait` seconds for another build to finish."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    notify(f"waiting for another tpubuild build of this workspace ({_holder(fd)})")
                    told = True
                if time.monotonic() >= deadline:
                    holder = _holder(fd)
                    os.close(fd)
                    raise UsageError(
                        f"another tpubuild build is running in this workspace ({holder}); "
                        f"gave up after {wait:g} s"
                    ) from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}\n".encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None

    def __enter__(self) -> WorkspaceLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode().strip()
    except OSError:
        text = ""
    return text or "pid unknown"
