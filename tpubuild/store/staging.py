"""A source SavedModel's large files, hashed for the source's key by copying them into this
process's session: each of the user's bytes is read once, to hash it and to store it
(issue 54, item 2), where hashing it for the key, copying it into the store and hashing
the copy read it three times.

The key is taken before the `source` step runs (engine/loop.py `uptodate`); the step then
moves the staged copy in as the object (store/objects.py `ingest_copies`), fsynced then,
instead of reading the user's file again. The digest is the one of the bytes written (the
same buffer: digests/hashing.py `hash_while_copying`), so a staged object is always true
to its name. What a copy cannot prove by itself is that the user's file held those bytes
at one moment: a file written to while it is read gives a mix of its old and new bytes.
So the file's stat is compared before and after (a write changes its ctime, which no user
call sets back), and a file changed too recently for its ctime to tell (statcache.py's
racy window) is hashed once more from its own descriptor.

Files below STAGED_MIN_SIZE (saved_model.pb, the index, assets) are hashed as ever and
copied by the source step: two reads of a small file cost less than a session file each.
A staged copy the build does not use (the object was in the store already, the step was
cached) is removed at once or with the session.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from tpubuild import io_counters, progress
from tpubuild.digests import hash_fd, hash_file, hash_while_copying, is_racy, stat_key
from tpubuild.errors import StageError
from tpubuild.fs import open_regular, opened, remove_at
from tpubuild.store.sessions import Sessions

__all__ = ["SourceStaging"]

# From this size on a file is staged (the variables' data files): below it (saved_model.pb,
# the index, assets), two reads of it cost less than a file of the session each.
STAGED_MIN_SIZE = 4 << 20


class SourceStaging:
    """Copies of a build's source files in a work directory of its session, by digest."""

    def __init__(self, sessions: Sessions):
        self.sessions = sessions
        self._workdir: Path | None = None
        self._staged: dict[str, str] = {}  # digest -> its file's name in the work directory
        # What staging each digest read and wrote (io_counters.py): the source step's row
        # says it (engine/loop.py), though it happened while its key was taken.
        self._io: dict[str, dict[str, int]] = {}
        self._guard = threading.Lock()

    def hash(self, path: str, st: os.stat_result) -> str:
        """The BLAKE3 of the user's file `path` (absolute; `st` its stat, from the walk
        that found it), a large one copied into the session as it is read."""
        if st.st_size < STAGED_MIN_SIZE:
            return hash_file(path, st.st_size)
        started = time.time_ns()
        io_before = io_counters.read(io_counters.THREAD)
        writer_io: list[dict[str, int] | None] = []  # the copy's writing thread's own counters
        fd, now = open_regular(path, follow=True)  # links inside the model: walk_files checked them
        with opened(fd):
            if stat_key(now) != stat_key(st):
                raise StageError(f"{path} changed while it was being read (build again)")
            name = f"{os.urandom(8).hex()}.staged"
            with self.sessions.in_session(self._dir()) as work_fd:
                out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                              dir_fd=work_fd)
                try:
                    with opened(out):
                        digest, size = hash_while_copying(fd, out, writer_io)
                    after = os.fstat(fd)
                    if stat_key(after) != stat_key(st) or size != st.st_size:
                        raise StageError(f"{path} changed while it was being read (build again)")
                    if is_racy(st.st_mtime_ns, st.st_ctime_ns, started):
                        with progress.uncounted():  # the meter counted these bytes once
                            again = hash_fd(fd, size)
                        if again != digest:
                            raise StageError(f"{path} changed while it was being read (build again)")
                except BaseException as exc:
                    remove_at(name, work_fd)
                    if isinstance(exc, OSError) and exc.filename is None:
                        # A write's error names no file: the copy's, so the build's one line
                        # says where (`No space left on device: <cache>/v1/tmp/...`: errors.py).
                        raise OSError(exc.errno, exc.strerror, os.fspath(self._dir() / name)) from None
                    raise
        io = io_counters.add(io_counters.since(io_before, io_counters.THREAD), writer_io[0] if writer_io else None)
        with self._guard:
            if io is not None:
                self._io[digest] = io_counters.add(self._io.get(digest), io) or io
            duplicate = digest in self._staged  # the same bytes twice (two names in one model)
            if not duplicate:
                self._staged[digest] = name
        if duplicate:
            self._remove(name)
        return digest

    def io_of(self, digests: list[str]) -> dict[str, int] | None:
        """What staging read and wrote for `digests` (each said once), None if nothing."""
        with self._guard:
            found = [self._io.pop(d) for d in set(digests) if d in self._io]
        total = None
        for io in found:
            total = io_counters.add(total, io)
        return total

    def take(self, digest: str) -> tuple[Path, str] | None:
        """(work directory, file name) of the staged copy of `digest`, now the caller's to
        move into the store; None when there is none."""
        with self._guard:
            name = self._staged.pop(digest, None)
        return None if name is None or self._workdir is None else (self._workdir, name)

    def discard(self, digests: list[str]) -> None:
        """Remove the staged copies of `digests` (their objects are in the store already)."""
        with self._guard:
            names = [self._staged.pop(d) for d in digests if d in self._staged]
        for name in names:
            self._remove(name)

    def _dir(self) -> Path:
        with self._guard:
            if self._workdir is None:
                self._workdir = self.sessions.new_workdir("staged")
            return self._workdir

    def _remove(self, name: str) -> None:
        if self._workdir is not None:
            with self.sessions.in_session(self._workdir) as work_fd:
                remove_at(name, work_fd)
