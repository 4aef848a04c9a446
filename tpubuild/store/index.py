"""The cache's index, `v1/index.sqlite`: objects, stage records, and the workspaces that
use the cache with the stage keys each references; `gc` keeps everything a still-existing
registered workspace references (store/gc.py). The files on disk are the truth for
objects and records; the workspace registry is what only the index knows.

Every user of a shared cache writes it: tpubuild makes it itself with the cache's file
mode (sqlite alone makes a new database 0644 whatever the umask, and a second user of a
group-writable cache could not write it), and sqlite gives its -wal and -shm files the
database's own mode (os_unix.c `findCreateFileMode`). An index that this user cannot
write (made by an older tpubuild, another user's) is said once by a build, which goes on
unregistered; `gc` refuses to guess.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from tpubuild.config.finding import WORKSPACE_FILE
from tpubuild.errors import file_kind
from tpubuild.fs import holder, lstat_at, open_regular_at, opened
from tpubuild.keys import StageEntry
from tpubuild.store.layout import CacheLayout
from tpubuild.store.sessions import lock_wait

if TYPE_CHECKING:
    import sqlite3

INDEX = "index.sqlite"
# The files sqlite keeps beside the index (write-ahead log, its shared memory, a rollback journal).
_COMPANIONS = ("-wal", "-shm", "-journal")
# sqlite's primary result codes that are the machine's, as the errno they stand for.
_SQLITE_ERRNO = {13: errno.ENOSPC, 10: errno.EIO, 8: errno.EROFS}  # SQLITE_FULL, SQLITE_IOERR, SQLITE_READONLY
_SQLITE_BUSY = 5
# How long a write waits for another writer of the index, in all, and in each of sqlite's own waits.
INDEX_WAIT = 60.0
BUSY_STEP = 2.0


class StoreIndex:
    def __init__(self, layout: CacheLayout):
        self.layout = layout
        self.path = layout.root / INDEX
        self.refused = False  # said once: this process writes it no more
        self._db: sqlite3.Connection | None = None
        self._guard = threading.RLock()

    def close(self) -> None:
        with self._guard:
            if self._db is not None:
                self._db.close()
                self._db = None

    @contextmanager
    def _faults(self) -> Iterator[None]:
        """The index's own faults as the OSError they are, naming its file: sqlite says
        "database or disk is full" or "disk I/O error" and no path (the CLI then prints
        one line, engine/loop.py fails the stage without a traceback)."""
        import sqlite3

        try:
            yield
        except sqlite3.OperationalError as exc:
            code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF  # the primary result code
            if code not in _SQLITE_ERRNO:
                raise
            number = _SQLITE_ERRNO[code]
            unwritable = self._not_writable() if number == errno.EROFS else None
            if unwritable:  # "attempt to write a readonly database": a file of another user, not the disk
                raise PermissionError(errno.EACCES, unwritable, os.fspath(self.path)) from exc
            if number == errno.EIO and _no_space(self.path.parent):
                number = errno.ENOSPC  # WAL and journal files fail to grow as "disk I/O error"
            raise OSError(number, f"{os.strerror(number)} ({exc})", os.fspath(self.path)) from exc

    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            import sqlite3  # here: planning commands never open the index

            self._prepare()
            # sqlite's own busy wait is short: `_begin` waits longer, saying for whom.
            db = sqlite3.connect(self.path, timeout=BUSY_STEP, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(
                "CREATE TABLE IF NOT EXISTS objects(hash TEXT PRIMARY KEY, size INTEGER NOT NULL);"
                "CREATE TABLE IF NOT EXISTS stages(key TEXT PRIMARY KEY, stage TEXT, tree TEXT, created REAL);"
                "CREATE TABLE IF NOT EXISTS workspaces(root TEXT PRIMARY KEY, file TEXT, registered REAL);"
                "CREATE TABLE IF NOT EXISTS refs(root TEXT, recipe TEXT, key TEXT, PRIMARY KEY(root, recipe, key));"
            )
            self._db = db
        return self._db

    def _prepare(self) -> None:
        """Make the index file before sqlite does, with the mode every user of the cache
        needs (sqlite makes a new database 0644 whatever the umask, so a second user of a
        group-writable cache could not write it; it gives the -wal and -shm files the
        database's own mode). A link or a special file in the place of the index or of one
        of its companions is damage, removed first (sqlite follows a link to the database)."""
        with self.layout.at() as root_fd:
            mode = self.layout.file_mode(root_fd)
            for name in (INDEX, *(INDEX + suffix for suffix in _COMPANIONS)):
                st = lstat_at(name, root_fd)
                if st is not None and not stat.S_ISREG(st.st_mode):
                    self.layout.remove_damage(name, root_fd, self.layout.root / name, file_kind(st.st_mode))
                elif st is not None and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) != mode:
                    # Ours, from a tpubuild that let sqlite choose (0644): as every user needs it now.
                    try:
                        fd, _ = open_regular_at(name, root_fd)
                        with opened(fd):
                            os.fchmod(fd, mode)
                    except OSError:
                        pass
            try:
                fd = os.open(INDEX, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=root_fd)
            except FileExistsError:
                return
            with opened(fd):
                os.fchmod(fd, mode)

    def _not_writable(self) -> str | None:
        """Why this user cannot write the index (or one of its companions), or None."""
        for path in (self.path, *(Path(f"{self.path}{suffix}") for suffix in _COMPANIONS)):
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                continue
            if not os.access(path, os.W_OK):
                fix = f"; its owner can run `chmod g+w {self.path}*`" if st.st_uid != os.getuid() else ""
                return (f"not writable by you ({path.name} belongs to uid {st.st_uid}, mode "
                        f"{stat.S_IMODE(st.st_mode):o}{fix})")
        return None

    def unusable(self, exc: BaseException) -> None:
        """Say once that the index cannot be written, and why it matters (gc)."""
        with self._guard:
            if self.refused:
                return
            self.refused = True
        if isinstance(exc, PermissionError) and exc.filename == os.fspath(self.path):
            what = f"is {exc.strerror}"  # _index_not_writable: whose it is, and what its owner can do
        else:
            what = f"cannot be written ({exc.strerror if isinstance(exc, OSError) and exc.strerror else exc})"
        self.layout.report(f"warning: the cache index {self.path} {what}; this build is not registered in it, so "
                    "`tpubuild gc` run from another workspace may remove what this one uses")

    def _begin(self, db: sqlite3.Connection) -> None:
        """BEGIN IMMEDIATE: wait for another writer (anyone who can write the index can keep
        a transaction open), saying so once with its holder, up to INDEX_WAIT seconds
        (less when TPUBUILD_CACHE_LOCK_WAIT says less); then an EBUSY OSError naming it."""
        import sqlite3

        wait = min(INDEX_WAIT, lock_wait())
        deadline, said = time.monotonic() + wait, False
        while True:
            try:
                db.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF != _SQLITE_BUSY:
                    raise
            who = self._holder()
            if time.monotonic() >= deadline:
                raise OSError(errno.EBUSY, f"kept busy by another process ({who}) for {wait:g} s", os.fspath(self.path))
            if not said:
                said = True
                self.layout.report(f"waiting for the cache index {self.path} ({who}); giving up after {wait:g} s")

    def _holder(self) -> str:
        """Who holds sqlite's write lock: a POSIX lock on the database or, in WAL mode, on
        its -shm file (/proc/locks, fs/flock.py)."""
        for path in (Path(f"{self.path}-shm"), self.path):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue
            with opened(fd):
                who = holder(fd, kinds=("POSIX", "OFDLCK"))
            if who != "holder unknown":
                return who
        return "holder unknown"

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        import sqlite3

        with self._guard, self._faults():
            db = self._open()
            self._begin(db)
            try:
                yield db
            except BaseException:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # a failed write (a full disk) already rolled the transaction back
                raise
            db.execute("COMMIT")

    def register_workspace(self, root: Path, keys: set[str] | dict[str, set[str]], file: Path | None = None,
                           required: bool = True, only: set[str] | None = None) -> None:
        """Record which stage keys the workspace at `root` references (gc keeps them while
        the workspace exists). A set replaces all of the workspace's references; a dict
        {recipe: keys} replaces those recipes' only (a build of some recipes), and with
        `only` drops the references of every recipe not in it (gc: recipes gone). Not
        `required`: an index that cannot be written is said once, not an error."""
        if not required:
            import sqlite3

            if self.refused:  # said already in this process: no second wait
                return
            try:
                self.register_workspace(root, keys, file, only=only)
            except (OSError, sqlite3.Error) as exc:
                self.unusable(exc)
            return
        root_s = os.fspath(Path(root).resolve())
        file_s = os.fspath(file or Path(root_s) / WORKSPACE_FILE)
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO workspaces VALUES (?, ?, ?)", (root_s, file_s, time.time()))
            if only is not None:
                kept = sorted(only)
                db.execute(f"DELETE FROM refs WHERE root = ? AND recipe NOT IN ({', '.join('?' * len(kept))})",
                           (root_s, *kept))
            if isinstance(keys, dict):
                for recipe, recipe_keys in keys.items():
                    db.execute("DELETE FROM refs WHERE root = ? AND recipe = ?", (root_s, recipe))
                    db.executemany("INSERT OR IGNORE INTO refs VALUES (?, ?, ?)",
                                   [(root_s, recipe, k) for k in recipe_keys])
            else:
                db.execute("DELETE FROM refs WHERE root = ?", (root_s,))
                db.executemany("INSERT OR IGNORE INTO refs VALUES (?, '', ?)", [(root_s, k) for k in keys])

    def workspace_references(self, forget_missing: bool = True) -> dict[str, set[str]]:
        """Registered workspace root -> the keys it references. Workspaces whose file no
        longer exists are dropped from the index (`forget_missing`)."""
        with self._transaction() as db:
            rows = db.execute("SELECT root, file FROM workspaces").fetchall()
            out: dict[str, set[str]] = {}
            for root, file in rows:
                if not os.path.isfile(file) or not self._uses_this_cache(root, file):
                    if forget_missing:
                        db.execute("DELETE FROM workspaces WHERE root = ?", (root,))
                        db.execute("DELETE FROM refs WHERE root = ?", (root,))
                    continue
                out[root] = {k for (k,) in db.execute("SELECT key FROM refs WHERE root = ?", (root,))}
            return out

    def _uses_this_cache(self, root: str, file: str) -> bool:
        """Whether the workspace's file still names this cache (a workspace copied with its
        cache, or switched to another cache_dir, no longer pins this one's entries)."""
        import yaml

        try:
            data = yaml.safe_load(Path(file).read_text()) or {}
            cache_dir = Path(root) / str(data.get("cache_dir", ".tpubuild/cache"))
        except (OSError, yaml.YAMLError, AttributeError, TypeError):
            return True  # unreadable now: keep its entries (when in doubt, keep)
        return os.path.realpath(cache_dir / self.layout.root.name) == os.path.realpath(self.layout.root)

    def add_entry(self, entry: StageEntry) -> None:
        """Add a new entry and its objects to the index. The files on disk are the truth
        (gc scans them), so an index that cannot be written does not fail the stage."""
        import sqlite3

        if self.refused:
            return
        try:
            with self._transaction() as db:
                db.executemany("INSERT OR REPLACE INTO objects VALUES (?, ?)", [(f.hash, f.size) for f in entry.files])
                db.execute("INSERT OR REPLACE INTO stages VALUES (?, ?, ?, ?)",
                           (entry.key, entry.stage, entry.tree, time.time()))
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
                raise  # the machine's: the stage fails in one line naming the index
            self.unusable(exc)
        except sqlite3.Error as exc:
            self.unusable(exc)

    def forget(self, keys: set[str], objects: set[str]) -> None:
        """Drop removed stage entries and objects from the index (gc)."""
        with self._transaction() as db:
            db.executemany("DELETE FROM stages WHERE key = ?", [(k,) for k in keys])
            db.executemany("DELETE FROM objects WHERE hash = ?", [(h,) for h in objects])


def _no_space(directory: Path) -> bool:
    try:
        return os.statvfs(directory).f_bavail == 0
    except OSError:
        return False
