"""File-system helpers the store, publishing and the workspace share: placing a file as a
reflink, copy or checked hard link, and durable renames (`place`); directories walked,
written and removed without following a link, by descriptor (`nofollow`); flock-based locks
with deadlines that name their holder (`flock`), and the workspace's own lock (`wslock`);
names read from a place others write, checked before they become paths or numbers (`names`).
They know nothing of keys, recipes or the build; what they refuse (a link or a special file
where a regular file should be, a copy that does not hash to the object checked, a full disk
while copying) is raised as errors.py's StageError, because it fails the stage or publish
step that placed the file: one line naming the path, exit 1.
"""

from __future__ import annotations

from tpubuild.face import lazy

# Name -> the module of this package that defines it, loaded on first use (tpubuild/face.py).
_FACE = {
    "INT64_MAX": "names",
    "LockTimeout": "flock",
    "MAX_DEPTH": "nofollow",
    "NotAFile": "nofollow",
    "WorkspaceLock": "wslock",
    "clean_relative": "names",
    "copy_hashed": "place",
    "create_exclusive_at": "nofollow",
    "descend": "nofollow",
    "fsync_fd": "nofollow",
    "holder": "flock",
    "inside": "names",
    "lstat_at": "nofollow",
    "make_dir": "nofollow",
    "open_dir": "nofollow",
    "open_lock_file": "flock",
    "open_path": "nofollow",
    "open_regular": "place",
    "open_regular_at": "nofollow",
    "opened": "nofollow",
    "place_file": "place",
    "read_regular_at": "nofollow",
    "remove_at": "nofollow",
    "replace_file": "place",
    "shown": "names",
    "try_lock": "flock",
    "unlock": "flock",
    "version_number": "names",
    "wait_lock": "flock",
    "walk_regular": "nofollow",
    "write_atomic_at": "nofollow",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy(__name__, _FACE)
