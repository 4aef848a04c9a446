"""The workspace lock: one `tpubuild build` at a time writes a workspace's outputs and lock
files (the cache has its own lock, store/sessions.py).

An flock on `.tpubuild/build.lock`, taken with the same helper as the cache's lock
(fs/flock.py): the kernel drops it when the holder dies, even by SIGKILL, so a killed build
never leaves a stale lock behind, and whoever waits is told who holds it (from the
kernel's table of locks) and for how long it will wait.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from tpubuild.errors import UsageError
from tpubuild.fs.flock import LockTimeout, open_lock_file, unlock, wait_lock
from tpubuild.gitignore import ignore_itself
from tpubuild.trace_events import waiting


class WorkspaceLock:
    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / "build.lock"
        self.fd: int | None = None

    def acquire(self, wait: float, notify: Callable[[str], None] = lambda m: None) -> None:
        """Take the lock, waiting up to `wait` seconds for another build to finish."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        ignore_itself(self.path.parent)  # the state directory is tpubuild's alone: never in git
        fd = open_lock_file(str(self.path), None, 0o644)
        try:
            with waiting("workspace_lock"):  # build --profile's event (trace_events.py)
                wait_lock(fd, wait, notify, "another tpubuild build of this workspace")
        except LockTimeout as exc:
            os.close(fd)
            raise UsageError(f"another tpubuild build is running in this workspace ({exc.holder}); "
                             f"gave up after {wait:g} s") from None
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            unlock(self.fd)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> WorkspaceLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
