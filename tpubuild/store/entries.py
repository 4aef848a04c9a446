"""The stage records of a cache, `v1/stages/ab/<key>.json` (a part of `Store`,
store/store.py): read and validated like a downloaded record, trusted only under this
user's MAC key (store/record_mac.py), written atomic, read-only and indexed.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Callable

from tpubuild.digests import FileEntry, StatCache, hash_fd, tree_digest
from tpubuild.fs import (
    NotAFile,
    open_path,
    open_regular_at,
    opened,
    read_regular_at,
    remove_at,
    walk_regular,
    write_atomic_at,
)
from tpubuild.keys import RECORD_LIMIT, StageEntry, parse_entry
from tpubuild.store import record_mac
from tpubuild.store.index import StoreIndex
from tpubuild.store.objects import StoreObjects
from tpubuild.trace_events import span

__all__ = ["StageRecords"]


class StageRecords(StoreObjects):
    """Records on top of the objects they name; the state is made by `Store.__init__`."""

    cache_dir: Path
    stages: Path
    index: StoreIndex
    report: Callable[[str], None]
    _guard: threading.RLock
    _key: bytes | None  # this user's record key (_mac_key)
    _key_file: Path | None  # where it is
    _key_refused: bool

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
        peak_memory: int | None = None,
    ) -> StageEntry:
        """Move the files of `out_dir` (in this process's session) into the store and
        record them under `key`. Each file is opened once without following a link, made
        read-only, hashed from that descriptor, and renamed into `objects/` only if its
        name there is then that same inode: the object holds the bytes that were hashed.
        Symbolic links and special files in the output are a StageError naming them.
        A file that is a hard link of an object this process verified, its stat unchanged
        (variables a stage left as they were: savedmodel/model.py save links them), is
        recorded as that object without being read (known_object): one inode in the
        store however many stages pass it on, never hashed again."""
        entries = []
        with span("storing the outputs in the cache (hashing them)", cat="cache"), \
                self.sessions.in_session(out_dir) as out_fd:
            for rel, _ in walk_regular(out_fd, os.fspath(out_dir)):
                parent, name = os.path.split(rel)
                with opened(open_path(out_fd, parent)) as parent_fd:
                    fd, st = open_regular_at(name, parent_fd)
                    with opened(fd):
                        known = self.known_object(st)
                        if known is not None:  # a hard link of an object: shared, not read again
                            entries.append(FileEntry(rel, known, st.st_size))
                            continue
                        os.fchmod(fd, 0o444)
                        digest = hash_fd(fd, st.st_size)
                        entries.append(FileEntry(rel, digest, st.st_size))
                        if self.object_ok(digest, stat_cache):
                            continue
                        os.fsync(fd)
                        self.move_in(name, parent_fd, digest, os.fstat(fd), os.path.join(out_dir, rel))
        entry = self._record(key, stage, entries, summary, warnings, record, peak_memory)
        self.sessions.remove(out_dir)
        return entry

    def put_files(self, key: str, stage: str, files: list[FileEntry], src_root: Path, record: dict,
                  stat_cache: StatCache | None = None) -> StageEntry:
        """Copy a user directory's files, whose hashes the key took, into the store (each
        copy checked against its hash: `ingest_copies`) and record them under `key`."""
        self.sessions.open()
        with span("copying into the cache", cat="cache", files=len(files), bytes=sum(f.size for f in files)):
            self.ingest_copies(files, src_root, stat_cache)
        return self._record(key, stage, files, {}, [], record)

    def add_entry(self, entry: StageEntry) -> StageEntry:
        """Record an entry whose objects are already in the store, verified (one fetched
        from the remote cache, remote/cache.py)."""
        self.sessions.open()
        return self._record(entry.key, entry.stage, entry.files, entry.summary, entry.warnings, entry.record,
                            entry.peak_memory)

    def _record(self, key: str, stage: str, files: list[FileEntry], summary: dict, warnings: list[str],
                record: dict, peak_memory: int | None = None) -> StageEntry:
        """Write the stage entry of objects already in the store (atomic, durable, indexed;
        read-only, readable by every user of the cache: gc reads everyone's)."""
        entry = StageEntry(key, stage, tree_digest(files), files, summary, warnings, record, peak_memory)
        data = entry.to_json()
        mac_key = self._mac_key(create=True)
        text = json.dumps(record_mac.seal(data, mac_key) if mac_key else data, sort_keys=True)
        with self.layout.at("stages", key[:2]) as shard:
            write_atomic_at(f"{key}.json", shard, text.encode("utf-8"), 0o444)
        self.index.add_entry(entry)
        return entry
