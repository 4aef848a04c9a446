"""The directories of a cache's layout (`<cache_dir>/v1/...`), opened without following a
link, and what is said about damage found in them (docs/shared-cache.md).

Each component is opened with O_NOFOLLOW from its parent's descriptor (fs/nofollow.py);
a link, a file or a FIFO where a directory of the layout should be is damage: removed (the
link itself, never what it points to), said once, and a directory made. A new directory
takes the mode of the one it is made in, so a group-writable cache stays group-writable
whatever the umask.
"""

from __future__ import annotations

import errno
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from tpubuild.fs import NotAFile, descend, make_dir, open_dir, remove_at
from tpubuild.gitignore import ignore_itself

LAYOUT = "v1"
# Caches this process said are shared (the warning is one line per cache and process).
_said_shared: set[str] = set()


class CacheLayout:
    def __init__(self, cache_dir: Path, report: Callable[[str], None]):
        self.cache_dir = Path(cache_dir)
        self.root = self.cache_dir / LAYOUT
        self.report = report
        self._warned: set[str | Path] = set()  # what was said already (damage, untrusted records)
        self._lock = threading.Lock()

    def say_once(self, what: str | Path, message: str) -> None:
        with self._lock:
            if what in self._warned:
                return
            self._warned.add(what)
        self.report(message)

    def remove_damage(self, name: str, dir_fd: int, path: Path | str, what: str) -> None:
        """Remove `name` of `dir_fd` (at `path`), `what` tpubuild does not keep there, and
        say so once: the link itself, never what it points to."""
        how = " (the link itself, not what it points to)" if what == "a symbolic link" else ""
        if remove_at(name, dir_fd):
            self.say_once(os.fspath(path), f"warning: cache {path} is {what}, not what tpubuild keeps there; "
                                           f"removed{how}")
        else:  # another user's, or too big to remove in one go: skipped, said once, never fatal
            self.say_once(os.fspath(path), f"warning: cache {path} is {what}, not what tpubuild keeps there; "
                                           "cannot remove all of it (another user's?): left in place")

    @staticmethod
    def dir_mode(parent_fd: int, name: str) -> int:
        """The mode of a new directory `name`: its parent's (a group-writable cache stays
        group-writable whatever the umask), `tmp/` sticky in a shared cache (no user can
        rename another's session), `keys/` sticky and writable by all in a shared cache,
        private to its user otherwise (store/record_mac.py)."""
        mode = os.fstat(parent_fd).st_mode & 0o2777
        shared = mode & 0o022
        if name == "keys":
            return 0o1777 if shared else 0o700
        if name == "tmp" and shared:
            return mode | 0o1000
        return mode

    @staticmethod
    def file_mode(dir_fd: int) -> int:
        """The mode of a file every user of the cache writes (the index, the lock): the
        read and write bits of its directory."""
        return os.fstat(dir_fd).st_mode & 0o666

    def open(self, parts: tuple[str, ...], create: bool = True) -> int:
        """A descriptor of `v1/<parts>`, each component opened without following a link,
        made (`create`) with `dir_mode` when absent. A link or a non-directory in the
        place of one is damage: removed, one warning, and a directory made; without
        `create`, FileNotFoundError."""
        if create:
            # The user's own path (it may be a link they made). One tpubuild makes is this
            # user's alone whatever the umask: a cache is shared only by making its
            # directory group-writable first (docs/shared-cache.md).
            if not os.path.isdir(self.cache_dir):
                os.makedirs(self.cache_dir, mode=0o755, exist_ok=True)
                # A cache directory tpubuild makes ignores itself in git (tpubuild/gitignore.py).
                ignore_itself(self.cache_dir)
        path = self.cache_dir

        def step(name: str, fd: int) -> int:
            nonlocal path
            path = path / name
            try:
                return make_dir(name, fd, self.dir_mode(fd, name)) if create else open_dir(name, fd)
            except NotAFile as exc:
                self.remove_damage(name, fd, path, exc.kind)
                if not create:
                    raise FileNotFoundError(errno.ENOENT, "removed as damage", os.fspath(path)) from None
                return make_dir(name, fd, self.dir_mode(fd, name))

        return descend(os.open(self.cache_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), (LAYOUT, *parts), step)

    @contextmanager
    def at(self, *parts: str, create: bool = True) -> Iterator[int]:
        """`open` as a context: the descriptor is closed on leaving."""
        fd = self.open(parts, create)
        try:
            yield fd
        finally:
            os.close(fd)

    def warn_if_shared(self) -> None:
        """One line, once per process and cache, when others than its owner can write the
        cache: its users must trust each other (docs/shared-cache.md)."""
        where = os.fspath(self.root)
        if where in _said_shared:
            return
        _said_shared.add(where)
        try:
            st = os.stat(self.root, follow_symlinks=False)
        except OSError:
            return
        if st.st_mode & 0o002:
            who = "every user of this machine"
        elif st.st_mode & 0o020:
            who = f"the users of group {_group_name(st.st_gid)}"
        elif st.st_uid != os.getuid():
            who = f"its owner, uid {st.st_uid}"
        else:
            return
        self.report(f"warning: the cache {self.cache_dir} can be written by {who}: a shared cache is for users who "
                    "trust each other (docs/shared-cache.md); share builds with others through a remote cache "
                    "with signed records")


def _group_name(gid: int) -> str:
    try:
        import grp

        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except (KeyError, ImportError):
        return f"gid {gid}"
