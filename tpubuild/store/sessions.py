"""The store lock (`v1/lock`) and this process's session (`v1/tmp/<session>/`), in a
cache several processes and users share (docs/shared-cache.md).

- A session is one directory per build process, mode 0700 (no other user can enter it),
  holding its stage work dirs and checkout temps, beside `<session>.lock`, a file made
  and flocked first and held for the process's whole life: its flock says the session is
  alive. `tmp/` of a shared cache is sticky, like /tmp. Dead sessions (a free flock) are
  removed when the next session opens, under the store lock.
- A name in `tmp/` is not trusted: the session's own descriptor is kept, and what a stage
  wrote is read from it (`in_session`); a session no longer under its name is refused.
- The store lock is taken briefly to open a session; `gc` and `verify-cache` hold it and
  wait for every live session to end (`exclusive`). Anyone who can read the cache can
  hold it, so every wait has a deadline (TPUBUILD_CACHE_LOCK_WAIT for a build) and names
  the holder (fs/flock.py).
"""

from __future__ import annotations

import atexit
import errno
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from tpubuild.errors import StageError, UsageError
from tpubuild.fs import (
    LockTimeout,
    NotAFile,
    lstat_at,
    open_dir,
    open_lock_file,
    open_path,
    opened,
    remove_at,
    try_lock,
    unlock,
    wait_lock,
)
from tpubuild.store.layout import CacheLayout
from tpubuild.trace_events import waiting

# How long a build waits for the store lock (held by gc, verify-cache, or anyone who can
# read the cache), in seconds; this variable sets it.
LOCK_WAIT_VARIABLE = "TPUBUILD_CACHE_LOCK_WAIT"
LOCK_WAIT = 600.0


class Sessions:
    def __init__(self, layout: CacheLayout):
        self.layout = layout
        self.tmp = layout.root / "tmp"
        self.lock_path = layout.root / "lock"
        self.closing: list[Callable[[], None]] = []  # what else ends with the session (the index)
        self._guard = threading.RLock()  # a session is per process; threads share it
        self.session: Path | None = None
        self._session_fd: int | None = None  # the session directory itself, whatever its name becomes
        self._lock_fd: int | None = None
        self._busy: str | None = None  # the store lock timed out once: said once, not waited for again

    # --- the store lock ---------------------------------------------------------------------
    def _store_lock(self) -> int:
        """A descriptor of `v1/lock` to flock (damage there removed and the file made)."""
        with self.layout.at() as root_fd:
            for _ in range(3):
                try:
                    return open_lock_file("lock", root_fd, self.layout.file_mode(root_fd))
                except NotAFile as exc:
                    self.layout.remove_damage("lock", root_fd, self.lock_path, exc.kind)
        raise UsageError(f"the cache lock {self.lock_path} keeps being replaced by something else; not used")

    # --- this process's session -------------------------------------------------------------
    def open(self) -> Path:
        """This process's session directory, made on first use under the store lock, after
        removing the sessions of dead processes. A store lock held past its deadline is one
        UsageError naming the holder (and no second wait in this process)."""
        with self._guard:
            if self.session is not None:
                return self.session
            if self._busy is not None:
                raise UsageError(self._busy)
            wait = lock_wait()
            lock_fd = self._store_lock()
            self.layout.warn_if_shared()  # once `v1/` exists, with the mode it was given
            with opened(lock_fd):
                try:
                    with waiting("cache_lock"):  # build --profile's event (trace_events.py)
                        wait_lock(lock_fd, wait, self.layout.report, f"the cache lock {self.lock_path}")
                except LockTimeout as exc:
                    self._busy = (f"the cache lock {self.lock_path} stayed busy ({exc.holder}); gave up after "
                                  f"{wait:g} s (set {LOCK_WAIT_VARIABLE} to wait longer)")
                    raise UsageError(self._busy) from None
                with self.layout.at("tmp") as tmp_fd:
                    self._clean_dead(tmp_fd)
                    name, self._session_fd, self._lock_fd = _new_session(tmp_fd)
            self.session = self.tmp / name
            atexit.register(self.close)
            return self.session

    def close(self) -> None:
        """End this process's session: its directory goes (emptied by its own descriptor,
        removed by name only if the name still is it), its flock is dropped."""
        with self._guard:
            if self.session is not None and self._session_fd is not None:
                name = self.session.name
                for entry in os.listdir(self._session_fd):
                    remove_at(entry, self._session_fd)
                try:
                    with self.layout.at("tmp", create=False) as tmp_fd:
                        here = lstat_at(name, tmp_fd)
                        mine = os.fstat(self._session_fd)
                        if here is not None and (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino):
                            os.rmdir(name, dir_fd=tmp_fd)
                        os.unlink(f"{name}.lock", dir_fd=tmp_fd)
                except OSError:
                    pass
                os.close(self._session_fd)
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # drops the flock
            self.session = self._session_fd = self._lock_fd = None
            for also in self.closing:
                also()

    def new_workdir(self, label: str) -> Path:
        """A work directory inside this process's session (no other build deletes it)."""
        session = self.open()
        assert self._session_fd is not None
        for _ in range(100):
            name = f"{label}-{os.urandom(4).hex()}"
            try:
                os.mkdir(name, 0o700, dir_fd=self._session_fd)
            except FileExistsError:
                continue
            return session / name
        raise FileExistsError(errno.EEXIST, "no free work directory name", os.fspath(session))

    @contextmanager
    def in_session(self, path: Path) -> Iterator[int]:
        """A descriptor of `path`, a directory of this process's session, opened from the
        session's own descriptor (what a name in `tmp/` points to is not trusted: no one
        else can enter the session, but the owner of `tmp/` can rename it). A session
        directory that is no longer under its name is a StageError: what a stage wrote
        there is not stored."""
        session = self.open()
        assert self._session_fd is not None
        rel = Path(path).relative_to(session).as_posix()
        with self.layout.at("tmp", create=False) as tmp_fd:
            here = lstat_at(session.name, tmp_fd)
        mine = os.fstat(self._session_fd)
        if here is None or (here.st_dev, here.st_ino) != (mine.st_dev, mine.st_ino):
            raise StageError(f"the session directory {session} was replaced while the stage ran (by another user of "
                             "the cache?); its output is not stored")
        fd = open_path(self._session_fd, rel) if rel != "." else os.dup(self._session_fd)
        try:
            yield fd
        finally:
            os.close(fd)

    def remove(self, path: Path) -> None:
        """Remove a directory of this session, by descriptor from the session's own."""
        session = self.open()
        assert self._session_fd is not None
        parent, name = os.path.split(Path(path).relative_to(session).as_posix())
        try:
            with opened(open_path(self._session_fd, parent)) as fd:
                remove_at(name, fd)
        except OSError:
            pass

    # --- other processes' sessions ------------------------------------------------------------
    def clean(self) -> list[str]:
        """Remove the sessions of dead processes (their flock is free) and leftovers of
        older layouts. Skipped while gc holds the store (it cleans up itself). Returns the
        names removed."""
        try:
            lock_fd = self._store_lock()
        except OSError:
            return []
        with opened(lock_fd):
            if not try_lock(lock_fd):
                return []
            try:
                with self.layout.at("tmp", create=False) as tmp_fd:
                    return self._clean_dead(tmp_fd)
            except FileNotFoundError:
                return []

    def _clean_dead(self, tmp_fd: int) -> list[str]:
        """Under the store lock: remove the sessions whose flock is free, and anything in
        `tmp/` that is no session (a crash before its lock existed, damage). Another
        user's dead session is removed when it can be (its directory is theirs, 0700)."""
        removed = []
        own = self.session.name if self.session is not None else None
        names = set(os.listdir(tmp_fd))
        for name in sorted(names):
            base = name.removesuffix(".lock")
            if base == own or (name == base and f"{name}.lock" in names):
                continue
            if name == base:  # no lock file: a crash before the lock existed, or an older layout
                if remove_at(name, tmp_fd):
                    removed.append(base)
                continue
            try:
                fd = open_lock_file(name, tmp_fd, 0o644, create=False)
            except NotAFile as exc:
                self.layout.remove_damage(name, tmp_fd, self.tmp / name, exc.kind)
                if remove_at(base, tmp_fd):
                    removed.append(base)
                continue
            except OSError:
                continue
            with opened(fd):
                if not try_lock(fd):
                    continue  # alive
                if remove_at(base, tmp_fd):
                    try:
                        os.unlink(name, dir_fd=tmp_fd)
                    except OSError:
                        pass
                    removed.append(base)
        try:
            with self.layout.at("trees", create=False) as trees_fd:
                for name in os.listdir(trees_fd):
                    if name.startswith("."):  # checkout temps and trash of older versions
                        remove_at(name, trees_fd)
        except FileNotFoundError:
            pass
        return removed

    def _live(self, tmp_fd: int) -> list[str]:
        """The lock files (names in `tmp/`) of sessions whose owner is alive (other processes)."""
        live = []
        own = self.session.name if self.session is not None else None
        for name in sorted(os.listdir(tmp_fd)):
            if not name.endswith(".lock") or name.removesuffix(".lock") == own:
                continue
            try:
                fd = open_lock_file(name, tmp_fd, 0o644, create=False)
            except OSError:
                continue  # damage: cleaned once every session has ended
            with opened(fd):
                if try_lock(fd):
                    unlock(fd)
                else:
                    live.append(name)
        return live

    @contextmanager
    def exclusive(self, wait: float, notify: Callable[[str], None]) -> Iterator[None]:
        """Hold the store alone: no session can start, and every running one has ended
        (gc, verify-cache). Waits up to `wait` seconds, saying for whom."""
        cache = self.layout.cache_dir
        lock_fd = self._store_lock()
        self.layout.warn_if_shared()
        deadline = time.monotonic() + wait
        with opened(lock_fd):
            try:
                wait_lock(lock_fd, wait, notify, f"another tpubuild command that holds the cache {cache}")
            except LockTimeout as exc:
                raise UsageError(f"the cache {cache} stayed busy ({exc.holder}); gave up after {wait:g} s") from None
            with self.layout.at("tmp") as tmp_fd:
                live = self._live(tmp_fd)
                if live:
                    notify(f"waiting for {len(live)} running tpubuild build(s) using the cache {cache}")
                for name in live:
                    try:
                        fd = open_lock_file(name, tmp_fd, 0o644, create=False)
                    except OSError:
                        continue
                    with opened(fd):
                        try:
                            wait_lock(fd, max(0.0, deadline - time.monotonic()), lambda m: None, name)
                        except LockTimeout as exc:
                            raise UsageError(f"a tpubuild build is still using the cache {cache} ({exc.holder}); "
                                             f"gave up after {wait:g} s") from None
                self._clean_dead(tmp_fd)
            yield


def lock_wait() -> float:
    """How long a build waits for the cache (TPUBUILD_CACHE_LOCK_WAIT seconds, default 600)."""
    try:
        return max(0.0, float(os.environ.get(LOCK_WAIT_VARIABLE, LOCK_WAIT)))
    except ValueError:
        raise UsageError(f"{LOCK_WAIT_VARIABLE}={os.environ[LOCK_WAIT_VARIABLE]!r} is not a number of seconds") \
            from None


def _new_session(tmp_fd: int) -> tuple[str, int, int]:
    """(name, directory descriptor, lock descriptor) of a new session in `tmp/`: its lock
    file made and flocked first (readable by every user, so that their gc can see it is
    alive), then its directory, mode 0700 (no other user can enter it)."""
    for _ in range(100):
        name = f"{os.getpid()}-{os.urandom(4).hex()}"
        try:
            lock_fd = open_lock_file(f"{name}.lock", tmp_fd, 0o644)
        except OSError:
            continue
        if not try_lock(lock_fd):
            os.close(lock_fd)
            continue
        try:
            if lstat_at(name, tmp_fd) is not None:
                remove_at(name, tmp_fd)  # a leftover that happens to have this name
            os.mkdir(name, 0o700, dir_fd=tmp_fd)
            session_fd = open_dir(name, tmp_fd)
            os.fchmod(session_fd, 0o700)
        except BaseException:
            os.close(lock_fd)
            raise
        return name, session_fd, lock_fd
    raise FileExistsError(errno.EEXIST, "no free session name", "tmp")
