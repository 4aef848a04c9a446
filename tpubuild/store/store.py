"""The content-addressed store under `cache_dir` (layout `v1/`), safe to share by several
workspaces and concurrent builds on one machine, and by users who trust each other
(docs/shared-cache.md: who may write what, and what each build trusts).

- `v1/objects/ab/cdef...`: file contents by BLAKE3 hash, read-only regular files (a link,
  a special file, or in a private cache another user's file, is damage: `object_problem`).
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

The parts, one module each, joined here as one class (mixins: every part works on the
same directories, descriptors and per-process state, and the rest of tpubuild sees one
`Store`): objects (store/objects.py), stage records (store/entries.py), checkouts
(store/checkouts.py), gc's view (store/scan.py) and dep files (store/depfiles.py); the
sessions and the index are objects of their own (store/sessions.py, store/index.py) that
`Store` delegates to.

Durability: every file is fsynced before the rename that publishes it, and the directory
holding the new name after it; a killed process leaves no half entry, object or checkout.
"""

from __future__ import annotations

import sys
import threading
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Callable

from tpubuild.store.checkouts import StoreCheckouts, link_or_copy
from tpubuild.store.depfiles import StoreDepFiles
from tpubuild.store.entries import StageRecords
from tpubuild.store.index import StoreIndex
from tpubuild.store.layout import LAYOUT, CacheLayout
from tpubuild.store.scan import StoreScan
from tpubuild.store.sessions import Sessions

__all__ = ["LAYOUT", "Store", "link_or_copy"]


class Store(StageRecords, StoreCheckouts, StoreScan, StoreDepFiles):
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
        self._verified_inodes: dict[tuple[int, int], tuple[str, int, int]] = {}  # by inode
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
