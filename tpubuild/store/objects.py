"""The objects of a cache, `v1/objects/ab/cdef...` (a part of `Store`, store/store.py):
file contents by BLAKE3 hash, read-only regular files, moved in from this process's
session, checked (by stat, else rehashed) before each use, damage removed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Callable, Iterator

from tpubuild import progress
from tpubuild.digests import FileEntry, StatCache, hash_fd, stat_key
from tpubuild.errors import StageError, file_kind
from tpubuild.fs import NotAFile, copy_hashed, fsync_fd, lstat_at, open_dir, open_regular_at, opened, remove_at
from tpubuild.keys import StageEntry
from tpubuild.store.layout import CacheLayout
from tpubuild.store.sessions import Sessions

__all__ = ["StoreObjects"]


class StoreObjects:
    """The objects part of `Store`; the state is made by `Store.__init__`."""

    root: Path
    objects: Path
    layout: CacheLayout
    sessions: Sessions
    # Objects this process hashed itself, with the stat they had (see Store.__init__).
    _verified: dict[str, list[int]]
    # The same objects by inode (st_dev, st_ino) -> (digest, size, mtime_ns): a stage's
    # output file that is a hard link of one (variables a stage left unchanged) is known
    # without reading it (known_object).
    _verified_inodes: dict[tuple[int, int], tuple[str, int, int]]
    _private: bool | None  # private(): computed once

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

    def object_problem(self, st: os.stat_result) -> str | None:
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

    def object_ok(self, digest: str, stat_cache: StatCache | None) -> bool:
        """Whether the object exists, is a regular file of the cache (`object_problem`;
        damage is removed) and has the right content (trusted when this process verified it
        and its stat did not change since; else hashed, from the descriptor whose stat is
        checked, via the stat cache)."""
        try:
            with self.layout.at("objects", digest[:2], create=False) as shard:
                st = lstat_at(digest[2:], shard)
                if st is None:
                    return False
                problem = self.object_problem(st)
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
            self._trust(digest, st)
            return True
        return False

    def move_in(self, name: str, dir_fd: int, digest: str, st: os.stat_result, display: str) -> None:
        """Rename `name` (in `dir_fd`, a directory of the session; `st` its fstat, taken
        when it was hashed) into the store as the object `digest`, then check the object
        is that inode (else a StageError: the file changed while it was being stored)."""
        with self.layout.at("objects", digest[:2]) as shard:
            os.rename(name, digest[2:], src_dir_fd=dir_fd, dst_dir_fd=shard)
            now = lstat_at(digest[2:], shard)
            if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise StageError(f"{display} was replaced while it was being stored; not recorded (build again)")
            fsync_fd(shard)
            self._trust(digest, now)

    def _trust(self, digest: str, st: os.stat_result) -> None:
        """Remember that this process hashed the object `digest`, whose lstat is `st`."""
        self._verified[digest] = stat_key(st)
        self._verified_inodes[(st.st_dev, st.st_ino)] = (digest, st.st_size, st.st_mtime_ns)

    def known_object(self, st: os.stat_result) -> str | None:
        """The digest of the object whose inode `st` (an fstat) is, when this process
        hashed it and its size and mtime are unchanged since: a hard link of it in a
        stage's output (variables the stage left unchanged, savedmodel/model.py save) is
        then stored without being read again. None otherwise. Not the ctime, which
        `_verified` checks too: every hard link made or removed changes it (the checkout,
        the stage's own link, its session's removal), and a write changes the mtime; what
        this trusts less is an mtime set back by hand (utime) in this build's lifetime,
        on a read-only object of this cache."""
        known = self._verified_inodes.get((st.st_dev, st.st_ino))
        # Still an object this process trusts (discard_object and damage removal forget it:
        # its inode number may be a new file's by now).
        if known is not None and known[0] in self._verified and known[1:] == (st.st_size, st.st_mtime_ns) \
                and stat.S_ISREG(st.st_mode) and not st.st_mode & 0o222:
            return known[0]
        return None

    def has_object(self, digest: str, stat_cache: StatCache | None = None) -> bool:
        """Whether the object exists with the right content (see `object_ok`)."""
        return self.object_ok(digest, stat_cache)

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
                self.move_in(name, dir_fd, digest, os.fstat(fd), os.fspath(path))

    def verify(self, entry: StageEntry, stat_cache: StatCache) -> bool:
        """Whether every object of `entry` exists with the right content; a corrupted object
        is deleted so the stage is rebuilt (never used). Checkouts are left alone: each
        use of one compares it with the objects (`checkout`)."""
        self.sessions.open()  # from here on, gc waits for this build
        ok = True
        for f in entry.files:
            if not self.object_ok(f.hash, stat_cache):
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
                problem = self.object_problem(st)
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
                    self._trust(digest, st)
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
        missing = list({f.hash: f for f in files if not (
            self.object_ok(f.hash, stat_cache) if stat_cache is not None
            else os.path.lexists(self.object_path(f.hash)))}.values())
        if not missing:
            return
        work = self.sessions.new_workdir("ingest")
        try:
            # On a terminal, a large model's copy shows its bytes done (progress.py); each
            # copy's check reads what was just counted.
            with progress.meter("copying into the cache", sum(f.size for f in missing)):
                for f in missing:
                    src = os.path.join(src_root, f.path)
                    with self.sessions.in_session(work) as work_fd:
                        # Links inside the model are allowed (walk_files checked they stay inside it).
                        # Copied in the kernel (copy_file_range), the copy hashed behind it
                        # (fs/place.py copy_hashed): the user's file is read once here.
                        # Copying and hashing in one pass through this process's memory
                        # reads it once too, but measured slower here: 2 GiB in 8.6-11.6 s
                        # against 2.7-3.4 s (write() of user memory against the kernel's
                        # copy; the copy's hash reads the page cache at ~3 GB/s on all cores).
                        digest = copy_hashed(src, f.hash, follow=True, dst_dir_fd=work_fd)
                        if digest != f.hash:
                            raise StageError(f"{src} changed while it was being read")
                        fd, _ = open_regular_at(f.hash, work_fd)
                        with opened(fd):
                            self.move_in(f.hash, work_fd, f.hash, os.fstat(fd), src)
        finally:
            self.sessions.remove(work)
