"""The content-addressed store under `cache_dir` (layout `v1/`), safe to share by several
workspaces and concurrent builds on one machine, and by users who trust each other
(docs/shared-cache.md: who may write what, and what each build trusts).

- `v1/objects/ab/cdef...`: file contents by BLAKE3 hash, read-only regular files (a link,
  a special file, or in a private cache another user's file, is damage: `_object_problem`).
- `v1/stages/ab/<key>.json`: per stage key, the output tree (path -> object), the stage's
  summary and warnings, the key record (what `explain` diffs), and a MAC under the
  writer's key: only records whose MAC verifies with this user's key are used.
- `v1/keys/<uid>`: each user's secret record key, mode 0600 (store/record_mac.py); a
  user whose key there is not one only they could have made uses a key of their own
  outside the cache instead (record_mac.user_key_dir).
- `v1/trees/<tree hash>/`: a checkout of a tree as hardlinks to objects: the input
  directory of the next stage. Never trusted because it exists: each use compares every
  file with its (verified) object and replaces a wrong one by a temp link + rename, so a
  reader of the old file is never disturbed and a partial checkout is repaired.
- `v1/tmp/<session>/`, `v1/lock`: one private directory per build process, and the store
  lock gc and verify-cache hold (store/sessions.py).
- `v1/index.sqlite`: the workspaces that use this cache and the keys each references (per
  recipe, what its last build used; and what its lock files name, store/registration.py),
  for gc (store/index.py).

Nothing in the cache is walked, written or deleted through a symbolic link: every
directory is opened component by component with O_NOFOLLOW (store/layout.py,
nofollow.py), and a link, a FIFO or a directory where tpubuild keeps something else is
damage, removed (the link, never what it points to) with one warning, then made again.
Objects and records are read-only files every user of the cache can read.

Durability: every file is fsynced before the rename that publishes it, and the directory
holding the new name after it; a killed process leaves no half entry, object or checkout.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Callable, Iterator

from tpubuild.digests import FileEntry, StatCache, hash_fd, stat_key, tree_digest
from tpubuild.errors import StageError, file_kind
from tpubuild.fs import (
    NotAFile,
    fsync_fd,
    lstat_at,
    make_dir,
    open_dir,
    open_path,
    open_regular_at,
    opened,
    place_file,
    read_regular_at,
    remove_at,
    replace_file,
    walk_regular,
    write_atomic_at,
)
from tpubuild.keys import RECORD_LIMIT, StageEntry, parse_entry
from tpubuild.store import record_mac
from tpubuild.store.index import StoreIndex
from tpubuild.store.layout import LAYOUT, CacheLayout
from tpubuild.store.sessions import Sessions

__all__ = ["LAYOUT", "Store", "link_or_copy"]


class Store:
    def __init__(self, cache_dir: Path, report: Callable[[str], None] | None = None):
        # Where one-line warnings about the store's own damage go (stderr unless told).
        self.report = report or (lambda message: print(message, file=sys.stderr))
        self.layout = CacheLayout(Path(cache_dir), lambda message: self.report(message))
        self.cache_dir, self.root = self.layout.cache_dir, self.layout.root
        self.objects = self.root / "objects"
        self.stages = self.root / "stages"
        self.trees = self.root / "trees"
        self.sessions = Sessions(self.layout)
        self.index = StoreIndex(self.layout)
        self.sessions.closing.append(self.index.close)
        self.tmp, self.lock_path, self.index_path = self.sessions.tmp, self.sessions.lock_path, self.index.path
        # Objects this process hashed itself, with the stat they had: trusted while the
        # stat is unchanged (the stat cache cannot keep them: they are too fresh).
        self._verified: dict[str, list[int]] = {}
        self._private: bool | None = None  # private(): computed once
        self._guard = threading.RLock()
        self._key: bytes | None = None  # this user's record key (_mac_key)
        self._key_file: Path | None = None  # where it is
        self._key_refused = False

    # --- sessions, the store lock and the index (store/sessions.py, store/index.py) -----------
    def session_dir(self) -> Path:
        """This process's private temp directory (mode 0700), made on first use under the
        store lock; its flock tells other processes that it is alive (gc waits for it)."""
        return self.sessions.open()

    new_build_tmp = session_dir

    def close(self) -> None:
        """End this process's session: its temp directory goes, its flock is dropped."""
        self.sessions.close()

    def clean_tmp(self) -> list[str]:
        """Remove the sessions of dead processes; the names removed (sessions.py)."""
        return self.sessions.clean()

    def exclusive(self, wait: float = 3600.0,
                  notify: Callable[[str], None] = lambda m: None) -> AbstractContextManager[None]:
        """Hold the store alone (gc, verify-cache): no session can start, and every running
        one has ended. Waits up to `wait` seconds, saying for whom."""
        return self.sessions.exclusive(wait, notify)

    def new_workdir(self, label: str) -> Path:
        """A work directory inside this process's session (no other build deletes it)."""
        return self.sessions.new_workdir(label)

    def remove_workdir(self, path: Path) -> None:
        """Remove a work directory of `new_workdir`, by descriptor from the session's own."""
        self.sessions.remove(path)

    def register_workspace(self, root: Path, keys: set[str] | dict[str, set[str]], file: Path | None = None,
                           required: bool = True, only: set[str] | None = None) -> None:
        """Record which stage keys the workspace at `root` references (store/index.py)."""
        self.index.register_workspace(root, keys, file, required, only)

    def workspace_references(self, forget_missing: bool = True) -> dict[str, set[str]]:
        """Registered workspace root -> the keys it references (store/index.py)."""
        return self.index.workspace_references(forget_missing)

    def forget(self, keys: set[str], objects: set[str]) -> None:
        """Drop removed stage entries and objects from the index (gc)."""
        self.index.forget(keys, objects)

    # --- stage entries -------------------------------------------------------------
    def entry_path(self, key: str) -> Path:
        return self.stages / key[:2] / f"{key}.json"

    def has(self, key: str) -> bool:
        return os.path.lexists(self.entry_path(key))

    def is_empty(self) -> bool:
        """No stage record at all: nothing was built with this cache yet (a fresh clone),
        which `explain` and `build --check` say rather than guess what changed."""
        try:
            shards = [entry.path for entry in os.scandir(self.stages) if entry.is_dir(follow_symlinks=False)]
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
        a cache directory others can write is not trusted more than a remote. Read from a
        regular file, never through a link; a link, a FIFO or a directory there is damage,
        removed."""
        path = self.entry_path(key)
        try:
            with self.layout.at("stages", key[:2], create=False) as shard:
                try:
                    raw = read_regular_at(f"{key}.json", shard, RECORD_LIMIT)
                except NotAFile as exc:
                    self.layout.remove_damage(f"{key}.json", shard, path, exc.kind)
                    return None
                except ValueError as exc:
                    raw, problem = None, str(exc)
                except PermissionError:
                    # Another user's record, from a tpubuild that wrote records 0600.
                    self.layout.say_once(path, f"warning: cache record {path} is not readable by you (another user's); "
                                         "ignored, the stage rebuilds")
                    return None
                entry, problem = parse_entry(key, raw, hash_record=False) if raw is not None else (None, problem)
                if entry is None:
                    self.report(f"warning: cache record {path} is invalid ({problem}); removed, the stage rebuilds")
                    remove_at(f"{key}.json", shard)  # a record is tpubuild's own file; the stage writes a good one
                    return None
        except FileNotFoundError:
            return None
        assert raw is not None  # an entry was parsed from it
        data = json.loads(raw)
        if not record_mac.verifies(data, self._mac_key(create=False)):
            # Another user's record in a shared cache, or one someone rewrote: not ours to
            # trust (store/record_mac.py). Left in place; the rebuilt stage replaces it.
            why = "it has no MAC" if record_mac.FIELD not in data else \
                f"its MAC does not verify with your key {self._key_file or record_mac.key_path(self.root)}"
            self.layout.say_once(path, f"warning: cache record {path} was not written by your tpubuild ({why}); "
                                 "ignored, the stage rebuilds")
            return None
        return entry

    def _mac_key(self, create: bool) -> bytes | None:
        """This user's record key (store/record_mac.py), made on the first record written
        (`create`); None when there is none yet, or when no key can be trusted (said once:
        then no record of this cache is trusted by this process)."""
        with self._guard:
            if self._key is None and not self._key_refused:
                self._key = self._find_key(create)
            return self._key

    def _find_key(self, create: bool) -> bytes | None:
        """The key in `keys/<uid>` of the cache, unless TPUBUILD_KEY_DIR names a directory of
        this user's; when the one in the cache is not one only this user could have made
        (another user's file there, `keys/` not writable, a link), the key in this user's
        own key directory, with one warning saying why."""
        display = record_mac.key_path(self.root)
        if record_mac.user_key_dir(explicit_only=True) is not None:
            return self._user_key(create, None)
        try:
            with self.layout.at("keys", create=create) as keys_fd:
                key = record_mac.read_key(keys_fd, display)
                if key is None and create:
                    key = record_mac.create_key(keys_fd, display)
                elif key is None and not os.access(".", os.W_OK, dir_fd=keys_fd):
                    # Reading before this build writes a record: where it would make its key.
                    st = os.fstat(keys_fd)
                    raise record_mac.KeyProblem(f"{display.parent} is not writable by you (it belongs to uid "
                                                f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})")
                if key is not None:
                    self._key_file = display
                return key
        except FileNotFoundError:
            return None
        except (record_mac.KeyProblem, OSError) as exc:
            problem = str(exc) if isinstance(exc, record_mac.KeyProblem) else f"{display}: {exc.strerror or exc}"
            return self._user_key(create, problem)

    def _user_key(self, create: bool, problem: str | None) -> bytes | None:
        directory = record_mac.user_key_dir()
        try:
            if directory is None:
                raise record_mac.KeyProblem(f"no directory for a key of yours (set {record_mac.KEY_DIR_VARIABLE}, "
                                            "or HOME)")
            key = record_mac.user_key(directory, create)
        except (record_mac.KeyProblem, OSError) as exc:
            self._key_refused = True
            first = f"{problem}; " if problem else ""
            self.report(f"warning: {first}{exc}: no stage record of the cache {self.cache_dir} is trusted by this "
                        f"build (every stage rebuilds); set {record_mac.KEY_DIR_VARIABLE} to a directory only you can "
                        "write")
            return None
        if key is not None:
            self._key_file = directory / record_mac.USER_KEY_FILE
            if problem:
                self.layout.say_once("key", f"warning: {problem}: your records in {self.cache_dir} are MACed with your "
                                      f"own key {self._key_file} instead, outside the cache "
                                      f"({record_mac.KEY_DIR_VARIABLE} chooses its directory)")
        return key

    def touch(self, key: str) -> None:
        """Mark an entry as used now (gc keeps recently used entries); never through a link."""
        try:
            with self.layout.at("stages", key[:2], create=False) as shard:
                os.utime(f"{key}.json", dir_fd=shard, follow_symlinks=False)
        except OSError:
            pass

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
        """Move the files of `out_dir` (in this process's session) into the store and
        record them under `key`. Each file is opened once without following a link, made
        read-only, hashed from that descriptor, and renamed into `objects/` only if its
        name there is then that same inode: the object holds the bytes that were hashed.
        Symbolic links and special files in the output are a StageError naming them."""
        entries = []
        with self.sessions.in_session(out_dir) as out_fd:
            for rel, _ in walk_regular(out_fd, os.fspath(out_dir)):
                parent, name = os.path.split(rel)
                with opened(open_path(out_fd, parent)) as parent_fd:
                    fd, st = open_regular_at(name, parent_fd)
                    with opened(fd):
                        os.fchmod(fd, 0o444)
                        digest = hash_fd(fd, st.st_size)
                        entries.append(FileEntry(rel, digest, st.st_size))
                        if self._object_ok(digest, stat_cache):
                            continue
                        os.fsync(fd)
                        self._move_in(name, parent_fd, digest, os.fstat(fd), os.path.join(out_dir, rel))
        entry = self._record(key, stage, entries, summary, warnings, record)
        self.sessions.remove(out_dir)
        return entry

    def _move_in(self, name: str, dir_fd: int, digest: str, st: os.stat_result, display: str) -> None:
        """Rename `name` (in `dir_fd`, a directory of the session; `st` its fstat, taken
        when it was hashed) into the store as the object `digest`, then check the object
        is that inode (else a StageError: the file changed while it was being stored)."""
        with self.layout.at("objects", digest[:2]) as shard:
            os.rename(name, digest[2:], src_dir_fd=dir_fd, dst_dir_fd=shard)
            now = lstat_at(digest[2:], shard)
            if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise StageError(f"{display} was replaced while it was being stored; not recorded (build again)")
            fsync_fd(shard)
            self._verified[digest] = stat_key(now)

    def put_files(self, key: str, stage: str, files: list[FileEntry], src_root: Path, record: dict,
                  stat_cache: StatCache | None = None) -> StageEntry:
        """Copy a user directory's files, whose hashes the key took, into the store (each
        copy checked against its hash: `ingest_copies`) and record them under `key`."""
        self.session_dir()
        self.ingest_copies(files, src_root, stat_cache)
        return self._record(key, stage, files, {}, [], record)

    def add_entry(self, entry: StageEntry) -> StageEntry:
        """Record an entry whose objects are already in the store, verified (one fetched
        from the remote cache, remote/cache.py)."""
        self.session_dir()
        return self._record(entry.key, entry.stage, entry.files, entry.summary, entry.warnings, entry.record)

    def _record(self, key: str, stage: str, files: list[FileEntry], summary: dict, warnings: list[str],
                record: dict) -> StageEntry:
        """Write the stage entry of objects already in the store (atomic, durable, indexed;
        read-only, readable by every user of the cache: gc reads everyone's)."""
        entry = StageEntry(key, stage, tree_digest(files), files, summary, warnings, record)
        data = entry.to_json()
        mac_key = self._mac_key(create=True)
        text = json.dumps(record_mac.seal(data, mac_key) if mac_key else data, sort_keys=True)
        with self.layout.at("stages", key[:2]) as shard:
            write_atomic_at(f"{key}.json", shard, text.encode("utf-8"), 0o444)
        self.index.add_entry(entry)
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

    def _object_problem(self, st: os.stat_result) -> str | None:
        """Why the object whose lstat is `st` is damage whatever its content, or None:
        objects are regular files (a symbolic link would make a hard-link publish link the
        link, a copy read whatever it points to; a FIFO blocks a read, a device never
        ends), and in a private cache they are this user's."""
        if not stat.S_ISREG(st.st_mode):
            return file_kind(st.st_mode)
        if st.st_uid != os.getuid() and self.private():
            return f"owned by uid {st.st_uid}, in a cache only uid {os.getuid()} can write"
        return None

    def _remove_object_damage(self, digest: str, shard: int, problem: str) -> None:
        """Remove a damaged object (the link itself, never what it points to), one warning."""
        self._verified.pop(digest, None)
        obj = self.object_path(digest)
        if remove_at(digest[2:], shard):
            self.layout.say_once(digest, f"warning: cache object {obj} is {problem}; removed, its stage rebuilds")
        else:  # another user's, or too big to remove in one go: skipped, said once, never fatal
            self.layout.say_once(digest, f"warning: cache object {obj} is {problem}; cannot remove all of it "
                                         "(another user's?): left in place")

    def _object_ok(self, digest: str, stat_cache: StatCache | None) -> bool:
        """Whether the object exists, is a regular file of the cache (`_object_problem`;
        damage is removed) and has the right content (trusted when this process verified it
        and its stat did not change since; else hashed, from the descriptor whose stat is
        checked, via the stat cache)."""
        try:
            with self.layout.at("objects", digest[:2], create=False) as shard:
                st = lstat_at(digest[2:], shard)
                if st is None:
                    return False
                problem = self._object_problem(st)
                if problem is not None:
                    self._remove_object_damage(digest, shard, problem)
                    return False
                if self._verified.get(digest) == stat_key(st):
                    return True
                try:
                    fd, st = open_regular_at(digest[2:], shard)
                except NotAFile as exc:  # swapped since the lstat
                    self._remove_object_damage(digest, shard, exc.kind)
                    return False
                with opened(fd):
                    actual = (stat_cache or StatCache(None)).fd_hash(os.fspath(self.object_path(digest)), fd)
        except FileNotFoundError:
            return False
        if actual == digest:
            self._verified[digest] = stat_key(st)
            return True
        return False

    def has_object(self, digest: str, stat_cache: StatCache | None = None) -> bool:
        """Whether the object exists with the right content (see `_object_ok`)."""
        return self._object_ok(digest, stat_cache)

    def adopt_object(self, path: Path | str, digest: str) -> None:
        """Move a file the caller hashed to `digest`, in this process's session, into the
        store as that object (a remote cache download, verified before it comes here):
        read-only, durable."""
        parent, name = os.path.split(os.fspath(path))
        with self.sessions.in_session(Path(parent)) as dir_fd:
            fd, _ = open_regular_at(name, dir_fd)
            with opened(fd):
                os.fchmod(fd, 0o444)
                os.fsync(fd)
                self._move_in(name, dir_fd, digest, os.fstat(fd), os.fspath(path))

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

    def _shards(self) -> Iterator[tuple[str, int]]:
        """(name, descriptor) of each `objects/ab` directory; damage among them removed."""
        try:
            objects_fd = self.layout.open(("objects",), create=False)
        except FileNotFoundError:
            return
        with opened(objects_fd):
            for sub in sorted(os.listdir(objects_fd)):
                if sub.startswith("."):
                    continue
                try:
                    shard = open_dir(sub, objects_fd)
                except NotAFile as exc:
                    self.layout.remove_damage(sub, objects_fd, self.objects / sub, exc.kind)
                    continue
                except FileNotFoundError:
                    continue
                with opened(shard):
                    yield sub, shard

    def object_sizes(self) -> dict[str, int]:
        """Every object -> its size, scanned (not the index); anything in `objects/` that is
        not a regular file is damage, removed with one warning, and not counted."""
        sizes = {}
        for sub, shard in self._shards():
            for name in sorted(os.listdir(shard)):
                if name.startswith("."):
                    continue
                st = lstat_at(name, shard)
                if st is None:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    self._remove_object_damage(sub + name, shard, file_kind(st.st_mode))
                    continue
                sizes[sub + name] = st.st_size
        return sizes

    def all_objects(self) -> list[str]:
        """Every object (a regular file in `objects/ab/`; damage is `verify_all`'s)."""
        digests = []
        for sub, shard in self._shards():
            for name in sorted(os.listdir(shard)):
                st = None if name.startswith(".") else lstat_at(name, shard)
                if st is not None and stat.S_ISREG(st.st_mode):
                    digests.append(sub + name)
        return digests

    def verify_all(self, progress: Callable[[str], None] = lambda digest: None) -> list[str]:
        """Rehash every object, whatever its stat says (`verify-cache`; call under
        `exclusive`); a corrupted one is removed, so the next build rebuilds its stage.
        Damage (a link, a directory, a FIFO) is removed with its own warning. Returns the
        removed corrupted digests."""
        bad = []
        for sub, shard in self._shards():
            for name in sorted(os.listdir(shard)):
                if name.startswith("."):
                    continue
                digest = sub + name
                progress(digest)
                st = lstat_at(name, shard)
                if st is None:
                    continue
                problem = self._object_problem(st)
                if problem is not None:
                    self._remove_object_damage(digest, shard, problem)
                    continue
                try:
                    fd, st = open_regular_at(name, shard)
                except NotAFile as exc:
                    self._remove_object_damage(digest, shard, exc.kind)
                    continue
                except OSError:
                    continue
                with opened(fd):
                    ok = hash_fd(fd, st.st_size) == digest
                if ok:
                    self._verified[digest] = stat_key(st)
                else:
                    self._verified.pop(digest, None)
                    remove_at(name, shard)
                    bad.append(digest)
        return bad

    def discard_object(self, digest: str) -> bool:
        """Remove a bad or unused object (whatever is at its name, never through a link).
        Only the object: a concurrent build reading a checkout keeps its open files, and the
        next use of that checkout relinks the rebuilt object. True when a regular file
        was removed."""
        self._verified.pop(digest, None)
        try:
            with self.layout.at("objects", digest[:2], create=False) as shard:
                st = lstat_at(digest[2:], shard)
                if st is None:
                    return False
                return remove_at(digest[2:], shard) and stat.S_ISREG(st.st_mode)
        except FileNotFoundError:
            return False

    def ingest_copies(self, files: list[FileEntry], src_root: Path, stat_cache: StatCache | None = None) -> None:
        """Copy files of a user directory (a source SavedModel) into the store, so what is
        published never shares an inode with the user's files. With `stat_cache`, an
        existing object is verified (and replaced when damaged), not trusted. Each copy
        is hashed from its own descriptor before it is renamed in."""
        work = None
        try:
            for f in files:
                present = self._object_ok(f.hash, stat_cache) if stat_cache is not None else \
                    os.path.lexists(self.object_path(f.hash))
                if present:
                    continue
                if work is None:
                    work = self.new_workdir("ingest")
                src = os.path.join(src_root, f.path)
                with self.sessions.in_session(work) as work_fd:
                    # Links inside the model are allowed (walk_files checked they stay inside it).
                    place_file(src, f.hash, "copy", follow=True, dst_dir_fd=work_fd)
                    fd, _ = open_regular_at(f.hash, work_fd)
                    with opened(fd):
                        if hash_fd(fd, os.fstat(fd).st_size) != f.hash:
                            raise StageError(f"{src} changed while it was being read")
                        self._move_in(f.hash, work_fd, f.hash, os.fstat(fd), src)
        finally:
            if work is not None:
                self.sessions.remove(work)

    # --- checkouts -----------------------------------------------------------------
    def checkout(self, entry: StageEntry) -> Path:
        """The tree of `entry` as a directory of read-only hardlinks to its objects (which
        the caller verified). An existing checkout is checked file by file against the
        objects' inodes and repaired in place, walked by descriptor: a link in `trees/` (or
        in a checkout) is damage, removed (never followed: the files of the directory it
        points to are never touched). A new one appears by a rename; one that cannot be
        placed in `trees/` is used from this process's session."""
        dest = self.trees / entry.tree
        with self.layout.at("trees") as trees_fd:
            st = lstat_at(entry.tree, trees_fd)
            if st is not None and not stat.S_ISDIR(st.st_mode):
                self.layout.remove_damage(entry.tree, trees_fd, dest, file_kind(st.st_mode))
                st = None
            if st is not None and self._repair_checkout(entry, trees_fd, entry.tree):
                return dest
            work = self.new_workdir("checkout")
            with self.sessions.in_session(work) as work_fd:
                mode = self.layout.dir_mode(trees_fd, entry.tree)
                with opened(make_dir("tree", work_fd, mode)) as tree_fd:
                    self._link_objects(entry.files, tree_fd, mode)
                if st is not None:  # too damaged to repair: set aside (readers keep it), or removed
                    try:
                        os.rename(entry.tree, "old", src_dir_fd=trees_fd, dst_dir_fd=work_fd)
                    except OSError:
                        remove_at(entry.tree, trees_fd)
                try:
                    os.rename("tree", entry.tree, src_dir_fd=work_fd, dst_dir_fd=trees_fd)
                except OSError:
                    if self._repair_checkout(entry, trees_fd, entry.tree):  # another build's, just made
                        self.sessions.remove(work)
                        return dest
                    return work / "tree"  # this build's own, for as long as its session lives
            fsync_fd(trees_fd)
        self.sessions.remove(work)
        return dest

    def _repair_checkout(self, entry: StageEntry, trees_fd: int, name: str) -> bool:
        """Make `trees/<name>` hold exactly `entry`'s files, each the object's inode; False
        when it cannot be repaired in place (a link or a special file in it, a directory
        where a file should be, another user's directory we cannot write...)."""
        expected = {f.path: f for f in entry.files}
        try:
            tree_fd = open_dir(name, trees_fd)
        except OSError:
            return False
        with opened(tree_fd):
            try:
                present = dict(walk_regular(tree_fd, os.fspath(self.trees / name)))
            except StageError as exc:  # a link or a special file in it: never followed, never read
                where = getattr(exc, "path", os.fspath(self.trees / name))
                self.layout.say_once(where, f"warning: cache checkout {self.trees / name} holds {getattr(exc, 'kind', '?')} "
                                      f"at {where}; set aside and made again (never followed)")
                return False
            except OSError:
                return False
            try:
                for rel in sorted(present.keys() - expected.keys()):
                    parent, base = os.path.split(rel)
                    with opened(open_path(tree_fd, parent)) as parent_fd:
                        os.unlink(base, dir_fd=parent_fd)  # a stage must not write into its input; undo it
                wrong = [f for rel, f in expected.items()
                         if present.get(rel) is None or _dev_ino(present[rel]) != self._object_dev_ino(f.hash)]
                self._link_objects(wrong, tree_fd, self.layout.dir_mode(trees_fd, name), replace=True)
            except (OSError, StageError):
                return False
        return True

    def _object_dev_ino(self, digest: str) -> tuple[int, int] | None:
        try:
            with self.layout.at("objects", digest[:2], create=False) as shard:
                st = lstat_at(digest[2:], shard)
        except OSError:
            return None
        return _dev_ino(st) if st is not None else None

    def _link_objects(self, files: list[FileEntry], tree_fd: int, mode: int, replace: bool = False) -> None:
        """Hardlink (copy when linking is impossible) the objects of `files` into the
        directory `tree_fd`, its subdirectories made with `mode`, never through a link;
        each directory fsynced (a hard link adds a name to a durable object; a copy is
        fsynced itself)."""
        by_dir: dict[str, list[FileEntry]] = {}
        for f in files:
            by_dir.setdefault(os.path.dirname(f.path), []).append(f)
        for parent in sorted(by_dir):
            with opened(open_path(tree_fd, parent, create_mode=mode)) as parent_fd:
                for f in by_dir[parent]:
                    base = os.path.basename(f.path)
                    if replace:
                        replace_file(self.object_path(f.hash), base, "hardlink", dst_dir_fd=parent_fd)
                    else:
                        place_file(self.object_path(f.hash), base, "hardlink", dst_dir_fd=parent_fd)
                fsync_fd(parent_fd)
        fsync_fd(tree_fd)

    def materialize(self, files: list[FileEntry], dest: Path, prefix: str = "") -> None:
        """Hardlink the objects of `files` into `dest`, a directory of this process's own
        (copy when linking is impossible)."""
        made: set[str] = set()
        for f in files:
            target = os.path.join(dest, prefix, f.path)
            parent = os.path.dirname(target)
            if parent not in made:
                os.makedirs(parent, exist_ok=True)
                made.add(parent)
            link_or_copy(self.object_path(f.hash), target)

    # --- gc's view: every record, object and checkout, damage removed --------------------
    def scan_records(self) -> tuple[list[tuple[float, str, set[str], str]], int]:
        """([(last used, key, object hashes, tree)], damaged): every stage record, read
        without following a link. A record that is not a regular file, cannot be read or is
        invalid is removed (its stage rebuilds, as `get` would) and counted in `damaged`."""
        entries: list[tuple[float, str, set[str], str]] = []
        damaged = 0
        try:
            stages_fd = self.layout.open(("stages",), create=False)
        except FileNotFoundError:
            return entries, damaged
        with opened(stages_fd):
            for sub in sorted(os.listdir(stages_fd)):
                try:
                    shard = open_dir(sub, stages_fd)
                except NotAFile as exc:
                    self.layout.remove_damage(sub, stages_fd, self.stages / sub, exc.kind)
                    continue
                except OSError:
                    continue
                with opened(shard):
                    for name in sorted(os.listdir(shard)):
                        if not name.endswith(".json") or name.startswith("."):
                            continue  # a temp file of an interrupted write
                        path, key = self.stages / sub / name, name[: -len(".json")]
                        try:
                            fd, st = open_regular_at(name, shard)
                            with opened(fd):
                                raw = os.read(fd, RECORD_LIMIT + 1)
                            entry, problem = parse_entry(key, raw, hash_record=False)
                        except NotAFile as exc:
                            entry, problem = None, exc.kind
                        except OSError as exc:
                            entry, problem = None, exc.strerror or str(exc)
                        if entry is None:
                            self.layout.say_once(path, f"warning: cache record {path} is invalid ({problem}); removed")
                            if remove_at(name, shard):
                                damaged += 1
                            continue
                        entries.append((st.st_mtime, key, {f.hash for f in entry.files}, entry.tree))
        return entries, damaged

    def remove_record(self, key: str) -> bool:
        """Remove the record of `key` (never through a link); True when one was removed."""
        try:
            with self.layout.at("stages", key[:2], create=False) as shard:
                if lstat_at(f"{key}.json", shard) is None:
                    return False
                return remove_at(f"{key}.json", shard)
        except FileNotFoundError:
            return False

    def tree_names(self) -> list[str]:
        try:
            with self.layout.at("trees", create=False) as trees_fd:
                return sorted(name for name in os.listdir(trees_fd) if not name.startswith("."))
        except FileNotFoundError:
            return []

    def remove_tree(self, name: str) -> None:
        """Remove the checkout `trees/<name>`: renamed away first (never half a checkout
        under its name), then deleted by descriptor, never through a link."""
        with self.layout.at("trees") as trees_fd:
            trash = f".trash-{os.getpid()}-{os.urandom(4).hex()}"
            try:
                os.rename(name, trash, src_dir_fd=trees_fd, dst_dir_fd=trees_fd)
            except OSError:
                trash = name
            remove_at(trash, trees_fd)


def _dev_ino(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def link_or_copy(src: Path | str, dst: str, link_type: str = "hardlink") -> None:
    """Place `src` at `dst` (replacing it) as a hard link, or a reflink/copy when
    `link_type` is "copy" or linking is impossible."""
    try:
        os.unlink(dst)
    except FileNotFoundError:
        pass
    place_file(src, dst, link_type, durable=False)
