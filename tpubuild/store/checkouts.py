"""The checkouts of a cache, `v1/trees/<tree hash>/` (a part of `Store`, store/store.py):
a tree as read-only hardlinks to its objects, the input directory of the next stage,
compared file by file with the objects on each use and repaired in place.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tpubuild.digests import FileEntry
from tpubuild.errors import StageError, file_kind
from tpubuild.fs import (
    fsync_fd,
    lstat_at,
    make_dir,
    open_dir,
    open_path,
    opened,
    place_file,
    remove_at,
    replace_file,
    walk_regular,
)
from tpubuild.keys import StageEntry
from tpubuild.store.objects import StoreObjects

__all__ = ["StoreCheckouts", "link_or_copy"]


class StoreCheckouts(StoreObjects):
    """Checkouts on top of the objects they link; the state is made by `Store.__init__`."""

    trees: Path

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
            work = self.sessions.new_workdir("checkout")
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
