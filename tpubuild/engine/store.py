"""The content-addressed store under the workspace cache dir (layout `v1/`).

- `v1/objects/ab/cdef...`: file contents by BLAKE3 hash, read-only.
- `v1/stages/ab/<key>.json`: per stage key, the output tree (path -> object), the stage's
  summary and warnings, and the key record (what `explain` diffs).
- `v1/trees/<tree hash>/`: a checkout of a tree as hardlinks to objects: the input
  directory of the next stage.
- `v1/tmp/`: stage working directories; whatever is left there after a crash is garbage.
Every entry appears by an atomic rename, so a killed build leaves no half entry behind.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpubuild.atomic import write_text_atomic
from tpubuild.engine.hashing import SCHEME, FileEntry, hash_file, tree_digest, walk_files
from tpubuild.engine.statcache import StatCache
from tpubuild.errors import StageError

LAYOUT = "v1"


@dataclass
class StageEntry:
    """A stage output in the store."""

    key: str
    stage: str
    tree: str
    files: list[FileEntry]
    summary: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "scheme": SCHEME,
            "key": self.key,
            "stage": self.stage,
            "tree": self.tree,
            "files": [[f.path, f.hash, f.size] for f in self.files],
            "summary": self.summary,
            "warnings": self.warnings,
            "record": self.record,
            "created": time.time(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StageEntry:
        return cls(
            key=data["key"],
            stage=data["stage"],
            tree=data["tree"],
            files=[FileEntry(p, h, s) for p, h, s in data["files"]],
            summary=data.get("summary", {}),
            warnings=data.get("warnings", []),
            record=data.get("record", {}),
        )


class Store:
    def __init__(self, cache_dir: Path):
        self.root = Path(cache_dir) / LAYOUT
        self.objects = self.root / "objects"
        self.stages = self.root / "stages"
        self.trees = self.root / "trees"
        self.tmp = self.root / "tmp"

    # --- stage entries -------------------------------------------------------------
    def entry_path(self, key: str) -> Path:
        return self.stages / key[:2] / f"{key}.json"

    def has(self, key: str) -> bool:
        return os.path.exists(self.entry_path(key))

    def get(self, key: str) -> StageEntry | None:
        try:
            data = json.loads(self.entry_path(key).read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            return None  # never written half (atomic), but a damaged file is a miss
        if data.get("scheme") != SCHEME or data.get("key") != key:
            return None
        return StageEntry.from_json(data)

    def touch(self, key: str) -> None:
        """Mark an entry as used now (gc keeps recently used entries)."""
        try:
            os.utime(self.entry_path(key))
        except OSError:
            pass

    def new_workdir(self, label: str) -> Path:
        self.tmp.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{label}-", dir=self.tmp))

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
        """Move the files of `out_dir` into the store and record them under `key`."""
        entries = []
        for rel, st in walk_files(out_dir):
            src = os.path.join(out_dir, rel)
            digest = hash_file(src, st.st_size)
            entries.append(FileEntry(rel, digest, st.st_size))
            obj = self.object_path(digest)
            if not os.path.exists(obj):
                obj.parent.mkdir(parents=True, exist_ok=True)
                os.chmod(src, 0o444)
                os.replace(src, obj)  # same file system: cache_dir holds tmp/ too
                if stat_cache is not None:
                    stat_cache.record(os.fspath(obj), os.stat(obj), digest)
        entry = StageEntry(key, stage, tree_digest(entries), entries, summary, warnings, record)
        self.entry_path(key).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.entry_path(key), json.dumps(entry.to_json(), sort_keys=True))
        shutil.rmtree(out_dir, ignore_errors=True)
        return entry

    # --- objects -------------------------------------------------------------------
    def object_path(self, digest: str) -> Path:
        return self.objects / digest[:2] / digest[2:]

    def verify(self, entry: StageEntry, stat_cache: StatCache) -> bool:
        """Whether every object of `entry` exists with the right content; a corrupted object
        is deleted so the stage is rebuilt (never used)."""
        ok = True
        for f in entry.files:
            obj = self.object_path(f.hash)
            try:
                actual = stat_cache.file_hash(os.fspath(obj))
            except FileNotFoundError:
                ok = False
                continue
            if actual != f.hash:
                self.discard_object(f.hash)
                ok = False
        return ok

    def discard_object(self, digest: str) -> None:
        """Remove a bad object and every checkout that could share its inode."""
        try:
            os.unlink(self.object_path(digest))
        except FileNotFoundError:
            pass
        if self.trees.exists():
            for tree in os.listdir(self.trees):
                self._remove_dir(self.trees / tree)

    def ingest_copies(self, files: list[FileEntry], src_root: Path) -> None:
        """Copy files of a user directory (a source SavedModel) into the store, so what is
        published never shares an inode with the user's files."""
        for f in files:
            obj = self.object_path(f.hash)
            if os.path.exists(obj):
                continue
            obj.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".ingest-", dir=obj.parent)
            os.close(fd)
            try:
                shutil.copyfile(os.path.join(src_root, f.path), tmp)
                if hash_file(tmp) != f.hash:
                    raise StageError(f"{os.path.join(src_root, f.path)} changed while it was being read")
                os.chmod(tmp, 0o444)
                os.replace(tmp, obj)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise

    # --- checkouts -----------------------------------------------------------------
    def checkout(self, entry: StageEntry) -> Path:
        """The tree of `entry` as a directory of read-only hardlinks (made once)."""
        dest = self.trees / entry.tree
        if dest.is_dir():
            return dest
        self.trees.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".checkout-", dir=self.trees))
        self.materialize(entry.files, tmp)
        try:
            os.rename(tmp, dest)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another build made the same checkout
        return dest

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

    def _remove_dir(self, path: Path) -> None:
        try:
            trash = Path(tempfile.mkdtemp(prefix=".trash-", dir=self.tmp if self.tmp.exists() else path.parent))
            os.rename(path, trash / "x")
            shutil.rmtree(trash, ignore_errors=True)
        except OSError:
            pass

    def clean_tmp(self) -> None:
        """Drop work directories left by killed builds (call under the workspace lock)."""
        if self.tmp.exists():
            shutil.rmtree(self.tmp, ignore_errors=True)
        if self.trees.exists():
            for name in os.listdir(self.trees):
                if name.startswith("."):
                    shutil.rmtree(self.trees / name, ignore_errors=True)


def link_or_copy(src: Path | str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError as exc:
        if exc.errno == errno.EEXIST:
            os.unlink(dst)
            os.link(src, dst)
        elif exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o444)
        elif exc.errno == errno.ENOSPC:
            raise StageError(f"no space left on device while writing {dst}") from None
        else:
            raise
