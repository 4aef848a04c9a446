"""The content-addressed store under `cache_dir` (layout `v1/`), safe to share by several
workspaces and concurrent builds on one machine.

- `v1/objects/ab/cdef...`: file contents by BLAKE3 hash, read-only regular files (a link,
  a special file, or in a private cache another user's file, is damage: `_object_problem`).
- `v1/stages/ab/<key>.json`: per stage key, the output tree (path -> object), the stage's
  summary and warnings, the key record (what `explain` diffs), and a MAC under the
  writer's key: only records whose MAC verifies with this user's key are used.
- `v1/keys/<uid>`: each user's secret record key, mode 0600 (engine/record_mac.py).
  docs/shared-cache.md: what a co-user of a shared cache can and cannot make you publish.
- `v1/trees/<tree hash>/`: a checkout of a tree as hardlinks to objects: the input
  directory of the next stage. Never trusted because it exists: each use compares every
  file with its (verified) object and replaces a wrong one by a temp link + rename, so a
  reader of the old file is never disturbed and a partial checkout is repaired.
- `v1/tmp/<session>/` + `v1/tmp/<session>.lock`: one directory per build process, holding
  its stage work dirs and checkout temps, with a flock the process holds for its whole
  life. `clean_tmp` removes only sessions whose flock is free, i.e. whose owner is dead.
- `v1/lock`: the store lock (filelock). Taken briefly to open a session and to clean
  sessions; `gc` and `verify-cache` hold it and wait for every live session to end, so
  nothing is collected from under a running build.
- `v1/index.sqlite`: objects, stage records, and the workspaces that use this cache with
  the stage keys each references (per recipe, what its last build used; and what its
  lock files name, engine/used_keys.py); `gc` keeps everything a still-existing
  registered workspace references.

Durability: every file is fsynced before the rename that publishes it, and the directory
holding the new name after it; a killed process leaves no half entry, object or checkout.
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import shutil
import stat
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from tpubuild.atomic import fsync_path, write_text_atomic
from tpubuild.config.finding import WORKSPACE_FILE
from tpubuild.engine import record_mac
from tpubuild.engine.fsutil import fsync_tree, place_file, replace_file
from tpubuild.engine.hashing import FileEntry, file_kind, hash_file, tree_digest, walk_files
from tpubuild.engine.records import StageEntry, parse_entry
from tpubuild.engine.statcache import StatCache, stat_key
from tpubuild.errors import StageError, UsageError
from tpubuild.gitignore import make_ignored_dir

if TYPE_CHECKING:
    import sqlite3

    from filelock import FileLock

LAYOUT = "v1"
# sqlite's primary result codes that are the machine's, as the errno they stand for.
_SQLITE_ERRNO = {13: errno.ENOSPC, 10: errno.EIO, 8: errno.EROFS}  # SQLITE_FULL, SQLITE_IOERR, SQLITE_READONLY


class Store:
    def __init__(self, cache_dir: Path, report: Callable[[str], None] | None = None):
        self.root = Path(cache_dir) / LAYOUT
        self.objects = self.root / "objects"
        self.stages = self.root / "stages"
        self.trees = self.root / "trees"
        self.tmp = self.root / "tmp"
        self.lock_path = self.root / "lock"
        self.index_path = self.root / "index.sqlite"
        # Where one-line warnings about the store's own damage go (stderr unless told).
        self.report = report or (lambda message: print(message, file=sys.stderr))
        self._guard = threading.RLock()  # filelock is reentrant per process, not per thread
        self._session: Path | None = None
        self._session_lock: FileLock | None = None
        self._db: sqlite3.Connection | None = None
        # Objects this process hashed itself, with the stat they had: trusted while the
        # stat is unchanged (the stat cache cannot keep them: they are too fresh).
        self._verified: dict[str, list[int]] = {}
        self._private: bool | None = None  # private(): computed once
        self._warned: set[str | Path] = set()  # damaged objects and untrusted records already reported
        self._key: bytes | None = None  # this user's record key (_mac_key)
        self._key_refused = False

    # --- the store lock and per-process sessions -------------------------------------
    def _store_lock(self) -> FileLock:
        self._make_root()
        return _lock(self.lock_path)

    def _make_root(self) -> None:
        # A cache directory this creates ignores itself in git (tpubuild/gitignore.py).
        make_ignored_dir(self.root.parent)
        self.root.mkdir(exist_ok=True)

    def session_dir(self) -> Path:
        """This process's private temp directory, made on first use. Its flock tells other
        processes that it is alive; gc waits for it, `clean_tmp` leaves it alone."""
        with self._guard:
            if self._session is not None:
                return self._session
            self._make_root()
            self.tmp.mkdir(exist_ok=True)
            name = f"{os.getpid()}-{os.urandom(4).hex()}"
            with self._store_lock():  # never while gc collects; never raced by clean_tmp
                lock = _lock(self.tmp / f"{name}.lock")
                lock.acquire()
                (self.tmp / name).mkdir()
            self._session, self._session_lock = self.tmp / name, lock
            atexit.register(self.close)
            return self._session

    new_build_tmp = session_dir

    def close(self) -> None:
        """End this process's session: its temp directory goes, its flock is dropped."""
        with self._guard:
            if self._session is None or self._session_lock is None:
                return
            shutil.rmtree(self._session, ignore_errors=True)
            try:
                os.unlink(f"{self._session}.lock")
            except OSError:
                pass
            self._session_lock.release()
            self._session = self._session_lock = None
            if self._db is not None:
                self._db.close()
                self._db = None

    def clean_tmp(self) -> list[str]:
        """Remove the sessions of dead processes (their flock is free) and leftovers of
        older layouts. Skipped while gc holds the store (it cleans up itself). Returns the
        names removed."""
        from filelock import Timeout

        if not self.tmp.exists():
            return []
        lock = self._store_lock()
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return []
        try:
            return self._clean_dead_sessions()
        finally:
            lock.release()

    def _clean_dead_sessions(self) -> list[str]:
        from filelock import Timeout

        removed = []
        own = self._session.name if self._session is not None else None
        names = set(os.listdir(self.tmp)) if self.tmp.exists() else set()
        for name in sorted(names):
            base = name.removesuffix(".lock")
            if base == own or (name == base and f"{name}.lock" in names):
                continue
            if name.endswith(".lock"):
                owner = _lock(self.tmp / name)
                try:
                    owner.acquire(timeout=0)
                except Timeout:
                    continue  # alive
                try:
                    self.remove_dir(self.tmp / base)
                    os.unlink(self.tmp / name)
                except OSError:
                    pass
                finally:
                    owner.release()
            else:  # no lock file: a crash before the lock existed, or an older layout
                self.remove_dir(self.tmp / name)
            removed.append(base)
        if self.trees.exists():  # checkout temps of older versions lived here
            for name in os.listdir(self.trees):
                if name.startswith("."):
                    shutil.rmtree(self.trees / name, ignore_errors=True)
        return removed

    def live_sessions(self) -> list[Path]:
        """The lock files of sessions whose owner is alive (other processes)."""
        from filelock import Timeout

        live = []
        own = self._session.name if self._session is not None else None
        for name in sorted(os.listdir(self.tmp)) if self.tmp.exists() else []:
            if not name.endswith(".lock") or name.removesuffix(".lock") == own:
                continue
            probe = _lock(self.tmp / name)
            try:
                probe.acquire(timeout=0)
                probe.release()
            except Timeout:
                live.append(self.tmp / name)
        return live

    @contextmanager
    def exclusive(self, wait: float = 3600.0, notify: Callable[[str], None] = lambda m: None) -> Iterator[None]:
        """Hold the store alone: no session can start, and every running one has ended
        (gc, verify-cache). Waits up to `wait` seconds."""
        from filelock import Timeout

        lock = self._store_lock()
        deadline = time.monotonic() + wait
        try:
            lock.acquire(timeout=0)
        except Timeout:
            notify(f"waiting for another tpubuild command that holds the cache {self.root.parent}")
            try:
                lock.acquire(timeout=wait)
            except Timeout:
                raise UsageError(f"the cache {self.root.parent} stayed busy; gave up after {wait:g} s") from None
        try:
            live = self.live_sessions()
            if live:
                notify(f"waiting for {len(live)} running tpubuild build(s) using the cache {self.root.parent}")
            for path in live:
                owner = _lock(path)
                try:
                    owner.acquire(timeout=max(0.0, deadline - time.monotonic()))
                    owner.release()
                except Timeout:
                    raise UsageError(
                        f"a tpubuild build is still using the cache {self.root.parent}; gave up after {wait:g} s"
                    ) from None
            self._clean_dead_sessions()
            yield
        finally:
            lock.release()

    # --- the index ---------------------------------------------------------------------
    @contextmanager
    def _index_faults(self) -> Iterator[None]:
        """The index's own faults as the OSError they are, naming its file: sqlite says
        "database or disk is full" or "disk I/O error" and no path (the CLI then prints
        one line, engine/build.py fails the stage without a traceback)."""
        import sqlite3

        try:
            yield
        except sqlite3.OperationalError as exc:
            code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF  # the primary result code
            if code not in _SQLITE_ERRNO:
                raise
            number = _SQLITE_ERRNO[code]
            if number == errno.EIO and _no_space(self.index_path.parent):
                number = errno.ENOSPC  # WAL and journal files fail to grow as "disk I/O error"
            raise OSError(number, f"{os.strerror(number)} ({exc})", os.fspath(self.index_path)) from exc

    def _open_index(self) -> sqlite3.Connection:
        if self._db is None:
            self._make_root()
            import sqlite3  # here: planning commands never open the index

            db = sqlite3.connect(self.index_path, timeout=60, check_same_thread=False, isolation_level=None)
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

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        import sqlite3

        with self._guard, self._index_faults():
            db = self._open_index()
            db.execute("BEGIN IMMEDIATE")
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
                           only: set[str] | None = None) -> None:
        """Record which stage keys the workspace at `root` references (gc keeps them while
        the workspace exists). A set replaces all of the workspace's references; a dict
        {recipe: keys} replaces those recipes' only (a build of some recipes), and with
        `only` drops the references of every recipe not in it (gc: recipes gone)."""
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
        return os.path.realpath(cache_dir / self.root.name) == os.path.realpath(self.root)

    def _index_entry(self, entry: StageEntry) -> None:
        """Add a new entry and its objects to the index. The files on disk are the truth
        (gc scans them), so an index that cannot be written does not fail the stage."""
        import sqlite3

        try:
            with self._transaction() as db:
                db.executemany("INSERT OR REPLACE INTO objects VALUES (?, ?)", [(f.hash, f.size) for f in entry.files])
                db.execute("INSERT OR REPLACE INTO stages VALUES (?, ?, ?, ?)",
                           (entry.key, entry.stage, entry.tree, time.time()))
        except sqlite3.Error:
            pass

    def forget(self, keys: set[str], objects: set[str]) -> None:
        """Drop removed stage entries and objects from the index (gc)."""
        with self._transaction() as db:
            db.executemany("DELETE FROM stages WHERE key = ?", [(k,) for k in keys])
            db.executemany("DELETE FROM objects WHERE hash = ?", [(h,) for h in objects])

    # --- stage entries -------------------------------------------------------------
    def entry_path(self, key: str) -> Path:
        return self.stages / key[:2] / f"{key}.json"

    def has(self, key: str) -> bool:
        return os.path.exists(self.entry_path(key))

    def is_empty(self) -> bool:
        """No stage record at all: nothing was built with this cache yet (a fresh clone),
        which `explain` and `build --check` say rather than guess what changed."""
        try:
            shards = [entry.path for entry in os.scandir(self.stages) if entry.is_dir()]
        except OSError:
            return True
        for shard in shards:
            try:
                if any(name.endswith(".json") for name in os.listdir(shard)):
                    return False
            except OSError:
                continue
        return True

    def get(self, key: str) -> StageEntry | None:
        """The record stored under `key`, validated like a downloaded one (records.py):
        a cache directory others can write is not trusted more than a remote."""
        path = self.entry_path(key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        entry, problem = parse_entry(key, raw, hash_record=False)
        if entry is None:
            self.report(f"warning: cache record {path} is invalid ({problem}); removed, the stage rebuilds")
            try:
                path.unlink()  # a record is tpubuild's own file; the stage writes a good one
            except OSError:
                pass
            return None
        data = json.loads(raw)
        if not record_mac.verifies(data, self._mac_key(create=False)):
            # Another user's record in a shared cache, or one someone rewrote: not ours to
            # trust (engine/record_mac.py). Left in place; the rebuilt stage replaces it.
            if path not in self._warned:
                self._warned.add(path)
                why = "it has no MAC" if record_mac.FIELD not in data else \
                    f"its MAC does not verify with your key {record_mac.key_path(self.root)}"
                self.report(f"warning: cache record {path} was not written by your tpubuild ({why}); "
                            "ignored, the stage rebuilds")
            return None
        return entry

    def _mac_key(self, create: bool) -> bytes | None:
        """This user's record key (engine/record_mac.py), made on the first record written
        (`create`); None when there is none, or when the file there cannot be trusted (said
        once: then no record of this cache is trusted by this process)."""
        with self._guard:
            if self._key is None and not self._key_refused:
                try:
                    self._key = record_mac.create_key(self.root, not self.private()) if create \
                        else record_mac.read_key(self.root)
                except (record_mac.KeyProblem, OSError) as exc:
                    self._key_refused = True
                    self.report(f"warning: {exc}: no stage record of the cache {self.root.parent} is trusted "
                                "by this build (every stage rebuilds); remove that file to make a new key")
            return self._key

    def touch(self, key: str) -> None:
        """Mark an entry as used now (gc keeps recently used entries)."""
        try:
            os.utime(self.entry_path(key))
        except OSError:
            pass

    def new_workdir(self, label: str) -> Path:
        """A work directory inside this process's session (no other build deletes it)."""
        return Path(tempfile.mkdtemp(prefix=f"{label}-", dir=self.session_dir()))

    def put(
        self,
        key: str,
        stage: str,
        out_dir: Path,
        summary: dict,
        warnings: list[str],
        record: dict,
        stat_cache: StatCache | None = None,
    ) -> StageEntry:
        """Move the files of `out_dir` into the store and record them under `key`.
        Symbolic links and special files in the output are a StageError naming them."""
        self.session_dir()
        entries = []
        parents: set[Path] = set()
        for rel, st in walk_files(out_dir, symlinks="reject"):
            src = os.path.join(out_dir, rel)
            digest = hash_file(src, st.st_size)
            entries.append(FileEntry(rel, digest, st.st_size))
            obj = self.object_path(digest)
            if self._object_ok(digest, stat_cache):
                continue
            obj.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(src, 0o444)
            fsync_path(src)
            os.replace(src, obj)  # same file system: cache_dir holds tmp/ too
            self._verified[digest] = stat_key(os.stat(obj))
            parents.add(obj.parent)
        for parent in parents:
            fsync_path(parent)
        entry = self._record(key, stage, entries, summary, warnings, record)
        shutil.rmtree(out_dir, ignore_errors=True)
        return entry

    def put_files(self, key: str, stage: str, files: list[FileEntry], src_root: Path, record: dict,
                  stat_cache: StatCache | None = None) -> StageEntry:
        """Copy a user directory's files, whose hashes the key took, into the store (each
        copy checked against its hash: `ingest_copies`) and record them under `key`."""
        self.session_dir()
        self.ingest_copies(files, src_root, stat_cache)
        return self._record(key, stage, files, {}, [], record)

    def add_entry(self, entry: StageEntry) -> StageEntry:
        """Record an entry whose objects are already in the store, verified (one fetched
        from the remote cache, engine/remote.py)."""
        self.session_dir()
        return self._record(entry.key, entry.stage, entry.files, entry.summary, entry.warnings, entry.record)

    def _record(self, key: str, stage: str, files: list[FileEntry], summary: dict, warnings: list[str],
                record: dict) -> StageEntry:
        """Write the stage entry of objects already in the store (atomic, durable, indexed)."""
        entry = StageEntry(key, stage, tree_digest(files), files, summary, warnings, record)
        path = self.entry_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = entry.to_json()
        mac_key = self._mac_key(create=True)
        write_text_atomic(path, json.dumps(record_mac.seal(data, mac_key) if mac_key else data, sort_keys=True))
        fsync_path(path.parent)
        self._index_entry(entry)
        return entry

    # --- objects -------------------------------------------------------------------
    def object_path(self, digest: str) -> Path:
        return self.objects / digest[:2] / digest[2:]

    def private(self) -> bool:
        """Whether only this user can write the cache (its `v1/` and `objects/` are this
        user's, writable by no group or other): then nothing in it is another user's.
        A cache several users share is group- or world-writable (docs/shared-cache.md)."""
        if self._private is None:
            self._private = True
            for directory in (self.root, self.objects):
                try:
                    st = os.stat(directory)
                except OSError:
                    continue
                if st.st_uid != os.getuid() or st.st_mode & 0o022:
                    self._private = False
        return self._private

    def _object_problem(self, obj: str, st: os.stat_result) -> tuple[str, str] | None:
        """(why, what to remove) when the object at `obj` (lstat `st`) is damage whatever its
        content: objects are regular files in real directories (a symbolic link would make a
        hard-link publish link the link, a copy read whatever it points to; a FIFO blocks a
        read, a device never ends), and in a private cache they are this user's."""
        parent = os.path.dirname(obj)
        if os.path.islink(parent):
            return f"in {parent}, a symbolic link", parent
        if stat.S_ISLNK(st.st_mode):
            return "a symbolic link", obj
        if not stat.S_ISREG(st.st_mode):
            return file_kind(st.st_mode), obj
        if st.st_uid != os.getuid() and self.private():
            return f"owned by uid {st.st_uid}, in a cache only uid {os.getuid()} can write", obj
        return None

    def _remove_damage(self, digest: str, obj: str, damage: tuple[str, str]) -> None:
        """Remove a damaged object (the link itself, never what it points to), one warning."""
        problem, target = damage
        self._verified.pop(digest, None)
        if digest not in self._warned:
            self._warned.add(digest)
            self.report(f"warning: cache object {obj} is {problem}; removed, its stage rebuilds")
        try:
            os.unlink(target)
        except FileNotFoundError:
            pass

    def _object_ok(self, digest: str, stat_cache: StatCache | None) -> bool:
        """Whether the object exists, is a regular file of the cache (`_object_problem`;
        damage is removed) and has the right content (trusted when this process verified it
        and its stat did not change since; else hashed via the stat cache)."""
        obj = os.fspath(self.object_path(digest))
        try:
            st = os.lstat(obj)
        except FileNotFoundError:
            return False
        damage = self._object_problem(obj, st)
        if damage is not None:
            self._remove_damage(digest, obj, damage)
            return False
        if self._verified.get(digest) == stat_key(st):
            return True
        actual = (stat_cache or StatCache(None)).file_hash(obj, st)
        if actual == digest:
            self._verified[digest] = stat_key(st)
            return True
        return False

    def has_object(self, digest: str, stat_cache: StatCache | None = None) -> bool:
        """Whether the object exists with the right content (see `_object_ok`)."""
        return self._object_ok(digest, stat_cache)

    def adopt_object(self, path: Path | str, digest: str) -> None:
        """Move a file the caller hashed to `digest` into the store as that object (a
        remote cache download, verified before it comes here): read-only, durable."""
        self.session_dir()  # from here on, gc waits for this process
        obj = self.object_path(digest)
        obj.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o444)
        fsync_path(path)
        os.replace(path, obj)
        fsync_path(obj.parent)
        self._verified[digest] = stat_key(os.stat(obj))

    def verify(self, entry: StageEntry, stat_cache: StatCache) -> bool:
        """Whether every object of `entry` exists with the right content; a corrupted object
        is deleted so the stage is rebuilt (never used). Checkouts are left alone: each
        use of one compares it with the objects (`checkout`)."""
        self.session_dir()  # from here on, gc waits for this build
        ok = True
        for f in entry.files:
            if not self._object_ok(f.hash, stat_cache):
                self.discard_object(f.hash)
                ok = False
        return ok

    def all_objects(self) -> list[str]:
        digests = []
        for sub in sorted(os.listdir(self.objects)) if self.objects.exists() else []:
            digests += [sub + name for name in sorted(os.listdir(self.objects / sub)) if not name.startswith(".")]
        return digests

    def verify_all(self, progress: Callable[[str], None] = lambda digest: None) -> list[str]:
        """Rehash every object, whatever its stat says (`verify-cache`; call under
        `exclusive`); a corrupted one is removed, so the next build rebuilds its stage.
        Returns the removed digests."""
        bad = []
        for digest in self.all_objects():
            progress(digest)
            obj = self.object_path(digest)
            try:
                st = os.lstat(obj)
                damage = self._object_problem(os.fspath(obj), st)
                if damage is not None:
                    self._remove_damage(digest, os.fspath(obj), damage)
                ok = damage is None and hash_file(obj) == digest
            except OSError:
                ok = False
            if ok:
                self._verified[digest] = stat_key(os.stat(obj))
            else:
                self.discard_object(digest)
                bad.append(digest)
        return bad

    def discard_object(self, digest: str) -> None:
        """Remove a bad object. Only the object: a concurrent build reading a checkout keeps
        its open files, and the next use of that checkout relinks the rebuilt object."""
        self._verified.pop(digest, None)
        try:
            os.unlink(self.object_path(digest))
        except FileNotFoundError:
            pass

    def ingest_copies(self, files: list[FileEntry], src_root: Path, stat_cache: StatCache | None = None) -> None:
        """Copy files of a user directory (a source SavedModel) into the store, so what is
        published never shares an inode with the user's files. With `stat_cache`, an
        existing object is verified (and replaced when damaged), not trusted."""
        work = None
        for f in files:
            obj = self.object_path(f.hash)
            present = self._object_ok(f.hash, stat_cache) if stat_cache is not None else obj.exists()
            if present:
                continue
            work = work or self.new_workdir("ingest")
            tmp = os.path.join(work, f.hash)
            place_file(os.path.join(src_root, f.path), tmp, "copy", follow=True)  # links inside the model are allowed
            if hash_file(tmp) != f.hash:
                raise StageError(f"{os.path.join(src_root, f.path)} changed while it was being read")
            obj.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, obj)
            fsync_path(obj.parent)
            self._verified[f.hash] = stat_key(os.stat(obj))
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)

    # --- checkouts -----------------------------------------------------------------
    def checkout(self, entry: StageEntry) -> Path:
        """The tree of `entry` as a directory of read-only hardlinks to its objects (which
        the caller verified). An existing checkout is checked file by file against the
        objects' inodes and repaired in place; a new one appears by a rename."""
        dest = self.trees / entry.tree
        if dest.is_dir() and self._repair_checkout(entry, dest):
            return dest
        self.trees.mkdir(parents=True, exist_ok=True)
        work = self.new_workdir("checkout")
        self.materialize(entry.files, work / "tree")
        fsync_tree(work / "tree")
        if dest.is_dir():  # a checkout too damaged to repair: set it aside, readers keep it
            os.rename(dest, work / "old")
        try:
            os.rename(work / "tree", dest)
        except OSError:
            if not (dest.is_dir() and self._repair_checkout(entry, dest)):  # another build's
                raise
        fsync_path(self.trees)
        shutil.rmtree(work, ignore_errors=True)
        return dest

    def _repair_checkout(self, entry: StageEntry, dest: Path) -> bool:
        """Make `dest` hold exactly `entry`'s files, each the object's inode; False when it
        cannot be repaired in place (a directory where a file should be, a link...)."""
        expected = {f.path: f for f in entry.files}
        try:
            present = dict(walk_files(dest, symlinks="reject"))
        except (StageError, OSError):
            return False
        try:
            for rel in present.keys() - expected.keys():
                os.unlink(dest / rel)  # a stage must not write into its input; undo it
            for rel, f in expected.items():
                obj = self.object_path(f.hash)
                st = present.get(rel)
                if st is not None and (st.st_dev, st.st_ino) == _dev_ino(obj):
                    continue
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                replace_file(obj, target, "hardlink")
        except OSError:
            return False
        return True

    def materialize(self, files: list[FileEntry], dest: Path, prefix: str = "") -> None:
        """Hardlink the objects of `files` into `dest` (copy when linking is impossible)."""
        made: set[str] = set()
        for f in files:
            target = os.path.join(dest, prefix, f.path)
            parent = os.path.dirname(target)
            if parent not in made:
                os.makedirs(parent, exist_ok=True)
                made.add(parent)
            link_or_copy(self.object_path(f.hash), target)

    def remove_dir(self, path: Path) -> None:
        """Rename away first, then delete: never a half-deleted directory under its name."""
        if not os.path.lexists(path):
            return
        try:
            trash = Path(tempfile.mkdtemp(prefix=".trash-", dir=path.parent))
            os.rename(path, trash / "x")
            shutil.rmtree(trash, ignore_errors=True)
        except OSError:
            pass


def _lock(path: Path) -> FileLock:
    """A filelock (flock) on `path`, one per process rather than per thread (sessions
    are per process; threads share them under `Store._guard`). Imported here, so that
    planning commands (explain, --dry-run) never pay for it."""
    from filelock import FileLock

    return FileLock(path, thread_local=False)


def _dev_ino(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def link_or_copy(src: Path | str, dst: str, link_type: str = "hardlink") -> None:
    """Place `src` at `dst` (replacing it) as a hard link, or a reflink/copy when
    `link_type` is "copy" or linking is impossible."""
    try:
        os.unlink(dst)
    except FileNotFoundError:
        pass
    place_file(src, dst, link_type, durable=False)


def _no_space(directory: Path) -> bool:
    try:
        return os.statvfs(directory).f_bavail == 0
    except OSError:
        return False
